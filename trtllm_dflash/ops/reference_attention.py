"""Plain-torch reference implementations of the attention plugins: the drafter's block attention
over injected context K/V and the target's causal attention over its in-place cache.

These define the semantics (as `reference.py` does for sampling and verification): the Triton
kernels, the TensorRT plugins and the ONNX node evaluators are checked against them, and the
torch runtime runs them wherever a kernel is not available (CPU). Tensor layouts are token-major,
like flash-attention's KV cache: queries/keys/values are `[batch, tokens, heads, head_dim]` and a
KV cache is `[batch, capacity, kv_heads, head_dim]` with slot == absolute token position.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trtllm_dflash.contracts.draft_window import draft_visible

# ----------------------------------------------------------------------------- block attention


def append_context(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    new_counts: torch.Tensor,
) -> None:
    """Write the first `new_counts[r]` rows of `k_new/v_new [b, n, Hkv, D]` at slot cache_lens[r]."""
    n = k_new.shape[1]
    if n == 0:
        return
    offsets = torch.arange(n, device=k_new.device)
    valid = offsets.view(1, -1) < new_counts.view(-1, 1)
    rows = torch.arange(k_new.shape[0], device=k_new.device).view(-1, 1).expand(-1, n)[valid]
    slots = (cache_lens.view(-1, 1) + offsets.view(1, -1))[valid]
    k_cache[rows, slots] = k_new[valid].to(k_cache.dtype)
    v_cache[rows, slots] = v_new[valid].to(v_cache.dtype)


def block_attention(
    q: torch.Tensor,
    k_block: torch.Tensor,
    v_block: torch.Tensor,
    k_ctx_new: torch.Tensor,
    v_ctx_new: torch.Tensor,
    new_counts: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    scale: float,
    window: int = 0,
    causal: int = 0,
) -> torch.Tensor:
    """KV-injected block attention of one draft layer (appends the new context to the cache).

    q `[b, B, Hq, D]` and k/v_block `[b, B, Hkv, D]` come from the block tokens (after norm and
    RoPE), k/v_ctx_new `[b, n, Hkv, D]` from the new context rows (first new_counts[r] valid).
    After the append, row r has context length `L_r = cache_lens[r] + new_counts[r]`, and the block
    sits at positions L_r .. L_r+B-1. Which of the L_r context slots and B block keys a query sees
    is `draft_window.draft_visible(window, causal)`: with window == 0 (full layers) all of them,
    bidirectionally; with window > 0 (sliding layers) those within window - 1 positions on either
    side. Returns `[b, B, Hq, D]` in q's dtype.
    """
    append_context(k_cache, v_cache, cache_lens, k_ctx_new, v_ctx_new, new_counts)
    batch, block, num_heads, head_dim = q.shape
    ctx_lens = cache_lens + new_counts
    span = int(ctx_lens.max()) if batch else 0
    compute = torch.promote_types(q.dtype, torch.float32)  # fp32 accumulation, fp64 stays fp64
    keys = torch.cat([k_cache[:, :span].to(compute), k_block.to(compute)], dim=1)
    values = torch.cat([v_cache[:, :span].to(compute), v_block.to(compute)], dim=1)
    if batch == 1 and window == 0 and not causal:  # one row, full attention: every key is visible, no mask needed
        out = F.scaled_dot_product_attention(
            q.to(compute).transpose(1, 2),
            keys.transpose(1, 2),
            values.transpose(1, 2),
            scale=scale,
            enable_gqa=num_heads != keys.shape[2],
        )
        return out.transpose(1, 2).to(q.dtype)

    key_pos = torch.arange(span + block, device=q.device).view(1, 1, -1)
    is_ctx = key_pos < span
    # context slot j has position j; block key t has position L_r + t
    key_pos = torch.where(is_ctx, key_pos, ctx_lens.view(-1, 1, 1) + key_pos - span)
    query_pos = ctx_lens.view(-1, 1, 1) + torch.arange(block, device=q.device).view(1, -1, 1)
    visible = torch.where(is_ctx, key_pos < ctx_lens.view(-1, 1, 1), torch.ones_like(is_ctx))
    visible = visible & draft_visible(query_pos, key_pos, window, causal)

    out = F.scaled_dot_product_attention(
        q.to(compute).transpose(1, 2),
        keys.transpose(1, 2),
        values.transpose(1, 2),
        attn_mask=visible.unsqueeze(1),
        scale=scale,
        enable_gqa=num_heads != keys.shape[2],
    )
    return out.transpose(1, 2).to(q.dtype)


def block_attention_partials(
    q: torch.Tensor,
    k_block: torch.Tensor,
    v_block: torch.Tensor,
    k_ctx_new: torch.Tensor,
    v_ctx_new: torch.Tensor,
    new_counts: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    scale: float,
    window: int,
    splits: int,
    causal: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The split (flash-decoding) form of `block_attention`: per-split outputs and log-sum-exps.

    Row r's visible context `[lo, L_r)` (lo = 0, or L_r - window + 1 for sliding layers) is cut
    into `splits` chunks of ceil((L_r - lo) / splits) slots; the last split also holds the block's
    own keys. Returns `partial_out [b, Hkv, splits, B*g, D]` (float32, normalised within the split,
    0 where it sees no key) and `partial_lse [b, Hkv, splits, B*g]` (natural log, -inf where it
    sees no key); query row m of KV head h is block position m // g, query head h*g + m % g.
    `merge_partials` turns them into `block_attention`'s output. Appends like `block_attention`.
    """
    append_context(k_cache, v_cache, cache_lens, k_ctx_new, v_ctx_new, new_counts)
    batch, block, num_heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    group = num_heads // kv_heads
    ctx_lens = (cache_lens + new_counts).tolist()
    out = torch.zeros(batch, kv_heads, splits, block * group, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.full((batch, kv_heads, splits, block * group), float("-inf"), dtype=torch.float32, device=q.device)
    t = torch.arange(block, device=q.device)
    for r, length in enumerate(ctx_lens):
        lo = max(length - window + 1, 0) if window > 0 else 0
        chunk = -(-(length - lo) // splits)
        # queries [Hkv, B*g, D]: row m = (t, j)
        queries = q[r].float().view(block, kv_heads, group, head_dim).permute(1, 0, 2, 3).reshape(kv_heads, block * group, head_dim)
        q_pos = length + t.repeat_interleave(group)
        for s in range(splits):
            begin, end = lo + s * chunk, min(lo + (s + 1) * chunk, length)
            keys = [k_cache[r, begin:end].float()]
            values = [v_cache[r, begin:end].float()]
            key_pos = [torch.arange(begin, max(end, begin), device=q.device)]
            if s == splits - 1:
                keys.append(k_block[r].float())
                values.append(v_block[r].float())
                key_pos.append(length + t)
            keys, values, key_pos = torch.cat(keys), torch.cat(values), torch.cat(key_pos)
            if keys.shape[0] == 0:
                continue
            visible = draft_visible(q_pos.view(-1, 1), key_pos.view(1, -1), window, causal)
            scores = torch.einsum("hmd,nhd->hmn", queries, keys) * scale
            scores = scores.masked_fill(~visible, float("-inf"))
            row_lse = torch.logsumexp(scores, dim=-1)
            seen = row_lse > float("-inf")
            weights = torch.where(seen.unsqueeze(-1), torch.exp(scores - row_lse.unsqueeze(-1)), torch.zeros_like(scores))
            out[r, :, s] = torch.einsum("hmn,nhd->hmd", weights, values)
            lse[r, :, s] = row_lse
    return out, lse


def merge_partials(partial_out: torch.Tensor, partial_lse: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Combine `block_attention_partials` (or `target_attention_partials`) into `[b, B, Hq, D]`:
    `like`'s batch, block, heads and dtype, the partials' head dim (a target's value head dim)."""
    batch, block, num_heads = like.shape[:3]
    kv_heads, head_dim = partial_out.shape[1], partial_out.shape[-1]
    weights = torch.softmax(partial_lse, dim=2).nan_to_num(0.0)  # over splits
    merged = (weights.unsqueeze(-1) * partial_out).sum(dim=2)  # [b, Hkv, B*g, D]
    merged = merged.view(batch, kv_heads, block, num_heads // kv_heads, head_dim).permute(0, 2, 1, 3, 4)
    return merged.reshape(batch, block, num_heads, head_dim).to(like.dtype)


# ----------------------------------------------------------------------------- target attention


def write_block(k_cache: torch.Tensor, v_cache: torch.Tensor, starts: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor) -> None:
    """Write `k_new/v_new [b, T, Hkv, D]` at slots starts[r] .. starts[r]+T-1 of each row (in place).

    Slots past the capacity are dropped (a padded prefill row may run past it; nothing reads them).
    """
    batch, tokens = k_new.shape[:2]
    if tokens == 0:
        return
    slots = starts.view(-1, 1).to(torch.int64) + torch.arange(tokens, device=k_new.device)
    valid = slots < k_cache.shape[1]
    rows = torch.arange(batch, device=k_new.device).view(-1, 1).expand(-1, tokens)[valid]
    k_cache[rows, slots[valid]] = k_new[valid].to(k_cache.dtype)
    v_cache[rows, slots[valid]] = v_new[valid].to(v_cache.dtype)


def _live_span(starts: torch.Tensor, tokens: int, capacity: int) -> tuple[torch.Tensor, int]:
    """Which rows start inside the capacity (the others are a CUDA graph's padding rows, which see
    nothing), and the slots the live rows read: up to the furthest block's end (a host read)."""
    live = starts < capacity
    return live, min(int(starts[live].max()) + tokens if bool(live.any()) else 0, capacity)


def _causal_visible(query_pos: torch.Tensor, span: int, window: int) -> torch.Tensor:
    """`[b, M, span]`: which of the slots 0..span-1 the queries at positions `query_pos [b, M]` see:
    j <= position, and j > position - window on sliding layers (window > 0)."""
    query_pos = query_pos.unsqueeze(-1)
    key_pos = torch.arange(span, device=query_pos.device).view(1, 1, -1)
    visible = key_pos <= query_pos
    if window > 0:
        visible = visible & (key_pos > query_pos - window)
    return visible


def target_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    starts: torch.Tensor,
    sinks: torch.Tensor | None,
    scale: float,
    window: int = 0,
) -> torch.Tensor:
    """Causal attention of a target layer over its in-place KV cache (writes the block first).

    q `[b, T, Hq, Dk]`, k_new `[b, T, Hkv, Dk]`, v_new `[b, T, Hkv, Dv]` are the block's tokens at
    positions starts[r] + t (after norm and RoPE); k/v_cache `[b, S, Hkv, D*]` hold slot == position.
    The block is written at its positions, then query t of row r sees the slots j with
    j <= starts[r] + t (and j > starts[r] + t - window when window > 0): the committed prefix and
    the block causally. Only slots below starts[r] + T are ever read, so what a rejected draft left
    behind past a row's length is never seen. A row whose block starts at or past the capacity (a
    CUDA graph's padding row, runtime/cuda_graphs.py) writes nothing and reads nothing: its output
    is zeros. `sinks [Hq]` (gpt-oss) are one extra logit per head in the softmax denominator, with
    no value. Returns `[b, T, Hq, Dv]` in q's dtype.
    """
    write_block(k_cache, v_cache, starts, k_new, v_new)
    batch, tokens, num_heads, _ = q.shape
    live, span = _live_span(starts, tokens, k_cache.shape[1])
    compute = torch.promote_types(q.dtype, torch.float32)
    keys = k_cache[:, :span].to(compute).transpose(1, 2)  # [b, Hkv, span, Dk]
    values = v_cache[:, :span].to(compute).transpose(1, 2)
    group = num_heads // keys.shape[1]
    if group > 1:
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    visible = _causal_visible(starts.view(-1, 1).to(torch.int64) + torch.arange(tokens, device=q.device), span, window)
    visible = visible & live.view(-1, 1, 1)
    scores = torch.matmul(q.to(compute).transpose(1, 2), keys.transpose(-1, -2)) * scale  # [b, Hq, T, span]
    scores = scores.masked_fill(~visible.unsqueeze(1), float("-inf"))
    if sinks is not None:
        sink = sinks.to(compute).view(1, -1, 1, 1).expand(batch, -1, tokens, 1)
        weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        weights = torch.softmax(scores, dim=-1)
    out = torch.matmul(weights, values)
    out = torch.where(live.view(-1, 1, 1, 1), out, 0.0)  # a padding row: a softmax over nothing
    return out.transpose(1, 2).to(q.dtype)


def target_attention_partials(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    starts: torch.Tensor,
    sinks: torch.Tensor | None,
    scale: float,
    window: int,
    splits: int,
    causal: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The split (flash-decoding) form of `target_attention`: per-split outputs and log-sum-exps.

    Row r's committed prefix, cache slots `[lo, min(starts[r], S))` (lo = 0, or starts[r] - window + 1
    on sliding layers: the window of the block's first token), is cut into `splits` chunks of
    ceil(length / splits) slots; the last split also holds the block's own keys and the sinks, so
    each counts once. Each query keeps `target_attention`'s visibility. Returns `partial_out
    [b, Hkv, splits, T*g, Dv]` (float32, normalised within the split, 0 where it sees nothing) and
    `partial_lse [b, Hkv, splits, T*g]` (natural log, -inf where it sees nothing), in
    `block_attention_partials`' layout: `merge_partials` turns them into `target_attention`'s
    output. Writes the block like `target_attention`; a row starting at or past the capacity sees
    nothing in any split (its lse is the sinks' alone, or -inf).
    """
    write_block(k_cache, v_cache, starts, k_new, v_new)
    batch, tokens, num_heads, head_dim_k = q.shape
    capacity, kv_heads, head_dim_v = k_cache.shape[1], k_cache.shape[2], v_cache.shape[3]
    group = num_heads // kv_heads
    device = q.device
    out = torch.zeros(batch, kv_heads, splits, tokens * group, head_dim_v, dtype=torch.float32, device=device)
    lse = torch.full((batch, kv_heads, splits, tokens * group), float("-inf"), dtype=torch.float32, device=device)
    live, span = _live_span(starts, tokens, capacity)
    if batch == 0 or span == 0 and sinks is None:
        return out, lse
    # packed query rows [b, Hkv, T*g, Dk]: row m is token m // g, query head h*g + m % g
    queries = (
        q.float()
        .view(batch, tokens, kv_heads, group, head_dim_k)
        .permute(0, 2, 1, 3, 4)
        .reshape(batch, kv_heads, tokens * group, head_dim_k)
    )
    keys = k_cache[:, :span].float().transpose(1, 2)  # [b, Hkv, span, Dk]
    values = v_cache[:, :span].float().transpose(1, 2)
    scores = torch.matmul(queries, keys.transpose(-1, -2)) * scale  # [b, Hkv, T*g, span]

    starts = starts.view(-1, 1).to(torch.int64)
    key_pos = torch.arange(span, device=device).view(1, -1)  # [1, span]
    visible = _causal_visible(starts + torch.arange(tokens, device=device).repeat_interleave(group), span, window)  # [b, T*g, span]
    visible = visible & live.view(-1, 1, 1)
    lo = (starts - window + 1).clamp_min(0) if window > 0 else torch.zeros_like(starts)
    chunk = ((starts.clamp_max(capacity) - lo).clamp_min(0) + splits - 1) // splits
    split_of_key = torch.where(key_pos < starts, (key_pos - lo) // chunk.clamp_min(1), splits - 1)  # [b, span]
    for s in range(splits):
        mask = (visible & (split_of_key == s).unsqueeze(1)).unsqueeze(1)  # [b, 1, T*g, span]
        split_scores = scores.masked_fill(~mask, float("-inf"))
        if sinks is not None and s == splits - 1:
            sink = sinks.float()[torch.arange(kv_heads * group, device=device).view(kv_heads, 1, group)]  # [Hkv, 1, g]
            sink = sink.expand(kv_heads, tokens, group).reshape(1, kv_heads, tokens * group, 1).expand(batch, -1, -1, -1)
            split_scores = torch.cat([split_scores, sink], dim=-1)
        split_lse = torch.logsumexp(split_scores, dim=-1)
        seen = split_lse > float("-inf")
        weights = torch.exp(split_scores - torch.where(seen, split_lse, 0.0).unsqueeze(-1))[..., :span]
        out[:, :, s] = torch.matmul(weights, values)
        lse[:, :, s] = split_lse
    return out, lse

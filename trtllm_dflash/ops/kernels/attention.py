"""Triton kernels of the attention plugins: the drafter's KV-injected block attention and the
target's causal attention over an in-place cache (one kernel family, one flash step).

Semantics: `trtllm_dflash.ops.reference_attention.block_attention` (and `block_attention_partials` /
`merge_partials` for the split form). Layouts are token-major and contiguous: q/out
`[b, B, Hq, D]`, block and new-context keys/values `[b, T, Hkv, D]`, caches `[b, capacity, Hkv, D]`
with slot == absolute position.

One program handles one (query tile, KV split) of one KV head of one sequence. Its query tile
holds all `B * group` query rows that share the KV head (GQA packing), so every key and value is
read once per KV head. Long contexts are split over `num_splits` programs (flash-decoding): each
writes a normalised partial output and its log-sum-exp, and `merge_kernel` combines them (in a
launch of its own, or in the split launch's last program: attention_merge.py). With one split the
program writes the final output directly.

`target_attention_kernel` (semantics `reference_attention.target_attention`) is the target's layer: q/out
`[b, T, Hq, Dk|Dv]`, the block's keys/values `[b, T, Hkv, Dk|Dv]`, caches `[b, capacity, Hkv, Dk|Dv]`
(slot == position); it writes the block at each row's positions and attends causally over the
row's own slots, with the same GQA packing and flash step. Its split form
(`target_attention_split_kernel`, semantics `reference_attention.target_attention_partials`) cuts each row's
committed prefix over `num_splits` programs and writes partials in the drafter's layout, so
`merge_kernel` combines them too.

Parameter order is inputs, then scalars, then outputs: the calling convention of TensorRT's
ahead-of-time plugins, so the same compiled kernel is launched by torch and by TensorRT.

Reductions go through the builtin `tl.reduce` with Triton's own combine functions instead of the
sum/max wrappers: those wrappers are `@triton.jit` functions bound to compiled or interpreted
mode once, when triton is imported, which would tie this file to one mode
(see `trtllm_dflash/ops/kernels/__init__.py`).
"""

import triton
import triton.language as tl

from trtllm_dflash.ops import kernels

wait_for_inputs = kernels.load("grid_dependency", interpret=triton.knobs.runtime.interpret).wait_for_inputs

SUM = tl.standard._sum_combine
MAX = tl.standard._elementwise_max


@triton.jit
def _online_update(q, k, v, visible, m_i, l_i, acc, qk_scale, IEEE: tl.constexpr):
    """One flash-attention step over a key tile (scores in base 2, masked keys excluded)."""
    if IEEE:
        scores = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        scores = tl.dot(q, tl.trans(k))
    scores = tl.where(visible, scores * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.reduce(scores, 1, MAX))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(scores - m_use[:, None])
    l_i = l_i * alpha + tl.reduce(p, 1, SUM)
    if IEEE:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    acc = acc * alpha[:, None] + pv
    return m_new, l_i, acc


@triton.jit
def block_attention_kernel(
    # inputs
    q_ptr,
    k_block_ptr,
    v_block_ptr,
    k_ctx_ptr,
    v_ctx_ptr,
    new_counts_ptr,
    k_cache_ptr,
    v_cache_ptr,
    cache_lens_ptr,
    # scalars (int32: TensorRT passes plugin scalars as integers, so the scale travels as its bits)
    block,
    num_new,
    capacity,
    num_kv_heads,
    group,
    window,
    causal,
    scale_bits,
    num_splits,
    # outputs (the caches alias the cache inputs)
    out_ptr,
    k_cache_out_ptr,
    v_cache_out_ptr,
    # compile-time configuration
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_T: tl.constexpr,
    IEEE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Node DFlashBlockAttention: the whole context in one program per (query tile, KV head, row)."""
    wait_for_inputs(PDL)
    _block_attention(
        q_ptr,
        k_block_ptr,
        v_block_ptr,
        k_ctx_ptr,
        v_ctx_ptr,
        new_counts_ptr,
        k_cache_ptr,
        v_cache_ptr,
        cache_lens_ptr,
        block,
        num_new,
        capacity,
        num_kv_heads,
        group,
        window,
        causal,
        scale_bits,
        1,
        out_ptr,
        out_ptr,
        k_cache_out_ptr,
        v_cache_out_ptr,
        HEAD_DIM,
        BLOCK_M,
        BLOCK_N,
        BLOCK_T,
        False,
        IEEE,
    )


@triton.jit
def block_attention_split_kernel(
    # inputs
    q_ptr,
    k_block_ptr,
    v_block_ptr,
    k_ctx_ptr,
    v_ctx_ptr,
    new_counts_ptr,
    k_cache_ptr,
    v_cache_ptr,
    cache_lens_ptr,
    # scalars
    block,
    num_new,
    capacity,
    num_kv_heads,
    group,
    window,
    causal,
    scale_bits,
    num_splits,
    # outputs
    partial_out_ptr,
    partial_lse_ptr,
    k_cache_out_ptr,
    v_cache_out_ptr,
    # compile-time configuration
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_T: tl.constexpr,
    IEEE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Node DFlashBlockAttentionSplit: one program per (query tile x split, KV head, row)."""
    wait_for_inputs(PDL)
    _block_attention(
        q_ptr,
        k_block_ptr,
        v_block_ptr,
        k_ctx_ptr,
        v_ctx_ptr,
        new_counts_ptr,
        k_cache_ptr,
        v_cache_ptr,
        cache_lens_ptr,
        block,
        num_new,
        capacity,
        num_kv_heads,
        group,
        window,
        causal,
        scale_bits,
        num_splits,
        partial_out_ptr,
        partial_lse_ptr,
        k_cache_out_ptr,
        v_cache_out_ptr,
        HEAD_DIM,
        BLOCK_M,
        BLOCK_N,
        BLOCK_T,
        True,
        IEEE,
    )


@triton.jit
def _block_attention(
    q_ptr,
    k_block_ptr,
    v_block_ptr,
    k_ctx_ptr,
    v_ctx_ptr,
    new_counts_ptr,
    k_cache_ptr,
    v_cache_ptr,
    cache_lens_ptr,
    block,
    num_new,
    capacity,
    num_kv_heads,
    group,
    window,
    causal,
    scale_bits,
    num_splits,
    out_ptr,
    lse_ptr,
    k_cache_out_ptr,
    v_cache_out_ptr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_T: tl.constexpr,
    SPLIT: tl.constexpr,
    IEEE: tl.constexpr,
):
    pid = tl.program_id(0)
    split = pid % num_splits
    m_tile = pid // num_splits
    head = tl.program_id(1)
    row = tl.program_id(2).to(tl.int64)

    cached = tl.load(cache_lens_ptr + row).to(tl.int32)
    fresh = tl.load(new_counts_ptr + row).to(tl.int32)
    ctx_len = cached + fresh
    dims = tl.arange(0, HEAD_DIM)
    kv_row_stride = num_kv_heads * HEAD_DIM
    cache_base = row * capacity * kv_row_stride + head * HEAD_DIM
    ctx_base = row * num_new * kv_row_stride + head * HEAD_DIM
    cache_dtype = k_cache_out_ptr.dtype.element_ty

    # Append this head's new context rows to the cache (one program per head and sequence).
    if (split == 0) & (m_tile == 0):
        for start in range(0, fresh, BLOCK_N):
            offs = start + tl.arange(0, BLOCK_N)
            ok = (offs < fresh) & (cached + offs < capacity)
            src = ctx_base + offs[:, None].to(tl.int64) * kv_row_stride + dims[None, :]
            dst = cache_base + (cached + offs)[:, None].to(tl.int64) * kv_row_stride + dims[None, :]
            k_new = tl.load(k_ctx_ptr + src, mask=ok[:, None], other=0.0)
            v_new = tl.load(v_ctx_ptr + src, mask=ok[:, None], other=0.0)
            tl.store(k_cache_out_ptr + dst, k_new.to(cache_dtype), mask=ok[:, None])
            tl.store(v_cache_out_ptr + dst, v_new.to(cache_dtype), mask=ok[:, None])

    # Query rows of this tile: row m is block position m // group, query head head*group + m % group.
    rows = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < block * group
    t = rows // group
    q_head = head * group + rows % group
    q_offs = ((row * block + t) * (num_kv_heads * group) + q_head).to(tl.int64)[:, None] * HEAD_DIM + dims[None, :]
    q = tl.load(q_ptr + q_offs, mask=row_ok[:, None], other=0.0)
    compute_dtype = q.dtype
    query_pos = ctx_len + t

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, HEAD_DIM], 0.0, tl.float32)
    qk_scale = scale_bits.to(tl.float32, bitcast=True) * 1.4426950408889634
    # `draft_window.DraftWindow`: a query at p sees a key at j iff |p - j| < window on sliding layers
    # (symmetric, never causal), every key on full layers, and j <= p as well for causal drafters.
    # Context keys all lie before every query, so only the lower bound cuts them. (Vector-only masks:
    # the CPU interpreter mishandles bool scalar & vector.)
    sliding = window > 0
    reach = tl.where(sliding, window, 1 << 30)

    # This split's share of the visible context [lo, ctx_len).
    lo = tl.where(sliding, tl.maximum(ctx_len - window + 1, 0), 0)
    chunk = (ctx_len - lo + num_splits - 1) // num_splits
    c_start = lo + split * chunk
    c_end = tl.minimum(c_start + chunk, ctx_len)
    for n0 in range(c_start, c_end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        ok = pos < c_end
        in_cache = pos < cached
        # Slots before cache_lens come from the cache; the new rows straight from the inputs, cast
        # to the cache dtype exactly as if they had been read back after the append.
        cache_offs = cache_base + pos[:, None].to(tl.int64) * kv_row_stride + dims[None, :]
        new_offs = ctx_base + (pos - cached)[:, None].to(tl.int64) * kv_row_stride + dims[None, :]
        k_old = tl.load(k_cache_ptr + cache_offs, mask=(ok & in_cache)[:, None], other=0.0)
        v_old = tl.load(v_cache_ptr + cache_offs, mask=(ok & in_cache)[:, None], other=0.0)
        k_new = tl.load(k_ctx_ptr + new_offs, mask=(ok & ~in_cache)[:, None], other=0.0).to(cache_dtype)
        v_new = tl.load(v_ctx_ptr + new_offs, mask=(ok & ~in_cache)[:, None], other=0.0).to(cache_dtype)
        k = tl.where(in_cache[:, None], k_old, k_new).to(compute_dtype)
        v = tl.where(in_cache[:, None], v_old, v_new).to(compute_dtype)
        visible = ok[None, :] & (pos[None, :] > query_pos[:, None] - reach)
        m_i, l_i, acc = _online_update(q, k, v, visible, m_i, l_i, acc, qk_scale, IEEE)

    # The block's own keys, handled by the last split: within the window on both sides, and not
    # after the query for causal drafters.
    if split == num_splits - 1:
        tb = tl.arange(0, BLOCK_T)
        tb_ok = tb < block
        b_offs = ((row * block + tb) * num_kv_heads + head).to(tl.int64)[:, None] * HEAD_DIM + dims[None, :]
        k = tl.load(k_block_ptr + b_offs, mask=tb_ok[:, None], other=0.0).to(compute_dtype)
        v = tl.load(v_block_ptr + b_offs, mask=tb_ok[:, None], other=0.0).to(compute_dtype)
        last_visible = tl.where(causal != 0, t, tl.minimum(t + reach - 1, BLOCK_T))
        visible = (tb_ok[None, :] & row_ok[:, None]) & (tb[None, :] <= last_visible[:, None]) & (tb[None, :] > t[:, None] - reach)
        m_i, l_i, acc = _online_update(q, k, v, visible, m_i, l_i, acc, qk_scale, IEEE)

    has_keys = l_i > 0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    if SPLIT:
        part = ((row * num_kv_heads + head) * num_splits + split) * (block * group) + rows
        tl.store(out_ptr + part[:, None] * HEAD_DIM + dims[None, :], out, mask=row_ok[:, None])
        lse = tl.where(has_keys, (m_i + tl.log2(tl.where(has_keys, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
        tl.store(lse_ptr + part, lse, mask=row_ok)
    else:
        tl.store(out_ptr + q_offs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def target_attention_kernel(
    # inputs
    q_ptr,
    k_new_ptr,
    v_new_ptr,
    k_cache_ptr,
    v_cache_ptr,
    starts_ptr,
    sinks_ptr,
    # scalars
    tokens,
    capacity,
    num_kv_heads,
    group,
    window,
    scale_bits,
    # outputs (the caches alias the cache inputs)
    out_ptr,
    k_cache_out_ptr,
    v_cache_out_ptr,
    # compile-time configuration
    HEAD_DIM_K: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    IEEE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Node DFlashTargetAttention: causal attention of a target layer over its in-place cache.

    One program per (packed query tile, KV head, row); semantics `reference_attention.target_attention`.
    Caches hold slot == position per row. The block's keys/values are written at slots
    starts[r] + t, but no program reads them back from the cache: the prefix comes from cache slots
    below starts[r] and the block's own keys straight from k_new/v_new (cast to the cache dtype, as
    if read back). So the writes and the reads of one launch never touch the same slot, whatever
    order the programs run in, and one kernel is enough (a TensorRT AOT plugin launches one).
    Token t is written by the program whose tile holds its first packed query row (for a verify
    block that is the single tile), so a long prefill writes in parallel.
    """
    wait_for_inputs(PDL)
    _target_attention(
        q_ptr,
        k_new_ptr,
        v_new_ptr,
        k_cache_ptr,
        v_cache_ptr,
        starts_ptr,
        sinks_ptr,
        tokens,
        capacity,
        num_kv_heads,
        group,
        window,
        scale_bits,
        1,
        out_ptr,
        out_ptr,
        k_cache_out_ptr,
        v_cache_out_ptr,
        HEAD_DIM_K,
        HEAD_DIM_V,
        BLOCK_M,
        BLOCK_N,
        HAS_SINKS,
        False,
        IEEE,
    )


@triton.jit
def target_attention_split_kernel(
    # inputs
    q_ptr,
    k_new_ptr,
    v_new_ptr,
    k_cache_ptr,
    v_cache_ptr,
    starts_ptr,
    sinks_ptr,
    # scalars
    tokens,
    capacity,
    num_kv_heads,
    group,
    window,
    scale_bits,
    num_splits,
    # outputs (the caches alias the cache inputs)
    partial_out_ptr,
    partial_lse_ptr,
    k_cache_out_ptr,
    v_cache_out_ptr,
    # compile-time configuration
    HEAD_DIM_K: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    IEEE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Node DFlashTargetAttentionSplit: one program per (query tile x KV split, KV head, row).

    Semantics `reference_attention.target_attention_partials`; `merge_kernel` combines the partials. Each
    row's committed prefix is cut into `num_splits` chunks of slots; the last split also attends
    the block's own keys and adds the sinks, so both count once. The block is written by split 0
    of the tile that owns each token, and, as in the unsplit kernel, no program reads a slot the
    launch writes: the splits need no ordering between them.
    """
    wait_for_inputs(PDL)
    _target_attention(
        q_ptr,
        k_new_ptr,
        v_new_ptr,
        k_cache_ptr,
        v_cache_ptr,
        starts_ptr,
        sinks_ptr,
        tokens,
        capacity,
        num_kv_heads,
        group,
        window,
        scale_bits,
        num_splits,
        partial_out_ptr,
        partial_lse_ptr,
        k_cache_out_ptr,
        v_cache_out_ptr,
        HEAD_DIM_K,
        HEAD_DIM_V,
        BLOCK_M,
        BLOCK_N,
        HAS_SINKS,
        True,
        IEEE,
    )


@triton.jit
def _target_attention(
    q_ptr,
    k_new_ptr,
    v_new_ptr,
    k_cache_ptr,
    v_cache_ptr,
    starts_ptr,
    sinks_ptr,
    tokens,
    capacity,
    num_kv_heads,
    group,
    window,
    scale_bits,
    num_splits,
    out_ptr,
    lse_ptr,
    k_cache_out_ptr,
    v_cache_out_ptr,
    HEAD_DIM_K: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    SPLIT: tl.constexpr,
    IEEE: tl.constexpr,
):
    pid = tl.program_id(0)
    split = pid % num_splits
    m_tile = pid // num_splits
    head = tl.program_id(1)
    row = tl.program_id(2).to(tl.int64)
    first_split = split == 0
    last_split = split == num_splits - 1

    start = tl.load(starts_ptr + row).to(tl.int32)
    dk = tl.arange(0, HEAD_DIM_K)
    dv = tl.arange(0, HEAD_DIM_V)
    k_stride = num_kv_heads * HEAD_DIM_K  # elements per slot (token) of the key tensors
    v_stride = num_kv_heads * HEAD_DIM_V
    k_cache_base = row * capacity * k_stride + head * HEAD_DIM_K
    v_cache_base = row * capacity * v_stride + head * HEAD_DIM_V
    k_new_base = row * tokens * k_stride + head * HEAD_DIM_K
    v_new_base = row * tokens * v_stride + head * HEAD_DIM_V
    k_dtype = k_cache_out_ptr.dtype.element_ty
    v_dtype = v_cache_out_ptr.dtype.element_ty
    m0 = m_tile * BLOCK_M

    # Write the tokens this tile owns at their positions (slots past the capacity are dropped);
    # with a KV split, split 0 of the tile writes them.
    own_lo = (m0 + group - 1) // group
    own_hi = tl.where(first_split, tl.minimum((m0 + BLOCK_M + group - 1) // group, tokens), own_lo)
    for t0 in range(own_lo, own_hi, BLOCK_N):
        tt = t0 + tl.arange(0, BLOCK_N)
        ok = (tt < own_hi) & (start + tt < capacity)
        slot = (start + tt)[:, None].to(tl.int64)
        src = tt[:, None].to(tl.int64)
        k_blk = tl.load(k_new_ptr + k_new_base + src * k_stride + dk[None, :], mask=ok[:, None], other=0.0)
        v_blk = tl.load(v_new_ptr + v_new_base + src * v_stride + dv[None, :], mask=ok[:, None], other=0.0)
        tl.store(k_cache_out_ptr + k_cache_base + slot * k_stride + dk[None, :], k_blk.to(k_dtype), mask=ok[:, None])
        tl.store(v_cache_out_ptr + v_cache_base + slot * v_stride + dv[None, :], v_blk.to(v_dtype), mask=ok[:, None])

    # Query rows of this tile: row m is block token m // group, query head head*group + m % group.
    rows = m0 + tl.arange(0, BLOCK_M)
    row_ok = rows < tokens * group
    t = rows // group
    q_head = head * group + rows % group
    num_heads = num_kv_heads * group
    q_offs = ((row * tokens + t) * num_heads + q_head)[:, None] * HEAD_DIM_K + dk[None, :]
    q = tl.load(q_ptr + q_offs, mask=row_ok[:, None], other=0.0)
    compute_dtype = q.dtype
    query_pos = start + t

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, HEAD_DIM_V], 0.0, tl.float32)
    qk_scale = scale_bits.to(tl.float32, bitcast=True) * 1.4426950408889634
    # Sliding layers see keys j with p - window < j <= p; full layers an unbounded window.
    sliding = window > 0
    reach = tl.where(sliding, window, 1 << 30)
    t_first = m0 // group
    t_last = tl.minimum((m0 + BLOCK_M - 1) // group, tokens - 1)

    # The committed prefix: cache slots [row_lo, hi) (row_lo: the window of the row's first token),
    # this split's chunk of it, from the window of the tile's first query on, so a step costs
    # O(length) (O(window) on sliding layers), never O(capacity). A row whose block starts at or
    # past the capacity (a CUDA graph's padding row) reads nothing: its output is zeros.
    row_lo = tl.where(sliding, tl.maximum(start - window + 1, 0), 0)
    hi = tl.where(start < capacity, start, 0)
    chunk = (tl.maximum(hi - row_lo, 0) + num_splits - 1) // num_splits
    c_start = row_lo + split * chunk
    c_end = tl.minimum(c_start + chunk, hi)
    lo = tl.maximum(c_start, tl.where(sliding, tl.maximum(start + t_first - window + 1, 0), 0))
    for n0 in range(lo, c_end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        ok = pos < c_end
        slot = pos[:, None].to(tl.int64)
        k = tl.load(k_cache_ptr + k_cache_base + slot * k_stride + dk[None, :], mask=ok[:, None], other=0.0)
        v = tl.load(v_cache_ptr + v_cache_base + slot * v_stride + dv[None, :], mask=ok[:, None], other=0.0)
        visible = ok[None, :] & (pos[None, :] > query_pos[:, None] - reach)
        m_i, l_i, acc = _online_update(q, k.to(compute_dtype), v.to(compute_dtype), visible, m_i, l_i, acc, qk_scale, IEEE)

    # The block's own keys t' <= t (causal, windowed) from the inputs, up to the tile's last token
    # (the last split only); those at positions past the capacity were not written and are not seen.
    b_lo = tl.where(sliding, tl.maximum(t_first - window + 1, 0), 0)
    b_hi = tl.where(last_split, tl.minimum(t_last + 1, capacity - start), b_lo)
    for n0 in range(b_lo, b_hi, BLOCK_N):
        tb = n0 + tl.arange(0, BLOCK_N)
        ok = tb < b_hi
        src = tb[:, None].to(tl.int64)
        k = tl.load(k_new_ptr + k_new_base + src * k_stride + dk[None, :], mask=ok[:, None], other=0.0)
        v = tl.load(v_new_ptr + v_new_base + src * v_stride + dv[None, :], mask=ok[:, None], other=0.0)
        k = k.to(k_dtype).to(compute_dtype)
        v = v.to(v_dtype).to(compute_dtype)
        visible = ok[None, :] & (tb[None, :] <= t[:, None]) & (tb[None, :] > t[:, None] - reach)
        m_i, l_i, acc = _online_update(q, k, v, visible, m_i, l_i, acc, qk_scale, IEEE)

    if HAS_SINKS:
        # gpt-oss: one more logit per query head in the denominator, with no value (the last split's).
        sink = tl.load(sinks_ptr + q_head, mask=row_ok, other=0.0).to(tl.float32) * 1.4426950408889634
        sink = tl.where(last_split, sink, float("-inf"))
        m_new = tl.maximum(m_i, sink)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.exp2(sink - m_use)
        acc = acc * alpha[:, None]
        m_i = m_new

    has_keys = l_i > 0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    if SPLIT:
        part = ((row * num_kv_heads + head) * num_splits + split) * (tokens * group) + rows
        tl.store(out_ptr + part[:, None] * HEAD_DIM_V + dv[None, :], out, mask=row_ok[:, None])
        lse = tl.where(has_keys, (m_i + tl.log2(tl.where(has_keys, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
        tl.store(lse_ptr + part, lse, mask=row_ok)
    else:
        out_offs = ((row * tokens + t) * num_heads + q_head)[:, None] * HEAD_DIM_V + dv[None, :]
        tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])

"""The DFlash block-diffusion drafter in PyTorch (z-lab `DFlashDraftModel` layout).

A stack of Qwen3-style decoder layers whose attention keys/values are prefixed, in EVERY layer,
with the layer's own projection of the target's context feature (KV injection). Most drafters
have no embedding or LM head: the runtime embeds the block with the target's embedding and
scores the output with the target's LM head (`DFlashDrafter.logits`); a checkpoint that ships
its own `lm_head` / `embed_tokens` uses those instead.

Two entry points share the weights:
- `step`: one decoding step with a KV cache (new context rows appended, block not cached);
- `forward_train`: many blocks against a whole sequence's context with an explicit mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config

from trtllm_dflash import ops
from trtllm_dflash.config import DrafterConfig
from trtllm_dflash.hf_compat import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding
from trtllm_dflash.modeling import fused_ops
from trtllm_dflash.modeling.draft_attention import DraftAttentionPlan
from trtllm_dflash.modeling.fused_ops import norm_of, rms_norm, rotate
from trtllm_dflash.modeling.kv_cache import LayerCache
from trtllm_dflash.modeling.packed_linear import Linear, through
from trtllm_dflash.modeling.slots import Slots


def hf_config(config: DrafterConfig) -> Qwen3Config:
    """The transformers config that drives the shared RMSNorm, MLP and RoPE modules."""
    return Qwen3Config(
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        rms_norm_eps=config.rms_norm_eps,
        rope_theta=config.rope_theta,
        rope_scaling=config.rope_scaling,
        max_position_embeddings=config.max_position_embeddings,
        hidden_act=config.hidden_act,
        attention_bias=config.attention_bias,
        vocab_size=config.vocab_size or 1,
    )


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on `[b, T, heads, D]` with cos/sin `[b, T, D]`."""
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    return (x * cos + rotate_half(x) * sin).to(x.dtype)


def _stamp(tensors: list[torch.Tensor]) -> tuple:
    return tuple((id(t), t._version) for t in tensors)


def stacked_weights(cache: dict, linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weights (and biases) of `linears` stacked on the output axis, for one matmul in place of
    several; kept in `cache` until a weight is replaced or changed in place (training)."""
    params = [p for linear in linears for p in (linear.weight, linear.bias) if p is not None]
    if cache.get("linear") != _stamp(params):
        cache["linear"] = _stamp(params)
        cache["weight"] = torch.cat([linear.weight.detach() for linear in linears])
        biases = [linear.bias for linear in linears]
        cache["bias"] = torch.cat([b.detach() for b in biases]) if all(b is not None for b in biases) else None
    return cache["weight"], cache["bias"]


class DFlashAttention(nn.Module):
    def __init__(self, config: DrafterConfig, layer: int) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = self.head_dim**-0.5
        self.attention = config.attention_of(layer)  # which keys a block query sees (draft_window)
        bias = config.attention_bias
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self._stacked: dict = {}  # q/k/v weights as one matrix, for decoding (stacked_weights)

    def project_step(self, h: torch.Tensor, ctx_hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], linear: Linear = F.linear):
        """Decoding: the block's queries, keys and values in one matmul, the context rows' keys
        and values in another.

        The same arithmetic as `project_queries` + `project_keys_values` twice, in a few calls
        instead of dozens (a decoding step's cost at small sizes is mostly per call): the block's
        queries and keys sit side by side in the projection's output and are normed and rotated
        as one tensor. `rope` is cos/sin `[b, n + B, D]` over the context rows then the block;
        `linear` runs the projections (F.linear, or packed linears on a CPU: modeling/packed_linear.py).
        Returns q, k, v, k_ctx, v_ctx.
        """
        n, (b, t) = ctx_hidden.shape[1], h.shape[:2]
        weight, bias = stacked_weights(self._stacked, [self.q_proj, self.k_proj, self.v_proj])
        q_width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        qkv = linear(h, weight, bias)
        norm_weight, eps = self._head_norm()
        if fused_ops.kernels_run(h.device) and rope[0].dtype == h.dtype:  # the GPU: norm + RoPE in one kernel each
            kv_ctx = linear(ctx_hidden, weight[q_width:], None if bias is None else bias[q_width:])
            cos, sin = rope
            q, k, v = fused_ops.qk_norm_rope(
                qkv, cos[:, n:], sin[:, n:], (norm_weight, eps), self.num_heads, self.num_kv_heads, self.head_dim
            )
            _, k_ctx, v_ctx = fused_ops.qk_norm_rope(
                kv_ctx, cos[:, :n], sin[:, :n], (norm_weight[self.num_heads :], eps), 0, self.num_kv_heads, self.head_dim
            )
            return q, k, v, k_ctx, v_ctx
        cos, sin = rope[0].unsqueeze(2), rope[1].unsqueeze(2)
        qk = rms_norm(qkv[..., : q_width + kv_width].reshape(b, t, -1, self.head_dim), norm_weight, eps)
        q, k = rotate(qk, cos[:, n:], sin[:, n:]).to(h.dtype).split([self.num_heads, self.num_kv_heads], dim=2)
        v = qkv[..., q_width + kv_width :].reshape(b, t, -1, self.head_dim)
        kv_ctx = linear(ctx_hidden, weight[q_width:], None if bias is None else bias[q_width:])
        k_ctx = rms_norm(kv_ctx[..., :kv_width].reshape(b, n, -1, self.head_dim), norm_weight[self.num_heads :], eps)
        k_ctx = rotate(k_ctx, cos[:, :n], sin[:, :n]).to(h.dtype)
        v_ctx = kv_ctx[..., kv_width:].reshape(b, n, -1, self.head_dim)
        return q, k, v, k_ctx, v_ctx

    def _head_norm(self) -> tuple[torch.Tensor, float]:
        """q_norm's and k_norm's weights side by side over the heads (cached, see stacked_weights)."""
        params = [self.q_norm.weight, self.k_norm.weight]
        if self._stacked.get("norm") != _stamp(params):
            self._stacked["norm"] = _stamp(params)
            q, k = (p.detach() for p in params)
            self._stacked["norm_weight"] = torch.cat([q.expand(self.num_heads, -1), k.expand(self.num_kv_heads, -1)])
        return self._stacked["norm_weight"], self.q_norm.variance_epsilon

    def project_keys_values(self, h: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """Keys (normed, rotated) and values `[b, T, Hkv, D]` of block or context rows."""
        shape = (*h.shape[:-1], self.num_kv_heads, self.head_dim)
        k = apply_rope(self.k_norm(self.k_proj(h).view(shape)), *rope)
        v = self.v_proj(h).view(shape)
        return k, v

    def project_queries(self, h: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        shape = (*h.shape[:-1], self.num_heads, self.head_dim)
        return apply_rope(self.q_norm(self.q_proj(h).view(shape)), *rope)

    def step(
        self,
        h,
        rope,
        ctx_hidden,
        new_counts,
        cache: LayerCache,
        cache_lens,
        slots: Slots,
        history: int = 0,
        row: tuple[int, int] | None = None,
        plan: DraftAttentionPlan | None = None,
        linear: Linear = F.linear,
    ):
        """One decoding step of this layer; `rope` covers the context rows then the block.

        `cache` covers every slot; batch row r uses slot slots.ids[r], one attention call per run
        of consecutive slots. `row` (one row on the host: its cache length and new context
        count) writes the context K/V straight into the cache as a slice copy, and the attention op
        gets no new rows. `plan` (a CPU batch, modeling/draft_attention.py) attends over the cache in place.
        """
        q, k, v, k_ctx, v_ctx = self.project_step(h, ctx_hidden, rope, linear)
        if plan is not None:
            return linear(plan.attend(q, k, v, k_ctx, v_ctx, cache, self.scale).flatten(-2), self.o_proj.weight, self.o_proj.bias)
        if row is not None and history == 0:
            start, count = row
            slot = slots.ids[0]
            cache.keys[slot, start : start + count] = k_ctx[0, :count]
            cache.values[slot, start : start + count] = v_ctx[0, :count]
            k_ctx, v_ctx, new_counts, cache_lens = k_ctx[:, :0], v_ctx[:, :0], new_counts * 0, cache_lens + new_counts
        if history > 0 and bool(((cache_lens + new_counts) > history).any()):
            out = self._bounded_step(q, k, v, k_ctx, v_ctx, new_counts, cache, cache_lens, history, slots.ids)
        else:
            outs = [
                ops.block_attention(
                    q[rows],
                    k[rows],
                    v[rows],
                    k_ctx[rows],
                    v_ctx[rows],
                    new_counts[rows],
                    cache.keys[held],
                    cache.values[held],
                    cache_lens[rows],
                    self.scale,
                    self.attention.window,
                    int(self.attention.causal),
                )
                for rows, held in slots.runs()
            ]
            out = outs[0] if len(outs) == 1 else torch.cat(outs)
        return linear(out.flatten(-2), self.o_proj.weight, self.o_proj.bias)

    def _bounded_step(self, q, k, v, k_ctx, v_ctx, new_counts, cache: LayerCache, cache_lens, history: int, slot_of: tuple[int, ...]):
        """Block attention over only the last `history` context positions of each row.

        Keys are cached already rotated, so attention over the cache slots [lo, L) is the same
        op on a view of the cache that starts at slot lo (positions shift alike for queries and
        keys, so a sliding window keeps its meaning). Rows differ in lo, hence one call per row.
        New context rows that fall before lo are never visible again and are not written.
        """
        outs = []
        for r in range(q.shape[0]):
            start, count = int(cache_lens[r]), int(new_counts[r])
            lo = max(start + count - history, 0)
            skip = max(lo - start, 0)
            row, slot = slice(r, r + 1), slice(slot_of[r], slot_of[r] + 1)
            outs.append(
                ops.block_attention(
                    q[row],
                    k[row],
                    v[row],
                    k_ctx[row, skip:],
                    v_ctx[row, skip:],
                    new_counts[row] - skip,
                    cache.keys[slot, lo:],
                    cache.values[slot, lo:],
                    cache_lens[row] + skip - lo,
                    self.scale,
                    self.attention.window,
                    int(self.attention.causal),
                )
            )
        return torch.cat(outs, dim=0)

    def forward_train(self, h, block_rope, ctx_hidden, ctx_rope, mask):
        q = self.project_queries(h, block_rope)
        k, v = self.project_keys_values(h, block_rope)
        k_ctx, v_ctx = self.project_keys_values(ctx_hidden, ctx_rope)
        keys = torch.cat([k_ctx, k], dim=1).transpose(1, 2)
        values = torch.cat([v_ctx, v], dim=1).transpose(1, 2)
        out = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2),
            keys,
            values,
            attn_mask=mask,
            scale=self.scale,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        return self.o_proj(out.transpose(1, 2).flatten(-2))


class DFlashDecoderLayer(nn.Module):
    # its fused step can leave the residual add to the next layer's norm kernel (DFlash2's layer cannot)
    carries_residual = True

    def __init__(self, config: DrafterConfig, layer: int, shared: Qwen3Config) -> None:
        super().__init__()
        self.self_attn = DFlashAttention(config, layer)
        self.mlp = Qwen3MLP(shared)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self._stacked: dict = {}  # gate/up weights as one matrix, for decoding (stacked_weights)

    def fuses(self, x: torch.Tensor) -> bool:
        """Whether a step on `x` runs the fused-layer kernels (the GPU): norms with the residual add,
        q/k norm + RoPE, SiLU * up."""
        mlp = self.mlp
        return (
            fused_ops.kernels_run(x.device)
            and type(mlp.act_fn).__name__ in ("SiLU", "SiLUActivation")
            and x.dtype == mlp.down_proj.weight.dtype
        )

    def step(
        self, x, rope, ctx_hidden, new_counts, cache: LayerCache, cache_lens, slots, history: int = 0, row=None, plan=None, linear=F.linear
    ) -> torch.Tensor:
        """One decoding step of this layer over the block `x [b, B, H]`, op by op (on the kernels the
        drafter runs `fused_step` instead)."""
        attn = self.self_attn.step(
            rms_norm(x, *norm_of(self.input_layernorm)), rope, ctx_hidden, new_counts, cache, cache_lens, slots, history, row, plan, linear
        )
        return self.finish_step(x, attn, linear)

    def fused_step(
        self, x, delta, rope, ctx_hidden, new_counts, cache: LayerCache, cache_lens, slots, history=0, row=None, plan=None, linear=F.linear
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`step` on the kernels (`fuses`) over the residual stream `x + delta` (delta None: `x`):
        returns the stream after the attention and the MLP's output, which the next layer's norm
        kernel (or the final norm's) adds, as the fused target pass does (modeling/fused_target.py)."""
        x, h = fused_ops.add_rms_norm(x, delta, *norm_of(self.input_layernorm))
        attn = self.self_attn.step(h, rope, ctx_hidden, new_counts, cache, cache_lens, slots, history, row, plan, linear)
        x, h = fused_ops.add_rms_norm(x, attn, *norm_of(self.post_attention_layernorm))
        mlp = self.mlp
        weight, bias = stacked_weights(self._stacked, [mlp.gate_proj, mlp.up_proj])
        return x, fused_ops.silu_mul_linear(linear(h, weight, bias), mlp.down_proj.weight, mlp.down_proj.bias, linear)

    def forward_train(self, x, block_rope, ctx_hidden, ctx_rope, mask, block_size: int) -> torch.Tensor:
        """Uncached forward of many blocks laid end to end on the token axis (training)."""
        attn = self.self_attn.forward_train(self.input_layernorm(x), block_rope, ctx_hidden, ctx_rope, mask)
        return self._finish(x, attn)

    def _finish(self, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        x = x + attn_out
        return x + self.mlp(self.post_attention_layernorm(x))

    def finish_step(self, x: torch.Tensor, attn_out: torch.Tensor, linear: Linear = F.linear) -> torch.Tensor:
        """`_finish` for decoding: gate and up projections as one matmul, the norm inlined."""
        mlp = self.mlp
        weight, bias = stacked_weights(self._stacked, [mlp.gate_proj, mlp.up_proj])
        x = x + attn_out
        gate, up = linear(rms_norm(x, *norm_of(self.post_attention_layernorm)), weight, bias).chunk(2, dim=-1)
        return x + linear(mlp.act_fn(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)


class DFlashDrafter(nn.Module):
    """Weights and forward passes of a DFlash drafter; tensor names match z-lab checkpoints."""

    decoder_layer = DFlashDecoderLayer

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.config = config
        shared = hf_config(config)
        self.layers = nn.ModuleList(self.decoder_layer(config, i, shared) for i in range(config.num_hidden_layers))
        self.fc = nn.Linear(config.num_taps * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config=shared)
        # cos/sin of every position, set by the runtime where the kernels run (a step on them gathers its rows)
        self.rope_table: fused_ops.RopeTable | None = None
        # a checkpoint's own LM head / embedding (most drafters use the target's): see attach_own_weights
        self.lm_head: nn.Linear | None = None
        self.embed_tokens: nn.Embedding | None = None

    def attach_own_weights(self, lm_head: torch.Tensor | None = None, embed_tokens: torch.Tensor | None = None) -> None:
        """Give the drafter its own LM head and/or embedding (shapes from the checkpoint's tensors),
        used instead of the target's by `logits` / `embed`."""
        if lm_head is not None:
            self.lm_head = nn.Linear(lm_head.shape[1], lm_head.shape[0], bias=False)
        if embed_tokens is not None:
            self.embed_tokens = nn.Embedding(embed_tokens.shape[0], embed_tokens.shape[1])

    def decode_projections(self) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """(weight, bias) of every projection a decoding step runs: q/k/v, the context rows' k/v and
        gate/up stacked as the step stacks them, and every other nn.Linear as it is
        (runtime/linear_choice.py times the step's projections by these shapes)."""
        out, stacked = [], set()
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            weight, bias = stacked_weights(attn._stacked, [attn.q_proj, attn.k_proj, attn.v_proj])
            q_width = attn.num_heads * attn.head_dim
            out += [(weight, bias), (weight[q_width:], None if bias is None else bias[q_width:])]
            out.append(stacked_weights(layer._stacked, [mlp.gate_proj, mlp.up_proj]))
            stacked |= {id(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj)}
        return out + [(m.weight, m.bias) for m in self.modules() if type(m) is nn.Linear and id(m) not in stacked]

    def context_hidden(self, target_features: torch.Tensor) -> torch.Tensor:
        """`hidden_norm(fc(concat of tapped target hidden states))`."""
        return self.hidden_norm(self.fc(target_features))

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary_emb(x, positions)

    def step(
        self,
        block_embeds: torch.Tensor,
        ctx_features: torch.Tensor,
        new_counts: torch.Tensor,
        cache_lens: torch.Tensor,
        caches: list[LayerCache],
        slots: Slots | None = None,
        linear: Linear = F.linear,
    ) -> torch.Tensor:
        """One drafting step for a batch; returns the final-normed block hidden states.

        block_embeds `[b, B, H]`: embedded `[anchor, MASK, ...]`; ctx_features `[b, n, taps*H]`:
        the new context rows (first new_counts[r] valid) at positions cache_lens[r] + i; the block
        sits at cache_lens + new_counts. `caches[i]` is layer i's cache over every slot and `slots`
        say which slot each batch row uses (default: row r in slot r); `linear` runs every
        projection (the torch runtime passes packed linears on a CPU); the caller advances
        cache_lens by new_counts afterwards.
        """
        n, block = ctx_features.shape[1], block_embeds.shape[1]
        offsets = torch.arange(n + block, device=cache_lens.device)
        # context row i at cache_lens + i, block token t at cache_lens + new_counts + t
        positions = cache_lens.view(-1, 1) + offsets + torch.where(offsets < n, 0, new_counts.view(-1, 1) - n)
        x = self.residual(block_embeds)
        fused = self.decoder_layer.carries_residual and all(layer.fuses(x) for layer in self.layers)
        ctx_hidden = linear(ctx_features, self.fc.weight)
        if fused:  # the norm in one kernel
            ctx_hidden = fused_ops.add_rms_norm(ctx_hidden, None, *norm_of(self.hidden_norm))[1]
        else:
            ctx_hidden = rms_norm(ctx_hidden, *norm_of(self.hidden_norm))
        rope = self.rope_table.rows(positions) if fused and self.rope_table is not None else self.rope(block_embeds, positions)
        history = self.config.history  # read per call: `config` may be replaced to change it
        # one row on the CPU: its context rows are written into the cache by slice (host lengths are free there)
        row = (int(cache_lens[0]), int(new_counts[0])) if block_embeds.shape[0] == 1 and cache_lens.device.type == "cpu" else None
        slots = slots if slots is not None else Slots.of(slice(0, block_embeds.shape[0]), block_embeds.device)
        plan = None
        if row is None and history == 0 and self._plannable(cache_lens.device, caches):
            plan = DraftAttentionPlan.make(cache_lens, new_counts, n, block, slots, caches[0].keys.dtype)
        if fused:  # the GPU: each layer's residual add inside the next norm kernel
            delta = None
            for layer, cache in zip(self.layers, caches):
                x, delta = layer.fused_step(x, delta, rope, ctx_hidden, new_counts, cache, cache_lens, slots, history, row, plan, linear)
            return fused_ops.add_rms_norm(x, delta, *norm_of(self.norm))[1]
        for layer, cache in zip(self.layers, caches):
            x = layer.step(x, rope, ctx_hidden, new_counts, cache, cache_lens, slots, history, row, plan, linear)
        return self.final_norm(x)

    def _plannable(self, device: torch.device, caches: list[LayerCache]) -> bool:
        """Whether a batched step attends by a DraftAttentionPlan: on a CPU, every layer full and
        bidirectional, caches in float32/float64 (the op's arithmetic; it upcasts lower precisions)."""
        return (
            device.type == "cpu"
            and not fused_ops.kernels_run(device)
            and caches[0].keys.dtype in (torch.float32, torch.float64)
            and all(layer.self_attn.attention.window == 0 and not layer.self_attn.attention.causal for layer in self.layers)
        )

    def residual(self, block_embeds: torch.Tensor) -> torch.Tensor:
        """The residual stream a step starts from (V1: the embeddings themselves)."""
        return block_embeds

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm of the residual stream, in the drafter's dtype."""
        return rms_norm(x, *norm_of(self.norm))

    def forward_train(
        self,
        block_embeds: torch.Tensor,
        block_positions: torch.Tensor,
        ctx_features: torch.Tensor,
        ctx_positions: torch.Tensor,
        mask: torch.Tensor | dict[int, torch.Tensor],
        block_size: int | None = None,
    ) -> torch.Tensor:
        """Uncached forward of many blocks of `block_size` (default: the config's) at once (training).

        mask `[b, 1, Q, S + Q]` (True = visible), or one mask per layer window (`DraftWindow`).
        """
        ctx_hidden = self.context_hidden(ctx_features)
        ctx_rope = self.rope(ctx_hidden, ctx_positions)
        block_rope = self.rope(block_embeds, block_positions)
        x = self.residual(block_embeds)
        for layer in self.layers:
            layer_mask = mask[layer.self_attn.attention] if isinstance(mask, dict) else mask
            x = layer.forward_train(x, block_rope, ctx_hidden, ctx_rope, layer_mask, block_size or self.config.block_size)
        return self.final_norm(x)

    def logits(self, hidden: torch.Tensor, lm_head: nn.Module, linear: Linear | None = None) -> torch.Tensor:
        """Draft logits through the drafter's own LM head if it has one, else the target's
        (`lm_head`), with the optional output scalings; `linear` (decoding) runs a plain
        nn.Linear head's matmul."""
        logits = through(self.lm_head if self.lm_head is not None else lm_head, hidden, linear)
        if self.config.output_multiplier is not None:
            logits = logits * self.config.output_multiplier
        if self.config.final_logit_softcapping is not None:
            cap = self.config.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return logits

    def embed(self, tokens: torch.Tensor, embedding: nn.Module) -> torch.Tensor:
        """Block embedding through the drafter's own embedding if it has one, else the target's,
        scaled if the checkpoint says so."""
        embeds = (self.embed_tokens if self.embed_tokens is not None else embedding)(tokens)
        if self.config.input_embedding_scale is not None:
            embeds = embeds * self.config.input_embedding_scale
        return embeds

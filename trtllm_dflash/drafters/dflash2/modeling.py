"""The DFlash V2 drafter (`DFlash2DraftModel`, inco.ai): DFlash V1 plus two cheap modules.

- A grouped dynamic causal convolution before and after each sublayer of every draft layer
  (`attention_conv`, `mlp_conv`): a projection of the sublayer's normed input gives per-position
  coefficients shared by each group of `conv_group_size` channels, added to a learned base
  kernel; taps never cross the block. The residual stream stays in float32.
- A candidate selector head: the top-k tokens of the unary logits at each draft position,
  re-scored left to right with the previous pick through two low-rank codebooks. Its draft
  distribution q is the candidates' softmax, so V2 verifies losslessly under sampling.

Attention, KV injection, `fc` / `hidden_norm` and the caches are V1's (modeling/drafter.py);
tensor names match the published checkpoints (`layers.{i}.attention_conv.kernel_projection.weight`,
`.base_kernel`, `candidate_selector.hidden_projection.weight`, `.predecessor_codebook`,
`.successor_codebook`). The ops' semantics are `trtllm_dflash/ops/reference_dflash2.py`.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from trtllm_dflash import ops
from trtllm_dflash.config import V2_ARCHITECTURE, V2_DEFAULTS, DrafterConfig
from trtllm_dflash.modeling.drafter import DFlashDecoderLayer, DFlashDrafter, stacked_weights
from trtllm_dflash.modeling.fused_ops import norm_of, rms_norm
from trtllm_dflash.modeling.kv_cache import LayerCache
from trtllm_dflash.modeling.packed_linear import Linear
from trtllm_dflash.ops.reference_dflash2 import scatter_draft_probs


class GroupedDynamicConv(nn.Module):
    """One sublayer's pair of convolutions: `pre` on its input, `post` on its output."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.kernel_size, self.groups = config.conv_kernel_size, config.conv_groups
        self.kernel_projection = nn.Linear(config.hidden_size, 2 * self.kernel_size * self.groups, bias=False)
        # identity by default: tap 0 passes x through, later taps and the dynamic part add nothing
        base = torch.zeros(2, self.kernel_size, config.hidden_size)
        base[:, 0] = 1.0
        self.base_kernel = nn.Parameter(base)

    def coefficients(self, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Dynamic coefficients `[.., T, K, G]` of the pre and post convolutions, from `a [.., T, H]`."""
        coef = F.linear(a, self.kernel_projection.weight).view(*a.shape[:-1], 2, self.kernel_size, self.groups)
        return coef[..., 0, :, :], coef[..., 1, :, :]

    def pre(self, a: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return ops.grouped_dynamic_conv(a, delta, self.base_kernel[0])

    def post(self, out: torch.Tensor, delta: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """`residual + conv(out)` in float32."""
        return ops.grouped_dynamic_conv(out, delta, self.base_kernel[1], residual)


class DFlash2DecoderLayer(DFlashDecoderLayer):
    """A V1 decoder layer whose attention and MLP are each wrapped in a grouped dynamic conv."""

    carries_residual = False  # its residual adds are the convs' (float32), not a norm kernel's

    def __init__(self, config: DrafterConfig, layer: int, shared) -> None:
        super().__init__(config, layer, shared)
        self.attention_conv = GroupedDynamicConv(config)
        self.mlp_conv = GroupedDynamicConv(config)

    def step(
        self, x, rope, ctx_hidden, new_counts, cache: LayerCache, cache_lens, slots, history: int = 0, row=None, plan=None, linear=F.linear
    ) -> torch.Tensor:
        """x `[b, B, H]` float32 residual -> float32 residual (one decoding step)."""
        dtype = self.input_layernorm.weight.dtype
        a = rms_norm(x, *norm_of(self.input_layernorm)).to(dtype)
        pre, post = self.attention_conv.coefficients(a)
        attn = self.self_attn.step(
            self.attention_conv.pre(a, pre), rope, ctx_hidden, new_counts, cache, cache_lens, slots, history, row, plan, linear
        )
        x = self.attention_conv.post(attn, post, x)
        return self._mlp_sublayer(x, lambda h: self._mlp_step(h, linear))

    def _mlp_step(self, h: torch.Tensor, linear=F.linear) -> torch.Tensor:
        mlp = self.mlp
        weight, bias = stacked_weights(self._stacked, [mlp.gate_proj, mlp.up_proj])
        gate, up = linear(h, weight, bias).chunk(2, dim=-1)
        return linear(mlp.act_fn(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)

    def _mlp_sublayer(self, x: torch.Tensor, mlp) -> torch.Tensor:
        a = rms_norm(x, *norm_of(self.post_attention_layernorm)).to(self.post_attention_layernorm.weight.dtype)
        pre, post = self.mlp_conv.coefficients(a)
        return self.mlp_conv.post(mlp(self.mlp_conv.pre(a, pre)), post, x)

    def forward_train(self, x, block_rope, ctx_hidden, ctx_rope, mask, block_size: int) -> torch.Tensor:
        """Many blocks of `block_size` laid end to end on the token axis (training)."""
        b, q = x.shape[:2]

        def blocks(t: torch.Tensor) -> torch.Tensor:  # [b, Q, ...] -> [b, Q / B, B, ...]: convs stay inside a block
            return t.view(b, q // block_size, block_size, *t.shape[2:])

        dtype = self.input_layernorm.weight.dtype
        a = self.input_layernorm(x).to(dtype)
        pre, post = self.attention_conv.coefficients(a)
        attn_in = self.attention_conv.pre(blocks(a), blocks(pre)).view_as(a)
        attn = self.self_attn.forward_train(attn_in, block_rope, ctx_hidden, ctx_rope, mask)
        x = self.attention_conv.post(blocks(attn), blocks(post), blocks(x)).view(b, q, -1)
        a = self.post_attention_layernorm(x).to(dtype)
        pre, post = self.mlp_conv.coefficients(a)
        out = self.mlp(self.mlp_conv.pre(blocks(a), blocks(pre)).view_as(a))
        return self.mlp_conv.post(blocks(out), blocks(post), blocks(x)).view(b, q, -1)


class CandidateSelector(nn.Module):
    """The V2 head's weights: `hidden_projection [R, H]`, codebooks `[V, R]`."""

    def __init__(self, config: DrafterConfig, vocab_size: int) -> None:
        super().__init__()
        self.top_k = config.selector_top_k
        self.hidden_projection = nn.Linear(config.hidden_size, config.selector_rank, bias=False)
        self.predecessor_codebook = nn.Parameter(torch.zeros(vocab_size, config.selector_rank))
        self.successor_codebook = nn.Parameter(torch.zeros(vocab_size, config.selector_rank))


class DFlash2Drafter(DFlashDrafter):
    """Weights and forward passes of a DFlash V2 drafter."""

    decoder_layer = DFlash2DecoderLayer

    def __init__(self, config: DrafterConfig, vocab_size: int) -> None:
        super().__init__(config)
        self.candidate_selector = CandidateSelector(config, vocab_size)

    @classmethod
    def from_v1(cls, drafter: DFlashDrafter, vocab_size: int, **sizes: int) -> "DFlash2Drafter":
        """A V2 drafter that drafts exactly what the V1 `drafter` drafts (greedy): its weights, identity
        convolutions and zero codebooks; the starting point of V2 training. `sizes` override the
        published V2 sizes (conv_kernel_size, conv_group_size, selector_rank, selector_top_k)."""
        v2_sizes = {**V2_DEFAULTS, **sizes}
        config = dataclasses.replace(drafter.config, architectures=(V2_ARCHITECTURE,), **v2_sizes)
        v2 = cls(config, vocab_size)
        v2.attach_own_weights(
            drafter.lm_head.weight if drafter.lm_head is not None else None,
            drafter.embed_tokens.weight if drafter.embed_tokens is not None else None,
        )
        v2.load_state_dict(drafter.state_dict(), strict=False)  # every V1 tensor; the V2 ones keep their identity init
        for layer in v2.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                nn.init.zeros_(conv.kernel_projection.weight)
        param = next(drafter.parameters())
        return v2.to(device=param.device, dtype=param.dtype)

    def residual(self, block_embeds: torch.Tensor) -> torch.Tensor:
        """The residual stream in float32 (as published; float64 models keep float64)."""
        return block_embeds.to(torch.promote_types(block_embeds.dtype, torch.float32))

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, *norm_of(self.norm)).to(self.norm.weight.dtype)

    def propose(
        self,
        hidden: torch.Tensor,
        lm_head: nn.Module,
        anchor: torch.Tensor,
        temperature: torch.Tensor,
        seed: torch.Tensor,
        positions: torch.Tensor,
        linear: Linear | None = None,
        all_greedy: bool | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft tokens `[b, B-1]` for block positions 1..B-1 from their final hidden states
        `[b, B-1, H]`, and the draft distribution q `[b, B-1, V]` (None when every row is greedy;
        `all_greedy`: the host knows whether they are, else it is read from `temperature`)."""
        unary = self.logits(hidden, lm_head, linear)
        selector = self.candidate_selector
        z = F.linear(hidden, selector.hidden_projection.weight)
        tokens, cand, cand_probs = ops.candidate_select(
            unary, z, anchor, selector.predecessor_codebook, selector.successor_codebook, temperature, seed, positions, selector.top_k
        )
        if bool((temperature <= 0).all()) if all_greedy is None else all_greedy:
            return tokens, None
        return tokens, scatter_draft_probs(cand, cand_probs, unary.shape[-1])

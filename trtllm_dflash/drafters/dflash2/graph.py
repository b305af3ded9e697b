"""The DFlash V2 drafter as one drafting step: V1's graph with the grouped dynamic convolutions
around each sublayer (float32 residual) and the candidate selector's head.

Heads (graphs.json `head`):
- `HEAD_SCORES` (native, plain ONNX ops; TensorRT-RTX builds it): the graph ends at the
  selector's inputs. Candidates are `torch.topk` of the unary logits (ONNX TopK; ties follow
  TopK's order, which only matters when the k-th and (k+1)-th logits are equal); for each draft
  position the graph scores every candidate i after every candidate j of the position before
  (after the anchor at the first) in float32: `unary[c_i] + <S[c_i], P[c_j] * z_t>`, a
  `[b, B-1, k, k]` table. The left-to-right walk over it, O(B k) per row, runs in the runtime
  (`runtime/selector.py`), with `reference_dflash2.select_step`. The unary logits are an output
  too, so the graph is checked against the torch runtime logit for logit.
- `HEAD_PLUGIN` (plugin variant): the convs and the whole walk are the V2 plugin ops
  (drafters/dflash2/plugin_ops.py); the graph takes temperature and seed and returns draft tokens,
  candidate ids and their q.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trtllm_dflash.drafters.dflash2 import plugin_ops
from trtllm_dflash.graphs.drafter import DrafterGraph
from trtllm_dflash.modeling.fused_ops import norm_of, rms_norm

HEAD_SCORES = "v2_selector_scores"
HEAD_PLUGIN = "v2_selector_plugin"


def native_conv(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """`reference_dflash2.grouped_dynamic_conv` over one block per row with plain ops (pad and
    shift instead of a loop over the dynamic block length), summed in the reference's order."""
    kernel_size, hidden = base.shape
    steps, groups = x.shape[-2], delta.shape[-1]
    dynamic = delta.float().unsqueeze(-1).expand(*delta.shape, hidden // groups).flatten(-2)  # [b, B, K, H]
    coefficients = base.float() + dynamic
    padded = F.pad(x.float(), (0, 0, kernel_size - 1, 0))  # K - 1 zero rows before the anchor
    out = coefficients[..., 0, :] * x.float()
    for k in range(1, kernel_size):
        out = out + coefficients[..., k, :] * padded[:, kernel_size - 1 - k : kernel_size - 1 - k + steps]
    if residual is not None:
        return residual.float() + out
    return out.to(x.dtype)


def selector_scores(unary, z, anchor, predecessor, successor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(candidates `[b, T, k]`, scores `[b, T, k, k]`): the score of candidate i at position t after
    candidate j of position t - 1 (after the anchor at t = 0), in float32."""
    values, cand = torch.topk(unary, min(top_k, unary.shape[-1]), dim=-1)
    previous = torch.cat([anchor.view(-1, 1, 1).expand(-1, 1, cand.shape[-1]), cand[:, :-1]], dim=1)  # [b, T, k]
    u = predecessor[previous].float() * z.float().unsqueeze(2)  # [b, T, k (j), R]
    pair = torch.matmul(u, successor[cand].float().transpose(-1, -2))  # [b, T, j, i]
    return cand, values.float().unsqueeze(2) + pair


class DrafterV2Graph(DrafterGraph):
    """One DFlash V2 drafting step (see the module docstring for the heads)."""

    def conv(self, x, delta, base, residual=None) -> torch.Tensor:
        if self.plugin:
            return plugin_ops.conv(x, delta, base, residual)
        return native_conv(x, delta, base, residual)

    def forward(self, block_ids, ctx_features, new_counts, cache_lens, past_keys: tuple, past_values: tuple, temperature=None, seed=None):
        drafter = self.drafter
        step = self.prepare(block_ids, ctx_features, new_counts, cache_lens, past_keys)
        x = drafter.residual(step.embeds)
        new_keys, new_values = [], []
        for layer, past_k, past_v in zip(drafter.layers, past_keys, past_values):
            dtype = layer.input_layernorm.weight.dtype
            a = rms_norm(x, *norm_of(layer.input_layernorm)).to(dtype)
            pre, post = layer.attention_conv.coefficients(a)
            base = layer.attention_conv.base_kernel
            out, k_ctx, v_ctx = self.attend(layer.self_attn, self.conv(a, pre, base[0]), step, past_k, past_v)
            x = self.conv(out, post, base[1], x)
            a = rms_norm(x, *norm_of(layer.post_attention_layernorm)).to(dtype)
            pre, post = layer.mlp_conv.coefficients(a)
            base = layer.mlp_conv.base_kernel
            x = self.conv(layer.mlp(self.conv(a, pre, base[0])), post, base[1], x)
            new_keys.append(k_ctx)
            new_values.append(v_ctx)
        hidden = drafter.final_norm(x)[:, 1:]
        unary = drafter.logits(hidden, self.lm_head)
        selector = drafter.candidate_selector
        z = F.linear(hidden, selector.hidden_projection.weight)
        anchor = block_ids[:, 0]
        codebooks = (selector.predecessor_codebook, selector.successor_codebook)
        if self.plugin:
            steps = torch.arange(1, hidden.shape[1] + 1, device=block_ids.device)
            positions = (cache_lens + new_counts).view(-1, 1) + steps
            head = plugin_ops.select(unary, z, anchor, *codebooks, temperature, seed, positions, selector.top_k)
        else:
            head = (unary, *selector_scores(unary, z, anchor, *codebooks, selector.top_k))
        return (*head, tuple(new_keys), tuple(new_values))

"""MoE experts as dense batched matmuls for the duration of an export (see `dense_experts_forward`)."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from trtllm_dflash import hf_compat

DENSE_EXPERTS = "dflash_dense"


def dense_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """MoE experts as plain batched matmuls over ALL experts, weighted by a dense routing matrix.

    For export only (a transformers experts implementation, see `exportable_experts`): every token
    goes through every expert and unselected experts get weight 0, so the result is the routed
    sum; the graph is MatMul/Equal/ReduceSum with the weights kept as `[experts, ...]` tensors,
    no data-dependent shapes and no per-token weight copies.
    """
    experts = torch.arange(self.num_experts, device=hidden_states.device)
    routing = ((top_k_index.unsqueeze(-1) == experts).to(hidden_states.dtype) * top_k_weights.unsqueeze(-1).to(hidden_states.dtype)).sum(1)

    def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        # x [E or 1, T, in]; weight [E, in, out] (transposed layout) or [E, out, in]
        out = torch.matmul(x, weight if self.is_transposed else weight.transpose(1, 2))
        return out + bias.unsqueeze(1) if bias is not None else out

    x = hidden_states.unsqueeze(0)  # [1, T, H], broadcast over the experts
    if self.has_gate:
        projected = self._apply_gate(linear(x, self.gate_up_proj, self.gate_up_proj_bias if self.has_bias else None))
    else:
        projected = self.act_fn(linear(x, self.up_proj, self.up_proj_bias if self.has_bias else None))
    out = linear(projected, self.down_proj, self.down_proj_bias if self.has_bias else None)  # [E, T, H]
    if self.has_post_expert_norm:
        out = self.post_expert_norm(out)
    return (out * routing.transpose(0, 1).unsqueeze(-1)).sum(0).to(hidden_states.dtype)


def exportable_experts(model: nn.Module) -> str | None:
    """Switch MoE experts to `dense_experts_forward`; returns the implementation to restore (None: no experts).

    transformers' default `grouped_mm` experts are a custom op without an ONNX translation, its
    eager path loops over the experts a batch hits (data-dependent control flow), and its
    `batched_mm` path copies each token's top-k expert weights (gigabytes per step at gpt-oss
    sizes). Dense experts compute num_experts / top_k times the routed FLOPs but read each expert
    weight once per call, which is what a decode step of a batch of blocks needs anyway.
    """
    if not hf_compat.can_set_experts(model):
        return None
    hf_compat.register_experts(DENSE_EXPERTS, dense_experts_forward)
    previous = hf_compat.experts_implementation(model)
    model.set_experts_implementation(DENSE_EXPERTS)
    return previous


@contextlib.contextmanager
def dense_experts(model: nn.Module):
    """MoE experts as `dense_experts_forward` for the duration of an export, restored afterwards."""
    previous = exportable_experts(model)
    try:
        yield
    finally:
        if previous is not None:
            model.set_experts_implementation(previous)

"""Small ops of the fused decoding passes, written so that each is the same arithmetic as
transformers' modules (RMSNorm, rotate-half RoPE) in as few calls as possible."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trtllm_dflash.ops.kernels import dependent_launch, tiles


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm, op for op (float32 statistics, weight applied in the input dtype)."""
    if x.dtype == torch.float32:  # the same ops without the casts, in one call (F.rms_norm's are bit for bit these)
        if weight.shape == x.shape[-1:]:
            return F.rms_norm(x, weight.shape, weight, eps)
        return weight * F.rms_norm(x, x.shape[-1:], None, eps)  # a weight per head: `[heads, D]`
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def norm_of(module: nn.Module) -> tuple[torch.Tensor, float]:
    """(weight, eps) of an RMSNorm module."""
    return module.weight, module.variance_epsilon


# rotary embeddings whose cos/sin depend on the position alone (not on the sequence length seen)
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class RopeTable:
    """cos/sin `[length, D]` of positions 0 .. length-1, computed once by a model's rotary embedding.

    Why: a pass computing its cos/sin launches about nine small kernels (the position cast, the
    frequencies, cat, cos, sin, the scaling, the casts); gathering its rows from this table takes
    three (a clamp and two gathers). The values are the rotary embedding's own, element for element:
    its arithmetic is per position (on a CPU torch's vectorised cos may differ from its scalar
    tail by a rounding step, so the CPU's op-by-op path keeps computing them)."""

    def __init__(self, rotary_emb: nn.Module, length: int, dtype: torch.dtype, device: torch.device) -> None:
        like = torch.empty(0, dtype=dtype, device=device)  # the embedding reads only its dtype and device
        cos, sin = rotary_emb(like, torch.arange(length, device=device).view(1, -1))
        self.cos, self.sin, self.length = cos[0].contiguous(), sin[0].contiguous(), length

    @classmethod
    def of(cls, rotary_emb: nn.Module, length: int, dtype: torch.dtype, device: torch.device) -> "RopeTable | None":
        """The table, or None where the embedding's values depend on more than the position (dynamic
        NTK, LongRoPE) or per layer type."""
        if getattr(rotary_emb, "rope_type", None) not in STATIC_ROPE_TYPES:
            return None
        return cls(rotary_emb, length, dtype, device)

    def rows(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin `[*positions.shape, D]`. Positions past the table (none a pass reads: a padding
        row's, at most) take its last row instead of reading out of bounds."""
        index = positions.clamp(0, self.length - 1)
        return F.embedding(index, self.cos), F.embedding(index, self.sin)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on `[b, T, heads, D]` with cos/sin `[b, T, 1, D]` (transformers' rotate_half form)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


# ------------------------------------------------------------------ the fused GPU pass's three kernels
# Each runs its Triton kernel (ops/kernels/fused_layer.py) where the kernels run (CUDA, or Triton's
# interpreter on request) and the same arithmetic op by op otherwise; the kernels round once per
# element where transformers rounds after each op, so the two agree to a rounding step.


def _kernels(device: torch.device):
    """The fused-layer kernel module where the kernels run on `device`, else None."""
    from trtllm_dflash.ops import custom_ops, kernels

    return kernels.for_tensor_device("fused_layer", device) if custom_ops.kernels_enabled(device) else None


def kernels_run(device: torch.device) -> bool:
    """Whether the three ops below run their kernels on `device` (callers keep their own op-by-op
    code elsewhere, so the CPU's arithmetic does not change)."""
    return _kernels(device) is not None


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, rms_norm(x + delta)) over the last dim, in one pass where the kernel runs."""
    module = _kernels(x.device)
    if module is None:
        total = x if delta is None else x + delta
        return total, rms_norm(total, weight, eps)
    hidden = x.shape[-1]
    x = x.contiguous()
    total = torch.empty_like(x) if delta is not None else x
    normed = torch.empty_like(x)
    rows = x.numel() // hidden
    block, warps = tiles.norm_tile(hidden)
    module.add_rms_norm_kernel[(rows,)](
        x,
        delta.contiguous() if delta is not None else x,
        weight,
        float(eps),
        hidden,
        total,
        normed,
        HAS_DELTA=delta is not None,
        BLOCK_H=block,
        num_warps=warps,
        **dependent_launch.launch_args(x.device),
    )
    return total, normed


def qk_norm_rope(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    norm: tuple[torch.Tensor, float] | None,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q `[b, T, q_heads, D]`, k and v `[b, T, kv_heads, D]` (contiguous) from the fused projection
    `qkv [b, T, (q_heads + 2 kv_heads) D]`: per-head RMSNorm of q and k with `norm` (a `[q_heads +
    kv_heads, D]` weight and eps, None for none), then rotate-half RoPE with cos/sin `[b, T, D]`."""
    batch, count = qkv.shape[:2]
    module = _kernels(qkv.device) if head_dim & (head_dim - 1) == 0 else None  # tl.arange needs a power of two
    if module is None:
        heads = qkv.view(batch, count, -1, head_dim)
        qk, v = heads[:, :, : q_heads + kv_heads], heads[:, :, q_heads + kv_heads :]
        if norm is not None:
            qk = rms_norm(qk, *norm)
        q, k = rotate(qk, cos.unsqueeze(2), sin.unsqueeze(2)).split([q_heads, kv_heads], dim=2)
        return q.contiguous(), k.contiguous(), v.contiguous()
    q = qkv.new_empty(batch, count, q_heads, head_dim)
    k = qkv.new_empty(batch, count, kv_heads, head_dim)
    v = qkv.new_empty(batch, count, kv_heads, head_dim)
    if batch * count == 0:
        return q, k, v
    weight, eps = norm if norm is not None else (qkv, 0.0)  # any pointer where there is no norm
    cos, sin = _rope_rows(cos), _rope_rows(sin)
    if cos.stride(0) != sin.stride(0):  # the kernel takes one batch stride for both
        cos, sin = cos.contiguous(), sin.contiguous()
    module.qk_norm_rope_kernel[(batch * count, q_heads + 2 * kv_heads)](
        qkv.contiguous(),
        cos,
        sin,
        weight,
        float(eps),
        q_heads,
        kv_heads,
        count,
        cos.stride(0),
        q,
        k,
        v,
        HAS_NORM=norm is not None,
        HEAD_DIM=head_dim,
        num_warps=tiles.QK_NORM_ROPE_WARPS,
        **dependent_launch.launch_args(qkv.device),
    )
    return q, k, v


def _rope_rows(table: torch.Tensor) -> torch.Tensor:
    """cos or sin `[b, T, D]` as the kernel reads it: each token's D values contiguous and a batch
    row's tokens one after the other, batch rows any stride apart. A slice over the tokens of a
    contiguous `[b, n + B, D]` (the drafter's context and block parts) already is: no copy."""
    if table.stride(-1) == 1 and (table.shape[1] <= 1 or table.stride(1) == table.shape[-1]):
        return table
    return table.contiguous()


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up from the fused gate/up projection `[..., 2F]` (gate first)."""
    module = _kernels(gate_up.device)
    gate, up = gate_up.chunk(2, dim=-1)
    if module is None:
        return torch.nn.functional.silu(gate) * up
    width = gate.shape[-1]
    out = gate_up.new_empty(*gate_up.shape[:-1], width)
    tokens = out.numel() // width
    block = tiles.silu_block(width)
    module.silu_mul_kernel[(tokens, -(-width // block))](
        gate_up.contiguous(), width, out, BLOCK_F=block, num_warps=tiles.SILU_WARPS, **dependent_launch.launch_args(gate_up.device)
    )
    return out


def silu_mul_linear(gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, linear=F.linear) -> torch.Tensor:
    """`linear(silu_mul(gate_up), weight, bias)`: the MLP's down projection. Where `linear` has a
    `gated` form (runtime/linear_choice.py's LinearChoices) that takes this call, the activation is
    formed inside the projection's kernel (its bits are `silu_mul`'s) and not launched on its own."""
    gated = getattr(linear, "gated", None)
    out = gated(gate_up, weight, bias) if gated is not None else None
    return out if out is not None else linear(silu_mul(gate_up), weight, bias)

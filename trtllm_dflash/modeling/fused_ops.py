"""Small ops of the fused decoding passes, written so that each is the same arithmetic as
transformers' modules (RMSNorm, rotate-half RoPE) in as few calls as possible."""

from __future__ import annotations

import torch
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm, op for op (float32 statistics, weight applied in the input dtype)."""
    if x.dtype == torch.float32:  # the same ops without the casts, which would be no-op calls
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def norm_of(module: nn.Module) -> tuple[torch.Tensor, float]:
    """(weight, eps) of an RMSNorm module."""
    return module.weight, module.variance_epsilon


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on `[b, T, heads, D]` with cos/sin `[b, T, 1, D]` (transformers' rotate_half form)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

"""The one place the V2 drafter graph calls the DFlash V2 plugin ops (`torch.ops.dflash`).

Export traces these calls into the plugin nodes (`grouped_dynamic_conv`, `candidate_select`);
their semantics are `trtllm_dflash/ops/reference_dflash2.py`. Importing this module registers them (with
the other `dflash::` ops); `missing()` names any that are still absent, and the plugin variant then
refuses V2 drafters in one line.
"""

from __future__ import annotations

import torch

from trtllm_dflash.ops import custom_ops  # noqa: F401  (registers torch.ops.dflash.*

OPS = ("grouped_dynamic_conv", "candidate_select")


def missing() -> str | None:
    """None when both V2 ops are registered with torch, else what is missing."""
    absent = [name for name in OPS if not hasattr(torch.ops.dflash, name)]
    return f"V2 plugin nodes not registered (torch.ops.dflash.{', '.join(absent)})" if absent else None


def conv(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """The grouped dynamic conv of `x [b, B, H]` (`residual + conv` in float32 with a residual)."""
    return torch.ops.dflash.grouped_dynamic_conv(x, delta, base, residual)


def select(unary, z, anchor, predecessor, successor, temperature, seed, positions, top_k: int):
    """The selector's walk: (tokens `[b, T]`, candidate ids `[b, T, k]`, candidate q `[b, T, k]`)."""
    return torch.ops.dflash.candidate_select(unary, z, anchor, predecessor, successor, temperature, seed, positions, top_k)

"""Linear layers through oneDNN, each weight reordered once into oneDNN's blocked layout (CPU).

torch's CPU `F.linear` hands the weight as stored to MKL's sgemm on every call. oneDNN's
inner-product primitive on a weight packed once runs a decoding step's shapes (8 to 600 rows,
hidden 128) 1.5-2.8x faster on this project's CPU machine (benchmarks/RESULTS.md, issue 38);
vLLM's CPU backend packs its weights for oneDNN the same way.

What to know about it:
- Each call costs ~12 us more than F.linear's, so small calls (under MIN_MACS multiply-adds: a
  one-token step's projections) stay on F.linear.
- A row's result does not depend on how many rows share a packed call (checked for 1 to 600
  rows); F.linear's does (1 to 3 rows take another kernel). Across the MIN_MACS line a row's
  bits change, as they do across F.linear's: equal up to float32 rounding.
- It is not bit-identical to `F.linear` where the reduction is longer than one oneDNN block (the
  MLP's down projection, say): a pass through packed linears matches transformers' forward
  within float32 rounding, not bit for bit (the torch runtime's probe checks it per pass).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

# what runs a projection: F.linear's signature (x, weight, bias)
Linear = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]

# the reorder takes the expected row count as a hint; the layout it picks gives the same bits at
# any row count (see the module docstring)
ROWS_HINT = 64
# a oneDNN call costs ~12 us more than F.linear's on this machine whatever its size, so calls of
# fewer multiply-adds (rows x in_features x out_features) than this stay on F.linear: there the
# overhead outweighs the faster kernel. Measured on the demo pair's projections (128 -> 128, 256,
# 768 and 4,096; 384 -> 128) at 1-64 rows: F.linear is faster up to ~520k, oneDNN from ~790k
# (a 48-row down projection: 46 us against 29). Counting outputs alone (8,192, the first version)
# kept 384-wide reductions of 16-63 rows on the slower path.
MIN_MACS = 650_000
# oneDNN builds a primitive the first time it sees a row count: ~1 ms per projection on this
# machine, against ~0.4 ms to run it (512 rows, 128 -> 768). Decoding steps reuse a few row counts,
# but a prefill shorter than a chunk has its prompt's length, often new. Row counts above
# EXACT_ROWS are padded up to a bucket (`bucket_rows`: 4 per doubling, at most 25% more rows), so
# a few dozen primitives serve every length and stay in oneDNN's cache: a layer's 4 projections at
# 100 new lengths of 60-600 rows took 1.6 ms each, against 2.5 ms; single prompts of 20-500 tokens
# got their first token 7% sooner in-process (median 16.7 vs 17.8 ms, 10.1 vs 10.9 ms). A row's
# bits do not depend on the rows beside it in a packed call, so padding changes none.
EXACT_ROWS = 64


def through(module: nn.Module, x: torch.Tensor, linear: Linear | None) -> torch.Tensor:
    """`module(x)`, with a plain nn.Linear's matmul run by `linear` where one is given (an LM head
    on packed linears); any other module, or no `linear`, runs as it is."""
    if linear is not None and type(module) is nn.Linear:
        return linear(x, module.weight, module.bias)
    return module(x)


def unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why packed linears cannot run here (None: they can): CPU, float32, a torch with oneDNN."""
    if device.type != "cpu":
        return f"packed linears are a CPU path; the model is on {device.type}"
    if dtype != torch.float32:
        return f"packed linears run float32 only; the model is {dtype}"
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return "this torch build has no oneDNN (mkldnn) linear ops"
    return None


class PackedLinears:
    """`F.linear` with each weight packed on its first call and the packed copy kept.

    Inference only: the packed copy is of the weight as it was then, so weights must not change
    while it is in use (the torch runtime's weights are frozen). A weight is found by the memory it
    views (address, shape, strides), so a fresh view of the same rows each call (`weight[a:b]`)
    finds its packed copy; the entry keeps that memory alive, so no other tensor can take it."""

    def __init__(self) -> None:
        self._packed: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if x.numel() * weight.shape[0] < MIN_MACS:
            return F.linear(x, weight, bias)
        key = (weight.data_ptr(), tuple(weight.shape), weight.stride(), weight.dtype)
        entry = self._packed.get(key)
        if entry is None:
            with torch.inference_mode(False):  # outlives any inference-mode caller
                packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), ROWS_HINT)
            entry = self._packed[key] = (weight, packed)
        rows = x.numel() // x.shape[-1]
        padded = bucket_rows(rows)
        if padded == rows:
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), entry[1], bias, "none", [], "")
        x_padded = x.new_zeros(padded, x.shape[-1])
        x_padded[:rows] = x.reshape(rows, x.shape[-1])
        out = torch.ops.mkldnn._linear_pointwise(x_padded, entry[1], bias, "none", [], "")
        return out[:rows].view(*x.shape[:-1], out.shape[-1])

    def __len__(self) -> int:
        return len(self._packed)


def bucket_rows(rows: int) -> int:
    """The row count a packed call runs with: `rows` up to EXACT_ROWS, else rounded up to the next
    of 4 evenly spaced counts per doubling (65 -> 80, 513 -> 640, 1000 -> 1024)."""
    if rows <= EXACT_ROWS:
        return rows
    step = 1 << (rows.bit_length() - 3)
    return -(-rows // step) * step

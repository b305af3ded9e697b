"""Host side of the skinny projection kernels (`skinny_linear.py`): tiles, K splits, launches.

`skinny_linear(x, weight, bias)` computes `F.linear` for an x of at most MAX_ROWS rows (a decode
pass's tokens) by streaming the weight once: enough programs to cover the SMs twice (output
column tiles x K splits), each K split at least MIN_K_STEPS tiles long so a program keeps loads in
flight, the splits summed in order by each tile's last split, in the same launch.

The tiles' counters are the device's `tile_counters` (zero between launches; launches that use
them run on one stream, and the first is not captured: see tile_counters.py).
"""

from __future__ import annotations

import torch

from trtllm_dflash.ops import kernels
from trtllm_dflash.ops.kernels import tile_counters
from trtllm_dflash.ops.kernels.launch import _launch_options
from trtllm_dflash.ops.kernels.tiles import cdiv

SKINNY_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_ROWS = 64  # past this a projection is a GEMM with reuse, cuBLAS's ground
BLOCK_N, BLOCK_K = 64, 128
# the gated form holds gate, up and their product per x tile: at BLOCK_K 128 it spills on sm_90a
# (255 registers at every row tile, tests/test_kernel_audit.py), at 64 it does not
GATED_BLOCK_K = 64
MIN_K_STEPS = 4  # BLOCK_K tiles per K split at least
NUM_WARPS, NUM_STAGES = 4, 4


def unsupported_reason(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, gated: bool = False) -> str | None:
    """Why the skinny kernels do not cover `F.linear(x, weight, bias)` (with `gated`: of
    `silu(gate) * up` from x = `[..., 2K]` gate then up) (None: they do)."""
    rows = x.numel() // max(x.shape[-1], 1)
    if x.dtype not in SKINNY_DTYPES or weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        return f"runs float16/bfloat16/float32 with one dtype, not {x.dtype} x {weight.dtype}"
    if weight.dim() != 2 or x.shape[-1] != weight.shape[1] * (2 if gated else 1) or not weight.is_contiguous():
        return f"needs a contiguous [N, K] weight whose K is {'half of ' if gated else ''}x's last dim"
    if not 1 <= rows <= MAX_ROWS:
        return f"covers 1 to {MAX_ROWS} rows, not {rows}"
    return None


def block_m(rows: int) -> int:
    """Rows per program: one tile of 16 (tl.dot's least) up to 64."""
    return 16 if rows <= 16 else 32 if rows <= 32 else 64


def k_splits(rows: int, n: int, k: int, sms: int) -> int:
    """K splits so that column tiles x splits fill `sms` SMs twice over, each split at least
    MIN_K_STEPS tiles of BLOCK_K."""
    programs = cdiv(n, BLOCK_N) * cdiv(rows, block_m(rows))
    wanted = cdiv(2 * sms, programs)
    return max(1, min(wanted, k // (MIN_K_STEPS * BLOCK_K)))


def split_candidates(rows: int, n: int, k: int, sms: int) -> list[int]:
    """K split counts worth timing: `k_splits`' and its halves and doubles, and none (1), within
    one BLOCK_K tile per split at least."""
    natural = k_splits(rows, n, k, sms)
    return sorted({s for s in (1, max(1, natural // 2), natural, 2 * natural) if s <= max(1, k // BLOCK_K)})


def skinny_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, splits: int | None = None, gated: bool = False
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` by the skinny kernels (check `unsupported_reason` first); `splits`
    overrides the K split count (default: `k_splits` for this device, 1 off CUDA). `gated`: x is a
    fused gate/up projection `[..., 2K]` and the product is that of `silu(gate) * up`, formed in
    the kernel (`fused_ops.silu_mul`'s bits)."""
    n, k = weight.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    rows = x2.shape[0]
    out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    if splits is None:
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.device.type == "cuda" else 0
        splits = k_splits(rows, n, k, sms) if sms else 1
    block_k = GATED_BLOCK_K if gated else BLOCK_K
    per_split = cdiv(cdiv(k, splits), block_k) * block_k
    splits = cdiv(k, per_split)
    tile_m = block_m(rows)
    grid = (cdiv(n, BLOCK_N), splits, cdiv(rows, tile_m))
    if grid[0] * grid[2] > tile_counters.MAX_TILES:
        splits, per_split, grid = 1, k, (grid[0], 1, grid[2])
    split = splits > 1
    partials = torch.empty(splits, rows, n, dtype=torch.float32, device=x.device) if split else out
    counters = tile_counters.tile_counters(x.device) if split else out
    has_bias = bias is not None
    kernels.for_tensor_device("skinny_linear", x.device).skinny_linear_kernel[grid](
        x2,
        weight,
        bias if has_bias else out,
        partials,
        counters,
        out,
        rows,
        n,
        k,
        per_split,
        splits,
        HAS_BIAS=has_bias,
        SPLIT=split,
        BLOCK_M=tile_m,
        BLOCK_N=BLOCK_N,
        BLOCK_K=block_k,
        IEEE=x.dtype == torch.float32,
        GATED=gated,
        **_launch_options(x.device, NUM_WARPS, NUM_STAGES),
    )
    return out.view(*lead, n)

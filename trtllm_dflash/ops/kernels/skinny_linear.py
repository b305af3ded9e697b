"""Triton kernels for `x @ weight.T (+ bias)` when x has few rows (a decode pass's projections).

Why: at batch 1 a verify pass multiplies 16 rows, an AR pass 1, by each weight matrix, so a
projection is a stream of its weight through the SMs and its time is the weight's bytes over the
bandwidth the kernel reaches. cuBLAS picks its kernels for general shapes; whether it streams a
skinny product at the bandwidth a dedicated kernel can reach is a question only a GPU answers, so
this one is a candidate that the runtime times against cuBLAS per shape (runtime/linear_choice.py)
and keeps only where it wins.

- `skinny_linear_kernel`: one program per (BLOCK_N output columns, K split, BLOCK_M rows). Each
  streams its columns' weight rows along K in BLOCK_K steps (contiguous, 16-byte loads) and
  accumulates `x @ w.T` in float32 with `tl.dot`; rows past M are masked. With one K split it adds
  the bias and stores in the output's dtype. With several it stores a float32 partial, then
  counts itself in on its tile's counter; the tile's last split to arrive sums the partials in
  split order (the same bits on every run, unlike atomics on the output), adds the bias, stores
  the output and sets the counter back to zero. One launch per projection: a second launch to sum
  the splits cost a kernel of a few microseconds per projection, three per layer of a decode pass.

  Memory order: last_split.py's (the count after a block barrier, the partials read through L2).

  GATED: x is the fused gate/up projection `[M, 2K]` and the product is `silu(gate) * up` times
  w.T, the activation formed as each x tile is loaded, rounded as `fused_layer.silu_mul_kernel`
  rounds it (the same bits): the MLP's down projection without the activation's own launch. Its
  K tiles are narrower (skinny_launch.GATED_BLOCK_K), so its sums differ from the plain launch's
  in float32 accumulation order only.

Semantics: `torch.nn.functional.linear` up to float32 accumulation order (the tests' tolerance).
"""

import triton
import triton.language as tl

from trtllm_dflash.ops import kernels

is_last_split = kernels.load("last_split", interpret=triton.knobs.runtime.interpret).is_last_split
_grid_dependency = kernels.load("grid_dependency", interpret=triton.knobs.runtime.interpret)
wait_for_inputs, prefetch_to_l2 = _grid_dependency.wait_for_inputs, _grid_dependency.prefetch_to_l2


@triton.jit
def skinny_linear_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    partial_ptr,
    counter_ptr,
    out_ptr,
    M,
    N,
    K,
    k_per_split,
    splits,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    IEEE: tl.constexpr,
    GATED: tl.constexpr,
    PDL: tl.constexpr = False,
    PREFETCH_STEPS: tl.constexpr = 4,
):
    """x `[M, K]` (`[M, 2K]` when GATED), w `[N, K]` (row-major, as nn.Linear keeps it); out `[M, N]`.
    When SPLIT: float32 partials `[splits, M, N]` and one int32 counter per (column tile, row tile),
    zero on entry and left zero. PDL: launched as a dependent launch (grid_dependency.py), the
    first PREFETCH_STEPS tiles of the program's weight slice asked into L2 before the wait."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    pid_m = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    k_lo = split * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    if PDL:  # one address per 128-byte line of each weight row's first tiles, kept inside the weight
        weight_rows = w_ptr + tl.minimum(cols, N - 1).to(tl.int64)[:, None] * K
        for k0 in range(k_lo, tl.minimum(k_lo + PREFETCH_STEPS * BLOCK_K, k_hi), BLOCK_K):
            lines = tl.minimum(k0 + tl.arange(0, BLOCK_K // 64) * 64, K - 1)
            prefetch_to_l2(weight_rows + lines[None, :], PDL)
    wait_for_inputs(PDL)
    acc = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)  # (tl.zeros is a jitted helper the interpreted form cannot call)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < k_hi
        x_mask = row_ok[:, None] & k_ok[None, :]
        if GATED:  # silu(gate) * up, rounded as silu_mul_kernel rounds it
            x_row = x_ptr + rows.to(tl.int64)[:, None] * (2 * K) + ks[None, :]
            gate = tl.load(x_row, mask=x_mask, other=0.0).to(tl.float32)
            up = tl.load(x_row + K, mask=x_mask, other=0.0).to(tl.float32)
            activated = (gate / (1.0 + tl.exp(-gate))).to(w_ptr.dtype.element_ty).to(tl.float32)
            x = (activated * up).to(w_ptr.dtype.element_ty)
        else:
            x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * K + ks[None, :], mask=x_mask, other=0.0)
        w = tl.load(w_ptr + cols.to(tl.int64)[:, None] * K + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    mask = row_ok[:, None] & col_ok[None, :]
    finish = True
    if SPLIT:
        tl.store(partial_ptr + (split * M + rows.to(tl.int64))[:, None] * N + cols[None, :], acc, mask=mask)
        tile = pid_m * tl.num_programs(0) + pid_n
        finish = is_last_split(counter_ptr, tile, splits)
        if finish:  # the tile's last split: every partial is in, sum them in split order
            acc = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
            for s in range(0, splits):
                offsets = (s * M + rows.to(tl.int64))[:, None] * N + cols[None, :]
                acc += tl.load(partial_ptr + offsets, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(counter_ptr + tile, 0)  # zero again for the next launch
    if finish:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        offsets = rows.to(tl.int64)[:, None] * N + cols[None, :]
        tl.store(out_ptr + offsets, acc.to(out_ptr.dtype.element_ty), mask=mask)

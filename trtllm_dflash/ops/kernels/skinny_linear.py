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
  the bias and stores in the output's dtype; with several it stores float32 partials.
- `skinny_reduce_kernel`: sums the splits' partials in split order (the same bits on every run,
  unlike atomics) and adds the bias.

Semantics: `torch.nn.functional.linear` up to float32 accumulation order (the tests' tolerance).
"""

import triton
import triton.language as tl


@triton.jit
def skinny_linear_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    k_per_split,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    IEEE: tl.constexpr,
):
    """x `[M, K]`, w `[N, K]` (row-major, as nn.Linear keeps it); out `[M, N]`, or float32 partials
    `[splits, M, N]` when SPLIT."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    pid_m = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    k_lo = split * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    acc = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)  # (tl.zeros is a jitted helper the interpreted form cannot call)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < k_hi
        x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * K + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + cols.to(tl.int64)[:, None] * K + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    mask = row_ok[:, None] & col_ok[None, :]
    if SPLIT:
        offsets = (split * M + rows.to(tl.int64))[:, None] * N + cols[None, :]
        tl.store(out_ptr + offsets, acc, mask=mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        offsets = rows.to(tl.int64)[:, None] * N + cols[None, :]
        tl.store(out_ptr + offsets, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def skinny_reduce_kernel(
    partial_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    splits,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """out `[M, N]` = the sum over `splits` of partials `[splits, M, N]` (+ bias), in split order."""
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    ok = offsets < M * N
    total = tl.full([BLOCK], 0.0, tl.float32)
    for s in range(0, splits):
        total += tl.load(partial_ptr + s * M * N + offsets, mask=ok, other=0.0)
    if HAS_BIAS:
        total += tl.load(bias_ptr + offsets % N, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + offsets, total.to(out_ptr.dtype.element_ty), mask=ok)

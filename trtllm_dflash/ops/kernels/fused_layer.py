"""Triton kernels of the fused target pass on a GPU (modeling/fused_target.py, issue 39).

Why: under a CUDA graph a Qwen3 layer run by transformers is ~47 kernels, most of them a few
microseconds of elementwise work (RMSNorm alone is 7 ops, RoPE 5). Between GEMMs a layer needs
only three of these, each one pass over its tensor:
- `add_rms_norm_kernel`, one program per token: the residual add (rounded to the stream's dtype,
  as torch's add is) and the RMSNorm of the sum (float32 statistics, the normed value rounded
  before the weight is applied, as transformers' RMSNorm does);
- `qk_norm_rope_kernel`, one program per (token, head) of the fused q/k/v projection: the
  per-head q/k RMSNorm (Qwen3; off for Llama-like layers), rotate-half RoPE with the pass's
  cos/sin (rows of D contiguous values, batch rows `rope_batch_stride` apart: the drafter passes
  the context's and the block's parts of one cos/sin without copying them), and q, k and v
  written as three contiguous tensors for the attention op;
- `silu_mul_kernel`, one program per (token, chunk of the FFN width): silu(gate) * up from the
  fused gate/up projection.

The semantics are `trtllm_dflash.modeling.fused_ops` (the torch reference these are tested
against); the kernels compute each in float32 and round once, so they differ from transformers'
op-by-op bf16 roundings by at most a rounding step per element (the tolerance the runtime's probe
and the tests state).
"""

import triton
import triton.language as tl

from trtllm_dflash.ops import kernels

wait_for_inputs = kernels.load("grid_dependency", interpret=triton.knobs.runtime.interpret).wait_for_inputs

# the builtin reduction with Triton's combine function (tl.sum is a jitted helper, which the
# interpreted form of this file cannot call; see attention.py)
SUM = tl.standard._sum_combine


@triton.jit
def add_rms_norm_kernel(
    x_ptr,
    delta_ptr,
    weight_ptr,
    eps,
    hidden,
    sum_ptr,
    norm_ptr,
    HAS_DELTA: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PDL: tl.constexpr = False,
):
    wait_for_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_H)
    mask = offs < hidden
    x = tl.load(x_ptr + row * hidden + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_DELTA:
        delta = tl.load(delta_ptr + row * hidden + offs, mask=mask, other=0.0).to(tl.float32)
        total = (x + delta).to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * hidden + offs, total, mask=mask)
        x = total.to(tl.float32)
    variance = tl.reduce(x * x, 0, SUM) / hidden
    normed = (x * (1.0 / tl.sqrt(variance + eps))).to(norm_ptr.dtype.element_ty).to(tl.float32)
    weight = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(norm_ptr + row * hidden + offs, (weight * normed).to(norm_ptr.dtype.element_ty), mask=mask)


@triton.jit
def qk_norm_rope_kernel(
    qkv_ptr,
    cos_ptr,
    sin_ptr,
    norm_weight_ptr,
    eps,
    q_heads,
    kv_heads,
    count,
    rope_batch_stride,
    q_ptr,
    k_ptr,
    v_ptr,
    HAS_NORM: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PDL: tl.constexpr = False,
):
    wait_for_inputs(PDL)
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    heads = q_heads + 2 * kv_heads
    offs = tl.arange(0, HEAD_DIM)
    half: tl.constexpr = HEAD_DIM // 2
    partner = (offs + half) % HEAD_DIM  # rotate_half reads the other half, negated for the first
    source = qkv_ptr + token * heads * HEAD_DIM + head * HEAD_DIM
    if head >= q_heads + kv_heads:  # a value head: copied out contiguous
        v = tl.load(source + offs)
        tl.store(v_ptr + (token * kv_heads + head - q_heads - kv_heads) * HEAD_DIM + offs, v)
    else:
        x = tl.load(source + offs).to(tl.float32)
        x_partner = tl.load(source + partner).to(tl.float32)
        if HAS_NORM:
            weight_ptr = norm_weight_ptr + head * HEAD_DIM  # [q_heads + kv_heads, HEAD_DIM]: q's norm, then k's
            rstd = 1.0 / tl.sqrt(tl.reduce(x * x, 0, SUM) / HEAD_DIM + eps)
            x = tl.load(weight_ptr + offs).to(tl.float32) * (x * rstd).to(qkv_ptr.dtype.element_ty).to(tl.float32)
            x_partner = tl.load(weight_ptr + partner).to(tl.float32) * (x_partner * rstd).to(qkv_ptr.dtype.element_ty).to(tl.float32)
            x = x.to(qkv_ptr.dtype.element_ty).to(tl.float32)
            x_partner = x_partner.to(qkv_ptr.dtype.element_ty).to(tl.float32)
        rope_row = (token // count) * rope_batch_stride + (token % count) * HEAD_DIM  # cos/sin may be a slice of a longer pass's
        cos = tl.load(cos_ptr + rope_row + offs).to(tl.float32)
        sin = tl.load(sin_ptr + rope_row + offs).to(tl.float32)
        rotated = tl.where(offs < half, -x_partner, x_partner)
        out = x * cos + rotated * sin
        if head < q_heads:
            tl.store(q_ptr + (token * q_heads + head) * HEAD_DIM + offs, out.to(q_ptr.dtype.element_ty))
        else:
            tl.store(k_ptr + (token * kv_heads + head - q_heads) * HEAD_DIM + offs, out.to(k_ptr.dtype.element_ty))


@triton.jit
def silu_mul_kernel(gate_up_ptr, width, out_ptr, BLOCK_F: tl.constexpr, PDL: tl.constexpr = False):
    wait_for_inputs(PDL)
    token = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    mask = offs < width
    gate = tl.load(gate_up_ptr + token * 2 * width + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + token * 2 * width + width + offs, mask=mask, other=0.0).to(tl.float32)
    activated = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + token * width + offs, (activated * up).to(out_ptr.dtype.element_ty), mask=mask)

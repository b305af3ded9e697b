"""Triton kernels that merge split attention: the per-split partial outputs of one KV head's
query rows combined by their log-sum-exp (semantics `reference_attention.merge_partials`).

- `merge_kernel`, a launch of its own after a split kernel of attention.py: the TensorRT
  plugins' DFlashAttentionMerge node. One program per (query tile, KV head, row).
- `block_attention_merged_kernel` and `target_attention_merged_kernel`: attention.py's split
  kernels with the merge in the same launch, for the torch path (one kernel per layer fewer). Each
  split stores its partials, then counts itself in on its (row, KV head, query tile) counter
  (`tile_counters.py`); the split that counts last merges the tile's rows, with the arithmetic of
  `merge_kernel` in the same split order (the same bits), and sets the counter back to zero.

The count and its memory order are last_split.py's, shared with the skinny projections' K splits.

The split kernels' work is attention.py's own `_block_attention` and `_target_attention`, loaded
in this module's mode (see `trtllm_dflash/ops/kernels/__init__.py`).
"""

import triton
import triton.language as tl

from trtllm_dflash.ops import kernels

_attention = kernels.load("attention", interpret=triton.knobs.runtime.interpret)
_block_attention, _target_attention = _attention._block_attention, _attention._target_attention
is_last_split = kernels.load("last_split", interpret=triton.knobs.runtime.interpret).is_last_split
wait_for_inputs = kernels.load("grid_dependency", interpret=triton.knobs.runtime.interpret).wait_for_inputs


@triton.jit
def _merge_tile(
    partial_out_ptr,
    partial_lse_ptr,
    out_ptr,
    row,
    head,
    m_tile,
    block,
    num_kv_heads,
    group,
    num_splits,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    CACHE: tl.constexpr,
):
    """Merge query tile `m_tile` of KV head `head` of sequence `row` into `out`; `CACHE` is the
    partials' load cache modifier."""
    rows = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < block * group
    dims = tl.arange(0, HEAD_DIM)
    base = (row * num_kv_heads + head) * num_splits * (block * group)

    lse_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for s in range(0, num_splits):
        lse = tl.load(partial_lse_ptr + base + s * (block * group) + rows, mask=row_ok, other=float("-inf"), cache_modifier=CACHE)
        lse_max = tl.maximum(lse_max, lse)
    lse_use = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    acc = tl.full([BLOCK_M, HEAD_DIM], 0.0, tl.float32)
    total = tl.full([BLOCK_M], 0.0, tl.float32)
    for s in range(0, num_splits):
        part = base + s * (block * group) + rows
        lse = tl.load(partial_lse_ptr + part, mask=row_ok, other=float("-inf"), cache_modifier=CACHE)
        weight = tl.exp(lse - lse_use)
        o = tl.load(partial_out_ptr + part[:, None] * HEAD_DIM + dims[None, :], mask=row_ok[:, None], other=0.0, cache_modifier=CACHE)
        acc += weight[:, None] * o
        total += weight
    out = acc / tl.where(total > 0, total, 1.0)[:, None]
    t = rows // group
    q_head = head * group + rows % group
    offs = ((row * block + t) * (num_kv_heads * group) + q_head).to(tl.int64)[:, None] * HEAD_DIM + dims[None, :]
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def merge_kernel(
    # inputs
    partial_out_ptr,
    partial_lse_ptr,
    like_ptr,  # the queries: only their shape and dtype matter (TensorRT derives the output from them)
    # scalars
    block,
    num_kv_heads,
    group,
    num_splits,
    # outputs
    out_ptr,
    # compile-time configuration
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Node DFlashAttentionMerge: combine the per-split outputs of one KV head's query rows."""
    wait_for_inputs(PDL)
    row = tl.program_id(2).to(tl.int64)
    _merge_tile(
        partial_out_ptr, partial_lse_ptr, out_ptr, row, tl.program_id(1), tl.program_id(0), block, num_kv_heads, group, num_splits,
        HEAD_DIM, BLOCK_M, "",
    )  # fmt: skip


@triton.jit
def _merge_when_last(
    counter_ptr,
    partial_out_ptr,
    partial_lse_ptr,
    out_ptr,
    block,
    num_kv_heads,
    group,
    num_splits,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """After this split's partials are stored: count it in on its tile; the tile's last split merges."""
    m_tiles = tl.num_programs(0) // num_splits
    m_tile = tl.program_id(0) // num_splits
    head = tl.program_id(1)
    row = tl.program_id(2).to(tl.int64)
    tile = (row * num_kv_heads + head) * m_tiles + m_tile
    if is_last_split(counter_ptr, tile, num_splits):
        _merge_tile(
            partial_out_ptr, partial_lse_ptr, out_ptr, row, head, m_tile, block, num_kv_heads, group, num_splits, HEAD_DIM, BLOCK_M, ".cg"
        )
        tl.store(counter_ptr + tile, 0)  # zero again for the next launch


@triton.jit
def block_attention_merged_kernel(
    # inputs
    q_ptr,
    k_block_ptr,
    v_block_ptr,
    k_ctx_ptr,
    v_ctx_ptr,
    new_counts_ptr,
    k_cache_ptr,
    v_cache_ptr,
    cache_lens_ptr,
    # scalars
    block,
    num_new,
    capacity,
    num_kv_heads,
    group,
    window,
    causal,
    scale_bits,
    num_splits,
    # outputs (partials and counters: scratch)
    partial_out_ptr,
    partial_lse_ptr,
    counter_ptr,
    out_ptr,
    k_cache_out_ptr,
    v_cache_out_ptr,
    # compile-time configuration
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_T: tl.constexpr,
    IEEE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """`block_attention_split_kernel` then, by each tile's last split, `merge_kernel`'s merge."""
    wait_for_inputs(PDL)
    _block_attention(
        q_ptr, k_block_ptr, v_block_ptr, k_ctx_ptr, v_ctx_ptr, new_counts_ptr, k_cache_ptr, v_cache_ptr, cache_lens_ptr,
        block, num_new, capacity, num_kv_heads, group, window, causal, scale_bits, num_splits,
        partial_out_ptr, partial_lse_ptr, k_cache_out_ptr, v_cache_out_ptr, HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_T, True, IEEE,
    )  # fmt: skip
    _merge_when_last(counter_ptr, partial_out_ptr, partial_lse_ptr, out_ptr, block, num_kv_heads, group, num_splits, HEAD_DIM, BLOCK_M)


@triton.jit
def target_attention_merged_kernel(
    # inputs
    q_ptr,
    k_new_ptr,
    v_new_ptr,
    k_cache_ptr,
    v_cache_ptr,
    starts_ptr,
    sinks_ptr,
    # scalars
    tokens,
    capacity,
    num_kv_heads,
    group,
    window,
    scale_bits,
    num_splits,
    # outputs (partials and counters: scratch; the caches alias the cache inputs)
    partial_out_ptr,
    partial_lse_ptr,
    counter_ptr,
    out_ptr,
    k_cache_out_ptr,
    v_cache_out_ptr,
    # compile-time configuration
    HEAD_DIM_K: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    IEEE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """`target_attention_split_kernel` then, by each tile's last split, `merge_kernel`'s merge."""
    wait_for_inputs(PDL)
    _target_attention(
        q_ptr, k_new_ptr, v_new_ptr, k_cache_ptr, v_cache_ptr, starts_ptr, sinks_ptr,
        tokens, capacity, num_kv_heads, group, window, scale_bits, num_splits,
        partial_out_ptr, partial_lse_ptr, k_cache_out_ptr, v_cache_out_ptr, HEAD_DIM_K, HEAD_DIM_V, BLOCK_M, BLOCK_N, HAS_SINKS, True, IEEE,
    )  # fmt: skip
    _merge_when_last(counter_ptr, partial_out_ptr, partial_lse_ptr, out_ptr, tokens, num_kv_heads, group, num_splits, HEAD_DIM_V, BLOCK_M)

"""The block-attention Triton kernels (run by Triton's CPU interpreter) against the torch reference.

`launch.block_attention` picks the interpreted kernel instance for CPU tensors, so these tests need
no TRITON_INTERPRET in the environment (see `trtllm_dflash/ops/kernels/__init__.py`). Grids stay small: the
interpreter runs every program in Python.
"""

from __future__ import annotations

import pytest
import torch
from support import block_attention_case

pytest.importorskip("triton")

from trtllm_dflash.errors import DFlashError  # noqa: E402
from trtllm_dflash.ops import reference_attention  # noqa: E402
from trtllm_dflash.ops.kernels import launch  # noqa: E402

TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def run_both(case, window=0, kv_splits=1, causal=0):
    """Kernel and reference on separate copies of the caches; returns outputs and caches."""
    mine = {k: v.clone() if torch.is_tensor(v) else v for k, v in case.items()}
    theirs = {k: v.clone() if torch.is_tensor(v) else v for k, v in case.items()}
    out = launch.block_attention(**mine, window=window, causal=causal, kv_splits=kv_splits)
    ref = reference_attention.block_attention(**theirs, window=window, causal=causal)
    return out, ref, mine, theirs


def written_out(case, window=0, causal=0):
    """The published rule, one query at a time (independent of the reference's masks): a block
    query at position p sees context slot j < L and block key L + t' iff |p - key| <= window - 1
    (window > 0) and key <= p (causal only); z-lab's DFlashDraftModel, flash window (W-1, W-1)."""
    q, kb, vb = case["q"].double(), case["k_block"].double(), case["v_block"].double()
    batch, block, heads, _ = q.shape
    group = heads // kb.shape[2]
    out = torch.zeros_like(q)
    for r in range(batch):
        cached, new = int(case["cache_lens"][r]), int(case["new_counts"][r])
        length = cached + new
        keys = torch.cat([case["k_cache"][r, :cached].double(), case["k_ctx_new"][r, :new].double(), kb[r]])
        values = torch.cat([case["v_cache"][r, :cached].double(), case["v_ctx_new"][r, :new].double(), vb[r]])
        for t in range(block):
            p = length + t
            seen = [j for j in range(length + block) if (window == 0 or abs(p - j) <= window - 1) and (not causal or j <= p)]
            for h in range(heads):
                k, v = keys[seen, h // group], values[seen, h // group]
                out[r, t, h] = torch.softmax(k @ q[r, t, h] * case["scale"], 0) @ v
    return out


@pytest.mark.parametrize("window,causal", [(0, 0), (1, 0), (3, 0), (9, 0), (0, 1), (3, 1)])
def test_reference_is_the_published_rule(window, causal):
    case = block_attention_case(11, 3, 6, 4, 2, 16, torch.float32)
    ref = reference_attention.block_attention(
        **{k: v.clone() if torch.is_tensor(v) else v for k, v in case.items()}, window=window, causal=causal
    )
    torch.testing.assert_close(ref.double(), written_out(case, window, causal), atol=1e-5, rtol=1e-5)


def assert_matches(case, window=0, kv_splits=1, causal=0):
    out, ref, mine, theirs = run_both(case, window, kv_splits, causal)
    dtype = case["q"].dtype
    assert out.dtype == dtype and out.shape == ref.shape
    torch.testing.assert_close(out.float(), ref.float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    # the append writes exactly the reference's cache contents, and nothing else
    assert torch.equal(mine["k_cache"].view(torch.uint8), theirs["k_cache"].view(torch.uint8))
    assert torch.equal(mine["v_cache"].view(torch.uint8), theirs["v_cache"].view(torch.uint8))


@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,block",
    [
        (2, 2, 64, 2),  # GQA ratio 1
        (4, 2, 128, 5),  # ratio 2, odd block size
        (4, 1, 256, 7),  # ratio 4, head_dim 256 (query tile capped at 64 rows: several tiles)
        (8, 1, 64, 16),  # ratio 8, the largest block
        (16, 2, 128, 16),  # ratio 8 with 2 KV heads: 128 packed rows
    ],
)
def test_gqa_ratios_head_dims_and_block_sizes(heads, kv_heads, head_dim, block):
    assert_matches(block_attention_case(1, 3, block, heads, kv_heads, head_dim, torch.float32))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_accumulate_in_float32(dtype):
    assert_matches(block_attention_case(2, 3, 6, 4, 2, 64, dtype))


@pytest.mark.parametrize("window", [1, 3, 9, 100])
def test_sliding_window_layers_are_symmetric_inside_the_block(window):
    # window 1: each query sees only itself; 3 < block: the window cuts inside the block, on both
    # sides; 9: reaches back into the context; 100: longer than every sequence
    assert_matches(block_attention_case(3, 3, 6, 4, 2, 64, torch.float32), window=window)


@pytest.mark.parametrize("window", [0, 3])
def test_causal_drafters(window):
    # ModelOpt `causal: true`: causal inside the block, alone and with a window
    assert_matches(block_attention_case(3, 3, 6, 4, 2, 64, torch.float32), window=window, causal=1)


@pytest.mark.parametrize("kv_splits,window,causal", [(3, 0, 0), (5, 0, 0), (4, 5, 0), (4, 2, 0), (3, 3, 1)])
def test_split_context_is_merged_exactly(kv_splits, window, causal):
    # more splits than some rows have context: empty splits must not disturb the merge
    assert_matches(block_attention_case(4, 3, 4, 8, 2, 64, torch.float32), window=window, kv_splits=kv_splits, causal=causal)


def test_split_kernel_half_precision():
    assert_matches(block_attention_case(5, 2, 16, 8, 2, 128, torch.bfloat16, capacity=96), kv_splits=3)


def test_fp8_kv_cache():
    # New rows are drawn on the float8 grid: Triton 3.9's interpreter rounds float->float8 wrongly
    # (1.945 -> 1.0), while GPUs round to nearest like torch. The data path is what is tested here.
    case = block_attention_case(6, 2, 4, 4, 2, 64, torch.bfloat16, cache_dtype=torch.float8_e4m3fn)
    for name in ("k_ctx_new", "v_ctx_new"):
        case[name] = case[name].to(torch.float8_e4m3fn).to(torch.bfloat16)
    assert_matches(case, kv_splits=2)


def test_kernel_result_does_not_depend_on_the_batch():
    case = block_attention_case(7, 3, 4, 4, 2, 64, torch.float32)
    out_all, _, _, _ = run_both(case)
    row = {k: v[1:2] if torch.is_tensor(v) else v for k, v in case.items()}
    out_one, _, _, _ = run_both(row)
    torch.testing.assert_close(out_all[1:2], out_one, atol=1e-6, rtol=1e-6)


def test_reference_split_form_merges_to_the_reference():
    """The split semantics the partial ONNX node exposes, checked within the reference."""
    case = block_attention_case(8, 3, 5, 4, 2, 64, torch.float32)
    for window, causal in ((0, 0), (4, 0), (2, 0), (3, 1)):
        full = reference_attention.block_attention(
            **{k: v.clone() if torch.is_tensor(v) else v for k, v in case.items()}, window=window, causal=causal
        )
        parts = reference_attention.block_attention_partials(
            **{k: v.clone() if torch.is_tensor(v) else v for k, v in case.items()}, window=window, splits=4, causal=causal
        )
        torch.testing.assert_close(reference_attention.merge_partials(*parts, case["q"]), full, atol=1e-5, rtol=1e-5)


def test_unsupported_shapes_are_clear_errors():
    case = block_attention_case(9, 1, 4, 2, 2, 64, torch.float32)
    case["q"] = case["q"][..., :48].contiguous()
    with pytest.raises(DFlashError, match="q has|k_block has|head_dim"):
        launch.block_attention(**case)
    case = block_attention_case(9, 1, 4, 2, 2, 64, torch.float32)
    case["k_cache"] = case["k_cache"].transpose(1, 2).contiguous().transpose(1, 2)
    with pytest.raises(DFlashError, match="not contiguous"):
        launch.block_attention(**case)

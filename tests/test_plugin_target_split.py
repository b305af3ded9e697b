"""The target-attention KV split (flash-decoding) against the unsplit kernel and the torch reference.

The split kernel cuts each row's committed prefix over `kv_splits` programs, the last split also
taking the block's own keys and the sinks; `merge_kernel` combines the partials. Run by Triton's
CPU interpreter (`launch.target_attention` picks it for CPU tensors), small grids only.
"""

from __future__ import annotations

import pytest
import torch
from support import INTERPRETER_TOLERANCE, clone, target_attention_case

pytest.importorskip("triton")


from trtllm_dflash.ops import (
    kernels,
    reference_attention,  # noqa: E402
)
from trtllm_dflash.ops.kernels import launch  # noqa: E402


def assert_split_matches(case, splits, sinks=None, window=0, scale=0.2):
    """Split launch == unsplit launch == reference, outputs close and caches bit-equal."""
    split, unsplit, ref = clone(case), clone(case), clone(case)
    out = launch.target_attention(**split, sinks=sinks, scale=scale, window=window, kv_splits=splits)
    one = launch.target_attention(**unsplit, sinks=sinks, scale=scale, window=window, kv_splits=1)
    expected = reference_attention.target_attention(**ref, sinks=sinks, scale=scale, window=window)
    tol = INTERPRETER_TOLERANCE[case["q"].dtype]
    assert out.dtype == case["q"].dtype and out.shape == expected.shape
    torch.testing.assert_close(out.float(), expected.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(out.float(), one.float(), atol=tol, rtol=tol)
    for name in ("k_cache", "v_cache"):
        assert torch.equal(split[name].view(torch.uint8), ref[name].view(torch.uint8)), name
    return out


@pytest.mark.parametrize("splits", [1, 2, 3, 9])  # 9: more splits than the 48-slot prefix has key tiles
@pytest.mark.parametrize(
    "heads,kv_heads,key_dim,value_dim,tokens",
    [
        (2, 2, 16, 16, 3),  # GQA 1
        (8, 2, 32, 64, 4),  # GQA 4, value head wider than the key head
        (8, 1, 64, 16, 2),  # GQA 8, value head narrower
    ],
)
def test_split_equals_unsplit_and_reference(splits, heads, kv_heads, key_dim, value_dim, tokens):
    case = target_attention_case(21, tokens=tokens, heads=heads, kv_heads=kv_heads, key_dim=key_dim, value_dim=value_dim, capacity=48)
    assert_split_matches(case, splits)


@pytest.mark.parametrize("window", [1, 3, 9, 100])
def test_split_sliding_windows(window):
    # the row's chunks start at the window of its first token; a tile skips what its own window excludes
    assert_split_matches(target_attention_case(22, tokens=6, heads=4, kv_heads=2, capacity=64), 3, window=window)


@pytest.mark.parametrize("window,splits", [(0, 2), (0, 5), (7, 3)])
def test_split_sinks_count_once(window, splits):
    case = target_attention_case(23, tokens=4, heads=4, kv_heads=2)
    assert_split_matches(case, splits, sinks=torch.tensor([1.5, -2.0, 0.0, 3.0]), window=window)
    # a dominant sink stays finite through the merge
    out = assert_split_matches(case, splits, sinks=torch.tensor([200.0, -200.0, 0.0, 60.0]), window=window)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_split_half_precision(dtype):
    case = target_attention_case(24, tokens=16, heads=8, kv_heads=2, dtype=dtype)
    assert_split_matches(case, 4, sinks=torch.randn(8, generator=torch.Generator().manual_seed(1)), window=11)


def test_split_prefill_tiles_and_ragged_starts():
    # 40 tokens x GQA 2 in 32-row tiles: three tiles x 3 splits; rows start at 0 (no prefix) and 20
    case = target_attention_case(25, batch=2, tokens=40, heads=4, kv_heads=2, key_dim=32, value_dim=32, capacity=96, starts=[0, 50])
    assert_split_matches(case, 3)
    assert_split_matches(case, 3, window=7)


def test_split_kernel_partials_equal_the_reference_partials():
    """The kernel's own partials, not just their merge: the chunking is the reference's (row 3, a
    CUDA graph's padding row at the capacity, sees nothing: its lse is the sinks' alone)."""
    case = target_attention_case(26, batch=4, tokens=3, heads=8, kv_heads=2, key_dim=32, value_dim=16, capacity=40, starts=[0, 17, 36, 40])
    sinks, splits, window = torch.randn(8, generator=torch.Generator().manual_seed(2)), 3, 6
    mine, ref = clone(case), clone(case)
    batch, tokens, heads, _ = case["q"].shape
    capacity, kv_heads = case["k_cache"].shape[1], case["k_cache"].shape[2]
    group = heads // kv_heads
    config = launch.target_attention_config(32, 16, tokens, group)
    partial_out = torch.empty(batch, kv_heads, splits, tokens * group, 16)
    partial_lse = torch.empty(batch, kv_heads, splits, tokens * group)
    options = dict(sinks=sinks, window=window, scale=0.3)
    kernels.load("attention", interpret=True).target_attention_split_kernel[
        launch.target_attention_grid(batch, tokens, kv_heads, group, config.block_m, splits)
    ](
        mine["q"],
        mine["k_new"],
        mine["v_new"],
        mine["k_cache"],
        mine["v_cache"],
        mine["starts"],
        sinks,
        *launch.target_attention_split_scalars(tokens, capacity, kv_heads, group, options, splits),
        partial_out,
        partial_lse,
        mine["k_cache"],
        mine["v_cache"],
        HEAD_DIM_K=32,
        HEAD_DIM_V=16,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        HAS_SINKS=True,
        IEEE=True,
    )
    expected_out, expected_lse = reference_attention.target_attention_partials(**ref, **options, splits=splits)
    assert torch.equal(torch.isinf(partial_lse), torch.isinf(expected_lse))  # the same splits see nothing
    torch.testing.assert_close(partial_lse, expected_lse, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(partial_out, expected_out, atol=2e-5, rtol=2e-5)
    assert torch.equal(mine["k_cache"], ref["k_cache"]) and torch.equal(mine["v_cache"], ref["v_cache"])


def test_reference_partials_merge_to_the_reference():
    case = target_attention_case(27, tokens=5, heads=6, kv_heads=2, key_dim=32, value_dim=64, capacity=30)
    sinks = torch.randn(6, generator=torch.Generator().manual_seed(3))
    for splits in (1, 2, 4, 40):
        for window in (0, 4):
            a, b = clone(case), clone(case)
            po, pl = reference_attention.target_attention_partials(**a, sinks=sinks, scale=0.25, window=window, splits=splits)
            expected = reference_attention.target_attention(**b, sinks=sinks, scale=0.25, window=window)
            torch.testing.assert_close(reference_attention.merge_partials(po, pl, case["q"]), expected, atol=2e-6, rtol=2e-6)
            assert torch.equal(a["k_cache"], b["k_cache"])


def test_split_never_reads_garbage_past_each_rows_positions():
    case = target_attention_case(28, tokens=6, heads=8, kv_heads=2)
    clean = assert_split_matches(case, 3)
    for r, start in enumerate(case["starts"].tolist()):
        case["k_cache"][r, start:] = float("nan")
        case["v_cache"][r, start:] = float("nan")
    dirty = launch.target_attention(**clone(case), sinks=None, scale=0.2, window=0, kv_splits=3)
    torch.testing.assert_close(dirty, clean, atol=0, rtol=0)


def test_split_count_follows_the_shape():
    # Qwen3-8B verify step (8 KV heads, one 64-row tile) on an H100's 132 SMs
    assert launch.target_kv_splits(1, 8, 1, prefix=8192, sms=132) == 16  # 512 keys per split bounds it
    assert launch.target_kv_splits(1, 8, 1, prefix=1024, sms=132) == 2
    assert launch.target_kv_splits(8, 8, 1, prefix=8192, sms=132) == 5  # ~2 programs per SM
    assert launch.target_kv_splits(64, 8, 1, prefix=8192, sms=132) == 1  # the grid is full already
    assert launch.target_kv_splits(1, 8, 1, prefix=300, sms=132) == 1  # too short to split
    assert launch.target_kv_splits(1, 1, 1, prefix=1 << 20, sms=132) == launch.MAX_KV_SPLITS
    assert launch.default_target_kv_splits(1, 8, 1, 16, 8208, torch.device("cpu")) == 1  # the interpreter: one split

"""The target-attention Triton kernel (run by Triton's CPU interpreter) against the torch reference.

`launch.target_attention` picks the interpreted kernel instance for CPU tensors, so these tests need
no TRITON_INTERPRET in the environment. Grids stay small (a few rows, one or two KV heads): the
interpreter runs every program in Python.
"""

from __future__ import annotations

import pytest
import torch
from support import INTERPRETER_TOLERANCE, clone, target_attention_case

pytest.importorskip("triton")

from trtllm_dflash import ops
from trtllm_dflash.errors import DFlashError  # noqa: E402
from trtllm_dflash.ops import (
    custom_ops,
    reference_attention,  # noqa: E402
)
from trtllm_dflash.ops.kernels import attention_traffic, launch  # noqa: E402


def run_both(case, sinks=None, window=0, scale=None):
    scale = scale if scale is not None else case["q"].shape[-1] ** -0.5
    mine, theirs = clone(case), clone(case)
    out = launch.target_attention(**mine, sinks=sinks, scale=scale, window=window)
    ref = reference_attention.target_attention(**theirs, sinks=sinks, scale=scale, window=window)
    return out, ref, mine, theirs


def assert_matches(case, sinks=None, window=0):
    out, ref, mine, theirs = run_both(case, sinks, window)
    dtype = case["q"].dtype
    assert out.dtype == dtype and out.shape == ref.shape == (*case["q"].shape[:3], case["v_cache"].shape[-1])
    torch.testing.assert_close(out.float(), ref.float(), atol=INTERPRETER_TOLERANCE[dtype], rtol=INTERPRETER_TOLERANCE[dtype])
    # the block lands exactly where the reference writes it, bit for bit, and nothing else changes
    assert torch.equal(mine["k_cache"].view(torch.uint8), theirs["k_cache"].view(torch.uint8))
    assert torch.equal(mine["v_cache"].view(torch.uint8), theirs["v_cache"].view(torch.uint8))


@pytest.mark.parametrize(
    "heads,kv_heads,key_dim,value_dim,tokens",
    [
        (2, 2, 16, 16, 1),  # GQA 1, plain decode (a block of one)
        (4, 2, 32, 64, 4),  # GQA 2, value head wider than the key head
        (8, 2, 128, 128, 16),  # GQA 4, the verify block of Qwen3-8B-like layers: 64 packed rows
        (8, 1, 64, 16, 16),  # GQA 8, value head narrower: 128 packed rows in one tile
        (4, 1, 256, 128, 4),  # head dim 256 (32-key steps)
        (6, 2, 64, 64, 5),  # GQA 3: a group that does not divide the tile
    ],
)
def test_gqa_head_dims_and_blocks(heads, kv_heads, key_dim, value_dim, tokens):
    assert_matches(target_attention_case(1, tokens=tokens, heads=heads, kv_heads=kv_heads, key_dim=key_dim, value_dim=value_dim))


@pytest.mark.parametrize("window", [1, 3, 9, 100])
def test_sliding_windows(window):
    # 1: each query sees only itself; 3 < block: the window cuts inside the block;
    # 9: reaches back into the prefix; 100: longer than every row
    assert_matches(target_attention_case(2, tokens=6, heads=4, kv_heads=2), window=window)


@pytest.mark.parametrize("window", [0, 4])
def test_attention_sinks(window):
    case = target_attention_case(3, tokens=4, heads=4, kv_heads=2)
    assert_matches(case, sinks=torch.randn(4, generator=torch.Generator().manual_seed(0)), window=window)


def test_a_dominant_sink_does_not_overflow():
    """Sinks far above every score (gpt-oss learns some large ones): the sink joins the running
    maximum instead of being added as exp(sink - m), which would overflow."""
    case = target_attention_case(4, tokens=4, heads=4, kv_heads=2)
    sinks = torch.tensor([200.0, -200.0, 0.0, 60.0])
    out, ref, _, _ = run_both(case, sinks)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_accumulates_in_float32(dtype):
    # the interpreter computes bf16 dots in float32 (see trtllm_dflash/ops/kernels/__init__.py); a GPU's
    # tensor cores round p to bf16 before p @ v: the tolerance covers both
    assert_matches(target_attention_case(5, tokens=16, heads=8, kv_heads=2, dtype=dtype), sinks=torch.randn(8), window=11)


def test_float32_queries_over_a_bf16_cache():
    # The block's keys are cast to the cache dtype before use, as if read back from the cache. They
    # are drawn on the bf16 grid: Triton 3.9's interpreter truncates float32 -> bfloat16 (-0.30204 ->
    # -0.30078) where GPUs and torch round to nearest (-0.30273); the data path is what is tested.
    case = target_attention_case(6, tokens=4, key_dim=32, value_dim=32, cache_dtype=torch.bfloat16)
    for name in ("k_new", "v_new"):
        case[name] = case[name].to(torch.bfloat16).float()
    assert_matches(case)


def test_prefill_longer_than_a_verify_block_tiles_over_the_tokens():
    # 40 tokens x GQA 2 = 80 packed rows in 32-row tiles: three tiles write and read their own tokens
    case = target_attention_case(7, batch=2, tokens=40, heads=4, kv_heads=2, key_dim=32, value_dim=32, capacity=64, starts=[0, 20])
    assert launch.target_attention_config(32, 32, 40, 2).m_tiles(40, 2) == 3
    assert_matches(case)
    assert_matches(case, window=7)


def test_the_cache_is_written_exactly_at_the_block_slots():
    case = target_attention_case(8, tokens=5, heads=4, kv_heads=2, key_dim=32, value_dim=16, capacity=24, starts=[0, 11, 21])
    mine = clone(case)
    launch.target_attention(**mine, sinks=None, scale=0.2, window=0)
    for r, start in enumerate(case["starts"].tolist()):
        end = min(start + 5, 24)  # row 2 runs past the capacity: its last slots are dropped
        for name, new in (("k_cache", "k_new"), ("v_cache", "v_new")):
            expected = case[name][r].clone()
            expected[start:end] = case[new][r, : end - start]
            assert torch.equal(mine[name][r], expected), (name, r)
    assert_matches(case)  # the row past the capacity attends like the reference


def test_garbage_past_each_rows_positions_is_never_read():
    """NaN in every slot at or past a row's end (what a rejected draft or a longer row leaves):
    a single NaN loaded into a tile would poison the row (0 * NaN), so this checks the loop bounds."""
    case = target_attention_case(9, tokens=6, heads=8, kv_heads=2)
    clean, _, _, _ = run_both(case)
    for r, start in enumerate(case["starts"].tolist()):
        case["k_cache"][r, start:] = float("nan")
        case["v_cache"][r, start:] = float("nan")
    dirty, _, mine, _ = run_both(case)
    assert torch.isfinite(dirty).all()
    torch.testing.assert_close(dirty, clean, atol=0, rtol=0)  # (the reference itself is not NaN-proof)
    for r, start in enumerate(case["starts"].tolist()):
        assert torch.isfinite(mine["k_cache"][r, start : start + 6]).all()
        assert torch.isnan(mine["k_cache"][r, start + 6 :]).all()


def test_slots_below_a_sliding_window_are_never_read():
    """A sliding layer's step reads O(window) slots: NaN below the first query's window changes nothing."""
    case = target_attention_case(14, tokens=4, heads=4, kv_heads=2, capacity=64, starts=[30, 12, 50])
    clean, _, _, _ = run_both(case, window=5)
    for r, start in enumerate(case["starts"].tolist()):
        case["k_cache"][r, : start - 4] = float("nan")
        case["v_cache"][r, : start - 4] = float("nan")
    dirty, _, _, _ = run_both(case, window=5)
    torch.testing.assert_close(dirty, clean, atol=0, rtol=0)


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_a_row_starting_at_the_capacity_reads_and_writes_nothing(splits, with_sinks):
    """A CUDA graph's padding rows start at the capacity (runtime/cuda_graphs.py): NaN in their whole
    cache row is never read (zeros out, not NaN), their rows stay as they were, and the live rows
    are unchanged by them."""
    case = target_attention_case(15, batch=4, tokens=4, heads=4, kv_heads=2, key_dim=16, value_dim=16, capacity=40, starts=[3, 40, 30, 47])
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(4)) if with_sinks else None
    for r in (1, 3):
        case["k_cache"][r] = float("nan")
        case["v_cache"][r] = float("nan")
    mine, theirs = clone(case), clone(case)
    out = launch.target_attention(**mine, sinks=sinks, scale=0.25, window=0, kv_splits=splits)
    ref = reference_attention.target_attention(**theirs, sinks=sinks, scale=0.25, window=0)
    assert torch.equal(out[[1, 3]], torch.zeros_like(out[[1, 3]])) and torch.equal(ref[[1, 3]], out[[1, 3]])
    live = {k: v[[0, 2]] for k, v in case.items()}
    alone = launch.target_attention(**clone(live), sinks=sinks, scale=0.25, window=0, kv_splits=splits)
    torch.testing.assert_close(out[[0, 2]], alone, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out[[0, 2]], ref[[0, 2]], atol=1e-5, rtol=1e-5)
    for name in ("k_cache", "v_cache"):
        assert torch.equal(mine[name][[1, 3]].isnan(), case[name][[1, 3]].isnan())  # nothing written
        assert torch.equal(mine[name].nan_to_num(7.0), theirs[name].nan_to_num(7.0))  # NaN where NaN, else equal


def test_kernel_result_does_not_depend_on_the_batch():
    case = target_attention_case(10, tokens=4)
    out_all, _, _, _ = run_both(case)
    out_one, _, _, _ = run_both({k: v[1:2] for k, v in case.items()})
    torch.testing.assert_close(out_all[1:2], out_one, atol=1e-6, rtol=1e-6)


def test_ops_run_the_kernel_when_asked_and_the_reference_otherwise(monkeypatch):
    case = target_attention_case(11, tokens=3, key_dim=32, value_dim=32)
    calls = []
    kernel = launch.target_attention
    monkeypatch.setattr(launch, "target_attention", lambda *a, **k: calls.append("kernel") or kernel(*a, **k))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    expected_caches = clone(case)
    expected = reference_attention.target_attention(**expected_caches, sinks=None, scale=0.3, window=2)
    ops.target_attention(**clone(case), sinks=None, scale=0.3, window=2)
    assert calls == []
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    mine = clone(case)
    got = ops.target_attention(**mine, sinks=None, scale=0.3, window=2)
    assert calls == ["kernel"]
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=2e-5)
    assert torch.equal(mine["k_cache"], expected_caches["k_cache"]) and torch.equal(mine["v_cache"], expected_caches["v_cache"])


def test_what_the_kernel_does_not_cover_falls_back_to_the_reference(monkeypatch):
    case = target_attention_case(12, tokens=2, key_dim=32, value_dim=32)
    assert launch.target_attention_supported(case["q"], case["k_cache"], case["v_cache"])
    fp8 = case["k_cache"].to(torch.float8_e4m3fn)
    assert not launch.target_attention_supported(case["q"], fp8, case["v_cache"])  # an FP8 cache needs its scales
    odd = torch.zeros(3, 48, 2, 48)  # head dim 48: not a tl.dot tile
    assert not launch.target_attention_supported(torch.zeros(3, 2, 4, 48), odd, odd)
    assert not launch.target_attention_supported(case["q"], case["k_cache"].transpose(1, 2), case["v_cache"])
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(launch, "target_attention", lambda *a, **k: pytest.fail("the kernel must not run"))
    x = target_attention_case(12, tokens=2, key_dim=48, value_dim=48)
    torch.ops.dflash.target_attention(*x.values(), None, 0.2, 0)
    assert custom_ops.kernels_enabled(x["q"].device)


def test_bad_shapes_are_clear_errors():
    case = target_attention_case(13, tokens=2, key_dim=32, value_dim=32)
    bad = {**case, "v_new": case["v_new"][..., :16]}
    with pytest.raises(DFlashError, match="v_new has shape"):
        launch.target_attention(**bad, sinks=None, scale=0.2)
    with pytest.raises(DFlashError, match="sinks has shape"):
        launch.target_attention(**case, sinks=torch.zeros(3), scale=0.2)
    with pytest.raises(DFlashError, match="not a multiple"):
        launch.target_attention(**target_attention_case(13, heads=3, kv_heads=2, key_dim=32, value_dim=32), sinks=None, scale=0.2)
    with pytest.raises(DFlashError, match="value head dims"):
        launch.target_attention_config(64, 192)


def test_launch_plan_of_a_qwen3_8b_verify_step():
    config = launch.target_attention_config(128, 128, 16, 4)
    # the 64 x 128 query tile; 32-key tiles keep it within an engine launch's 48 KiB of shared memory
    assert (config.block_m, config.block_n, config.num_warps, config.num_stages) == (64, 32, 8, 1)
    assert launch.tile_shared_bytes(64, 32, 128, 128, 2, 1, 1) <= launch.ENGINE_SHARED_BUDGET
    assert launch.target_attention_grid(8, 16, 8, 4, config.block_m) == (1, 8, 8)
    tokens, capacity, kv_heads, group, window, scale_bits = launch.target_attention_scalars(16, 8192, 8, 4, dict(window=0, scale=128**-0.5))
    assert (tokens, capacity, kv_heads, group, window) == (16, 8192, 8, 4, 0)
    assert scale_bits == launch.float_bits(128**-0.5)


def test_benchmark_shapes_and_bytes_moved():
    shapes = attention_traffic.TARGET_ATTENTION_BENCH_SHAPES
    assert {(s.batch, s.context) for s in shapes if s.tokens == 16} == {(b, c) for b in (1, 8, 64) for c in (1024, 8192)}
    assert {(s.batch, s.context) for s in shapes if s.tokens == 1} == {(b, 1024) for b in (1, 8, 32)}
    s = next(s for s in shapes if (s.batch, s.context) == (1, 1024))
    assert (s.tokens, s.heads, s.kv_heads, s.head_dim_k, s.head_dim_v) == (16, 32, 8, 128, 128)
    # one layer, one row, bf16: read (1024 + 16) x 8 x 256 x 2, write 16 x 8 x 256 x 2, q and out 2 x 16 x 32 x 128 x 2
    assert s.bytes_moved() == (1024 + 16) * 8 * 256 * 2 + 16 * 8 * 256 * 2 + 2 * 16 * 32 * 128 * 2
    windowed = attention_traffic.target_attention_bytes(1, 16, 32, 8, 128, 128, context=8192, window=128)
    assert windowed == (127 + 16) * 8 * 256 * 2 + 16 * 8 * 256 * 2 + 2 * 16 * 32 * 128 * 2
    inputs = attention_traffic.target_attention_bench_inputs(s, torch.device("cpu"))
    assert inputs["k_cache"].shape == (1, 1024 + 16, 8, 128) and inputs["starts"].tolist() == [1024]

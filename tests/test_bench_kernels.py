"""The kernel benchmark's target-attention half without a GPU: the SDPA backend search, the bytes and
the table on a tiny shape (our kernel in Triton's interpreter, SDPA on CPU, where only the math
backend runs), and the script's one-line refusal without CUDA. Times here mean nothing; the
selection and the table are what is tested."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from trtllm_dflash.bench import kernels, sdpa_baseline
from trtllm_dflash.ops import reference_attention
from trtllm_dflash.ops.kernels import attention_traffic

ROOT = Path(__file__).resolve().parents[1]
TINY = attention_traffic.TargetAttentionShape(
    "tiny-verify", batch=2, tokens=4, heads=4, kv_heads=2, head_dim_k=16, head_dim_v=16, context=40
)


def cpu_timer(fn, repeats=2):
    """Median wall time in ms (a stand-in for do_bench, which needs CUDA)."""
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        fn()
        times.append((time.perf_counter() - begin) * 1e3)
    return sorted(times)[len(times) // 2]


def _operands(window=0, dtype=torch.float32):
    inputs = attention_traffic.target_attention_bench_inputs(TINY, torch.device("cpu"), dtype=dtype)
    expected = reference_attention.target_attention(**inputs, sinks=None, scale=0.25, window=window)  # writes the block
    return sdpa_baseline.verify_operands(inputs["q"], inputs["k_cache"], inputs["v_cache"], TINY.context, 0.25, window), expected


@pytest.mark.parametrize("window", [0, 7])
def test_the_boolean_verify_mask_is_the_reference_attention(window):
    operands, expected = _operands(window)
    assert operands.q.shape == (2, 4, 4, 16) and operands.k.shape == (2, 2, 44, 16) and operands.group == 2
    mask = operands.boolean_mask()
    first_visible = 40 - window + 1 if window else 0  # query 0 is at position 40
    assert mask.shape == (4, 44) and mask[0, first_visible:41].all() and not mask[0, 41:].any() and not mask[0, :first_visible].any()
    got = torch.nn.functional.scaled_dot_product_attention(operands.q, operands.k, operands.v, attn_mask=mask, scale=0.25, enable_gqa=True)
    torch.testing.assert_close(got.transpose(1, 2), expected, atol=1e-5, rtol=1e-5)
    k, v = operands.expanded()
    assert k.shape == (2, 4, 44, 16) and torch.equal(k[:, 1], operands.k[:, 0]) and torch.equal(v[:, 2], operands.v[:, 1])


def test_on_cpu_only_math_runs_and_the_rest_say_why():
    operands, expected = _operands()
    timings = sdpa_baseline.time_candidates(operands, expected, cpu_timer)
    assert [t.candidate for t in timings] == list(sdpa_baseline.CANDIDATES)
    ran = {t.candidate.backend for t in timings if t.ms is not None}
    assert "MATH" in ran and not ran & {"FLASH_ATTENTION", "CUDNN_ATTENTION"}
    refused = {t.candidate.name: t.refused for t in timings if t.ms is None}
    assert refused["FLASH_ATTENTION (gqa, lower-right mask)"] == "flash and memory-efficient attention need CUDA"
    assert refused["FLASH_VARLEN (cache, per-row length mask)"] == "flash attention needs CUDA"
    assert all(refused.values())
    best = sdpa_baseline.fastest(timings)
    assert best.candidate.backend in ran and best.ms == min(t.ms for t in timings if t.ms is not None)


def test_a_candidate_an_in_graph_timer_cannot_capture_is_not_a_baseline():
    """kernels.graph_median_ms gives NaN where a call cannot be captured in a CUDA graph: such a
    candidate is reported as refused, and the fastest is chosen among the others."""
    operands, expected = _operands()
    calls = []

    def timer(fn):
        calls.append(fn)
        return math.nan if len(calls) == 1 else cpu_timer(fn)

    math_backend = next(c for c in sdpa_baseline.CANDIDATES if c.backend == "MATH")  # the one that runs on CPU
    timings = sdpa_baseline.time_candidates(operands, expected, timer, candidates=(math_backend, math_backend))
    ran = [t for t in timings if t.ms is not None]
    assert [t.refused for t in timings] == ["cannot be captured in a CUDA graph", ""] and len(ran) == 1
    assert sdpa_baseline.fastest(timings).ms == min(t.ms for t in ran)


def test_a_sliding_window_has_no_lower_right_candidate_and_a_wrong_result_is_not_a_baseline():
    operands, expected = _operands(window=7)
    timings = sdpa_baseline.time_candidates(operands, expected, cpu_timer)
    lower_right = [t for t in timings if t.candidate.mask == "lower-right"]
    assert lower_right and all(t.refused == "a sliding window has no bottom-right causal form" for t in lower_right)
    wrong = sdpa_baseline.time_candidates(operands, expected + 1.0, cpu_timer)  # as if SDPA saw another mask
    assert all(t.ms is None for t in wrong)
    assert {t.refused for t in wrong if t.candidate.backend == "MATH"} == {"computes another attention than the kernel"}
    none = sdpa_baseline.fastest(wrong)
    assert none.candidate.backend == "none" and none.ms != none.ms  # nan


def test_target_benchmark_table_on_cpu():
    pytest.importorskip("triton")
    result = kernels.bench_target_attention(TINY, bandwidth=1e9, timer=cpu_timer, device=torch.device("cpu"), kv_splits=2)
    assert result.kv_splits == 2 and result.unsplit_ms is not None and result.sdpa_backend.startswith("MATH")
    assert result.bytes_moved == TINY.bytes_moved() and result.floor_ms == pytest.approx(TINY.bytes_moved() / 1e9 * 1e3)
    bench = kernels.KernelBenchmark(1e9, [], [], [result])
    table = kernels.kernel_tables(bench)
    assert "| tiny-verify | 4 / 2 / 16 | 4 | 40 | 2 | 2 |" in table and "| MATH (gqa, boolean mask) |" in table
    assert "- FLASH_ATTENTION (gqa, lower-right mask): flash and memory-efficient attention need CUDA" in table
    data = kernels.result_json(bench)
    assert data["target"][0]["sdpa_backend"] == result.sdpa_backend and data["target"][0]["shape"]["name"] == "tiny-verify"
    assert len(data["target"][0]["sdpa_timings"]) == len(sdpa_baseline.CANDIDATES)


def test_the_script_refuses_in_one_line_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the script would run the benchmark")
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_kernels.py"), "--target-only"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: this benchmark needs an NVIDIA GPU with a CUDA build of torch; run it on a GPU machine"
    ]

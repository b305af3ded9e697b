"""`benchmarks/bench_gpu_step.py --tiny`: the full-depth GPU step benchmark's code path on CPU, so it
cannot rot between GPU windows (its numbers mean nothing here)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from trtllm_dflash.bench import gpu_step

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gpu_step.py"


def _script():
    spec = importlib.util.spec_from_file_location("bench_gpu_step", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_the_tiny_mode_writes_every_row_and_part(tmp_path):
    out = tmp_path / "step.md"
    args = ["--tiny", "--device", "cpu", "--batches", "1,2", "--contexts", "24", "--repeats", "2", "--loop-steps", "8", "--out", str(out)]
    assert _script().main(args) == 0
    table = out.read_text()
    assert "| 1 | 24 |" in table and "| 2 | 24 |" in table
    result = json.loads(out.with_suffix(".json").read_text())
    assert [(r["batch"], r["context"]) for r in result["rows"]] == [(1, 24), (2, 24)]
    assert "| 2 | 24 |" in table.split("half its rows a CUDA graph's padding rows")[1]
    for row in result["rows"]:
        sampled = [m for m in gpu_step.VERIFY_MODES if m != "greedy"]
        expected = {"ar", "verify pass", "draft", "dflash step"} | {f"verify {m}" for m in gpu_step.VERIFY_MODES}
        padding = set(gpu_step.PADDING_STARTS) if row["batch"] > 1 else set()  # half the rows padding: batch 2 only
        assert set(row["parts"]) == expected | {f"draft sampling {m}" for m in sampled} | padding
        assert all(part["ms"] > 0 and part["floor_ms"] > 0 for part in row["parts"].values())
        assert row["loop_ar_ms"] > 0 and row["loop_dflash_ms"] > 0 and row["loop_async_ms"] > 0


def test_a_part_that_fails_is_said_and_marked_and_the_run_goes_on(tmp_path, monkeypatch):
    """A kernel that does not compile or launch on a GPU window's machine costs its own cells, not
    the window: the draft pass failing leaves the other parts measured, the draft and DFlash step
    cells "failed", and the reason in the log (and no profile of it)."""
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    def fails(*args, **kwargs):
        raise RuntimeError("no kernel image is available for execution on the device\nmore")

    monkeypatch.setattr(TorchRuntime, "draft_forward", fails)
    out, said = tmp_path / "step.md", []
    args = ["--tiny", "--device", "cpu", "--batches", "1", "--contexts", "24", "--repeats", "2", "--loop-contexts", ""]
    result = gpu_step.run(
        gpu_step.TINY, batches=(1,), contexts=(24,), loop_contexts=(), repeats=2, device="cpu", out=out, say=said.append, profile=True
    )
    assert _script().main([*args, "--out", str(tmp_path / "script.md")]) == 0
    parts = result.rows[0].parts
    assert parts["draft"].how == "failed" and result.rows[0].dflash.how == "failed"
    assert all(t.ms > 0 for name, t in parts.items() if name != "draft")
    assert "  draft: failed (RuntimeError: no kernel image is available for execution on the device)" in said
    assert [p.name for p in result.rows[0].profiles] == ["AR pass", "verify pass"]  # nothing of the draft pass to profile
    row = next(line for line in out.read_text().splitlines() if line.startswith("| 1 | 24 |"))
    assert row.split(" | ")[4:6] == ["failed", "failed"]  # the draft pass and the DFlash step


def _bounds_row(batch: int, ar: float, step_parts: tuple[float, float, float], top_k: float, other: float | None = None):
    """A row at 1k context with the parts issue 39 bounds (floors: AR 3.6 ms, DFlash step 4.35 ms)."""
    from trtllm_dflash.bench.step_results import StepRow, Timed

    row = StepRow(batch, 1024)
    for suffix, scale in (("", 1.0), *(((", other launches", other),) if other is not None else ())):
        draft, verify, greedy = (ms * scale for ms in step_parts)
        row.parts |= {
            f"ar{suffix}": Timed(ar * scale, 3.6, "graph"),
            f"draft{suffix}": Timed(draft, 0.79, "graph"),
            f"verify pass{suffix}": Timed(verify, 3.557, "graph"),
            f"verify greedy{suffix}": Timed(greedy, 0.003, "graph"),
            f"verify top-k+top-p{suffix}": Timed(top_k * scale, 0.003, "graph"),
        }
    return row


def test_issue_39s_bounds_are_judged_on_the_rows_at_1k_for_each_launch_kind():
    """The GPU bounds of "What must be shown", from the batch-1 and batch-32 rows at 1k context: the
    tokens/s bound by the GPU's name (H200: 1,300), each kind of launch apart, a failed part failed."""
    from trtllm_dflash.bench.step_results import Ceilings, StepBenchmark, issue_bounds, markdown

    one = _bounds_row(1, 5.0, (1.0, 3.96, 0.04), 0.08, other=0.9)  # DFlash step 5.0 ms: 1,300 tok/s at tau 6.5
    many = _bounds_row(32, 6.6, (3.3, 15.0, 0.08), 0.6, other=0.8)
    result = StepBenchmark(gpu_step.QWEN3_8B, "NVIDIA H200", Ceilings(4.2e12, 7.6e14), "dflash", [one, many])
    ran = {b.name: b for b in issue_bounds(result)}
    assert abs(ran["tok/s at tau 6.5, batch 1 (H200)"].value - 1300) < 1e-6 and ran["tok/s at tau 6.5, batch 1 (H200)"].met
    assert ran["DFlash step / AR step, batch 1"].value == 1.0 and ran["DFlash step / AR step, batch 1"].met
    assert abs(ran["AR step, % of its floor, batch 1"].value - 72) < 1e-9 and not ran["AR step, % of its floor, batch 1"].met
    assert ran["top-k+top-p verification, ms, batch 1"].met and not ran["top-k+top-p verification, ms, batch 32"].met
    other = {b.name: b for b in issue_bounds(result, ", other launches")}
    assert other["AR step, % of its floor, batch 1"].met and other["top-k+top-p verification, ms, batch 32"].met  # 0.48 ms
    table = markdown(result).split("Issue 39's bounds")[1]
    assert "| bound | limit | ordinary launches | dependent launches |" in table
    assert "| AR step, % of its floor, batch 1 | >= 75 | 72 (not met) | 80 (met) |" in table
    h100 = StepBenchmark(gpu_step.QWEN3_8B, "NVIDIA H100 80GB HBM3", result.ceilings, "dflash", [one])
    assert issue_bounds(h100)[0].limit == 900 and len(issue_bounds(h100)) == 4  # no batch-32 row: its bounds left out
    one.parts["draft"] = dataclasses.replace(one.parts["draft"], ms=math.nan, how="failed")
    assert "| DFlash step / AR step, batch 1 | <= 1.35 | failed | 1 (met) |" in markdown(result)
    one.parts["ar"] = dataclasses.replace(one.parts["ar"], ms=math.nan, how="failed")
    assert "| AR step, % of its floor, batch 1 | >= 75 | failed | 80 (met) |" in markdown(result)
    elsewhere = StepBenchmark(gpu_step.TINY, "cpu", result.ceilings, "dflash", [_bounds_row(1, 5.0, (1, 1, 1), 1, other=None)])
    assert "tok/s" not in "".join(b.name for b in issue_bounds(elsewhere)) and "| as run |" in markdown(elsewhere)


def test_the_floors_count_qwen3_8b_as_the_issue_does():
    """15.14 GB of target weights per step (36 layers + LM head, bf16) and the K/V a 1k context reads."""
    from trtllm_dflash.bench.gpu_step import QWEN3_8B, Floors

    layer = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 12288 + 2 * 4096 + 2 * 128  # q,k,v,o, MLP, norms
    params = 36 * layer + 4096 + 151936 * 4096
    floors = Floors(QWEN3_8B, target_weight_bytes=2 * params, target_params=params, draft_weight_bytes=0, draft_params=0, element=2)
    moved, flops = floors.target_pass(batch=1, context=1024, tokens=1)
    assert abs(2 * params / 1e9 - 15.14) < 0.02
    assert moved - 2 * params == 36 * 2 * 8 * 128 * 2 * 1024 + 151936 * 2
    assert flops > 2 * params


def test_the_measured_attention_choice_is_reported_with_every_candidate(tmp_path):
    """`--attention-choice measure` (the GPU run's): the runtime times the candidates per batch bucket
    and the table lists them (here flash is refused: no CUDA)."""
    out = tmp_path / "step.md"
    args = ["--tiny", "--device", "cpu", "--batches", "2", "--contexts", "24", "--repeats", "2", "--loop-contexts", "", "--out", str(out)]
    assert _script().main([*args, "--attention-choice", "measure"]) == 0
    choices = json.loads(out.with_suffix(".json").read_text())["kernel_choices"]
    assert "by measurement" in choices
    for tokens in (1, gpu_step.TINY.block):
        for batch in (1, 2):
            line = next(x for x in choices.splitlines() if f"T={tokens} b<={batch}:" in x)
            assert "dflash " in line and "sdpa " in line and "flash: flash attention needs CUDA" in line
    assert choices in out.read_text()


def test_dependent_launches_both_times_each_pass_twice_and_tabulates_them(tmp_path):
    """`--dependent-launch both` (the GPU window's measured step): each row's AR, verify and draft
    passes and its verifications are timed again with the other launch kind, and the table sets the
    two side by side, with the DFlash step each way; without the flag, no such table."""
    out = tmp_path / "step.md"
    args = ["--tiny", "--device", "cpu", "--batches", "1,2", "--contexts", "24", "--repeats", "2", "--loop-contexts", "", "--out", str(out)]
    assert _script().main([*args, "--dependent-launch", "both"]) == 0
    text = out.read_text()
    table = text[text.index("Ordinary launches -> programmatic dependent launches") :].split("\n\n")[1].splitlines()
    assert [line.split(" | ")[:2] for line in table[2:]] == [["| 1", "24"], ["| 2", "24"]]
    assert all(line.count(" -> ") == 6 for line in table[2:])
    without = tmp_path / "plain.md"
    assert _script().main([*args[:-1], str(without)]) == 0
    assert "programmatic dependent launches" not in without.read_text()


def test_the_profile_splits_each_pass_into_kernel_kinds(tmp_path):
    """`--profile`: each profiled pass's kernels add up to its kernel time, kind by kind, and the table
    shows them beside the in-graph time (on a CPU the profiler sees aten ops)."""
    out = tmp_path / "step.md"
    args = ["--tiny", "--device", "cpu", "--batches", "1", "--contexts", "24", "--repeats", "2", "--loop-contexts", "", "--profile"]
    assert _script().main([*args, "--out", str(out)]) == 0
    row = json.loads(out.with_suffix(".json").read_text())["rows"][0]
    assert [p["name"] for p in row["profiles"]] == ["AR pass", "verify pass", "draft pass"]
    for profile in row["profiles"]:
        kernels = [gpu_step.pass_profile.Kernel(**k) for k in profile["kernels"]]
        assert kernels and all(k.ms > 0 and k.launches > 0 for k in kernels)
        built = gpu_step.pass_profile.PassProfile(profile["name"], profile["graph_ms"], tuple(kernels), profile["weight_bytes"])
        assert abs(sum(ms for _, ms in built.by_kind().values()) - built.kernel_ms) < 1e-9
        assert built.by_kind()["GEMM"][1] > 0  # the projections are matmuls on any device
    assert "| AR pass |" in out.read_text() and "Heaviest kernels of the verify pass" in out.read_text()


def test_kernel_kinds_from_the_names_a_gpu_profile_shows():
    from trtllm_dflash.bench.pass_profile import kind_of

    names = {
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel": "GEMM",
        "nvjet_tst_64x8_64x16_4x1_v_bz_splitK_TNT": "GEMM",
        "void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, 128, 16, 4, 4, false, false>": "GEMM",
        "target_attention_split_kernel": "attention",
        "merge_partials_kernel": "attention",
        "void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>": "attention",
        "add_rms_norm_kernel": "norm/rope/act",
        "qk_norm_rope_kernel": "norm/rope/act",
        "silu_mul_kernel": "norm/rope/act",
        "Memcpy DtoD (Device -> Device)": "copy/fill",
        "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel>": "copy/fill",
        "verify_commit_kernel": "other",
    }
    assert {name: kind_of(name) for name in names} == names


def test_the_gpu_window_runs_each_of_its_commands_through_in_tiny_mode(tmp_path):
    """benchmarks/gpu_window.sh on a CPU, each command with its own flags as the window gives them
    and the tiny model's sizes added last (argparse keeps the last), through an interpreter that
    appends them: every run exits 0 with every part measured, so a flag combination the window
    uses cannot first break on the GPU."""
    import os
    import subprocess
    import sys

    script = SCRIPT.parent / "gpu_window.sh"
    tiny = "--tiny --device cpu --batches 2 --contexts 24 --loop-contexts 24 --repeats 2 --loop-steps 8"
    shim = tmp_path / "python"
    shim.write_text(f'#!/usr/bin/env bash\nexec "{sys.executable}" "$@" {tiny}\n')
    shim.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "PYTHON": str(shim)}
    subprocess.run(["bash", str(script)], cwd=SCRIPT.parents[1], env=env, check=True, capture_output=True, timeout=600)
    runs = ("step_measured", "step")
    assert (out / "summary.txt").read_text().splitlines() == [f"{name}: exit 0" for name in runs]
    for name in runs:
        result = json.loads((out / f"{name}.json").read_text())
        assert [(r["batch"], r["context"]) for r in result["rows"]] == [(2, 24)]
        parts = result["rows"][0]["parts"]
        assert all(part["how"] != "failed" and part["ms"] > 0 for part in parts.values()), (out / f"{name}.log").read_text()
    measured = (out / "step_measured.md").read_text()
    assert "by measurement" in measured and "programmatic dependent launches" in measured and "Heaviest kernels" in measured


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the stop where no GPU is; this machine has one")
def test_without_a_gpu_the_full_depth_run_stops_in_one_line(capsys):
    assert _script().main(["--repeats", "10"]) == 2
    assert capsys.readouterr().err.strip() == (
        "bench_gpu_step: no CUDA device here; the full-depth benchmark needs one (use --tiny to run the code path on CPU)"
    )


def test_the_gpu_window_tests_exist(tmp_path):
    """`gpu_window.sh tests` names test files and node ids; a renamed test would cost a GPU window
    its run (pytest stops at a missing one). COLLECT_ONLY=1 collects them all, on any machine."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "COLLECT_ONLY": "1"}
    subprocess.run(["bash", str(SCRIPT.parent / "gpu_window.sh"), "tests"], cwd=SCRIPT.parents[1], env=env, check=True, timeout=300)
    assert (tmp_path / "summary.txt").read_text().splitlines() == ["collect: exit 0"]
    assert "test_dependent_launch_gpu.py::" in (tmp_path / "collect.log").read_text()

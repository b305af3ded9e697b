"""`dflash-trt selftest --gpu` (`make gpu-check`), the parts that run without a GPU.

On CPU: the one-line refusal, step orchestration (a failing step does not stop the others, exit
status), the report and its tables, TensorRT detection, the pytest step's plumbing, the
Qwen3-8B-shaped builders' shapes (on the meta device), and the decode measurement's bookkeeping
with a re-running stand-in for CUDA graphs. The GPU steps themselves only run on a GPU.
"""

from __future__ import annotations

import dataclasses
import textwrap
import time
from pathlib import Path

import pytest
import torch

from trtllm_dflash.bench import decode, kernels
from trtllm_dflash.checks import selftest

ENV = selftest.GpuEnvironment(
    gpu="NVIDIA H100 80GB HBM3",
    compute_capability="9.0",
    sm_count=132,
    memory_gib=79.2,
    driver="570.86.15",
    cuda="12.8",
    torch="2.9.0+cu128",
    triton="3.5.0",
    tensorrt=None,
    host="gpu-box",
    date="2026-11-23 10:00 UTC",
)


# ------------------------------------------------------------------------------ command line


def test_the_tensorrt_step_runs_the_command_line_the_console_script_runs():
    """selftest names the CLI's module as a string (importing it would loop): it must be the console
    script's, and runnable with `python -m`."""
    import importlib
    import tomllib

    scripts = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["dflash-trt"] == f"{selftest.CLI_MODULE}:main"
    assert 'if __name__ == "__main__":' in Path(importlib.import_module(selftest.CLI_MODULE).__file__).read_text()


def test_without_a_gpu_it_refuses_in_one_line_and_writes_nothing(run_main, tmp_path):
    out = tmp_path / "RESULTS.md"
    code, stdout, stderr = run_main("selftest", "--gpu", "--out", str(out))
    assert code == 2
    assert "no CUDA device is visible" in stderr
    assert len(stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_selftest_needs_the_gpu_flag(run_main):
    code, _, stderr = run_main("selftest")
    assert code == 2 and "--gpu" in stderr and len(stderr.strip().splitlines()) == 1


def _fake_steps(calls: list[str]):
    def ok(name):
        def run():
            calls.append(name)
            return selftest.StepOutcome(f"{name} fine", f"table of {name}\n")

        return run

    def broken():
        calls.append("broken")
        raise RuntimeError("kernel exploded\nsecond line")

    def skipped():
        calls.append("skipped")
        raise selftest.SkipStep("TensorRT is not installed")

    def disagrees():
        calls.append("disagrees")
        return selftest.StepOutcome("graphs changed the tokens", passed=False)

    return [
        selftest.Step("first", ok("first")),
        selftest.Step("broken", broken),
        selftest.Step("skipped", skipped),
        selftest.Step("disagrees", disagrees),
        selftest.Step("last", ok("last")),
    ]


def test_a_failing_step_does_not_stop_the_others():
    calls: list[str] = []
    results = selftest.run_steps(_fake_steps(calls))
    assert calls == ["first", "broken", "skipped", "disagrees", "last"]
    assert [r.status for r in results] == ["pass", "fail", "skip", "fail", "pass"]
    assert results[1].summary == "RuntimeError: kernel exploded"
    assert "Traceback" in results[1].error and "kernel exploded" in results[1].error
    assert results[2].summary == "TensorRT is not installed"
    assert all(r.seconds >= 0 for r in results)
    assert selftest.any_failed(results)
    assert not selftest.any_failed([r for r in results if r.status != "fail"])


def test_the_command_runs_every_step_appends_the_section_and_exits_1(run_main, monkeypatch, tmp_path):
    calls: list[str] = []
    monkeypatch.setattr(selftest, "require_cuda", lambda: None)
    monkeypatch.setattr(selftest, "gpu_environment", lambda: ENV)
    monkeypatch.setattr(selftest, "gpu_steps", lambda env, budget, say: _fake_steps(calls))
    out = tmp_path / "RESULTS.md"
    out.write_text("# Benchmark results\n\nearlier sections\n")
    code, stdout, _ = run_main("selftest", "--gpu", "--quick", "--out", str(out))
    assert code == 1
    assert calls == ["first", "broken", "skipped", "disagrees", "last"]
    assert "TensorRT is not installed" in stdout and "results appended to" in stdout
    text = out.read_text()
    assert text.startswith("# Benchmark results\n\nearlier sections\n\n## GPU check on NVIDIA H100 80GB HBM3")
    assert "`dflash-trt selftest --gpu --quick --out" in text
    assert "| broken | fail |" in text and "| skipped | skip |" in text and "| last | pass |" in text
    assert "### first\n\ntable of first" in text


def test_the_command_exits_0_when_nothing_failed(run_main, monkeypatch, tmp_path):
    monkeypatch.setattr(selftest, "require_cuda", lambda: None)
    monkeypatch.setattr(selftest, "gpu_environment", lambda: ENV)
    steps = [s for s in _fake_steps([]) if s.name in ("first", "skipped")]
    monkeypatch.setattr(selftest, "gpu_steps", lambda env, budget, say: steps)
    code, _, _ = run_main("selftest", "--gpu", "--out", str(tmp_path / "new" / "RESULTS.md"))
    assert code == 0
    assert (tmp_path / "new" / "RESULTS.md").read_text().startswith("## GPU check on")


def test_step_runs_only_the_named_steps_in_order(run_main, monkeypatch, tmp_path):
    """`--step` splits the check into calls of a few minutes each."""
    calls: list[str] = []
    monkeypatch.setattr(selftest, "require_cuda", lambda: None)
    monkeypatch.setattr(selftest, "gpu_environment", lambda: ENV)
    keys = ("warmup", "kernels", "tests", "decode-qwen3-8b", "decode-demo")
    keyed = [dataclasses.replace(s, key=key) for s, key in zip(_fake_steps(calls), keys)]
    monkeypatch.setattr(selftest, "gpu_steps", lambda env, budget, say: keyed)
    out = tmp_path / "RESULTS.md"
    code, _, _ = run_main("selftest", "--gpu", "--step", "decode-demo", "--step", "tests", "--out", str(out))
    assert code == 0
    assert calls == ["first", "skipped", "last"]  # the check's order, not the command line's; the tests bring the warm-up
    assert "--step decode-demo --step tests" in out.read_text()


def test_an_unknown_step_is_refused_before_the_gpu_is_looked_for(run_main, tmp_path):
    code, _, stderr = run_main("selftest", "--gpu", "--step", "kernel", "--out", str(tmp_path / "R.md"))
    assert code == 2 and len(stderr.strip().splitlines()) == 1
    assert "unknown GPU check step kernel" in stderr and "tests, kernels, choices, decode-demo" in stderr
    assert not (tmp_path / "R.md").exists()


def test_the_kernel_choice_step_reports_every_pick_and_fails_on_a_refusal(monkeypatch):
    """Here (no CUDA) flash attention and the spread verification are refused: the step names them
    and fails, as it would on a GPU where a candidate computed something else."""
    from trtllm_dflash.runtime import attention_choice

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    layer = attention_choice.LayerShape(heads=4, kv_heads=2, head_dim=16, value_dim=16)
    outcome = selftest.kernel_choice_step(
        selftest.QUICK, lambda text: None, device="cpu", layer=layer, vocab=300, capacity=80, projections=((48, 32),)
    )
    assert not outcome.passed
    assert (
        "T=1 b1 " in outcome.summary
        and "T=16 b8 " in outcome.summary
        and "verify b1 top-k positions" in outcome.summary
        and ", b1 other positions" in outcome.summary
    )
    assert "flash: flash attention needs CUDA" in outcome.summary and "spread: the verification kernels run on CUDA" in outcome.summary
    assert "rows 16 48x32 skinny: needs CUDA" in outcome.summary and "projections rows 1 48x32 torch" in outcome.summary
    assert "by measurement" in outcome.markdown and "decode-pass projections, by measurement" in outcome.markdown


def test_every_step_has_the_key_the_command_line_accepts():
    steps = selftest.gpu_steps(ENV, selftest.QUICK, lambda text: None)
    assert tuple(step.key for step in steps) == selftest.STEP_KEYS


# ------------------------------------------------------------------------------------ report


def test_section_names_the_machine_and_every_step():
    results = [
        selftest.StepResult("GPU tests", "pass", 61.2, "45 passed", "`pytest -q ...`: 45 passed.\n"),
        selftest.StepResult("TensorRT engines", "skip", 0.0, "TensorRT is not installed | really"),
    ]
    text = selftest.format_section(ENV, results, "dflash-trt selftest --gpu --out benchmarks/RESULTS.md", 412.4)
    assert text.startswith("## GPU check on NVIDIA H100 80GB HBM3, 2026-11-23 10:00 UTC\n")
    for fact in ("driver 570.86.15", "CUDA 12.8", "torch 2.9.0+cu128", "triton 3.5.0", "TensorRT not installed", "132 SMs", "412 s"):
        assert fact in text
    assert "no step failed" in text
    assert "| GPU tests | pass | 61.2 s | 45 passed |" in text
    assert "| TensorRT engines | skip | 0.0 s | TensorRT is not installed / really |" in text  # no broken table cell
    assert "### GPU tests" in text and "### TensorRT engines" not in text


def _attention(context, batch, ours, floor, sdpa):
    return kernels.AttentionResult(kernels.AttentionShape("qwen3-8b drafter", batch, context), 4, ours, floor, sdpa)


def test_kernel_tables_and_goals():
    result = kernels.KernelBenchmark(
        bandwidth=3.0e12,
        attention=[_attention(1024, 1, 0.020, 0.010, 0.030), _attention(8192, 8, 0.100, 0.080, 0.090)],
        verify=[kernels.VerifyResult(kernels.VerifyShape(8, "greedy"), 0.050, 0.040, True)],
    )
    text = kernels.kernel_tables(result)
    assert "3000 GB/s" in text
    assert "| qwen3-8b drafter | 32 / 8 / 128 | 16 | 4 | 1024 | 1 | 4 | 0.0200 | 0.0100 | 50% | 0.0300 | 1.50x |" in text
    assert "| float32 | greedy | 16 | 151936 | 8 | 0.0500 | 0.0400 | 80% | yes |" in text
    goals = kernels.goal_lines(result)
    assert goals[0].startswith(">= 70% of the bandwidth floor: MISSED at 2 of 3 shapes")
    assert "qwen3-8b drafter context 1024 batch 1 (50%)" in goals[0]
    assert goals[1].startswith("attention faster than torch SDPA: MISSED at 1 of 2 shapes")
    assert "context 8192 batch 8 (0.90x)" in goals[1]
    assert result.all_equal_to_reference
    assert "attention 2 shapes at 50%-80% of floor" in kernels.summary_line(result)


def test_target_attention_rows_and_goals():
    from trtllm_dflash.ops.kernels import attention_traffic

    shape = attention_traffic.TARGET_ATTENTION_BENCH_SHAPES[0]
    result = kernels.KernelBenchmark(3.0e12, [], [], [kernels.TargetAttentionResult(shape, 0.010, 0.008, 0.009)])
    text = kernels.kernel_tables(result)
    assert (
        f"| {shape.name} | 32 / 8 / 128 | 16 | 1024 | 1 | 1 | 0.0100 | - | "
        f"{shape.bytes_moved() / 1e6:.1f} | 0.0080 | 80% | - | 0.0090 | 0.90x |" in text
    )
    goals = kernels.goal_lines(result)
    assert goals[0].startswith(">= 70% of the bandwidth floor: met at 1 of 1 shapes")
    assert goals[1].startswith("attention faster than torch SDPA: MISSED at 0 of 1 shapes") and f"target {shape.name} (0.90x)" in goals[1]


def test_benchmarked_shapes_are_plain_data():
    assert len(kernels.ATTENTION_SHAPES) == 9 and len(kernels.VERIFY_SHAPES) == 18
    assert set(kernels.QUICK_ATTENTION_SHAPES) < set(kernels.ATTENTION_SHAPES)
    assert {(s.heads, s.kv_heads, s.head_dim, s.block) for s in kernels.ATTENTION_SHAPES} == {(32, 8, 128, 16)}


def _decoded(batch, speculative, graphs, seconds, tau, same=None):
    return decode.DecodeResult("demo", batch, speculative, graphs, 8, 1024, seconds, tau, same_as_eager=same)


def test_decode_table_compares_dflash_with_ar_and_graphs_with_eager():
    results = [
        _decoded(1, False, False, 4.0, 1.0),
        _decoded(1, False, True, 2.0, 1.0, same=True),
        _decoded(1, True, False, 2.0, 3.6),
        _decoded(1, True, True, 0.8, 3.6, same=False),
    ]
    table = decode.decode_table(results)
    assert "| 1 | AR | - | off | 1024 | 256.0 | 1.00 | 1.00x | - | - |" in table
    assert "| 1 | AR | - | on | 1024 | 512.0 | 1.00 | 1.00x | 2.00x | yes |" in table
    assert "| 1 | DFlash | - | on | 1024 | 1280.0 | 3.60 | 2.50x | 2.50x | NO |" in table
    summary = decode.decode_summary(results)
    assert summary == "batch 1: DFlash/AR 2.50x with graphs (2.00x without), graphs AR 2.00x, DFlash 2.50x, tau 3.60"
    outcome = selftest._decode_outcome(results, "note")
    assert not outcome.passed and "CUDA graphs changed the tokens of: DFlash batch 1" in outcome.summary
    # the run on transformers' attention beside the op's is reported, and its tokens are informational
    hf = _decoded(1, True, False, 2.5, 3.6, same=False)
    hf.attention, hf.variant = "hf", "hf attention"
    results = [*results[:3], hf]
    assert "| 1 | DFlash (hf attention) | hf | off | 1024 | 409.6 | 3.60 | 1.60x | - | NO |" in decode.decode_table(results)
    assert selftest._decode_outcome(results, "note").passed
    assert decode.decode_summary(results).startswith("batch 1: DFlash/AR - with graphs (2.00x without)")


# ----------------------------------------------------------------------------------- steps


def test_tensorrt_absence_is_detected_and_skips_with_the_reason(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorrt" else real(name, *a))
    assert selftest.tensorrt_version() is None
    with pytest.raises(selftest.SkipStep, match="TensorRT is not installed"):
        selftest.tensorrt_step(ENV, lambda text: None)


def test_pytest_counts_are_read_from_the_closing_line():
    assert selftest.parse_pytest_counts("....\n3 passed, 1 failed, 2 skipped in 4.20s\n") == {"passed": 3, "failed": 1, "skipped": 2}
    assert selftest.parse_pytest_counts("== 1 error in 0.1s ==") == {"error": 1}
    assert selftest.parse_pytest_counts("no summary") == {}


def test_gpu_tests_step_runs_pytest_and_names_failures(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_fake_gpu.py").write_text(
        textwrap.dedent("""
        def test_fine():
            pass

        def test_broken_with_a_name_long_enough_that_pytest_cuts_its_summary_line_before_the_message():
            assert 1 == 2
    """)
    )
    (tmp_path / "tests" / "test_other.py").write_text("def test_not_collected():\n    raise SystemExit\n")
    outcome = selftest.gpu_tests_step(tmp_path)
    assert not outcome.passed
    assert "1 failed" in outcome.summary and "1 passed" in outcome.summary
    name = "tests/test_fake_gpu.py::test_broken_with_a_name_long_enough_that_pytest_cuts_its_summary_line_before_the_message"
    # the message survives however long the name: the GPU run of 2026-11-26 reported a failure without it
    assert f"FAILED {name}: assert 1 == 2" in outcome.summary
    assert "The tests that failed" in outcome.markdown and "failed: assert 1 == 2" in outcome.markdown


def test_gpu_tests_step_says_each_test_as_it_finishes_and_lists_the_slowest(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_fake_gpu.py").write_text(
        textwrap.dedent("""
        import time

        import pytest

        def test_quick():
            pass

        def test_slower():
            time.sleep(0.3)

        def test_skipped():
            pytest.skip("needs a GPU")
    """)
    )
    said: list[str] = []
    outcome = selftest.gpu_tests_step(tmp_path, say=said.append)
    assert outcome.passed
    assert [line.split(" (")[0] for line in said] == [
        "passed tests/test_fake_gpu.py::test_quick",
        "passed tests/test_fake_gpu.py::test_slower",
        "skipped tests/test_fake_gpu.py::test_skipped",
    ]
    assert "slowest: tests/test_fake_gpu.py::test_slower (0." in outcome.summary
    rows = [line for line in outcome.markdown.splitlines() if line.startswith("| `")]
    assert rows[0].startswith("| `tests/test_fake_gpu.py::test_slower` | passed | 0.")  # slowest first


def _state(pid: int) -> str:
    """A process's state letter from /proc ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return ""


def test_gpu_tests_stopped_at_the_limit_list_what_finished_and_what_was_running(tmp_path):
    """The real pytest and plugin on a generated file whose fourth test sleeps past the limit."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_slow_gpu.py").write_text(
        textwrap.dedent(f"""
        import subprocess
        import time
        from pathlib import Path

        import pytest

        def test_quick():
            pass

        def test_broken():
            assert 1 == 2

        def test_skipped():
            pytest.skip("needs a GPU")

        def test_hangs():
            child = subprocess.Popen(["sleep", "300"])  # something pytest started, stopped with it
            Path({str(tmp_path / "child.pid")!r}).write_text(str(child.pid))
            time.sleep(300)

        def test_never_reached():
            pass
    """)
    )
    said: list[str] = []
    outcome = selftest.gpu_tests_step(tmp_path, say=said.append, limit_s=10)
    assert not outcome.passed
    summary = outcome.summary
    assert summary.startswith("pytest stopped at its 10 s limit: 3 of 5 finished: 1 passed, 1 failed, 1 skipped;")
    assert "running when stopped: tests/test_slow_gpu.py::test_hangs (running for " in summary
    assert "failed: tests/test_slow_gpu.py::test_broken" in summary and "test_never_reached" not in summary
    assert [line.split(" (")[0] for line in said] == [
        "passed tests/test_slow_gpu.py::test_quick",
        "failed tests/test_slow_gpu.py::test_broken",
        "skipped tests/test_slow_gpu.py::test_skipped",
    ]
    rows = [line for line in outcome.markdown.splitlines() if line.startswith("| `")]
    assert len(rows) == 4
    assert rows[0].startswith("| `tests/test_slow_gpu.py::test_quick` | passed | ") and rows[0].endswith(" s |")
    assert rows[1].startswith("| `tests/test_slow_gpu.py::test_broken` | failed: ") and "assert 1 == 2" in rows[1]
    assert rows[3].startswith("| `tests/test_slow_gpu.py::test_hangs` | **stopped while running** | ")
    child = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 10  # SIGKILL reaches the orphaned child asynchronously: it is briefly "R" while dying
    while _state(child) not in ("", "Z") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _state(child) in ("", "Z")  # the whole process group was stopped


def test_a_progress_line_cut_short_by_the_kill_is_ignored(tmp_path):
    from trtllm_dflash.checks import runs

    path = tmp_path / "progress.jsonl"
    path.write_text(
        '{"event": "collected", "count": 2}\n{"event": "start", "test": "a", "time": 1.0}\n'
        '{"event": "finish", "test": "a", "outcome": "passed", "seconds": 0.5}\n'
        '{"event": "start", "test": "b", "time": 2.0}\n{"event": "fin'
    )
    progress = runs.read_progress(path)
    assert progress.collected == 2 and progress.running == {"b": 2.0}
    assert progress.finished == [runs.TestRecord("a", "passed", 0.5)]
    assert runs.counts_text(progress) == "1 of 2 finished: 1 passed"


def test_gpu_tests_step_skips_without_a_tests_folder(tmp_path):
    with pytest.raises(selftest.SkipStep, match="no GPU test files"):
        (tmp_path / "tests").mkdir()
        selftest.gpu_tests_step(tmp_path)


# --------------------------------------------------------------------- Qwen3-8B-shaped builders


def test_qwen3_8b_shaped_pair_has_the_full_width_on_the_meta_device():
    from trtllm_dflash.checkpoints import validate_pair
    from trtllm_dflash.testing.qwen3_8b_shaped import make_qwen3_8b_shaped_drafter, make_qwen3_8b_shaped_target

    target = make_qwen3_8b_shaped_target()  # meta: no memory
    drafter = make_qwen3_8b_shaped_drafter(target.config)
    config = target.config
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size, config.vocab_size) == (2, 4096, 12288, 151936)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (32, 8, 128)
    shapes = {name: tuple(p.shape) for name, p in target.named_parameters()}
    assert shapes["model.embed_tokens.weight"] == shapes["lm_head.weight"] == (151936, 4096)  # untied, as Qwen3-8B
    assert shapes["model.layers.1.self_attn.q_proj.weight"] == (4096, 4096)
    assert shapes["model.layers.1.self_attn.k_proj.weight"] == (1024, 4096)
    assert shapes["model.layers.1.mlp.down_proj.weight"] == (4096, 12288)
    assert all(p.device.type == "meta" and p.dtype == torch.bfloat16 for p in target.parameters())
    assert 1.6e9 < sum(p.numel() for p in target.parameters()) < 1.7e9
    validate_pair(config, drafter.config)
    assert drafter.config.block_size == 16 and drafter.config.mask_token_id == 151669
    assert drafter.config.target_layer_ids == (0, 1)
    assert tuple(drafter.fc.weight.shape) == (4096, 2 * 4096)
    assert tuple(drafter.layers[0].mlp.gate_proj.weight.shape) == (12288, 4096)
    assert torch.get_default_dtype() == torch.float32  # the builders restore it


# ---------------------------------------------------------------------- decode bookkeeping


def test_measure_decode_compares_graphs_with_eager_and_leaves_no_hooks(rerun_graphs, tiny_qwen3, tiny_qwen3_drafter):
    """On CPU with the re-running stand-in for a CUDA graph (conftest.rerun_graphs)."""
    from trtllm_dflash.checkpoints import load_drafter, load_target

    target = load_target(tiny_qwen3, dtype=torch.float32)
    drafter = load_drafter(tiny_qwen3_drafter, target=target)
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
    results = decode.measure_decode("tiny", target.model, drafter, prompts, batches=(1, 2), max_new_tokens=12, repeats=1)
    assert [(r.batch, r.mode, r.cuda_graphs) for r in results] == [
        (b, mode, graphs) for b in (1, 2) for mode in ("AR", "DFlash") for graphs in (False, True)
    ]
    assert all(r.tokens == 36 and r.seconds > 0 for r in results)
    assert [r.same_as_eager for r in results if r.cuda_graphs] == [True] * 4
    assert all(r.tau == 1.0 for r in results if not r.speculative)
    assert all(not layer._forward_hooks for layer in target.model.model.layers)


# ------------------------------------------------------------------------------- kernel warm-up


def _parametrized_grid(test) -> set[tuple]:
    """Every parameter combination a test function's @pytest.mark.parametrize marks produce."""
    import itertools

    grids = []
    for mark in reversed(test.pytestmark):  # marks are stored nearest-the-function first: top decorator first here
        if mark.name == "parametrize":
            names, values = mark.args
            grids.append([v if len(names.split(",")) > 1 else (v,) for v in values])
    return {tuple(p for part in combo for p in part) for combo in itertools.product(*grids)}


def test_warmup_launches_exactly_the_gpu_tests_kernel_grids():
    """The warm-up's grids are test_plugin_gpu.py's: if the tests gain a variant, so must the warm-up."""
    import importlib.util

    from trtllm_dflash.checks import warmup

    spec = importlib.util.spec_from_file_location("plugin_gpu_tests", Path(__file__).parent / "test_plugin_gpu.py")
    tests = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tests)
    cases = warmup.warmup_cases()
    as_test_params = {
        op: {(getattr(torch, c.params[0]), *c.params[1:]) for c in cases if c.op == op} for op in ("block_attention", "target_attention")
    }
    block = _parametrized_grid(tests.test_block_attention_on_gpu)  # (dtype, heads, kv_heads, head_dim, kv_splits, window)
    target = _parametrized_grid(tests.test_target_attention_on_gpu)
    assert as_test_params["block_attention"] == block and len(block) == 36
    assert as_test_params["target_attention"] == target and len(target) == 60
    assert [c.params for c in cases if c.op == "verify"] == [("float32", 8, 16, 151936)]
    assert len({c.name for c in cases}) == len(cases) == 97


def test_warmup_cases_launch_the_ops_with_arguments_they_accept():
    """Three cases through the real ops on CPU (interpreted kernels, the verification reference):
    the arguments the warm-up builds are the ones the ops take. On a GPU they compile."""
    from trtllm_dflash.checks import warmup

    cases = {c.name: c for c in warmup.warmup_cases()}
    for name in (
        "block_attention[float32-16-16-64-1-40]",
        "target_attention[float32-16-16-128-64-1-128-True]",
        "verify[float32-8-16-151936]",
    ):
        warmup.launch_case(cases[name], device="cpu")


def test_a_warmup_worker_logs_every_case_and_goes_on_after_one_raises(monkeypatch, tmp_path):
    from trtllm_dflash.checks import runs, warmup
    from trtllm_dflash.checks.progress import PROGRESS_ENV

    monkeypatch.setenv(PROGRESS_ENV, str(tmp_path / "progress.jsonl"))
    cases = warmup.warmup_cases()[:3]

    def launch(case):
        if case is cases[1]:
            raise RuntimeError("out of resource: shared memory, Required: 262144, Hardware limit: 232448\nmore")

    warmup.run_worker(cases, launch)
    progress = runs.read_progress(tmp_path / "progress.jsonl")
    assert progress.collected == 3 and not progress.running
    assert [(r.test, r.outcome) for r in progress.finished] == [(c.name, o) for c, o in zip(cases, ("passed", "failed", "passed"))]
    assert progress.finished[1].error == "RuntimeError: out of resource: shared memory, Required: 262144, Hardware limit: 232448"


def test_the_warmup_runs_its_worker_processes_and_reports_what_they_did(tmp_path):
    """The real worker subprocesses on this CPU machine: every launch raises (no CUDA device), each
    is logged and reported, and the step passes (the GPU tests report kernel failures themselves)."""
    from trtllm_dflash.checks import warmup

    said: list[str] = []
    run = warmup.run_warmup(tmp_path, said.append, workers=2)
    assert run.returncodes == [0, 0] and not run.timed_out
    assert run.progress.collected == 97 and len(run.progress.finished) == 97
    assert {r.outcome for r in run.progress.finished} == {"failed"} and len(said) == 97
    summary, markdown, passed = warmup.warmup_report(run, workers=2)
    assert passed
    assert summary.startswith("97 kernel launches of tests/test_plugin_gpu.py in 2 processes, ")
    assert "; 97 raised (the GPU tests report them): block_attention[bfloat16-32-8-128-1-0] " in summary
    assert "Launches that raised:" in markdown and markdown.count("| `") == 5 + 97  # the slowest five, then every one that raised

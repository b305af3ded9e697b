"""`dflash-trt build` planning and bad inputs: fast, no torch in the child processes, nothing downloaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import one_error_line, run_cli

from trtllm_dflash.builder import stages as stage_mod
from trtllm_dflash.builder.stages import Stage, StageBlocked, StageRunner
from trtllm_dflash.errors import DFlashError


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_cli(*args, env=env)


# ----------------------------------------------------------------------------- plan


def test_dry_run_gpt_oss_on_b300_is_a_complete_trtllm_plan():
    result = cli("build", "--model", "gpt-oss-120b", "--gpu", "b300", "--dry-run", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["recipe"]["name"] == "gpt-oss-120b/b300"
    deployment = plan["deployment"]
    assert deployment["ok"] and deployment["backend"] == "trtllm"
    assert deployment["layout"] == {"num_gpus": 8, "tp": 8, "ep": 8, "attention_dp": False}
    assert deployment["precision"]["kv_cache"] == "fp8" and deployment["precision"]["experts"] == "mxfp4"
    assert deployment["max_concurrency"] > 0
    names = [s["name"] for s in plan["stages"]]
    assert names == ["checkpoints", "quantize", "trtllm", "repository"]  # no engines for the trtllm backend
    checkpoints = plan["stages"][0]
    assert not checkpoints["runs_here"] and "hf download" in checkpoints["where"]  # offline: says how, downloads nothing
    # the human-readable plan names the stages and where they run
    text = cli("build", "--model", "gpt-oss-120b", "--gpu", "b300", "--dry-run")
    assert text.returncode == 0
    for needle in ("gpt-oss-120b", "tp 8, ep 8", "trtllm", "llm_api.yaml", "max concurrency", "quantize", "repository"):
        assert needle in text.stdout, needle


def test_dry_run_for_every_shipped_engine_recipe():
    from trtllm_dflash.builder.spec import resolve_spec
    from trtllm_dflash.builder.stage_plan import make_build_plan
    from trtllm_dflash.recipes import list_recipes

    built = 0
    for recipe in list_recipes():
        if recipe.backend == "torch":
            with pytest.raises(DFlashError, match="needs no build"):
                resolve_spec(recipe=recipe.path)
            continue
        plan = make_build_plan(resolve_spec(recipe=recipe.path))
        names = [s.name for s in plan.stages]
        assert names[:2] == ["checkpoints", "quantize"]
        assert ("engines" in names) == (recipe.backend == "trt")
        for stage in plan.stages:  # here a stage may wait for a GPU or a download, never for a missing feature
            assert stage.runs_here or any(need in stage.where for need in MACHINE_NEEDS), (recipe.name, stage)
            assert not any(word in stage.where for word in ("not implemented", "not supported")), (recipe.name, stage)
        built += 1
    assert built >= 10


MACHINE_NEEDS = ("needs a CUDA GPU", "needs full TensorRT", "needs a ", "downloaded")


def test_every_recipe_runs_every_stage_on_its_own_gpu_machine(monkeypatch):
    """On the recipe's GPU, with the extras installed and the checkpoints cached, no stage stops the build."""
    from trtllm_dflash.builder import stage_plan
    from trtllm_dflash.builder.spec import resolve_spec
    from trtllm_dflash.recipes import list_recipes

    monkeypatch.setattr(stage_plan, "has_module", lambda name: True)
    monkeypatch.setattr(stage_plan, "hf_cached", lambda repo: True)
    for recipe in list_recipes():
        if recipe.backend == "torch":
            continue
        monkeypatch.setattr(stage_plan, "cuda_devices", lambda n=recipe.parallelism.num_gpus: n)
        plan = stage_plan.make_build_plan(resolve_spec(recipe=recipe.path))
        assert plan.stops_before is None, (recipe.name, [(s.name, s.where) for s in plan.stages if not s.runs_here])


def test_demo_rtx_plan_builds_everything_here():
    from trtllm_dflash.builder.spec import resolve_spec
    from trtllm_dflash.builder.stage_plan import make_build_plan

    plan = make_build_plan(resolve_spec("demo", "rtx-pro-6000"))
    by_name = {s.name: s for s in plan.stages}
    assert by_name["engines"].runs_here and "ahead of time" in by_name["engines"].where
    assert plan.spec.graphs == ("native",)  # the recipe asks for plugin-free graphs (TensorRT-RTX)
    assert plan.spec.precision.compute_dtype == "fp16"


def test_nvfp4_on_hopper_and_fp8_on_ampere_are_refused_at_plan_time(tmp_path):
    from trtllm_dflash.recipes import recipes_dir

    line = one_error_line(cli("build", "--model", "qwen3-8b", "--gpu", "h100", "--quant", "nvfp4", "--dry-run"))
    assert "nvfp4" in line and "h100" in line and "b200" in line and "b300" in line  # names the GPUs that run it
    planned = cli("plan", "--model", "qwen3-8b", "--gpu", "h100", "--quant", "nvfp4")  # the plan, then the refusal once
    assert "nvfp4" in one_error_line(planned) and planned.stdout.count("need SM >= 10.0") == 0
    ampere = tmp_path / "qwen3-8b-a100.yaml"
    ampere.write_text((recipes_dir() / "qwen3-8b" / "h100.yaml").read_text().replace("gpu: h100", "gpu: a100"))
    line = one_error_line(cli("build", "--recipe", str(ampere), "--dry-run"))
    assert "fp8" in line and "a100" in line and "h100" in line and "b200" in line


# ----------------------------------------------------------------------------- bad inputs


def test_unknown_model_and_gpu_fail_with_one_line():
    assert "x100" in one_error_line(cli("build", "--model", "demo", "--gpu", "x100", "--dry-run"))
    assert "no-such-model" in one_error_line(cli("build", "--model", "no-such-model", "--gpu", "b300", "--dry-run"))


def test_recipe_key_typo_fails_with_file_key_and_line(tmp_path):
    from trtllm_dflash.recipes import recipes_dir

    text = (recipes_dir() / "demo" / "rtx-pro-6000.yaml").read_text().replace("  use_plugins: false", "  use_plugin: false")
    assert "use_plugin:" in text
    recipe = tmp_path / "typo.yaml"
    recipe.write_text(text)
    line = one_error_line(cli("build", "--recipe", str(recipe), "--dry-run"))
    assert "typo.yaml:" in line and "trt.use_plugin" in line and "did you mean 'use_plugins'" in line


def test_out_that_is_a_file_or_read_only_fails_with_one_line(tmp_path):
    file = tmp_path / "a-file"
    file.write_text("")
    assert "is a file" in one_error_line(cli("build", "--model", "demo", "--gpu", "rtx-pro-6000", "--out", str(file)))
    if os.geteuid() == 0:  # root ignores file modes: use a place no one may write
        read_only = Path("/sys/dflash-build-test")
    else:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        read_only = locked / "out"
    line = one_error_line(cli("build", "--model", "demo", "--gpu", "rtx-pro-6000", "--out", str(read_only)))
    assert "cannot write" in line


# ----------------------------------------------------------------------------- stage directories


def _stage(name: str, write, inputs=None, depends=()):
    return Stage(name, name, write, inputs or {}, depends)


def test_stages_are_atomic_skipped_when_unchanged_and_survive_failures(tmp_path):
    calls = []

    def good(ctx):
        calls.append("good")
        (ctx.workdir / "out.txt").write_text("v1")
        return {"n": 1}

    with StageRunner(tmp_path) as runner:
        first = runner.run([_stage("a", good, {"x": 1})])
    assert first.complete and (tmp_path / "a" / "out.txt").read_text() == "v1"
    record = json.loads((tmp_path / "a" / stage_mod.STAGE_FILE).read_text())
    with StageRunner(tmp_path) as runner:
        again = runner.run([_stage("a", good, {"x": 1})])
    assert calls == ["good"] and again.records["a"]["key"] == record["key"]  # unchanged: skipped

    def crash(ctx):
        (ctx.workdir / "out.txt").write_text("half")
        raise RuntimeError("boom")

    def interrupt(ctx):
        (ctx.workdir / "out.txt").write_text("half")
        raise KeyboardInterrupt

    for failing in (crash, interrupt):
        with pytest.raises((RuntimeError, KeyboardInterrupt)):
            with StageRunner(tmp_path) as runner:
                runner.run([_stage("a", failing, {"x": 2})])
        assert (tmp_path / "a" / "out.txt").read_text() == "v1"  # the finished stage is intact
        assert not list(tmp_path.glob(".a.tmp-*"))  # nothing half-written left behind
    # a killed run leaves a hidden temporary directory: never trusted, removed by the next run
    (tmp_path / ".a.tmp-deadbeef").mkdir()
    (tmp_path / ".a.tmp-deadbeef" / stage_mod.STAGE_FILE).write_text("{}")
    with StageRunner(tmp_path) as runner:
        forced = StageRunner(tmp_path, force=True)
        assert runner.completed("a", record["key"]) is not None
    assert not (tmp_path / ".a.tmp-deadbeef").exists()
    with forced:
        forced.run([_stage("a", good, {"x": 1})])
    assert calls == ["good", "good"]  # --force rebuilds


def test_a_blocked_stage_stops_only_what_depends_on_it(tmp_path):
    def ok(ctx):
        return {}

    def blocked(ctx):
        raise StageBlocked("no GPU here", "run it on a GPU machine")

    with StageRunner(tmp_path) as runner:
        result = runner.run(
            [
                _stage("a", ok),
                _stage("b", blocked, depends=("a",)),
                _stage("c", ok, depends=("b",)),
                _stage("d", ok, depends=("a",)),
            ]
        )
    assert not result.complete
    assert set(result.records) == {"a", "d"} and set(result.blocked) == {"b"} and result.not_run == {"c": "b"}
    assert not (tmp_path / "b").exists()


def test_corrupted_file_in_a_stage_is_not_trusted(tmp_path):
    def good(ctx):
        (ctx.workdir / "weights.bin").write_bytes(b"0123456789")
        return {}

    with StageRunner(tmp_path) as runner:
        key = runner.run([_stage("a", good)]).records["a"]["key"]
        (tmp_path / "a" / "weights.bin").write_bytes(b"0123")  # truncated behind our back
        assert runner.completed("a", key) is None


def test_dry_run_imports_no_torch():
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from trtllm_dflash.cli.app import app\n"
        "result = CliRunner().invoke(app, ['build', '--model', 'gpt-oss-120b', '--gpu', 'b300', '--dry-run'])\n"
        "assert result.exit_code == 0, result.output\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'onnx', 'tensorrt_rtx_bindings', 'modelopt') if m in sys.modules)\n"
        "print(heavy)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"

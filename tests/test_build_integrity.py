"""No half-build is trusted (issue 30, item 3): the real `dflash-trt build` CLI, killed or out of disk.

- A build SIGKILLed once its export stage began leaves manifest.json incomplete (export `running`,
  the later stages `pending`), `repo --build` refuses it in one line naming those stages and the
  command to rerun, and the rerun skips the finished stages and completes.
- A build whose --out is a 2 MB tmpfs (a real ENOSPC from the kernel, no injection; root mounts it,
  else the test is skipped) fails in one line naming the directory and the space the export needs,
  exits 2 without a crash report, and keeps its finished stages.
- The check of old manifests (written before `planned` was recorded) and of failed stages, in-process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from trtllm_dflash.errors import DFlashError

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "COLUMNS": "400", "DFLASH_TRT_DEBUG": "0"}
BUILD = ["build", "--model", "demo", "--gpu", "rtx-pro-6000"]


def cli(*args: str) -> list[str]:
    """The installed entry point (trtllm_dflash.cli.app:main), as a user runs it."""
    code = "import sys; from trtllm_dflash.cli.app import main; sys.argv = ['dflash-trt', *sys.argv[1:]]; main()"
    return [sys.executable, "-c", code, *args]


def run_cli(*args: str, crash_dir: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cli(*args), capture_output=True, text=True, timeout=timeout, env={**ENV, "DFLASH_TRT_CRASH_DIR": str(crash_dir)})


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def statuses(out: Path) -> dict[str, str]:
    return {name: stage["status"] for name, stage in manifest(out)["stages"].items()}


def error_lines(text: str) -> list[str]:
    """The CLI's error lines (libraries' own warnings on stderr, torch's FutureWarnings, are not ours)."""
    assert "Traceback" not in text
    return [line for line in text.splitlines() if line.startswith("error:")]


@pytest.mark.slow
def test_a_build_killed_in_export_is_refused_by_repo_and_a_rerun_finishes_it(tmp_path):
    """~75 s on 2 shared cores: checkpoints+quantize, the kill, then the rerun (export, validate, engines)."""
    out, crashes = tmp_path / "build", tmp_path / "crashes"
    process = subprocess.Popen(
        cli(*BUILD, "--out", str(out)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**ENV, "DFLASH_TRT_CRASH_DIR": str(crashes)},
    )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if statuses(out).get("export") == "running":
                    break
            except (OSError, ValueError):
                pass  # not written yet (it is replaced atomically, so never half-read)
            time.sleep(0.05)
        assert process.poll() is None, "the build ended before its export stage began"
        assert statuses(out)["export"] == "running"
        time.sleep(1.0)  # well inside the export (it takes ~20 s): loading and tracing the graphs
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    killed = manifest(out)
    assert killed["complete"] is False
    assert killed["planned"] == ["checkpoints", "quantize", "export", "validate", "engines", "repository"]
    assert statuses(out) == {
        "checkpoints": "complete",
        "quantize": "complete",
        "export": "running",
        "validate": "pending",
        "engines": "pending",
        "repository": "pending",
    }
    assert killed["command"].startswith("dflash-trt build --model demo") and str(out) in killed["command"]
    assert not (out / "export").exists()  # only a hidden temporary folder, which no run trusts

    refused = run_cli("repo", "--build", str(out), "--out", str(tmp_path / "repo"), crash_dir=crashes)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    lines = error_lines(refused.stderr)
    assert len(lines) == 1, refused.stderr
    assert "unfinished: export (running), validate (pending), engines (pending), repository (pending)" in lines[0]
    assert f"rerun `{killed['command']}`" in lines[0] and "finished stages are skipped" in lines[0]
    assert not (tmp_path / "repo").exists() and not crashes.exists()

    rerun = run_cli(*BUILD, "--out", str(out), crash_dir=crashes)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "= checkpoints: unchanged" in rerun.stdout and "= quantize: unchanged" in rerun.stdout
    assert "✓ export" in rerun.stdout and "build complete" in rerun.stdout
    done = manifest(out)
    assert done["complete"] is True and set(statuses(out).values()) == {"complete"}
    assert done["stages"]["checkpoints"]["finished"] == killed["stages"]["checkpoints"]["finished"]  # not redone

    written = run_cli("repo", "--build", str(out), "--out", str(tmp_path / "repo"), crash_dir=crashes)
    assert written.returncode == 0, written.stdout + written.stderr
    assert 'key: "backend" value: { string_value: "trt" }' in (tmp_path / "repo" / "dflash" / "config.pbtxt").read_text()  # the engines


@pytest.fixture
def tiny_disk(tmp_path):
    """A 2 MB tmpfs: the kernel's own ENOSPC when the export writes its ~6.6 MB of graphs."""
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True).returncode != 0
    ):
        pytest.skip("mounting a size-limited tmpfs needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


@pytest.mark.slow  # ~30 s: a real demo build up to its export, on a 2 MB tmpfs
def test_a_full_disk_fails_in_one_line_and_keeps_the_finished_stages(tiny_disk, tmp_path):
    """~25 s: checkpoints and quantize fit, the export's graphs do not."""
    out, crashes = tiny_disk / "build", tmp_path / "crashes"
    result = run_cli(*BUILD, "--out", str(out), crash_dir=crashes)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert f"no space left on device in {out} during the export stage" in line
    assert "it needs ~6.6 MB" in line and "free there now" in line and "rerun the same command" in line
    assert "unexpectedly" not in line and "report it" not in line and not crashes.exists()
    assert statuses(out) == {
        "checkpoints": "complete",
        "quantize": "complete",
        "export": "failed",
        "validate": "pending",
        "engines": "pending",
        "repository": "pending",
    }
    assert manifest(out)["complete"] is False
    assert "no space left on device" in manifest(out)["stages"]["export"]["error"]
    assert json.loads((out / "checkpoints" / "stage.json").read_text())["stage"] == "checkpoints"  # intact
    assert not list(out.glob(".export.tmp-*"))  # the half-written graphs are gone, the space is back

    refused = run_cli("repo", "--build", str(out), "--out", str(tmp_path / "repo"), crash_dir=crashes)
    assert refused.returncode == 2 and len(error_lines(refused.stderr)) == 1
    assert "export (failed)" in refused.stderr


# ----------------------------------------------------------------------------- in-process checks


def write_build(root: Path, value: dict) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "manifest.json").write_text(json.dumps(value))
    return root


def test_a_manifest_without_its_artifact_is_refused(tmp_path):
    """A manifest `dflash-trt build` did not finish writing (no `planned`, no `artifact`) claims nothing."""
    from trtllm_dflash.backends import read_build_artifact

    done = {"status": "complete", "dir": "x", "summary": {}}
    build = write_build(tmp_path / "b", {"format": 1, "complete": True, "stages": {"checkpoints": done, "quantize": done}})
    with pytest.raises(DFlashError, match=r"records no artifact"):
        read_build_artifact(build)
    build = write_build(tmp_path / "c", {"format": 1, "planned": ["checkpoints", "export"], "stages": {"checkpoints": done}})
    with pytest.raises(DFlashError, match=r"unfinished: export \(missing\)"):
        read_build_artifact(build)


def test_a_failed_stage_makes_the_manifest_incomplete_and_a_blocked_one_does_not_refuse(tmp_path):
    """The runner records a failure before raising it; a stage blocked on this machine is a clean stop."""
    from trtllm_dflash.backends import unfinished_stages
    from trtllm_dflash.builder.stages import Stage, StageBlocked, StageRunner

    seen: list[dict] = []

    def record(result) -> None:
        seen.append({"running": dict(result.running), "failed": dict(result.failed), "complete": result.complete})

    def boom(ctx):
        raise RuntimeError("disk controller on fire")

    with pytest.raises(RuntimeError):
        with StageRunner(tmp_path / "out") as runner:
            runner.run([Stage("a", "a", lambda ctx: {}), Stage("b", "b", boom, depends=("a",)), Stage("c", "c", lambda ctx: {})], record)
    assert seen[-1] == {"running": {}, "failed": {"b": "disk controller on fire"}, "complete": False}
    assert any(s["running"] == {"b": s["running"].get("b")} and "b" in s["running"] for s in seen)  # recorded before it ran
    assert all(not s["complete"] for s in seen)  # never complete while a planned stage is left

    def blocked(ctx):
        raise StageBlocked("no GPU", "run it on one")

    with StageRunner(tmp_path / "out2") as runner:
        result = runner.run([Stage("a", "a", lambda ctx: {}), Stage("engines", "e", blocked, depends=("a",))])
    assert not result.complete and set(result.blocked) == {"engines"}
    assert unfinished_stages({"planned": ["a", "engines"], "stages": {"a": {"status": "complete"}, "engines": {"status": "blocked"}}}) == []


def test_enospc_inside_a_stage_becomes_one_line(tmp_path):
    """A library's wrapped write failure (torch raises RuntimeError from the OSError) is recognised too."""
    import errno

    from trtllm_dflash.builder.stages import OutOfSpace, Stage, StageRunner

    def wrapped(ctx):
        try:
            raise OSError(errno.ENOSPC, "No space left on device", str(ctx.workdir / "target.onnx"))
        except OSError as exc:
            raise RuntimeError("file write failed") from exc

    with pytest.raises(OutOfSpace) as caught:
        with StageRunner(tmp_path / "out") as runner:
            runner.run([Stage("export", "x", wrapped, size="~6.6 MB")])
    text = str(caught.value)
    assert "\n" not in text and f"in {(tmp_path / 'out').resolve()} during the export stage (it needs ~6.6 MB" in text

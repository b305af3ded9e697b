"""An unforeseen exception in a command: one line naming the command, the model and the versions,
the full traceback in a file, exit status 1; `--debug` shows the traceback instead."""

from __future__ import annotations

import sys

import pytest

from trtllm_dflash.api import DFlashPipeline
from trtllm_dflash.cli import crash


def _explode(*args, **kwargs):
    raise RuntimeError("boom inside the runtime\nsecond line")


def test_unexpected_error_is_one_line_and_a_traceback_file(run_main, monkeypatch, tmp_path):
    monkeypatch.setenv("DFLASH_TRT_CRASH_DIR", str(tmp_path))
    monkeypatch.setattr(DFlashPipeline, "load", _explode)
    code, out, err = run_main("generate", "--target", "demo", "--drafter", "demo", "--prompt", "def f(")
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("error: `dflash-trt generate` failed unexpectedly (RuntimeError: boom inside the runtime)")
    assert "model: qwen3 (demo pair)" in line
    assert "torch " in line and "transformers " in line and "tensorrt" in line
    written = list(tmp_path.glob("dflash-trt-generate-*.log"))
    assert len(written) == 1 and str(written[0]) in line
    text = written[0].read_text()
    assert "Traceback (most recent call last)" in text
    assert "in _explode" in text and "RuntimeError: boom inside the runtime" in text
    assert text.startswith("dflash-trt generate --target demo --drafter demo --prompt def f(")


def test_debug_shows_the_traceback_instead(run_main, monkeypatch, tmp_path):
    monkeypatch.setenv("DFLASH_TRT_CRASH_DIR", str(tmp_path))
    monkeypatch.setattr(DFlashPipeline, "load", _explode)
    with pytest.raises(RuntimeError, match="boom inside the runtime"):
        run_main("generate", "--target", "demo", "--drafter", "demo", "--prompt", "def f(", "--debug")
    assert not list(tmp_path.iterdir())


def test_user_errors_stay_one_line_with_exit_2(run_main, tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_TRT_CRASH_DIR", str(tmp_path))
    code, _, err = run_main("generate", "--target", str(tmp_path / "missing"), "--prompt", "x")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "failed unexpectedly" not in err
    assert not list(tmp_path.iterdir())


def test_command_and_model_are_read_from_the_arguments(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen3_5"}')
    assert crash.command_name(["dflash-trt", "plugins", "build", "--arch", "sm_90a"]) == "dflash-trt plugins build"
    assert crash.command_name(["dflash-trt", "build", "--model", "demo"]) == "dflash-trt build"
    assert crash.model_family(["dflash-trt", "generate", f"--target={tmp_path}"]) == "qwen3_5"
    assert crash.model_family(["dflash-trt", "build", "--model", "gpt-oss-120b"]) == "gpt-oss-120b"
    assert crash.model_family([sys.argv[0], "doctor"]) == "no model named"

"""`dflash-trt doctor`: the report matches what is really installed, and stages follow from it."""

from __future__ import annotations

import importlib.util
import json
import sys

from trtllm_dflash.checks.doctor import STAGES, collect, stage_status


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def test_report_matches_the_installed_packages():
    report = collect()
    have = report.capabilities
    assert have["torch"] == _installed("torch")
    assert have["tensorrt-rtx"] == _installed("tensorrt_rtx_bindings")
    assert have["tensorrt"] == _installed("tensorrt")
    assert have["tensorrt-llm"] == _installed("tensorrt_llm")
    assert have["modelopt"] == _installed("modelopt")
    assert have["triton"] == _installed("triton")
    assert have["cuda-gpu"] == bool(report.gpus.gpus)
    components = {c.key: c for c in report.components}
    if have["torch"]:
        import torch  # the test may import torch; doctor itself does not

        assert components["torch"].version == torch.__version__
        assert ("CUDA" in components["torch"].detail) == (torch.version.cuda is not None)
    for component in report.components:
        assert component.found or component.detail  # a missing piece says how to get it


def test_stages_follow_from_capabilities():
    report = collect()
    have = report.capabilities
    by_name = {s.name: s for s in report.stages}
    assert set(by_name) == {name for name, _, _ in STAGES}
    assert by_name["plan"].can_run and by_name["repository"].can_run
    assert by_name["engines-tensorrt-rtx"].can_run == have["tensorrt-rtx"]
    assert by_name["engines-tensorrt"].can_run == (have["tensorrt"] and have["cuda-gpu"])
    if not report.gpus.gpus:
        assert not by_name["quantize-nvfp4"].can_run and "cuda-gpu" in by_name["quantize-nvfp4"].missing
    status = stage_status("x", "", ("torch", "no-such-thing"), have)
    assert not status.can_run and status.missing[-1] == "no-such-thing"


def test_cli_doctor_json_with_recipe_steps(monkeypatch, capsys):
    from trtllm_dflash.cli.app import main

    monkeypatch.setattr(sys, "argv", ["dflash-trt", "doctor", "--json", "--recipe", "demo/rtx-pro-6000"])
    try:
        main()
    except SystemExit as exc:
        assert not exc.code
    payload = json.loads(capsys.readouterr().out)
    assert {c["key"] for c in payload["components"]} >= {"cuda-gpu", "torch", "tensorrt", "tensorrt-rtx", "tritonserver"}
    steps = {s["name"]: s for s in payload["recipe_steps"]}
    assert steps["engines"]["needs"] == ["tensorrt-rtx"]
    assert steps["engines"]["can_run"] == _installed("tensorrt_rtx_bindings")


def test_cli_doctor_table(monkeypatch, capsys):
    from trtllm_dflash.cli.app import main

    monkeypatch.setattr(sys, "argv", ["dflash-trt", "doctor"])
    try:
        main()
    except SystemExit as exc:
        assert not exc.code
    out = capsys.readouterr().out
    assert "TensorRT-RTX" in out and "build stages on this machine" in out and "engines-tensorrt" in out

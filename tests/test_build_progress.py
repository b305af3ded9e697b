"""Long build stages say what they do and how far they are (issue 41, item 3), and a build says which
graph variants it exports and why, naming --native-only."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
from rich.console import Console
from typer.testing import CliRunner

from trtllm_dflash.builder import export, plugin_graphs
from trtllm_dflash.cli.app import app
from trtllm_dflash.cli.build import RichReporter


class FakeTarget:
    """What export_pair reads of a target besides the graphs (the graph exports are replaced here)."""

    config = SimpleNamespace(get_text_config=lambda: SimpleNamespace(vocab_size=10, hidden_size=4))

    def get_input_embeddings(self):
        return None

    def get_output_embeddings(self):
        return None


def _record_export(monkeypatch, plugin_refusal: str | None) -> list[tuple]:
    """Replace the graph exports by stubs; every report and every export lands in one list, in order."""
    events: list[tuple] = []

    def stub(kind: str):
        def run(*args, **kwargs):
            events.append(("export", kind))
            return export.GraphInfo(file="x.onnx", inputs=[], outputs=[], num_layers=1, kv_heads=1, head_dim=1, dtype="fp32")

        return run

    monkeypatch.setattr(export, "export_target", stub("native target"))
    monkeypatch.setattr(export, "export_verifying_target", stub("plugin target"))
    monkeypatch.setattr(export, "export_drafter", stub("drafter"))
    monkeypatch.setattr(export, "verifying_target_refusal", lambda model: plugin_refusal)
    monkeypatch.setattr(plugin_graphs, "export_options", lambda variant: (variant != "native", None))
    return events


def _export_both_variants(tmp_path, events: list[tuple]) -> None:
    drafter = SimpleNamespace(config=SimpleNamespace(target_layer_ids=[0], to_dict=lambda: {}))
    export.export_pair(
        FakeTarget(),
        drafter,
        tmp_path,
        "fp32",
        export.Bounds(2, 8, 16, 4),
        ("native", "plugin"),
        progress=lambda text, done=None, total=None: events.append(("report", text, done, total)),
    )


def test_the_export_reports_each_graph_of_each_variant_before_exporting_it(monkeypatch, tmp_path):
    events = _record_export(monkeypatch, plugin_refusal=None)
    _export_both_variants(tmp_path, events)
    assert events == [
        ("report", "exporting the native target graph", 0, 4),
        ("export", "native target"),
        ("report", "exporting the native drafter graph", 1, 4),
        ("export", "drafter"),
        ("report", "exporting the plugin target graph", 2, 4),
        ("export", "plugin target"),
        ("report", "exporting the plugin drafter graph", 3, 4),
        ("export", "drafter"),
        ("report", "writing graphs.json", 4, 4),
    ]


def test_a_plugin_target_the_op_cannot_run_is_not_counted(monkeypatch, tmp_path):
    events = _record_export(monkeypatch, plugin_refusal="sliding layers")
    _export_both_variants(tmp_path, events)
    reports = [event[1:] for event in events if event[0] == "report"]
    assert reports == [
        ("exporting the native target graph", 0, 3),
        ("exporting the native drafter graph", 1, 3),
        ("exporting the plugin drafter graph", 2, 3),
        ("writing graphs.json", 3, 3),
    ]


def test_in_a_log_each_status_is_a_line_with_how_far_and_a_finished_step_with_its_time():
    out = io.StringIO()
    now = [0.0]
    reporter = RichReporter(Console(file=out, width=80, force_terminal=False, highlight=False), clock=lambda: now[0])
    stage = SimpleNamespace(name="export", title="Export the ONNX graphs")
    reporter.stage_started(stage)
    reporter.status("loading the checkpoints")
    reporter.status("exporting the native target graph", 0, 2)
    now[0] = 30.0
    reporter.status("exporting the plugin target graph", 1, 2)
    now[0] = 930.0
    reporter.status("writing graphs.json", 2, 2)
    reporter.stage_finished(stage, {"summary": {}})
    lines = [line.strip() for line in out.getvalue().splitlines()]
    assert lines == [
        "▶ export: Export the ONNX graphs",
        "loading the checkpoints",
        "exporting the native target graph (0/2 done)",
        "done: exporting the native target graph (30 s)",
        "exporting the plugin target graph (1/2 done)",
        "done: exporting the plugin target graph (900 s)",
        "writing graphs.json (2/2 done)",
        "✓ export (930.0 s)",
    ]


def test_calibration_samples_are_one_step_not_a_line_each_when_done():
    out = io.StringIO()
    now = [0.0]
    reporter = RichReporter(Console(file=out, width=120, force_terminal=True, color_system=None, highlight=False), clock=lambda: now[0])
    stage = SimpleNamespace(name="quantize", title="Quantize the target (ModelOpt)")
    reporter.stage_started(stage)
    for sample in range(4):
        now[0] = 10.0 * sample
        reporter.status("calibrating the target (fp8) on the calibration samples", sample, 4)
    now[0] = 45.0
    reporter.status("exporting the quantized checkpoint")
    reporter.stage_finished(stage, {"summary": {}})
    text = out.getvalue()
    assert text.count("done: calibrating the target (fp8) on the calibration samples (45 s)") == 1
    assert "✓ quantize" in text


@pytest.fixture(scope="module")
def local_pair(tmp_path_factory):
    from trtllm_dflash.testing.tiny import make_tiny_drafter, make_tiny_target

    root = tmp_path_factory.mktemp("own-pair")
    target = make_tiny_target(root / "my-llama", "llama", seed=2, num_layers=2)
    drafter = make_tiny_drafter(root / "my-drafter", target, seed=3, block_size=4, num_layers=1, target_layer_ids=(0, 1))
    return target, drafter


def _dry_run(*args: str):
    result = CliRunner().invoke(app, ["build", *args, "--dry-run"], env={"HF_HUB_OFFLINE": "1"})
    assert result.exit_code == 0, (result.output, result.exception)
    return " ".join(result.output.split())  # the words, whatever the terminal's width


def test_a_recipe_less_build_says_it_exports_both_variants_why_and_how_to_export_native_only(local_pair):
    target, drafter = local_pair
    text = _dry_run("--model", str(target), "--drafter", str(drafter), "--gpu", "h100")
    note = text.split("note: export:")[1].split("note:")[0]
    assert "the native and the plugin graphs" in note and "no recipe names this model" in note
    assert "trt.use_plugins: true" in note and "--native-only" in note
    assert "ONNX graphs (native, plugin)" in text

    native = _dry_run("--model", str(target), "--drafter", str(drafter), "--gpu", "h100", "--native-only")
    assert "note: export: the native graphs only" in native and "ONNX graphs (native):" in native
    assert "the plugin graphs" not in native


def test_native_only_is_refused_for_a_backend_without_graphs():
    result = CliRunner().invoke(app, ["build", "--model", "gpt-oss-120b", "--gpu", "b300", "--native-only", "--dry-run"])
    assert result.exit_code != 0
    assert "--native-only chooses the graphs of trt builds" in str(result.exception)

"""DFlash V2 drafters as engines: the native drafter graph (grouped dynamic convs, the selector's
scores), its walk in the ONNX / TensorRT runtimes, the build's validation against the torch
runtime, and a TensorRT-RTX engine of the graph.

The graphs are FP16 (as a build exports them) and run on CPU as float32 copies; the reference is
the torch runtime on the same rounded weights in float32, as the validate stage loads it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trtllm_dflash.builder.export import Bounds, export_pair
from trtllm_dflash.checkpoints import load_drafter, load_target, save_drafter
from trtllm_dflash.contracts import names
from trtllm_dflash.drafters.dflash2.graph import HEAD_SCORES, native_conv, selector_scores
from trtllm_dflash.ops import reference_dflash2
from trtllm_dflash.runtime.base import SamplingTensors
from trtllm_dflash.runtime.selector import walk_scores

BOUNDS = Bounds(max_batch=4, max_input_len=16, max_seq_len=64, block_size=8)
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]]


def make_demo_v2_drafter(path: Path) -> Path:
    """A V2 drafter for the demo target: the demo's trained V1 drafter with the published V2 sizes,
    its convolutions and selector moved off identity / zero (small enough that drafts are still accepted)."""
    from trtllm_dflash.demo import DEMO_DIR
    from trtllm_dflash.drafters.dflash2.modeling import DFlash2Drafter
    from trtllm_dflash.testing.tiny import perturb_v2

    target = load_target(DEMO_DIR / "target", dtype=torch.float32)
    drafter = DFlash2Drafter.from_v1(load_drafter(DEMO_DIR / "drafter", target), int(target.model.config.vocab_size))
    perturb_v2(drafter, seed=5, scale=0.01)
    with torch.no_grad():
        drafter.candidate_selector.hidden_projection.weight.mul_(0.003)
    return save_drafter(drafter, path)


def _reference(paths: dict[str, Path]):
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    target = load_target(paths["target"], dtype=torch.float16)
    drafter = load_drafter(paths["drafter"], target)  # FP16, as the target when loaded
    return TorchRuntime(target.model.float(), drafter.float())


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Path]:
    """The demo target and a V2 drafter for it (block 8, top-16 of 4096 tokens), exported FP16."""
    from trtllm_dflash.demo import DEMO_DIR

    root = tmp_path_factory.mktemp("v2-engines")
    drafter_dir = make_demo_v2_drafter(root / "drafter")
    target = load_target(DEMO_DIR / "target", dtype=torch.float16)
    export_pair(target.model, load_drafter(drafter_dir, target), root / "export", "fp16", BOUNDS)
    return {"target": DEMO_DIR / "target", "drafter": drafter_dir, "export": root / "export"}


@pytest.fixture(scope="module")
def graphs(exported):
    from trtllm_dflash.runtime.onnx_runtime import OnnxRuntime

    return OnnxRuntime(exported["export"], "native")


# ----------------------------------------------------------------------------- the graph's parts


def test_the_walk_over_graph_scores_is_the_reference_selector():
    """topk + the [k, k] score table + the runtime's walk == `reference_dflash2.candidate_select`."""
    generator = torch.Generator().manual_seed(0)
    b, steps, vocab, rank, top_k = 3, 5, 40, 8, 6
    unary = torch.randn(b, steps, vocab, generator=generator) * 3
    z = torch.randn(b, steps, rank, generator=generator)
    predecessor, successor = (torch.randn(vocab, rank, generator=generator) for _ in range(2))
    anchor, seed = torch.tensor([3, 17, 39]), torch.tensor([5, 6, 7])
    positions = torch.tensor([[9], [4], [30]]) + torch.arange(steps)
    cand, scores = selector_scores(unary, z, anchor, predecessor, successor, top_k)
    for temperature in (torch.zeros(b), torch.tensor([1.0, 0.6, 0.0])):
        sampling = SamplingTensors(temperature, torch.zeros(b, dtype=torch.long), torch.ones(b), seed)
        expected = reference_dflash2.candidate_select(unary, z, anchor, predecessor, successor, temperature, seed, positions, top_k)
        tokens, probs = walk_scores(cand, scores, sampling, positions, vocab)
        assert torch.equal(tokens, expected[0]) and torch.equal(cand, expected[1])
        torch.testing.assert_close(probs, expected[2], rtol=1e-5, atol=1e-6)
    assert not torch.equal(tokens[:, 0], cand[:, 0, 0])  # the codebooks moved some picks off the unary argmax


def test_the_native_conv_is_the_reference_conv():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, 32, generator=generator).half()
    delta, base = torch.randn(2, 5, 3, 2, generator=generator), torch.randn(3, 32, generator=generator)
    residual = torch.randn(2, 5, 32, generator=generator)
    assert torch.equal(native_conv(x, delta, base, residual), reference_dflash2.grouped_dynamic_conv(x, delta, base, residual))
    assert torch.equal(native_conv(x, delta, base), reference_dflash2.grouped_dynamic_conv(x, delta, base))


# ----------------------------------------------------------------------------- graphs vs the torch runtime


def test_the_v2_graph_is_plain_onnx_and_records_its_head(exported):
    import onnx

    info = json.loads((exported["export"] / "graphs.json").read_text())["variants"]["native"]["drafter"]
    assert info["head"] == HEAD_SCORES
    assert info["outputs"][:3] == [names.LOGITS, names.CANDIDATES, names.SELECTOR_SCORES]
    model = onnx.load(str(exported["export"] / "native" / "drafter.onnx"))
    assert {n.domain for n in model.graph.node} <= {"", "ai.onnx"}
    assert "TopK" in {n.op_type for n in model.graph.node}


def test_the_v2_graphs_pass_the_builds_validation(graphs, exported):
    """The validate stage's checks: logits, caches, unary draft logits, and the V2 proposals (greedy
    and sampled: equal tokens, close q) at both draft steps, then an equal greedy decode."""
    from trtllm_dflash.builder.validate import TOLERANCE, validate_graphs

    report = validate_graphs(graphs, _reference(exported), BOUNDS.block_size)
    assert report["greedy_decode_equal"] and report["max_relative_error"] < TOLERANCE
    compared = {c["name"]: c for c in report["comparisons"]}
    for label in ("empty draft cache", "filled draft cache"):
        assert compared[f"draft.logits ({label})"]["argmax_agree"] == 1.0
        assert compared[f"draft.tokens (greedy, {label})"]["max_abs"] == 0
        assert compared[f"draft.tokens (sampled, {label})"]["max_abs"] == 0
        assert compared[f"draft.q (sampled, {label})"]["rel"] < TOLERANCE


def _decode(runtime, prompts, **params):
    from trtllm_dflash.decoding import Decoder, Request, SamplingParams

    decoder = Decoder(runtime, max_batch=len(prompts), max_context=48)
    return decoder.generate([Request(list(p), SamplingParams(max_new_tokens=20, **params)) for p in prompts])


def test_decoding_through_the_v2_graphs_equals_the_torch_runtime_and_the_target(graphs, exported):
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    reference = _reference(exported)
    greedy = _decode(graphs, PROMPTS)
    assert [r.token_ids for r in greedy] == [r.token_ids for r in _decode(reference, PROMPTS)]
    assert [r.token_ids for r in greedy] == [r.token_ids for r in _decode(TorchRuntime(reference.model), PROMPTS)]
    sampled = _decode(graphs, PROMPTS, temperature=1.0, seed=11)
    expected = _decode(reference, PROMPTS, temperature=1.0, seed=11)
    assert [r.token_ids for r in sampled] == [r.token_ids for r in expected]
    assert [r.acceptance_lengths for r in sampled] == [r.acceptance_lengths for r in expected]
    assert max(tau for r in sampled + greedy for tau in r.acceptance_lengths) > 1  # some drafts were accepted


@pytest.mark.slow  # a plugin export of the demo pair (~25 s) and decoding through the nodes' CPU evaluators (~15 s)
def test_the_plugin_variant_runs_v2_through_its_plugin_nodes(tmp_path):
    """The plugin drafter graph holds the V2 nodes (conv, top-k partials + merge, the walk); decoded
    through their CPU evaluators it gives the torch runtime's tokens, greedy and sampled."""
    import onnx

    from trtllm_dflash.demo import DEMO_DIR
    from trtllm_dflash.runtime.onnx_runtime import OnnxRuntime

    drafter_dir = make_demo_v2_drafter(tmp_path / "drafter")
    target = load_target(DEMO_DIR / "target", dtype=torch.float16)
    export_pair(target.model, load_drafter(drafter_dir, target), tmp_path / "export", "fp16", BOUNDS, variants=("plugin",))
    graph = onnx.load(str(tmp_path / "export" / "plugin" / "drafter.onnx"))
    assert {n.op_type for n in graph.graph.node if n.domain == "dflash"} >= {
        "DFlash2GroupedConv",
        "DFlash2TopKPartials",
        "DFlash2TopKMerge",
        "DFlash2CandidateSelect",
    }
    graphs = OnnxRuntime(tmp_path / "export", "plugin")
    reference = _reference({"target": DEMO_DIR / "target", "drafter": drafter_dir})
    for temperature in (0.0, 1.0):
        got = _decode(graphs, PROMPTS[:2], temperature=temperature, seed=11)
        expected = _decode(reference, PROMPTS[:2], temperature=temperature, seed=11)
        assert [r.token_ids for r in got] == [r.token_ids for r in expected]
        assert [r.acceptance_lengths for r in got] == [r.acceptance_lengths for r in expected]


# ----------------------------------------------------------------------------- TensorRT-RTX


def test_tensorrt_rtx_builds_the_v2_drafter_engine(exported, tmp_path):
    """The native V2 drafter graph (TopK, gathers, float32 residual) parses and builds into a real
    TensorRT-RTX engine for SM 12.0, ahead of time on this CPU machine."""
    pytest.importorskip("tensorrt_rtx_bindings", reason="needs TensorRT-RTX: pip install 'trtllm-dflash[rtx]'")
    from trtllm_dflash.builder import engines

    info = json.loads((exported["export"] / "graphs.json").read_text())["variants"]["native"]["drafter"]
    flavour = engines.load_flavour("tensorrt-rtx")
    built = engines.build_engine(
        flavour,
        exported["export"] / "native" / "drafter.onnx",
        tmp_path / "drafter.engine",
        info,
        engines.profiles("drafter", BOUNDS),
        (12, 0),
    )
    assert built["bytes"] == (tmp_path / "drafter.engine").stat().st_size > 0


@pytest.mark.slow  # the whole build (export, validate, two TensorRT-RTX engines): ~50-90 s on 2 CPU cores
def test_a_demo_build_with_a_v2_drafter_validates_and_builds_tensorrt_rtx_engines(tmp_path):
    """`dflash-trt build --model demo --drafter V2`: the validate stage passes the V2 graphs against the
    torch runtime (proposals included) and the engines stage builds real TensorRT-RTX plans."""
    pytest.importorskip("tensorrt_rtx_bindings", reason="needs TensorRT-RTX: pip install 'trtllm-dflash[rtx]'")
    from typer.testing import CliRunner

    from trtllm_dflash.cli.app import app

    drafter = make_demo_v2_drafter(tmp_path / "drafter")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["build", "--model", "demo", "--drafter", str(drafter), "--gpu", "rtx-pro-6000", "--out", str(out)])
    assert result.exit_code == 0, (result.output, result.exception)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is True and manifest["stages"]["validate"]["summary"]["status"] == "passed"
    report = json.loads((out / "validate" / "report.json").read_text())["variants"]["native"]
    compared = {c["name"] for c in report["comparisons"]}
    assert {"draft.tokens (greedy, filled draft cache)", "draft.q (sampled, filled draft cache)"} <= compared
    assert report["greedy_decode_equal"]
    assert (out / "engines" / "native" / "drafter.engine").stat().st_size > 0
    graphs = json.loads((out / "export" / "graphs.json").read_text())
    assert graphs["variants"]["native"]["drafter"]["head"] == HEAD_SCORES

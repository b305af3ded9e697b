"""Every dense target family through the ONNX export, checked against the torch runtime.

For gpt-oss (attention sinks through its own eager attention with additive masks, MoE experts),
Gemma 3 (sliding + global layers, logit softcap), Gemma 4 (per-layer head dims and KV-head
counts, K = V global layers, KV-sharing layers without a cache) and Qwen3-MoE, a tiny random
target from transformers' own config class and a tiny random drafter are exported in FP16 (the
RTX recipes' precision) and validated as the build's validate stage does: prefill, verify on a
filled cache, two draft steps, every layer's cache, and a greedy speculative decode through the
graphs (onnxruntime) that must give the torch runtime's tokens. Each target graph is then built
into a real TensorRT-RTX engine for SM 12.0 (ahead of time, no GPU).
Hybrid (Gated DeltaNet) and MLA targets are refused with one line.

Each family's export takes ~20-40 s of dynamo tracing on a 2-core machine: gpt-oss runs in
`make test`, the other families are `slow` (`make test-all`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trtllm_dflash.builder.export import Bounds, UnsupportedTargetError, export_pair, export_target
from trtllm_dflash.checkpoints import load_drafter, load_target
from trtllm_dflash.testing.tiny import HYBRID_FAMILIES, make_tiny_drafter, make_tiny_target, tiny_target_config

EXPORTED_FAMILIES = ["gpt_oss", "gemma3", "gemma4", "qwen3_moe"]
# gpt-oss (the mission's own model: sinks, sliding windows, experts) runs in `make test`; the
# others are slow (`make test-all`)
FAMILY_PARAMS = [f if f == "gpt_oss" else pytest.param(f, marks=pytest.mark.slow) for f in EXPORTED_FAMILIES]
BOUNDS = Bounds(max_batch=4, max_input_len=32, max_seq_len=64, block_size=4)
DTYPE = "fp16"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """family -> its checkpoints and export directory, exported once per module."""
    done: dict[str, dict[str, Path]] = {}

    def get(family: str) -> dict[str, Path]:
        if family not in done:
            root = tmp_path_factory.mktemp(family)
            target_dir = make_tiny_target(root / "target", family, seed=7)
            drafter_dir = make_tiny_drafter(root / "drafter", target_dir, seed=1, block_size=BOUNDS.block_size, target_layer_ids=(1, 2))
            target = load_target(target_dir, dtype=torch.float16)
            export_pair(target.model, load_drafter(drafter_dir, target), root / "export", DTYPE, BOUNDS)
            done[family] = {"target": target_dir, "drafter": drafter_dir, "export": root / "export"}
        return done[family]

    return get


def _reference(paths: dict[str, Path]):
    """The torch runtime on the graph's rounded FP16 weights in float32, as the validate stage loads it."""
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    target = load_target(paths["target"], dtype=torch.float16)
    drafter = load_drafter(paths["drafter"], target)
    return TorchRuntime(target.model.float(), drafter.float())


@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_family_graphs_match_the_torch_runtime(exported, family):
    from trtllm_dflash.builder.validate import TOLERANCE, validate_graphs
    from trtllm_dflash.runtime.onnx_runtime import OnnxRuntime

    paths = exported(family)
    graphs = OnnxRuntime(paths["export"], "native")
    report = validate_graphs(graphs, _reference(paths), BOUNDS.block_size)
    assert report["greedy_decode_equal"] and report["max_relative_error"] < TOLERANCE
    names = {c["name"] for c in report["comparisons"]}
    assert {"prefill.logits", "verify.logits", "draft.logits (filled draft cache)", "target_cache.value[0]"} <= names
    # the decode ran past the sliding window (8), so windowed masks were exercised on both sides
    assert all(len(tokens) == 24 for tokens in report["greedy_tokens"])


@pytest.mark.slow
def test_gemma4_graph_has_per_layer_caches_and_none_for_shared_layers(exported):
    import onnx

    paths = exported("gemma4")
    info = json.loads((paths["export"] / "graphs.json").read_text())["variants"]["native"]["target"]
    # tiny Gemma 4: sliding, sliding, global (1 KV head of dim 32, K = V), sliding; layers 4-5 reuse K/V
    sliding, glob = {"kv_heads": 2, "key_dim": 16, "value_dim": 16}, {"kv_heads": 1, "key_dim": 32, "value_dim": 32}
    assert info["cache_layers"] == [sliding, sliding, glob, sliding, None, None]
    assert info["kv_heads"] == 0 and info["head_dim"] == 0  # not one uniform shape: read cache_layers
    model = onnx.load(str(paths["export"] / "native" / "target.onnx"))
    inputs = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    assert [n for n in inputs if n.startswith("past_key_")] == ["past_key_0", "past_key_1", "past_key_2", "past_key_3"]
    assert inputs["past_key_2"] == ["batch", "past", 1, 32] and inputs["past_value_3"] == ["batch", "past", 2, 16]
    outputs = [o.name for o in model.graph.output]
    assert "new_key_4" not in outputs and "new_value_3" in outputs
    # the runtime allocates exactly those layers, with their own shapes
    from trtllm_dflash.runtime.onnx_runtime import OnnxRuntime

    runtime = OnnxRuntime(paths["export"], "native", drafter=False)
    runtime.allocate(2, 16)
    layers = runtime.target_cache.layers
    assert [tuple(layer.keys.shape[2:]) if layer.keys is not None else None for layer in layers] == [
        (2, 16),
        (2, 16),
        (1, 32),
        (2, 16),
        None,
        None,
    ]


@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_tensorrt_rtx_builds_the_family_target_engine(exported, family, tmp_path):
    """The native target graph parses and builds into a real TensorRT-RTX engine (SM 12.0, AOT)."""
    pytest.importorskip("tensorrt_rtx_bindings", reason="needs TensorRT-RTX: pip install 'trtllm-dflash[rtx]'")
    from trtllm_dflash.builder import engines

    export_dir = exported(family)["export"]
    info = json.loads((export_dir / "graphs.json").read_text())
    flavour = engines.load_flavour("tensorrt-rtx")
    built = engines.build_engine(
        flavour,
        export_dir / "native" / "target.onnx",
        tmp_path / "target.engine",
        info["variants"]["native"]["target"],
        engines.profiles("target", BOUNDS),
        (12, 0),
    )
    engine = tmp_path / "target.engine"
    assert built["bytes"] == engine.stat().st_size
    assert engine.stat().st_size > 0.5 * (export_dir / "native" / "target.onnx").stat().st_size  # the weights are in it


@pytest.mark.parametrize("family", [*HYBRID_FAMILIES, "deepseek_v3"])
def test_hybrid_and_mla_targets_are_refused_at_export_with_one_line(family, tmp_path):
    from transformers import AutoModelForCausalLM

    config = tiny_target_config(family)
    model = AutoModelForCausalLM.from_config(config)
    with pytest.raises(UnsupportedTargetError) as error:
        export_target(model, [1, 2], tmp_path / "target.onnx", "fp32", BOUNDS)
    message = str(error.value)
    assert "\n" not in message and message.endswith("use backend: trtllm or torch")
    if family in HYBRID_FAMILIES:
        assert message == (
            f"{config.model_type} has Gated DeltaNet linear-attention layers; "
            "our engines keep no recurrent state; use backend: trtllm or torch"
        )
    else:
        assert message.startswith("deepseek_v3 has multi-head latent attention (MLA)")
    assert not (tmp_path / "target.onnx").exists()


def test_a_bounded_draft_history_is_refused_at_drafter_export(tmp_path):
    """z-lab's sliding_window_size is not in the drafter graph: refuse rather than export a drafter
    that silently attends to the whole history."""
    import dataclasses

    from trtllm_dflash.builder.export import export_drafter
    from trtllm_dflash.modeling.drafter import DFlashDrafter
    from trtllm_dflash.testing.tiny import tiny_drafter_config

    config = dataclasses.replace(tiny_drafter_config(tiny_target_config("qwen3")), sliding_window_size=16)
    embedding, lm_head = torch.nn.Embedding(128, 64), torch.nn.Linear(64, 128, bias=False)
    with pytest.raises(UnsupportedTargetError, match="sliding_window_size=16"):
        export_drafter(DFlashDrafter(config), embedding, lm_head, tmp_path / "drafter.onnx", "fp32", BOUNDS)
    assert not (tmp_path / "drafter.onnx").exists()

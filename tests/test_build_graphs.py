"""The exported graphs of a tiny pair in float32: both variants against the torch runtime, and determinism.

The plugin variant's drafter uses the DFlash block-attention plugin node (domain `dflash`, with
TensorRT's plugin attributes); it is evaluated with onnx's reference evaluator and the node's CPU
evaluator from the plugins part of the toolkit.
"""

from __future__ import annotations

import hashlib

import onnx
import pytest
import torch

from trtllm_dflash.builder import plugin_graphs, validate
from trtllm_dflash.builder.export import Bounds, export_drafter, export_pair

BOUNDS = Bounds(max_batch=4, max_input_len=32, max_seq_len=64, block_size=4)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from trtllm_dflash.checkpoints import load_drafter, load_target
    from trtllm_dflash.testing import make_tiny_drafter, make_tiny_target

    root = tmp_path_factory.mktemp("graphs")
    target_dir = make_tiny_target(root / "target", "llama", seed=5, num_layers=2)
    drafter_dir = make_tiny_drafter(root / "drafter", target_dir, seed=6, block_size=4, num_layers=2, target_layer_ids=(0, 1))
    target = load_target(target_dir)
    drafter = load_drafter(drafter_dir, target)
    torch.manual_seed(0)
    export_pair(target.model, drafter, root / "export", "fp32", BOUNDS, ("native", "plugin"))
    return {"root": root, "target": target, "drafter": drafter, "export": root / "export"}


@pytest.fixture(scope="module")
def reference(tiny):
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    return TorchRuntime(tiny["target"].model, tiny["drafter"])


def _runtime(tiny, variant):
    from trtllm_dflash.runtime.onnx_runtime import OnnxRuntime

    return OnnxRuntime(tiny["export"], variant, plugin_graphs.backend_for(variant), plugin_graphs.cpu_evaluators(variant))


def test_plugin_graph_holds_the_tensorrt_plugin_node(tiny):
    from trtllm_dflash.plugins import onnx_nodes

    model = onnx.load(str(tiny["export"] / "plugin" / "drafter.onnx"))
    plugin_nodes = [n for n in model.graph.node if n.domain == onnx_nodes.DOMAIN]
    assert [n.op_type for n in plugin_nodes] == ["DFlashBlockAttention"] * 2  # one per draft layer
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in plugin_nodes[0].attribute}
    assert attributes["plugin_namespace"] == b"dflash" and attributes["plugin_version"] == b"1" and attributes["aot"] == 1
    assert attributes["scale"] == pytest.approx(tiny["drafter"].config.head_dim ** -0.5)
    # the target has no plugin node: both variants share one target graph
    native = onnx.load(str(tiny["export"] / "native" / "drafter.onnx"))
    assert {n.domain for n in native.graph.node} <= {"", "ai.onnx"}


@pytest.mark.parametrize("variant", ["native", "plugin"])
def test_both_variants_reproduce_the_torch_runtime(tiny, reference, variant):
    results = {r.name: r for r in validate.compare_runtimes(_runtime(tiny, variant), reference, 4, prompt_lengths=(7, 3), seed=2)}
    assert max(r.rel for r in results.values()) < 1e-5, results
    assert results["draft.logits (filled draft cache)"].argmax_agree == 1.0


def test_greedy_decode_through_the_plugin_graphs_equals_torch(tiny, reference):
    prompts = [[5, 6, 7, 8, 9], [20, 21, 22]]
    assert validate.greedy_tokens(_runtime(tiny, "plugin"), prompts, 8) == validate.greedy_tokens(reference, prompts, 8)


def test_export_is_deterministic(tiny, tmp_path):
    torch.manual_seed(123)  # the exporter's example inputs must not leak into the graph
    model = tiny["target"].model
    export_drafter(tiny["drafter"], model.get_input_embeddings(), model.get_output_embeddings(), tmp_path / "drafter.onnx", "fp32", BOUNDS)
    first = (tiny["export"] / "native" / "drafter.onnx").read_bytes()
    again = (tmp_path / "drafter.onnx").read_bytes()
    assert hashlib.sha256(again).hexdigest() == hashlib.sha256(first).hexdigest()

"""The plugins' ONNX nodes: contract attributes, CPU evaluation through onnx.reference, and export
of the `dflash::` torch ops with the custom translation table."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

pytest.importorskip("triton")

from trtllm_dflash.ops import reference  # noqa: E402
from trtllm_dflash.plugins import onnx_nodes  # noqa: E402

FLOAT, INT64, INT32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32


def attention_inputs(seed=0, batch=2, block=4, heads=4, kv_heads=2, head_dim=64, capacity=24, new=3):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(batch, block, heads, head_dim, generator=g),
        torch.randn(batch, block, kv_heads, head_dim, generator=g),
        torch.randn(batch, block, kv_heads, head_dim, generator=g),
        torch.randn(batch, new, kv_heads, head_dim, generator=g),
        torch.randn(batch, new, kv_heads, head_dim, generator=g),
        torch.tensor([3, 1][:batch]),
        torch.randn(batch, capacity, kv_heads, head_dim, generator=g),
        torch.randn(batch, capacity, kv_heads, head_dim, generator=g),
        torch.tensor([6, 0][:batch]),
    ]


def verify_inputs(seed=0, batch=3, block=4, vocab=60):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, block, vocab, generator=g) * 3
    temperature = torch.tensor([0.0, 1.0, 0.7])
    top_k, top_p = torch.tensor([0, 0, 10]), torch.tensor([1.0, 0.9, 1.0])
    draft = reference.process_logits(logits[:, 1:] + torch.randn(batch, block - 1, vocab, generator=g), temperature, top_k, top_p)
    tokens = logits.argmax(-1).roll(1, dims=1)  # drafts = the target's argmax: long greedy runs
    tokens[:, 0] = 0
    return [logits, tokens, draft, temperature, top_k, top_p, torch.tensor([11, -5, 2**40]), torch.tensor([3, 9, 0])]


def single_node_model(spec, inputs, outputs, **attributes) -> onnx.ModelProto:
    """A one-node model; `outputs` (tensors like the expected results) give the output types."""
    node = onnx_nodes.make_node(spec, list(spec.inputs), list(spec.outputs), **attributes)

    def info(name, x):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(x.numpy().dtype), list(x.shape))

    graph = helper.make_graph(
        [node],
        spec.op_type,
        [info(name, x) for name, x in zip(spec.inputs, inputs)],
        [info(name, x) for name, x in zip(spec.outputs, outputs)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(onnx_nodes.DOMAIN, 1)])
    onnx.checker.check_model(model)
    return model


def evaluate(model, inputs):
    feeds = {i.name: x.numpy() for i, x in zip(model.graph.input, inputs)}
    return ReferenceEvaluator(model, new_ops=onnx_nodes.evaluators()).run(None, feeds)


def test_nodes_carry_the_tensorrt_plugin_contract():
    onnx_nodes.register_schemas()
    for spec in onnx_nodes.NODES:
        node = onnx_nodes.make_node(spec, list(spec.inputs), list(spec.outputs))
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert node.op_type == spec.op_type and node.domain == "dflash"
        assert attributes["plugin_namespace"] == b"dflash" and attributes["plugin_version"] == b"2"
        assert attributes["aot"] == 1
        assert onnx.defs.has(spec.op_type, "dflash")
    with pytest.raises(ValueError, match="no attribute"):
        onnx_nodes.make_node(onnx_nodes.BLOCK_ATTENTION, [], [], splits=2)


@pytest.mark.parametrize("window", [0, 3])
def test_block_attention_node_matches_the_torch_op(monkeypatch, window):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the torch op runs the Triton kernel
    inputs = attention_inputs()
    expected = torch.ops.dflash.block_attention_functional(*inputs, 0.125, window)
    model = single_node_model(onnx_nodes.BLOCK_ATTENTION, inputs, expected, scale=0.125, window=window)
    out, k_out, v_out = evaluate(model, inputs)
    np.testing.assert_allclose(out, expected[0].numpy(), atol=2e-5, rtol=2e-5)
    np.testing.assert_array_equal(k_out, expected[1].numpy())
    np.testing.assert_array_equal(v_out, expected[2].numpy())
    assert not np.array_equal(k_out, inputs[6].numpy())  # the new rows were appended


def test_split_and_merge_nodes_match_the_torch_op(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    inputs = attention_inputs(seed=1)
    expected = torch.ops.dflash.block_attention_functional(*inputs, 0.125, 0)
    partials = [torch.zeros(2, 2, 3, 8, 64), torch.zeros(2, 2, 3, 8)]  # [b, Hkv, splits, B*g, D]
    split = single_node_model(onnx_nodes.BLOCK_ATTENTION_SPLIT, inputs, partials + list(expected[1:]), scale=0.125, window=0, kv_splits=3)
    partial_out, partial_lse, k_out, _ = evaluate(split, inputs)
    merge_inputs = [torch.from_numpy(partial_out), torch.from_numpy(partial_lse), inputs[0]]
    (out,) = evaluate(single_node_model(onnx_nodes.ATTENTION_MERGE, merge_inputs, expected[:1]), merge_inputs)
    np.testing.assert_allclose(out, expected[0].numpy(), atol=2e-5, rtol=2e-5)
    np.testing.assert_array_equal(k_out, expected[1].numpy())


def test_verify_nodes_match_the_torch_op(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    inputs = verify_inputs()
    stop_ids = torch.tensor([[-1], [inputs[1][1, 2].item()], [-1]])
    expected = torch.ops.dflash.verify_block(*inputs, stop_ids)
    decisions_like = torch.zeros(3, 4, 2, dtype=torch.int32)
    partials_like = [torch.zeros(3, 4, 1), torch.zeros(3, 4, 1, dtype=torch.int32)]  # 60 logits: one chunk
    chunk_max, chunk_index = evaluate(single_node_model(onnx_nodes.VERIFY_PARTIALS, inputs[:1], partials_like), inputs[:1])
    np.testing.assert_array_equal(chunk_max, inputs[0].max(-1, keepdim=True).values.numpy())
    np.testing.assert_array_equal(chunk_index[..., 0], inputs[0].argmax(-1).numpy())
    positions_inputs = inputs + [torch.from_numpy(chunk_max), torch.from_numpy(chunk_index)]
    (decisions,) = evaluate(single_node_model(onnx_nodes.VERIFY_POSITIONS, positions_inputs, [decisions_like]), positions_inputs)
    commit_inputs = [torch.from_numpy(decisions), inputs[1], inputs[7], stop_ids]
    (result,) = evaluate(single_node_model(onnx_nodes.VERIFY_COMMIT, commit_inputs, [expected]), commit_inputs)
    np.testing.assert_array_equal(result, expected.numpy())
    assert result[:, 0].max() > 0


def test_verify_partials_node_splits_the_vocabulary_like_the_kernel():
    from trtllm_dflash.ops.kernels import launch

    g = torch.Generator().manual_seed(3)
    vocab = 2 * launch.VERIFY_CHUNK_V + 808  # three chunks, the last one partial; not a multiple of 16
    logits = torch.randn(2, 2, vocab, generator=g)
    logits[1, 0, [5, launch.VERIFY_CHUNK_V + 5]] = 9.0  # the same maximum in two chunks
    expected = launch.verify_partials(logits)  # the interpreted kernel
    like = [torch.zeros(2, 2, 3), torch.zeros(2, 2, 3, dtype=torch.int32)]
    chunk_max, chunk_index = evaluate(single_node_model(onnx_nodes.VERIFY_PARTIALS, [logits], like), [logits])
    np.testing.assert_array_equal(chunk_max, expected[0].numpy())
    np.testing.assert_array_equal(chunk_index, expected[1].numpy())
    assert chunk_index[1, 0].tolist()[:2] == [5, launch.VERIFY_CHUNK_V + 5]


@pytest.mark.parametrize("kv_splits", [1, 3])
def test_torch_export_emits_plugin_nodes_that_evaluate_like_torch(monkeypatch, kv_splits):
    class Step(torch.nn.Module):
        def forward(self, q, k_block, v_block, k_new, v_new, counts, k_cache, v_cache, lens, logits, tokens, draft, t, k, p, seed, start):
            out, k_cache, v_cache = torch.ops.dflash.block_attention_functional(
                q, k_block, v_block, k_new, v_new, counts, k_cache, v_cache, lens, 0.125, 0
            )
            sampled = torch.ops.dflash.verify_block(logits, tokens, draft, t, k, p, seed, start)
            greedy = torch.ops.dflash.verify_block(logits, tokens, None, t * 0, k, p, seed, start)
            return out, k_cache, v_cache, sampled, greedy

    args = attention_inputs(seed=2) + verify_inputs(seed=2)
    program = torch.onnx.export(
        Step(), tuple(args), dynamo=True, custom_translation_table=onnx_nodes.custom_translation_table(kv_splits), verbose=False
    )
    model = program.model_proto
    plugin_nodes = [n.op_type for n in model.graph.node if n.domain == "dflash"]
    attention = ["DFlashBlockAttention"] if kv_splits == 1 else ["DFlashBlockAttentionSplit", "DFlashAttentionMerge"]
    # both verifications read the same logits: the exporter keeps one DFlashVerifyPartials for them
    assert plugin_nodes == attention + ["DFlashVerifyPartials"] + ["DFlashVerifyPositions", "DFlashVerifyCommit"] * 2
    outputs = evaluate(model, args)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # compare with the kernels
    expected = Step()(*[a.clone() for a in args])
    for got, want in zip(outputs, expected):
        np.testing.assert_allclose(got, want.numpy(), atol=2e-5, rtol=2e-5)

"""The target-attention KV split as a graph: the DFlashTargetAttentionSplit node (+ DFlashAttentionMerge),
its CPU evaluator, its export from the functional op, its TensorRT launch plan and output shapes, and
its kernel variants. No triton needed: the evaluators run the torch reference."""

from __future__ import annotations

import math
import sys

import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from onnx.reference import ReferenceEvaluator
from support import TensorDesc, fake_tensorrt, target_attention_case

from trtllm_dflash.builder.kernel_space import recipe_kernel_space
from trtllm_dflash.ops import reference_attention
from trtllm_dflash.ops.kernels import launch
from trtllm_dflash.plugins import aot, onnx_nodes, tensorrt_plugins


def _info(name, tensor):
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(tensor.numpy().dtype), list(tensor.shape))


def _split_model(x: dict, sinks: torch.Tensor, kv_splits: int, **attributes) -> onnx.ModelProto:
    split, merge = onnx_nodes.TARGET_ATTENTION_SPLIT, onnx_nodes.ATTENTION_MERGE
    nodes = [
        onnx_nodes.make_node(
            split, list(split.inputs), ["partial_out", "partial_lse", "k_cache_out", "v_cache_out"], kv_splits=kv_splits, **attributes
        ),
        onnx_nodes.make_node(merge, ["partial_out", "partial_lse", "q"], ["out"]),
    ]
    values = {**x, "sinks": sinks}
    outputs = {"out": torch.zeros(*x["q"].shape[:-1], x["v_cache"].shape[-1]), "k_cache_out": x["k_cache"], "v_cache_out": x["v_cache"]}
    graph = helper.make_graph(
        nodes, "target_attention_split", [_info(n, values[n]) for n in split.inputs], [_info(n, t) for n, t in outputs.items()]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(onnx_nodes.DOMAIN, 1)])
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("has_sinks,window,kv_splits", [(0, 0, 2), (1, 4, 3), (1, 0, 40)])
def test_split_and_merge_nodes_evaluate_like_the_reference(has_sinks, window, kv_splits):
    onnx_nodes.register_schemas()
    x = target_attention_case(
        31, key_dim=16, value_dim=32, capacity=32, starts=(7, 0, 19)
    )  # value head wider than the key head: the merge takes the partials' dim
    sinks = torch.randn(4)
    model = _split_model(x, sinks, kv_splits, scale=0.2, window=window, has_sinks=has_sinks)
    feeds = {name: value.numpy() for name, value in {**x, "sinks": sinks}.items()}
    out, k_out, v_out = ReferenceEvaluator(model, new_ops=onnx_nodes.evaluators()).run(None, feeds)
    caches = {k: v.clone() for k, v in x.items()}
    expected = reference_attention.target_attention(**caches, sinks=sinks if has_sinks else None, scale=0.2, window=window)
    assert out.shape == tuple(expected.shape)
    np.testing.assert_allclose(out, expected.numpy(), atol=1e-5)
    np.testing.assert_array_equal(k_out, caches["k_cache"].numpy())
    np.testing.assert_array_equal(v_out, caches["v_cache"].numpy())


class _OneLayer(torch.nn.Module):
    def forward(self, q, k_new, v_new, k_cache, v_cache, starts, sinks):
        return torch.ops.dflash.target_attention_functional(q, k_new, v_new, k_cache, v_cache, starts, sinks, 1 / math.sqrt(16), 3)


def test_export_with_target_kv_splits_emits_the_split_and_the_merge():
    pytest.importorskip("onnxscript", reason="needs the export extra")
    x = target_attention_case(32, batch=2, key_dim=16, value_dim=16, capacity=32, starts=(3, 9))
    sinks = torch.randn(4)
    program = torch.onnx.export(
        _OneLayer(),
        (*x.values(), sinks),
        dynamo=True,
        custom_translation_table=onnx_nodes.custom_translation_table(target_kv_splits=3),
        opset_version=20,
    )
    model = program.model_proto
    nodes = [n for n in model.graph.node if n.domain == "dflash"]
    assert [n.op_type for n in nodes] == ["DFlashTargetAttentionSplit", "DFlashAttentionMerge"]
    attributes = {a.name: helper.get_attribute_value(a) for a in nodes[0].attribute}
    assert (attributes["kv_splits"], attributes["has_sinks"], attributes["window"]) == (3, 1, 3)
    feeds = {i.name: v.numpy() for i, v in zip(model.graph.input, (*x.values(), sinks))}
    got = ReferenceEvaluator(model, new_ops=onnx_nodes.evaluators()).run(None, feeds)
    expected = _OneLayer()(*(v.clone() for v in x.values()), sinks)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b.numpy(), atol=1e-5)
    with pytest.raises(ValueError, match="target_kv_splits must be >= 1"):
        onnx_nodes.custom_translation_table(target_kv_splits=0)


def _qwen3_8b_step(batch=1, capacity=8208, tokens=16, value_dim=128):
    shapes = dict(
        q=(batch, tokens, 32, 128),
        k_new=(batch, tokens, 8, 128),
        v_new=(batch, tokens, 8, value_dim),
        k_cache=(batch, capacity, 8, 128),
        v_cache=(batch, capacity, 8, value_dim),
        starts=(batch,),
        sinks=(32,),
    )
    dtypes = dict(q="bfloat16", k_new="bfloat16", v_new="bfloat16", k_cache="bfloat16", v_cache="bfloat16", starts="int64", sinks="float32")
    return shapes, dtypes


def test_split_launch_plan_of_a_qwen3_8b_verify_step():
    shapes, dtypes = _qwen3_8b_step()
    splits = launch.target_kv_splits(1, 8, 1, prefix=8192, sms=132)
    attributes = dict(scale=128**-0.5, window=0, has_sinks=0, kv_splits=splits)
    plan = tensorrt_plugins.plan_launch("DFlashTargetAttentionSplit", shapes, dtypes, attributes)
    unsplit = tensorrt_plugins.plan_launch("DFlashTargetAttention", shapes, dtypes, attributes)
    assert plan.variant.function == "target_attention_split_kernel" and plan.variant.node == "DFlashTargetAttentionSplit"
    assert plan.variant.constexprs == unsplit.variant.constexprs and plan.variant.num_warps == unsplit.variant.num_warps
    assert tuple(plan.grid) == (16, 8, 1) and tuple(unsplit.grid) == (1, 8, 1)  # 128 programs instead of 8
    assert plan.scalars == (*unsplit.scalars, 16)
    spec = onnx_nodes.TARGET_ATTENTION_SPLIT
    assert len(plan.variant.signature) == len(spec.inputs) + len(plan.scalars) + len(spec.outputs)

    # the merge of a target whose value head (64) is narrower than its key head (128)
    merge = tensorrt_plugins.plan_launch(
        "DFlashAttentionMerge",
        dict(partial_out=(1, 8, 16, 64, 64), partial_lse=(1, 8, 16, 64), like=(1, 16, 32, 128)),
        dict(partial_out="float32", partial_lse="float32", like="bfloat16"),
        {},
    )
    assert dict(merge.variant.constexprs) == {"HEAD_DIM": 64, "BLOCK_M": 64} and merge.variant.function == "merge_kernel"
    assert tuple(merge.grid) == (1, 8, 1) and merge.scalars == (16, 8, 4, 16)


def test_split_node_describes_its_partials_and_the_merge_the_value_head_dim(monkeypatch):
    trt, trtp = fake_tensorrt()
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setitem(sys.modules, "tensorrt.plugin", trtp)
    monkeypatch.setattr(tensorrt_plugins, "_REGISTERED", {})
    monkeypatch.setattr(tensorrt_plugins, "compiled_kernel", lambda variant, arch, prebuilt=None: (variant.function, "ptx", 0))
    tensorrt_plugins.register_plugins("sm_90a")
    shapes, dtypes = _qwen3_8b_step(batch=2, capacity=4096, value_dim=64)
    descs = {name: TensorDesc(shape, dtypes[name]) for name, shape in shapes.items()}
    attributes = dict(scale=0.1, window=128, has_sinks=1, kv_splits=4)
    describe, tensors, fields, _ = trtp.registered["dflash::DFlashTargetAttentionSplit"]
    assert tensors == list(onnx_nodes.TARGET_ATTENTION_SPLIT.inputs)
    assert fields == {"scale": float, "window": int, "has_sinks": int, "kv_splits": int}
    partial_out, partial_lse, k_out, v_out = describe(*descs.values(), *attributes.values())
    assert partial_out.shape_expr == (2, 8, 4, 64, 64) and partial_lse.shape_expr == (2, 8, 4, 64)
    assert partial_out.dtype == partial_lse.dtype == "float32"
    assert k_out.alias_of is descs["k_cache"] and v_out.alias_of is descs["v_cache"]
    name, _, params, scalars = trtp.aot["dflash::DFlashTargetAttentionSplit"](*descs.values(), *attributes.values(), outputs=None, tactic=0)
    assert name == "target_attention_split_kernel" and (params.grid_x, params.grid_y, params.grid_z) == (4, 8, 2)
    assert tuple(scalars)[-1] == 4
    merge_describe = trtp.registered["dflash::DFlashAttentionMerge"][0]
    out = merge_describe(partial_out, partial_lse, descs["q"])
    assert out.shape_expr == (2, 16, 32, 64) and out.dtype == "bfloat16"


def test_kernel_variants_carry_the_split_and_its_merges():
    from trtllm_dflash.recipes.loader import resolve_recipe

    space = recipe_kernel_space(resolve_recipe("qwen3-8b/h100"))
    variants = aot.kernel_variants(**space.options())
    by_node: dict[str, list] = {}
    for v in variants:
        by_node.setdefault(v.node, []).append(v)
    unsplit = {v.constexprs for v in by_node["DFlashTargetAttention"]}
    assert {v.constexprs for v in by_node["DFlashTargetAttentionSplit"]} == unsplit  # each tile has its split form
    # the merges of the target's partials (the verify block's 64-row tile) are built
    merges = {dict(v.constexprs)["BLOCK_M"] for v in by_node["DFlashAttentionMerge"] if dict(v.constexprs)["HEAD_DIM"] == 128}
    assert {launch.merge_block_m(128, t, 4) for t in space.blocks} <= merges
    assert len({v.label for v in variants}) == len(variants)
    # a target whose value head differs gets the merge of its value head dim
    odd = aot.kernel_variants(
        head_dims=(64,), dtypes=("bfloat16",), blocks=(16,), groups=(1,), target_head_dims=((128, 32),), target_groups=(8,)
    )
    assert any(v.function == "merge_kernel" and dict(v.constexprs)["HEAD_DIM"] == 32 for v in odd)
    label = aot.target_attention_split_variant(128, 128, "bfloat16", "bfloat16", 64, {"sinks": False}).label
    assert (
        label.startswith("target_attention_split_kernel.")
        and label.split(".", 1)[1]
        == aot.target_attention_variant(128, 128, "bfloat16", "bfloat16", 64, {"sinks": False}).label.split(".", 1)[1]
    )

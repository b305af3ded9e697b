"""`tensorrt_plugins.register_plugins` against a stand-in for `tensorrt.plugin` (TensorRT does not
install on CPU machines): the registered functions must have the signatures TensorRT reads (node
inputs as TensorDesc, then the node's attributes as typed fields, the aot_impl's names in the same
order plus outputs and tactic), describe the outputs, and launch what `plan_launch` plans. The stand-in
is support.fake_tensorrt."""

from __future__ import annotations

import sys

import pytest
from support import TensorDesc, fake_tensorrt

from trtllm_dflash.ops import attention_options
from trtllm_dflash.plugins import node_spec, onnx_nodes, tensorrt_plugins


@pytest.fixture
def registered(monkeypatch):
    trt, trtp = fake_tensorrt()
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setitem(sys.modules, "tensorrt.plugin", trtp)
    monkeypatch.setattr(tensorrt_plugins, "_REGISTERED", {})
    monkeypatch.setattr(tensorrt_plugins, "compiled_kernel", lambda variant, arch, prebuilt=None: (variant.function, "ptx", 0))
    ids = tensorrt_plugins.register_plugins("sm_90a")
    return ids, trtp


def test_every_node_registers_with_its_inputs_and_typed_attributes(registered):
    ids, trtp = registered
    assert ids == [spec.plugin_id for spec in onnx_nodes.NODES] == list(trtp.registered) == list(trtp.aot)
    fields = {plugin_id: entry[2] for plugin_id, entry in trtp.registered.items()}
    # the plugin fields engines were built with: names and types change only with PLUGIN_VERSION
    # (version 2: the drafter's window became symmetric and `causal` was added, issue 29)
    assert node_spec.PLUGIN_VERSION == "2"
    assert fields == {
        "dflash::DFlashBlockAttention": {"scale": float, "window": int, "causal": int},
        "dflash::DFlashBlockAttentionSplit": {"scale": float, "window": int, "causal": int, "kv_splits": int},
        "dflash::DFlashAttentionMerge": {},
        "dflash::DFlashTargetAttention": {"scale": float, "window": int, "has_sinks": int},
        "dflash::DFlashTargetAttentionSplit": {"scale": float, "window": int, "has_sinks": int, "kv_splits": int},
        "dflash::DFlashVerifyPartials": {},
        "dflash::DFlashVerifyPositions": {"has_draft_probs": int},
        "dflash::DFlashVerifyCommit": {},
        "dflash::DFlash2GroupedConv": {"has_residual": int},
        "dflash::DFlash2TopKPartials": {"top_k": int},
        "dflash::DFlash2TopKMerge": {"top_k": int},
        "dflash::DFlash2CandidateSelect": {},
    }
    for spec in onnx_nodes.NODES:
        assert trtp.registered[spec.plugin_id][1] == list(spec.inputs)
        assert trtp.registered[spec.plugin_id][3] == len(spec.outputs)


def test_target_attention_describes_and_launches_like_the_plan(registered):
    _, trtp = registered
    b, t, heads, kv_heads, dk, dv, capacity = 2, 16, 32, 8, 128, 64, 4096
    inputs = dict(
        q=TensorDesc((b, t, heads, dk), "bfloat16"),
        k_new=TensorDesc((b, t, kv_heads, dk), "bfloat16"),
        v_new=TensorDesc((b, t, kv_heads, dv), "bfloat16"),
        k_cache=TensorDesc((b, capacity, kv_heads, dk), "bfloat16"),
        v_cache=TensorDesc((b, capacity, kv_heads, dv), "bfloat16"),
        starts=TensorDesc((b,), "int64"),
        sinks=TensorDesc((heads,), "float32"),
    )
    attributes = dict(scale=0.125, window=128, has_sinks=1)
    describe, _, _, _ = trtp.registered["dflash::DFlashTargetAttention"]
    out, k_out, v_out = describe(*inputs.values(), *attributes.values())
    assert out.shape_expr == (b, t, heads, dv) and out.dtype == "bfloat16"
    assert k_out.alias_of is inputs["k_cache"] and v_out.alias_of is inputs["v_cache"]

    name, ptx, params, scalars = trtp.aot["dflash::DFlashTargetAttention"](*inputs.values(), *attributes.values(), outputs=None, tactic=0)
    plan = tensorrt_plugins.plan_launch(
        "DFlashTargetAttention", {k: v.shape_expr for k, v in inputs.items()}, {k: v.dtype for k, v in inputs.items()}, attributes
    )
    assert name == "target_attention_kernel" and dict(plan.variant.constexprs)["HAS_SINKS"] is True
    assert (params.grid_x, params.grid_y, params.grid_z) == tuple(plan.grid) == (1, kv_heads, b)
    assert tuple(scalars) == plan.scalars == (t, capacity, kv_heads, heads // kv_heads, 128, attention_options.float_bits(0.125))


def test_split_attention_describes_its_partials(registered):
    _, trtp = registered
    q, cache = TensorDesc((1, 16, 8, 64), "float16"), TensorDesc((1, 1024, 2, 64), "float16")
    inputs = [q, q, q, cache, cache, TensorDesc((1,), "int64"), cache, cache, TensorDesc((1,), "int64")]
    describe, _, _, _ = trtp.registered["dflash::DFlashBlockAttentionSplit"]
    partial_out, partial_lse, _, _ = describe(*inputs, scale=0.1, window=0, causal=0, kv_splits=4)
    assert partial_out.shape_expr == (1, 2, 4, 64, 64) and partial_lse.shape_expr == (1, 2, 4, 64)

"""Target attention over an in-place KV cache: the reference against plain attention over
[committed prefix; block], the cache writes, the torch custom ops and the ONNX node.

The plugin variant of the target graph is built on this op, so these are the semantics every
kernel and engine of it must reproduce: causal inside the block, each row at its own position,
sliding windows, attention sinks (gpt-oss), and nothing read past a row's own positions.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from onnx.reference import ReferenceEvaluator

from trtllm_dflash import ops
from trtllm_dflash.ops import reference_attention
from trtllm_dflash.plugins import onnx_nodes


def inputs(seed=0, batch=3, tokens=4, heads=4, kv_heads=2, key_dim=16, value_dim=16, capacity=32, starts=(7, 0, 19)):
    g = torch.Generator().manual_seed(seed)
    return dict(
        q=torch.randn(batch, tokens, heads, key_dim, generator=g),
        k_new=torch.randn(batch, tokens, kv_heads, key_dim, generator=g),
        v_new=torch.randn(batch, tokens, kv_heads, value_dim, generator=g),
        k_cache=torch.randn(batch, capacity, kv_heads, key_dim, generator=g),
        v_cache=torch.randn(batch, capacity, kv_heads, value_dim, generator=g),
        starts=torch.tensor(starts[:batch]),
    )


def naive(q, k_new, v_new, k_cache, v_cache, starts, sinks, scale, window):
    """Row by row and head by head: softmax over the prefix slots and the block, as eager attention does it."""
    batch, tokens, heads, _ = q.shape
    group = heads // k_cache.shape[2]
    out = torch.zeros(batch, tokens, heads, v_new.shape[-1])
    for r in range(batch):
        start = int(starts[r])
        keys = torch.cat([k_cache[r, :start], k_new[r]])  # positions 0 .. start + tokens - 1
        values = torch.cat([v_cache[r, :start], v_new[r]])
        for t in range(tokens):
            position = start + t
            lo = max(0, position - window + 1) if window > 0 else 0
            for h in range(heads):
                scores = keys[lo : position + 1, h // group] @ q[r, t, h] * scale
                if sinks is not None:
                    scores = torch.cat([scores, sinks[h].view(1)])
                weights = torch.softmax(scores, dim=0)[: position + 1 - lo]
                out[r, t, h] = weights @ values[lo : position + 1, h // group]
    return out


@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (8, 1)])
def test_reference_is_causal_attention_over_prefix_and_block(window, with_sinks, heads, kv_heads):
    x = inputs(heads=heads, kv_heads=kv_heads)
    sinks = torch.randn(heads) if with_sinks else None
    expected = naive(**x, sinks=sinks, scale=0.25, window=window)
    got = reference_attention.target_attention(**x, sinks=sinks, scale=0.25, window=window)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_block_is_written_in_place_and_nothing_else_changes():
    x = inputs()
    before_k, before_v = x["k_cache"].clone(), x["v_cache"].clone()
    reference_attention.target_attention(**x, sinks=None, scale=0.25, window=0)
    for r, start in enumerate(x["starts"].tolist()):
        slots = slice(start, start + 4)
        torch.testing.assert_close(x["k_cache"][r, slots], x["k_new"][r])
        torch.testing.assert_close(x["v_cache"][r, slots], x["v_new"][r])
        untouched = torch.ones(32, dtype=torch.bool)
        untouched[slots] = False
        assert torch.equal(x["k_cache"][r, untouched], before_k[r, untouched])
        assert torch.equal(x["v_cache"][r, untouched], before_v[r, untouched])


def test_slots_past_a_rows_positions_are_never_read():
    """What a rejected draft (or another row's longer block) left behind must not leak in."""
    x = inputs()
    clean = reference_attention.target_attention(**{k: v.clone() for k, v in x.items()}, sinks=None, scale=0.25, window=0)
    for r, start in enumerate(x["starts"].tolist()):
        x["k_cache"][r, start + 4 :] = float("nan")
        x["v_cache"][r, start + 4 :] = 1e6
    dirty = reference_attention.target_attention(**x, sinks=None, scale=0.25, window=0)
    torch.testing.assert_close(dirty, clean)


def test_value_dim_may_differ_and_bf16_stays_bf16():
    x = inputs(value_dim=8)
    x = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in x.items()}
    out = reference_attention.target_attention(**x, sinks=None, scale=0.25, window=0)
    assert out.shape == (3, 4, 4, 8) and out.dtype == torch.bfloat16


def test_custom_ops_match_the_reference_in_place_and_functional():
    x = inputs(seed=3)
    sinks = torch.randn(4)
    expected_caches = {k: v.clone() for k, v in x.items()}
    expected = reference_attention.target_attention(**expected_caches, sinks=sinks, scale=0.3, window=6)

    in_place = {k: v.clone() for k, v in x.items()}
    got = ops.target_attention(**in_place, sinks=sinks, scale=0.3, window=6)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(in_place["k_cache"], expected_caches["k_cache"])

    functional = {k: v.clone() for k, v in x.items()}
    out, k_out, v_out = torch.ops.dflash.target_attention_functional(*functional.values(), sinks, 0.3, 6)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(k_out, expected_caches["k_cache"])
    torch.testing.assert_close(v_out, expected_caches["v_cache"])
    assert torch.equal(functional["k_cache"], x["k_cache"])  # the functional form leaves its inputs alone


def _node_model(x: dict, sinks: torch.Tensor, **attributes) -> onnx.ModelProto:
    spec = onnx_nodes.TARGET_ATTENTION
    node = onnx_nodes.make_node(spec, list(spec.inputs), list(spec.outputs), **attributes)
    values = {**x, "sinks": sinks}

    def info(name, tensor):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(tensor.numpy().dtype), list(tensor.shape))

    out_like = {"out": torch.zeros(*x["q"].shape[:-1], x["v_cache"].shape[-1]), "k_cache_out": x["k_cache"], "v_cache_out": x["v_cache"]}
    graph = helper.make_graph(
        [node],
        "target_attention",
        [info(name, values[name]) for name in spec.inputs],
        [info(name, out_like[name]) for name in spec.outputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(onnx_nodes.DOMAIN, 1)])
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("has_sinks", [0, 1])
def test_onnx_node_evaluates_like_the_reference(has_sinks):
    onnx_nodes.register_schemas()
    x = inputs(seed=5)
    sinks = torch.randn(4)
    model = _node_model(x, sinks, scale=0.2, window=4, has_sinks=has_sinks)
    feeds = {name: value.numpy() for name, value in {**x, "sinks": sinks}.items()}
    out, k_out, v_out = ReferenceEvaluator(model, new_ops=onnx_nodes.evaluators()).run(None, feeds)
    caches = {k: v.clone() for k, v in x.items()}
    expected = reference_attention.target_attention(**caches, sinks=sinks if has_sinks else None, scale=0.2, window=4)
    np.testing.assert_allclose(out, expected.numpy(), atol=1e-5)
    np.testing.assert_array_equal(k_out, caches["k_cache"].numpy())
    np.testing.assert_array_equal(v_out, caches["v_cache"].numpy())


class _OneLayer(torch.nn.Module):
    def forward(self, q, k_new, v_new, k_cache, v_cache, starts, sinks):
        return torch.ops.dflash.target_attention_functional(q, k_new, v_new, k_cache, v_cache, starts, sinks, 1 / math.sqrt(16), 0)


def test_export_emits_one_aliased_plugin_node(tmp_path):
    from torch.export import Dim

    x = inputs(seed=7, batch=2, starts=(3, 9))
    sinks = torch.randn(4)
    batch, tokens = Dim("batch", min=1, max=8), Dim("tokens", min=1, max=16)
    program = torch.onnx.export(
        _OneLayer(),
        (*x.values(), sinks),
        dynamo=True,
        dynamic_shapes=({0: batch, 1: tokens}, {0: batch, 1: tokens}, {0: batch, 1: tokens}, {0: batch}, {0: batch}, {0: batch}, None),
        custom_translation_table=onnx_nodes.custom_translation_table(),
        opset_version=20,
    )
    model = program.model_proto
    nodes = [n for n in model.graph.node if n.domain == "dflash"]
    assert [n.op_type for n in nodes] == ["DFlashTargetAttention"]
    attributes = {a.name: helper.get_attribute_value(a) for a in nodes[0].attribute}
    assert attributes["has_sinks"] == 1 and attributes["window"] == 0 and abs(attributes["scale"] - 0.25) < 1e-7
    feeds = {i.name: v.numpy() for i, v in zip(model.graph.input, (*x.values(), sinks))}
    got = ReferenceEvaluator(model, new_ops=onnx_nodes.evaluators()).run(None, feeds)
    expected = _OneLayer()(*(v.clone() for v in x.values()), sinks)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b.numpy(), atol=1e-5)

"""Each op's spec (`ops.specs`) against every layer that still writes the op's signature by hand:
the reference functions and the launchers keep readable signatures, and must equal the spec's
inputs + options; the entry points, `dflash::` ops and plugin nodes are derived from it."""

from __future__ import annotations

import inspect

import pytest
import torch

from trtllm_dflash import ops
from trtllm_dflash.ops import reference, reference_dflash2, specs
from trtllm_dflash.ops.kernels import dflash2_launch, launch
from trtllm_dflash.plugins import dflash2_nodes, onnx_nodes

# per spec: the functions that implement it by hand, whose leading parameters must be the spec's
HAND_WRITTEN = {
    specs.BLOCK_ATTENTION: (reference.block_attention, launch.block_attention),
    specs.TARGET_ATTENTION: (reference.target_attention, launch.target_attention),
    specs.VERIFY_BLOCK: (reference.verify_block,),
    specs.VERIFY_BLOCK_PACKED: (reference.verify_block_packed, launch.verify_block),
    specs.VERIFY_POSITIONS: (reference.verify_positions, launch.verify_positions),
    specs.VERIFY_COMMIT: (reference.verify_commit, launch.verify_commit),
    specs.GROUPED_DYNAMIC_CONV: (reference_dflash2.grouped_dynamic_conv, dflash2_launch.grouped_dynamic_conv),
    specs.CANDIDATE_WALK: (reference_dflash2.candidate_walk, dflash2_launch.candidate_walk),
    specs.CANDIDATE_SELECT: (reference_dflash2.candidate_select, dflash2_launch.candidate_select),
}


def test_every_spec_is_checked():
    assert set(HAND_WRITTEN) == set(specs.SPECS)


@pytest.mark.parametrize("spec", specs.SPECS, ids=lambda s: s.name)
def test_hand_written_signatures_equal_the_spec(spec):
    for fn in HAND_WRITTEN[spec]:
        params = list(inspect.signature(fn).parameters.values())
        positional = [p for p in params if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD]
        names = tuple(p.name for p in positional[: len(spec.names)])
        assert names == spec.names, f"{fn.__module__}.{fn.__name__}"
        extra = positional[len(spec.names):]  # a launcher's tuning knobs, after the spec's, all optional
        assert all(p.default is not inspect.Parameter.empty for p in extra), f"{fn.__module__}.{fn.__name__}"
        defaults = {p.name: p.default for p in positional[: len(spec.names)]}
        assert defaults == {p.name: p.default for p in spec.parameters(torch.Tensor)}, f"{fn.__module__}.{fn.__name__}"


def test_entry_points_and_custom_ops_are_the_specs():
    for spec in (specs.BLOCK_ATTENTION, specs.TARGET_ATTENTION, specs.VERIFY_BLOCK, specs.VERIFY_BLOCK_PACKED,
                 specs.GROUPED_DYNAMIC_CONV, specs.CANDIDATE_SELECT):
        assert tuple(inspect.signature(getattr(ops, spec.name)).parameters) == spec.names
    for spec in (specs.BLOCK_ATTENTION, specs.BLOCK_ATTENTION.functional(), specs.TARGET_ATTENTION.functional(),
                 specs.VERIFY_BLOCK_PACKED, specs.CANDIDATE_SELECT):
        schema = getattr(torch.ops.dflash, spec.op_name).default._schema
        assert tuple(a.name for a in schema.arguments) == spec.names
        assert len(schema.returns) == len(spec.outputs)
        assert {a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write} == set(spec.mutates)


def test_plugin_nodes_take_the_specs_names():
    assert onnx_nodes.BLOCK_ATTENTION.inputs == specs.BLOCK_ATTENTION.node_inputs
    assert onnx_nodes.BLOCK_ATTENTION.outputs == specs.BLOCK_ATTENTION.functional().outputs == ("out", "k_cache_out", "v_cache_out")
    assert onnx_nodes.TARGET_ATTENTION_SPLIT.aliases == specs.TARGET_ATTENTION.aliases == {"k_cache_out": "k_cache", "v_cache_out": "v_cache"}
    assert onnx_nodes.VERIFY_POSITIONS.inputs[:8] == specs.VERIFY_POSITIONS.input_names
    assert onnx_nodes.VERIFY_COMMIT.inputs == specs.VERIFY_COMMIT.input_names
    assert dflash2_nodes.GROUPED_CONV.inputs == specs.GROUPED_DYNAMIC_CONV.input_names
    assert dflash2_nodes.CANDIDATE_SELECT.inputs == specs.CANDIDATE_WALK.input_names


def test_the_binding_checks_calls_against_the_spec():
    seen = specs.VERIFY_COMMIT.takes(torch.Tensor)(lambda *args: args)
    assert seen(1, 2, 3) == (1, 2, 3, None)
    assert seen(1, 2, start=3, stop_ids=4) == (1, 2, 3, 4)
    with pytest.raises(TypeError, match="start"):
        seen(1, 2)
    with pytest.raises(TypeError, match="stops"):
        seen(1, 2, 3, stops=4)
    with pytest.raises(TypeError):
        seen(1, 2, 3, 4, 5)

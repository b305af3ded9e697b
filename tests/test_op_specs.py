"""Each op's spec (`ops.specs`) against every layer: the reference functions write the op's
signature out (the one place it is written by hand, to be read) and must equal the spec's inputs +
options; the launchers, entry points, `dflash::` ops and plugin nodes are derived from the spec."""

from __future__ import annotations

import inspect
import re

import pytest
import torch

from trtllm_dflash import ops
from trtllm_dflash.ops import reference, reference_attention, reference_dflash2, specs
from trtllm_dflash.ops.kernels import dflash2_launch, launch
from trtllm_dflash.plugins import dflash2_nodes, onnx_nodes

# per spec: the reference function that writes its signature out, and the launcher derived from the spec
REFERENCE = {
    specs.BLOCK_ATTENTION: reference_attention.block_attention,
    specs.TARGET_ATTENTION: reference_attention.target_attention,
    specs.VERIFY_BLOCK: reference.verify_block,
    specs.VERIFY_BLOCK_PACKED: reference.verify_block_packed,
    specs.VERIFY_POSITIONS: reference.verify_positions,
    specs.VERIFY_COMMIT: reference.verify_commit,
    specs.GROUPED_DYNAMIC_CONV: reference_dflash2.grouped_dynamic_conv,
    specs.CANDIDATE_WALK: reference_dflash2.candidate_walk,
    specs.CANDIDATE_SELECT: reference_dflash2.candidate_select,
}
LAUNCHERS = {
    specs.BLOCK_ATTENTION: launch.block_attention,
    specs.TARGET_ATTENTION: launch.target_attention,
    specs.VERIFY_BLOCK_PACKED: launch.verify_block,
    specs.VERIFY_POSITIONS: launch.verify_positions,
    specs.VERIFY_COMMIT: launch.verify_commit,
    specs.GROUPED_DYNAMIC_CONV: dflash2_launch.grouped_dynamic_conv,
    specs.CANDIDATE_WALK: dflash2_launch.candidate_walk,
    specs.CANDIDATE_SELECT: dflash2_launch.candidate_select,
}


def test_every_spec_is_checked():
    assert set(REFERENCE) == set(specs.SPECS)
    assert set(LAUNCHERS) == set(specs.SPECS) - {specs.VERIFY_BLOCK}  # its kernel is the packed op's


@pytest.mark.parametrize("spec", specs.SPECS, ids=lambda s: s.name)
def test_signatures_equal_the_spec(spec):
    for fn in (REFERENCE[spec], LAUNCHERS.get(spec, REFERENCE[spec])):
        params = list(inspect.signature(fn).parameters.values())
        positional = [p for p in params if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD]
        assert tuple(p.name for p in positional) == spec.names, f"{fn.__module__}.{fn.__name__}"
        extra = [p for p in params if p.kind != inspect.Parameter.POSITIONAL_OR_KEYWORD]  # a launcher's knobs
        assert all(p.kind == inspect.Parameter.KEYWORD_ONLY and p.default is not inspect.Parameter.empty for p in extra)
        defaults = {p.name: p.default for p in positional}
        assert defaults == {p.name: p.default for p in spec.parameters(torch.Tensor)}, f"{fn.__module__}.{fn.__name__}"


@pytest.mark.parametrize("spec", LAUNCHERS, ids=lambda s: s.name)
def test_launchers_do_not_write_the_signature_again(spec):
    """A launcher's own source takes `inputs` (the spec's named tuple), never the op's parameters."""
    source = inspect.getsource(inspect.getmodule(LAUNCHERS[spec]))
    name = LAUNCHERS[spec].__name__
    decorator = f"@specs.{next(k for k, v in vars(specs).items() if v is spec)}.launcher(torch.Tensor)"
    assert re.search(rf"{re.escape(decorator)}\ndef {name}\(\s*inputs\b", source)  # the formatter may wrap the signature


def test_a_launcher_binds_like_python_and_hands_on_named_inputs():
    seen = {}

    @specs.VERIFY_COMMIT.launcher(torch.Tensor)
    def commit(inputs, *, knob: int = 1):
        seen.update(inputs._asdict(), knob=knob)

    commit(1, 2, start=3, knob=4)
    assert seen == {"decisions": 1, "block_tokens": 2, "start": 3, "stop_ids": None, "knob": 4}
    with pytest.raises(TypeError, match="start"):
        commit(1, 2)


def test_entry_points_and_custom_ops_are_the_specs():
    for spec in (
        specs.BLOCK_ATTENTION,
        specs.TARGET_ATTENTION,
        specs.VERIFY_BLOCK,
        specs.VERIFY_BLOCK_PACKED,
        specs.GROUPED_DYNAMIC_CONV,
        specs.CANDIDATE_SELECT,
    ):
        assert tuple(inspect.signature(getattr(ops, spec.name)).parameters) == spec.names
    for spec in (
        specs.BLOCK_ATTENTION,
        specs.BLOCK_ATTENTION.functional(),
        specs.TARGET_ATTENTION.functional(),
        specs.VERIFY_BLOCK_PACKED,
        specs.CANDIDATE_SELECT,
    ):
        schema = getattr(torch.ops.dflash, spec.op_name).default._schema
        assert tuple(a.name for a in schema.arguments) == spec.names
        assert len(schema.returns) == len(spec.outputs)
        assert {a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write} == set(spec.mutates)


def test_plugin_nodes_take_the_specs_names():
    assert onnx_nodes.BLOCK_ATTENTION.inputs == specs.BLOCK_ATTENTION.node_inputs
    assert onnx_nodes.BLOCK_ATTENTION.outputs == specs.BLOCK_ATTENTION.functional().outputs == ("out", "k_cache_out", "v_cache_out")
    assert (
        onnx_nodes.TARGET_ATTENTION_SPLIT.aliases == specs.TARGET_ATTENTION.aliases == {"k_cache_out": "k_cache", "v_cache_out": "v_cache"}
    )
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

"""The attention options table: what each layer derives from it, pinned for the existing options
(engines and prebuilt kernels depend on it), and the derivations for a new option."""

from __future__ import annotations

import inspect

import pytest
import torch

from trtllm_dflash import ops
from trtllm_dflash.ops import attention_options
from trtllm_dflash.ops.attention_options import SCALE, SINKS, WINDOW, AttentionOptions, ScalarOption
from trtllm_dflash.ops.kernels import launch
from trtllm_dflash.plugins import onnx_nodes  # noqa: F401


def test_existing_options_keep_their_signatures_schemas_and_attributes():
    assert str(inspect.signature(ops.target_attention)).endswith(
        "starts: torch.Tensor, sinks: Optional[torch.Tensor], scale: float, window: int = 0) -> torch.Tensor"
    )
    # the drafter's op: window (symmetric, issue 29) then causal (ModelOpt `causal: true`)
    assert str(inspect.signature(ops.block_attention)).endswith(
        "cache_lens: torch.Tensor, scale: float, window: int = 0, causal: int = 0) -> torch.Tensor"
    )
    assert str(inspect.signature(launch.block_attention)).endswith(
        "scale: float, window: int = 0, causal: int = 0, *, kv_splits: int | None = None, merge_in_launch: bool = True) -> torch.Tensor"
    )
    schema = str(torch.ops.dflash.target_attention.default._schema)
    assert schema.endswith(
        "Tensor(a3!) k_cache, Tensor(a4!) v_cache, Tensor starts, Tensor? sinks, float scale, SymInt window=0) -> Tensor"
    )
    assert str(torch.ops.dflash.block_attention_functional.default._schema).endswith(
        "Tensor cache_lens, float scale, SymInt window=0, SymInt causal=0) -> (Tensor, Tensor, Tensor)"
    )
    assert onnx_nodes.TARGET_ATTENTION.inputs[-1] == "sinks"
    assert onnx_nodes.TARGET_ATTENTION.attributes == {"scale": 1.0, "window": 0, "has_sinks": 0}
    assert onnx_nodes.BLOCK_ATTENTION.attributes == {"scale": 1.0, "window": 0, "causal": 0}
    assert onnx_nodes.BLOCK_ATTENTION_SPLIT.attributes == {"scale": 1.0, "window": 0, "causal": 0, "kv_splits": 2}
    assert attention_options.BLOCK_ATTENTION.kernel_scalar_params() == (("window", "i32"), ("causal", "i32"), ("scale_bits", "i32"))
    # kernel order: the window, then the scale's bits
    assert attention_options.TARGET_ATTENTION.kernel_scalar_params() == (("window", "i32"), ("scale_bits", "i32"))
    assert attention_options.TARGET_ATTENTION.kernel_scalars(dict(scale=0.5)) == (0, attention_options.float_bits(0.5))


def test_entry_points_bind_like_python():
    case = dict(
        q=torch.zeros(1, 2, 2, 16),
        k_new=torch.zeros(1, 2, 1, 16),
        v_new=torch.zeros(1, 2, 1, 16),
        k_cache=torch.zeros(1, 8, 1, 16),
        v_cache=torch.zeros(1, 8, 1, 16),
        starts=torch.tensor([0]),
    )
    positional = ops.target_attention(*case.values(), None, 0.25, 0)
    assert torch.equal(positional, ops.target_attention(**case, sinks=None, scale=0.25))
    with pytest.raises(TypeError, match="scale"):
        ops.target_attention(*case.values(), None)
    with pytest.raises(TypeError, match="softcap"):
        ops.target_attention(**case, sinks=None, scale=0.25, softcap=1.0)


def test_a_new_scalar_option_reaches_every_layer_from_its_row():
    softcap = ScalarOption("softcap", float, 0.0)
    options = AttentionOptions("target_attention", (SINKS, WINDOW, SCALE, softcap))
    assert [o.name for o in options.call_order] == ["sinks", "scale", "window", "softcap"]
    assert options.attributes() == {"scale": 1.0, "window": 0, "softcap": 0.0, "has_sinks": 0}  # ONNX attributes, TensorRT fields
    assert options.kernel_scalar_params()[-1] == ("softcap", "i32")
    assert options.kernel_scalars(dict(scale=1.0, softcap=30.0))[-1] == attention_options.float_bits(30.0)

    @options.takes_options(torch.Tensor)
    def op(q: torch.Tensor, **values) -> torch.Tensor:
        return values

    assert (
        str(inspect.signature(op))
        == "(q: torch.Tensor, sinks: Optional[torch.Tensor], scale: float, window: int = 0, softcap: float = 0.0) -> torch.Tensor"
    )
    assert op(1, None, 1, 0, 30) == dict(sinks=None, scale=1.0, window=0, softcap=30.0)
    assert op(1, None, 1) == dict(sinks=None, scale=1.0, window=0, softcap=0.0)  # callers that predate it are unchanged
    assert options.attribute_values(dict(sinks=torch.zeros(2), scale=0.5, window=4, softcap=30)) == dict(
        scale=0.5, window=4, softcap=30.0, has_sinks=1
    )

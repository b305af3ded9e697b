"""The facts every layer shares are written once (contracts/dtypes.py, contracts/defaults.py), and
the libraries and the modules that still spell them agree with that one copy."""

from __future__ import annotations

import inspect

import pytest
import torch

from trtllm_dflash.contracts import defaults, dtypes


def test_the_planner_sizes_are_the_table_s():
    """What planning/memory.py and builder/stage_plan.py priced weights at, block scales included."""
    sizes = {name: dtypes.bytes_per_element(name) for name in dtypes.PRECISIONS}
    assert sizes == {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "nvfp4": 4.5 / 8, "mxfp4": 4.25 / 8}
    assert dtypes.bytes_per_element("bfloat16") == dtypes.bytes_per_element("bf16")  # torch's spelling too
    assert dtypes.find("torch.float16") is dtypes.lookup("fp16")
    with pytest.raises(KeyError):
        dtypes.lookup("fp6")


def test_each_row_matches_torch_and_onnx():
    """The torch and ONNX columns name the types of the same size that the libraries call the same."""
    helper = pytest.importorskip("onnx.helper")
    for row in dtypes.TABLE:
        if row.torch is not None:
            assert torch.empty(0, dtype=row.to_torch()).element_size() * 8 == row.bits, row
        if row.onnx is not None:
            onnx_name = str(helper.tensor_dtype_to_np_dtype(row.onnx))
            assert onnx_name == ("float4_e2m1fn" if row.name in ("nvfp4", "mxfp4") else row.torch or row.name), row
    assert dtypes.onnx_bits(23) == 4 and dtypes.onnx_bits(8) == 32  # FLOAT4E2M1's values; STRING: the default


def test_the_defaults_the_served_model_decoder_and_pipeline_spell_are_the_contracts():
    """serving/, decoding.py and api.py still write these numbers themselves: they must stay the
    contracts' until they read them (or the help texts, which format the contracts, would lie)."""
    from trtllm_dflash import api
    from trtllm_dflash.decoding import Decoder
    from trtllm_dflash.served_model import model_parameters
    from trtllm_dflash.served_model.model_parameters import ServingConfig

    fields = ServingConfig.model_fields
    assert (fields["max_batch"].default, fields["max_context"].default) == (defaults.SERVED_MAX_BATCH, defaults.SERVED_MAX_CONTEXT)
    assert model_parameters.DEFAULT_PREFIX_CACHE_MIB == defaults.SERVED_PREFIX_CACHE_MIB
    assert model_parameters.DEFAULT_NEW_TOKENS == defaults.DEFAULT_NEW_TOKENS
    decoder = inspect.signature(Decoder.__init__).parameters
    assert (decoder["max_batch"].default, decoder["max_context"].default) == (defaults.DECODER_MAX_BATCH, defaults.DECODER_MAX_CONTEXT)
    assert api.DEFAULT_MAX_CONTEXT == defaults.GENERATE_MAX_CONTEXT
    assert inspect.signature(api.DFlashPipeline.generate).parameters["max_new_tokens"].default == defaults.DEFAULT_NEW_TOKENS


def test_help_texts_format_the_defaults(run_main, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option
    monkeypatch.setenv("TERMINAL_WIDTH", "1000")
    code, out, _ = run_main("repo", "--help")
    assert code == 0
    text = " ".join(out.split())
    assert f"else {defaults.SERVED_MAX_BATCH})" in text and f"else {defaults.SERVED_MAX_CONTEXT})" in text

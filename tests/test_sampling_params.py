"""SamplingParams is the one check of a request's sampling values and limits; each front end
names the field in its own words (no torch, no server needed)."""

from __future__ import annotations

import numpy as np
import pytest

from trtllm_dflash.contracts.request_limits import MAX_STOP_STRINGS, PROMPT_CHARS_PER_TOKEN, SEED_MAX, TOP_K_MAX
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.sampling_params import (
    PromptTooLongError,
    SamplingError,
    SamplingParams,
    check_prompt_text,
    check_prompt_tokens,
)


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        (SamplingParams(max_new_tokens=0), "max_new_tokens", "max_new_tokens must be > 0, got 0"),
        (SamplingParams(temperature=float("nan")), "temperature", "temperature must be >= 0 and finite, got nan"),
        (SamplingParams(top_p=0.0), "top_p", "top_p must be in (0, 1], got 0.0"),
        (SamplingParams(top_k=TOP_K_MAX + 1), "top_k", f"top_k must be in [0, {TOP_K_MAX}], got {TOP_K_MAX + 1}"),
        (SamplingParams(seed=SEED_MAX + 1), "seed", f"seed must be in [0, {SEED_MAX}], got {SEED_MAX + 1}"),
        (SamplingParams(stop=("x",) * (MAX_STOP_STRINGS + 1)), "stop", f"stop has {MAX_STOP_STRINGS + 1} strings"),
    ],
)
def test_validate_names_the_field(params, field, message):
    with pytest.raises(SamplingError) as caught:
        params.validate()
    assert caught.value.field == field and str(caught.value).startswith(message)
    assert isinstance(caught.value, DFlashError)


def test_renamed_says_the_field_in_a_front_ends_words_and_keeps_the_rest():
    with pytest.raises(SamplingError) as caught:
        SamplingParams(top_k=-1).validate()
    flag = caught.value.renamed({"top_k": "--top-k"})
    assert str(flag) == f"--top-k must be in [0, {TOP_K_MAX}], got -1; use 0 to disable top-k" and flag.field == "top_k"
    assert str(caught.value).startswith("top_k must")  # the original is unchanged
    with pytest.raises(PromptTooLongError) as long:
        check_prompt_text("x" * (2 * PROMPT_CHARS_PER_TOKEN + 1), 2)
    wire = long.value.renamed({"prompt": "text_input"})
    assert isinstance(wire, PromptTooLongError) and wire.length == 2 * PROMPT_CHARS_PER_TOKEN + 1 and wire.unit == "characters"
    assert str(wire).startswith(f"text_input has {2 * PROMPT_CHARS_PER_TOKEN + 1} characters, more than this server's limit")


def test_limits_and_prompts():
    SamplingParams(max_new_tokens=8).check_limit(8)
    with pytest.raises(SamplingError, match="max_new_tokens 9 is above this server's limit of 8"):
        SamplingParams(max_new_tokens=9).check_limit(8)
    with pytest.raises(SamplingError, match="empty prompt"):
        check_prompt_text("  \n", 16)
    check_prompt_text("x" * 10**6, None)  # no known context: the server checks
    check_prompt_tokens(15, 16)
    with pytest.raises(PromptTooLongError, match="prompt has 16 tokens"):
        check_prompt_tokens(16, 16)


def test_the_decoder_module_and_the_package_export_the_same_class():
    import trtllm_dflash
    from trtllm_dflash.decoding import SamplingParams as FromDecoding

    assert FromDecoding is SamplingParams and trtllm_dflash.SamplingParams is SamplingParams


def test_triton_inputs_map_to_and_from_sampling_params_by_one_table():
    from trtllm_dflash.served_model.protocol import INPUT_NAMES, params_body, parse_inputs, request_body

    params = SamplingParams(max_new_tokens=7, temperature=0.5, top_k=3, top_p=0.9, seed=11, stop=("END",))
    body = params_body("hi", params, streaming=True)
    assert body["sampling_param_max_tokens"] == 7 and body["sampling_param_stop"] == ["END"]
    raw = {
        name: np.array([v.encode() for v in value] if isinstance(value, list) else [value.encode() if isinstance(value, str) else value])
        for name, value in body.items()
    }
    assert parse_inputs(raw).params == params
    defaults = SamplingParams(max_new_tokens=5)
    assert parse_inputs({"text_input": np.array([b"hi"], dtype=np.object_)}, defaults).params == defaults
    assert request_body("hi", max_tokens=4) == request_body("hi", max_new_tokens=4)  # the older spelling still works
    assert set(INPUT_NAMES) == {"prompt", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop", "min_tokens", "ignore_eos"}

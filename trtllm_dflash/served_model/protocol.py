"""The wire format of the served DFlash model: input and output tensors, and request bodies.

Names and types follow TensorRT-LLM's LLM-API Triton model (`text_input`, `streaming`,
`sampling_param_*`; `text_output` and speculative-decoding statistics), so clients written for
it work unchanged. Light on purpose: the repository writer and the client import it without
torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from trtllm_dflash.contracts.grammar_spec import GrammarSpec
from trtllm_dflash.contracts.request_limits import MAX_SALT_CHARS
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.sampling_params import SamplingParams

# Inputs of the served model: (Triton datatype, numpy kinds accepted, optional). Names follow
# TensorRT-LLM's LLM-API Triton model so its clients work unchanged. The integer inputs are
# INT64 so that every value a client sends reaches the model as sent and is range-checked
# there: Triton's HTTP front end narrows a JSON integer to an INT32 input without a check
# (4294967304 arrived as 8), while a JSON integer outside INT64 is refused by Triton itself.
# Repositories written before declared max_tokens and top_k as INT32; the model still reads
# those (numpy kinds "iu"), but Triton then wraps large JSON values: rewrite them.
HEALTH_PROBE = "health_probe"
INPUTS: dict[str, tuple[str, str, bool]] = {
    "text_input": ("TYPE_STRING", "OSU", True),  # the prompt as text, or
    "input_ids": ("TYPE_INT64", "iu", True),  # as the target's token ids (the OpenAI front end's: tokenized once, there)
    "streaming": ("TYPE_BOOL", "b", True),
    "sampling_param_max_tokens": ("TYPE_INT64", "iu", True),
    "sampling_param_temperature": ("TYPE_FP32", "fiu", True),
    "sampling_param_top_k": ("TYPE_INT64", "iu", True),
    "sampling_param_top_p": ("TYPE_FP32", "fiu", True),
    "sampling_param_seed": ("TYPE_INT64", "iu", True),
    "sampling_param_stop": ("TYPE_STRING", "OSU", True),
    "sampling_param_min_tokens": ("TYPE_INT64", "iu", True),  # vLLM's names: what benchmark clients send
    "sampling_param_ignore_eos": ("TYPE_BOOL", "b", True),
    "sampling_param_exclude_input_from_output": ("TYPE_BOOL", "b", True),
    "sampling_param_return_perf_metrics": ("TYPE_BOOL", "b", True),
    "cache_salt": ("TYPE_STRING", "OSU", True),  # prefix-cache blocks are shared only between requests of the same salt
    "guided_decoding": ("TYPE_STRING", "OSU", True),  # a grammar (contracts/grammar_spec.py wire form) the answer follows
    # false: a streamed response carries the running totals only when it is the last (see OUTPUTS)
    "stream_totals": ("TYPE_BOOL", "b", True),
    # `serve`'s liveness probe (server_watch.ModelProbe): answered by the model process at once, never decoded or counted
    HEALTH_PROBE: ("TYPE_BOOL", "b", True),
}

# Outputs: name -> (Triton datatype, dims). Streaming responses carry the new text/ids/acceptance
# lengths of that step and the running totals; the last response has finish_reason set. A request
# whose `stream_totals` input is false (the OpenAI front end's) gets the step's STEP_OUTPUTS alone
# on every response but the last: 3 tensors to build, send and read per step instead of 13.
OUTPUTS: dict[str, tuple[str, list[int]]] = {
    "text_output": ("TYPE_STRING", [1]),
    "output_ids": ("TYPE_INT32", [-1]),
    "acceptance_lengths": ("TYPE_INT32", [-1]),
    "mean_acceptance_length": ("TYPE_FP32", [1]),
    "acceptance_rate": ("TYPE_FP32", [1]),
    "total_accepted_draft_tokens": ("TYPE_INT32", [1]),
    "total_draft_tokens": ("TYPE_INT32", [1]),
    "num_input_tokens": ("TYPE_INT32", [1]),
    "num_output_tokens": ("TYPE_INT32", [1]),
    "num_cached_tokens": ("TYPE_INT32", [1]),  # prompt tokens restored from the prefix cache, not prefilled
    "time_to_first_token": ("TYPE_FP32", [1]),
    "tokens_per_second": ("TYPE_FP32", [1]),
    "finish_reason": ("TYPE_STRING", [1]),
}


STEP_OUTPUTS = ("text_output", "output_ids", "acceptance_lengths")
LIST_OUTPUTS = tuple(name for name, (_, dims) in OUTPUTS.items() if dims == [-1])  # a value per token or step; the rest are one value


def merge_step_outputs(earlier: dict[str, np.ndarray], later: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Two streamed responses of one request as one: the step outputs joined in order, the rest
    (running totals, a finish reason) the later's. A client reads the same text, ids and
    acceptance lengths from it as from the two (served_model/call_thread.py's ResponseQueue)."""
    merged = {**earlier, **later}
    for name in LIST_OUTPUTS:
        if name in earlier and name in later:
            merged[name] = np.concatenate([earlier[name], later[name]])
    if "text_output" in earlier and "text_output" in later:
        merged["text_output"] = np.array([earlier["text_output"][0] + later["text_output"][0]], dtype=np.object_)
    return merged


# The limits the model runs with once loaded (model_parameters.ServingLimits as JSON: a context
# clamped to what the target or its engines hold can be below config.pbtxt's), sent only in the
# answer to a `health_probe`; the OpenAI front end reads them there instead of working them out
# from config.pbtxt. Repositories written before it do not declare it (their probes answer empty).
LIMITS_OUTPUT = "model_limits"
PROBE_OUTPUTS: dict[str, tuple[str, list[int]]] = {LIMITS_OUTPUT: ("TYPE_STRING", [1])}

# The one mapping between the package's names for a request's values (SamplingParams' fields,
# "prompt") and the model's inputs: request bodies, parsed inputs and error messages all use it.
INPUT_NAMES: dict[str, str] = {
    "prompt": "text_input",
    "max_new_tokens": "sampling_param_max_tokens",
    "temperature": "sampling_param_temperature",
    "top_k": "sampling_param_top_k",
    "top_p": "sampling_param_top_p",
    "seed": "sampling_param_seed",
    "stop": "sampling_param_stop",
    "min_tokens": "sampling_param_min_tokens",
    "ignore_eos": "sampling_param_ignore_eos",
}
# Our inputs that NVIDIA's LLM-API model does not declare: sent only when set, refused for that model
# (input_ids, stream_totals: the OpenAI front end sends them only to models that declare them).
OWN_ONLY_INPUTS = frozenset(
    {"sampling_param_min_tokens", "sampling_param_ignore_eos", "input_ids", "cache_salt", "guided_decoding", "stream_totals", HEALTH_PROBE}
)


# inputs that carry several values (one per stop string, one per token id); the others carry one
LIST_INPUTS = frozenset({"sampling_param_stop", "input_ids"})


@dataclasses.dataclass
class GenerateInputs:
    """One request's inputs after type checks (ranges are SamplingParams.validate's job).

    The prompt is `text`, or `token_ids` (the target's ids; `text` is then empty)."""

    text: str
    params: SamplingParams = SamplingParams()
    streaming: bool = False
    exclude_input: bool = True
    token_ids: tuple[int, ...] | None = None
    cache_salt: str | None = None  # see INPUTS
    stream_totals: bool = True  # see INPUTS


def parse_inputs(raw: dict[str, np.ndarray | None], defaults: SamplingParams = SamplingParams()) -> GenerateInputs:
    """Turn the request's input tensors into GenerateInputs; DFlashError names a bad input.

    Values the request does not send come from `defaults` (the served model's).
    """
    unknown = sorted(set(raw) - set(INPUTS))
    if unknown:
        raise DFlashError(f"unknown input(s) {', '.join(unknown)}", f"use only {', '.join(INPUTS)}")
    values: dict[str, Any] = {}
    for name, (_, kinds, optional) in INPUTS.items():
        array = raw.get(name)
        if array is None:
            if not optional:
                raise DFlashError(f"input {name} is missing", f"send the prompt as {name}")
            continue
        array = np.asarray(array)
        if array.dtype.kind not in kinds:
            raise DFlashError(
                f"input {name} has type {array.dtype}, expected {INPUTS[name][0][5:].lower()}", f"send {name} with the right type"
            )
        if name == "sampling_param_stop":
            values[name] = tuple(_text(v, name) for v in array.reshape(-1))
            continue
        if name == "input_ids":
            values[name] = tuple(int(v) for v in array.reshape(-1))
            continue
        if array.size != 1:
            raise DFlashError(f"input {name} has {array.size} values, expected one", "send one prompt per request")
        values[name] = _text(array.reshape(-1)[0], name) if kinds == "OSU" else array.reshape(-1)[0].item()
    types = {"max_new_tokens": int, "temperature": float, "top_k": int, "top_p": float, "seed": int, "min_tokens": int, "ignore_eos": bool}
    given = {field: types[field](values[INPUT_NAMES[field]]) for field in types if INPUT_NAMES[field] in values}
    if INPUT_NAMES["stop"] in values:
        given["stop"] = tuple(s for s in values[INPUT_NAMES["stop"]] if s)
    if ("text_input" in values) == ("input_ids" in values):
        raise DFlashError(
            "send the prompt as text_input or as input_ids" + (", not both" if "text_input" in values else ""),
            "send text_input (text) or input_ids (the target's token ids)",
        )
    if "guided_decoding" in values:
        try:
            given["grammar"] = GrammarSpec.from_json(values["guided_decoding"])
        except ValueError as exc:
            raise DFlashError(
                f"input guided_decoding {exc}", 'send {"kind": "json_schema", "value": SCHEMA} (or regex, choice, json_object)'
            ) from None
    token_ids = values.get("input_ids")
    if token_ids is not None and not token_ids:
        raise DFlashError("input input_ids is empty", "send at least one prompt token id")
    return GenerateInputs(
        text=values.get("text_input", ""),
        params=dataclasses.replace(defaults, **given),
        streaming=bool(values.get("streaming", False)),
        exclude_input=bool(values.get("sampling_param_exclude_input_from_output", True)),
        token_ids=token_ids,
        cache_salt=_salt(values.get("cache_salt")),
        stream_totals=bool(values.get("stream_totals", True)),
    )


def _salt(value: str | None) -> str | None:
    """A cache_salt input: None when absent; a non-empty string of at most MAX_SALT_CHARS."""
    if value is None:
        return None
    if not value or len(value) > MAX_SALT_CHARS:
        raise DFlashError(
            f"input cache_salt has {len(value)} characters, expected 1 to {MAX_SALT_CHARS}",
            "send a non-empty cache_salt (e.g. a tenant name or a random token), or leave it out",
        )
    return value


def _text(value: Any, name: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise DFlashError(f"input {name} is not valid UTF-8", "send UTF-8 text") from None
    return str(value)


def request_body(
    prompt: str,
    max_new_tokens: int | None = None,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop: Sequence[str] = (),
    streaming: bool = False,
    max_tokens: int | None = None,
    min_tokens: int = 0,
    ignore_eos: bool = False,
) -> dict[str, Any]:
    """The LLM-API style inputs of one request (JSON body of the generate endpoints).

    `max_new_tokens=None` leaves the length to the server's default; `max_tokens` is the older
    spelling of `max_new_tokens`, still accepted.
    """
    if max_tokens is not None:
        if max_new_tokens is not None:
            raise TypeError("pass max_new_tokens or its older spelling max_tokens, not both")
        max_new_tokens = max_tokens
    fields: dict[str, Any] = {"temperature": temperature}
    if max_new_tokens is not None:
        fields["max_new_tokens"] = max_new_tokens
    if top_k:
        fields["top_k"] = top_k
    if top_p != 1.0:
        fields["top_p"] = top_p
    if seed is not None:
        fields["seed"] = seed
    if stop:
        fields["stop"] = list(stop)
    if min_tokens:  # sent only when set: repositories written before these inputs still take the rest
        fields["min_tokens"] = min_tokens
    if ignore_eos:
        fields["ignore_eos"] = True
    return {"text_input": prompt, "streaming": streaming, **{INPUT_NAMES[field]: value for field, value in fields.items()}}


def params_body(
    prompt: str,
    params: SamplingParams,
    streaming: bool,
    prompt_ids: Sequence[int] | None = None,
    cache_salt: str | None = None,
    stream_totals: bool = True,
) -> dict[str, Any]:
    """The request body of a prompt and its checked SamplingParams (the OpenAI front end's); with
    `prompt_ids` the prompt goes as those token ids instead of its text; `cache_salt` when set;
    `stream_totals=False` asks for the totals on the last response only (sent only then: older
    repositories do not take the input)."""
    body = request_body(
        prompt,
        params.max_new_tokens,
        params.temperature,
        params.top_k,
        params.top_p,
        params.seed,
        params.stop,
        streaming,
        min_tokens=params.min_tokens,
        ignore_eos=params.ignore_eos,
    )
    if params.grammar is not None:
        body["guided_decoding"] = params.grammar.to_json()
    if prompt_ids is not None:
        del body["text_input"]
        body["input_ids"] = list(prompt_ids)
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    if not stream_totals:
        body["stream_totals"] = False
    return body


# ---------------------------------------------------------------------- NVIDIA's LLM-API Triton model
#
# The `trtllm` backend's repository serves NVIDIA's own model (TensorRT-LLM's
# triton_backend/all_models/llmapi/tensorrt_llm; read at 1/model.py @044a90d209e3 and @b35ac1b64368,
# 1/helpers.py @0df60f9ad779), which speaks the same input names but differently:
# - finish_reason / stop_reason / cumulative_logprob are sent only when the request sets
#   return_finish_reason / return_stop_reason / return_cumulative_logprob (helpers.get_output_config_from_request,
#   default False), as str(value): "None" on every streamed response before the last;
# - acceptance_rate, total_accepted_draft_tokens, total_draft_tokens and the *_time_ns timings only with
#   sampling_param_return_perf_metrics, as strings (np.asarray(..., dtype=<text_output's dtype>));
# - text_output is CompletionOutput.text: the whole text so far on every streamed response (cumulative);
# - a non-streamed text starts with the prompt unless sampling_param_exclude_input_from_output is set (its
#   default there is False; TensorRT-LLM's createResult keeps the prompt tokens then), and no token ids are sent.
# A model that declares LLMAPI_MARKER is taken to be that model: our own does not declare it.
LLMAPI_MARKER = "return_finish_reason"
LLMAPI_FLAGS: dict[str, str] = {
    "return_finish_reason": "TYPE_BOOL",
    "sampling_param_exclude_input_from_output": "TYPE_BOOL",
    "sampling_param_return_perf_metrics": "TYPE_BOOL",
}


def llmapi_body(body: dict[str, Any], declared: set[str] | frozenset[str]) -> dict[str, Any]:
    """A request body for NVIDIA's LLM-API model: the flags that make it send a finish reason and acceptance
    figures and leave the prompt out of the text, each only where the model declares it (Triton refuses others)."""
    return {**body, **{flag: True for flag in LLMAPI_FLAGS if flag in declared}}


class LLMApiStream:
    """One request's responses from NVIDIA's LLM-API model, as this package's responses.

    Its text is cumulative: each response becomes the new part (`text_output`) and the whole text so far
    (`full_text`). Detokenized text may rewrite its tail (a partial UTF-8 character becomes the character),
    so the new part starts where the texts stop agreeing, and `full_text` is the one to keep. finish_reason
    "None" (not finished) becomes None; the strings of its perf metrics become numbers under our names.
    """

    def __init__(self) -> None:
        self.text = ""

    def step(self, data: dict[str, Any]) -> dict[str, Any]:
        """Our response dict for one of its responses (HTTP JSON or gRPC outputs, decoded)."""
        text = _first(data.get("text_output")) or ""
        common = 0
        for old, new in zip(self.text, text):
            if old != new:
                break
            common += 1
        out: dict[str, Any] = {"text_output": text[common:], "full_text": text}
        self.text = text
        reason = _first(data.get("finish_reason"))
        out["finish_reason"] = None if reason in (None, "", "None") else str(reason)
        for name, kind in (("acceptance_rate", float), ("total_accepted_draft_tokens", int), ("total_draft_tokens", int)):
            value = _number(data.get(name), kind)
            if value is not None:
                out[name] = value
        arrival, first = _number(data.get("arrival_time_ns"), int), _number(data.get("first_token_time_ns"), int)
        if arrival is not None and first is not None and first >= arrival:
            out["time_to_first_token"] = (first - arrival) / 1e9
        return out


def _first(value: Any) -> Any:
    """Triton's JSON writes one-element tensors as scalars, gRPC gives lists: the one value either way."""
    if isinstance(value, (list, tuple)):
        return value[0] if value else None
    return value


def _number(value: Any, kind: type) -> Any:
    value = _first(value)
    if value is None:
        return None
    for convert in (kind, lambda v: int(float(v))) if kind is int else (kind,):  # "12" or "12.0"
        try:
            return convert(value)
        except (TypeError, ValueError, OverflowError):
            continue
    return None

"""The OpenAI request bodies the front end accepts, and the error every refusal is answered with.

Types are strict (pydantic); the ranges of the sampling values are checked by SamplingParams,
whose errors the front end maps to OpenAIError (frontend.py).
"""

from typing import Annotated, Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from trtllm_dflash.contracts.request_limits import MAX_SALT_CHARS

INT32_MAX = 2**31 - 1  # max_tokens: far above any model's context, and OpenAI's own bound


class OpenAIError(Exception):
    """An error answered as OpenAI's `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


# ---------------------------------------------------------------------- request bodies


def check_unicode(body: dict) -> None:
    """400 for text with a lone UTF-16 surrogate: `"\\ud800"` is valid JSON but not Unicode text,
    and the tokenizer (or the UTF-8 encoding on the way to Triton) would fail on it.

    Raises OpenAIError rather than ValueError: pydantic passes it through untouched, so the 400
    names the top-level field (`param`) and the path within it.
    """

    def walk(value: Any, path: str, param: str | None) -> None:
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise OpenAIError(
                    400,
                    f"{path} is not valid Unicode text (a lone UTF-16 surrogate at character {exc.start}); send UTF-8 text",
                    param,
                    "invalid_unicode",
                ) from None
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(key, path, param)
                walk(item, f"{path}.{key}", param)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, f"{path}[{i}]", param)

    for name, value in body.items():
        walk(name, "a field name", None)  # checked before it is quoted as a path or param
        walk(value, name, name)


# Strict types: JSON `true` is not 1 and 1.5 is not an int. The ranges of sampling are
# SamplingParams' (the front end maps its errors to a 400 naming the field); here only OpenAI's own
# bounds: a temperature up to 2, and max_tokens within int32 (it must fit the wire's integer).
MaxTokens = Annotated[StrictInt, Field(le=INT32_MAX)]
Temperature = Annotated[float, Field(strict=True, le=2)]  # OpenAI's range
TopP = Annotated[float, Field(strict=True)]
TopK = StrictInt  # an extension (vLLM's): -1 is "off" as well as 0
Seed = StrictInt
CacheSalt = Annotated[StrictStr, Field(min_length=1, max_length=MAX_SALT_CHARS)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool = False


class GenerationRequest(BaseModel):
    """Fields shared by chat and completions; unknown fields are kept and checked (UNSUPPORTED)."""

    model_config = ConfigDict(extra="allow")
    model: str
    max_tokens: Optional[MaxTokens] = None
    temperature: Optional[Temperature] = None
    top_p: Optional[TopP] = None
    top_k: Optional[TopK] = None  # an extension (vLLM's); -1 or 0 = off
    seed: Optional[Seed] = None
    stop: Optional[Union[str, list[str]]] = None
    n: Optional[StrictInt] = None
    stream: Optional[StrictBool] = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None  # accepted and ignored: it scopes nothing (cache_salt does)
    # vLLM's: prefix-cache blocks are shared only with requests of the same salt (and tenant, docs/serving.md)
    cache_salt: Optional[CacheSalt] = None
    # vLLM's extensions for fixed output lengths (benchmark clients send them); checked by SamplingParams
    min_tokens: Optional[StrictInt] = None
    ignore_eos: Optional[StrictBool] = None

    @model_validator(mode="before")
    @classmethod
    def _unicode(cls, data: Any) -> Any:
        """Text is checked before any field: pydantic's own errors for it are vague."""
        if isinstance(data, dict):
            check_unicode(data)
        return data


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: Optional[Union[str, list[dict[str, Any]]]] = None


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage]
    max_completion_tokens: Optional[MaxTokens] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None


class CompletionRequest(GenerationRequest):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    echo: Optional[StrictBool] = False


# OpenAI parameters (and other servers' extensions) this server does not implement: refused when
# set to anything but "off", so a client never gets an answer that silently ignored what it asked.
# logprobs: 0 (completions: the chosen tokens' logprobs) is asked-for, not off: only null/false pass.
UNSUPPORTED = {
    "logprobs": lambda v: v is None or v is False,
    "top_logprobs": lambda v: v is None or (v == 0 and v is not False),
    "logit_bias": lambda v: not v,
    "functions": lambda v: not v,
    "presence_penalty": lambda v: not v,
    "frequency_penalty": lambda v: not v,
    "best_of": lambda v: v in (None, 1),
    "suffix": lambda v: not v,
    "echo": lambda v: not v,
    # vLLM / TGI / TensorRT-LLM extensions
    "repetition_penalty": lambda v: v is None or v == 1,
    "length_penalty": lambda v: v is None or v == 1,
    "min_p": lambda v: not v,
    "typical_p": lambda v: v is None or v == 1,
    "use_beam_search": lambda v: not v,
    "beam_width": lambda v: v in (None, 1),
    "stop_token_ids": lambda v: not v,
    "bad_words": lambda v: not v,
    "allowed_token_ids": lambda v: not v,
    "include_stop_str_in_output": lambda v: not v,
    "skip_special_tokens": lambda v: v is None or v is True,
    "spaces_between_special_tokens": lambda v: v is None or v is True,
    "prompt_logprobs": lambda v: v is None,
    "truncate_prompt_tokens": lambda v: v is None,
    "guided_grammar": lambda v: v is None,
    "reasoning_effort": lambda v: v is None,
    "modalities": lambda v: v is None or v == ["text"],
}

# The value each UNSUPPORTED field is accepted with besides leaving it out, where there is one
# (the 400 names it: `response_format` {"type": "text"} passes, so "leave it out" alone would mislead).
ACCEPTED_VALUES = {
    "logprobs": "false",
    "top_logprobs": "0",
    "best_of": "1",
    "repetition_penalty": "1",
    "length_penalty": "1",
    "typical_p": "1",
    "beam_width": "1",
    "skip_special_tokens": "true",
    "spaces_between_special_tokens": "true",
    "modalities": '["text"]',
}

# Fields outside the schema that change nothing of the answer, so they are accepted and ignored;
# any other unknown field is refused with a 400 naming it (an ignored field would be a silent lie).
IGNORED = frozenset({"metadata", "store", "service_tier", "prediction"})

# Fields that constrain the answer with a grammar (tool_calls.request_grammar reads them)
GRAMMAR_FIELDS = frozenset(
    {"response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice", "tools", "tool_choice", "parallel_tool_calls"}
)

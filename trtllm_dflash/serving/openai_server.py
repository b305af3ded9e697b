"""An OpenAI-compatible HTTP front end for the served DFlash models (docs/serving.md).

`/v1/chat/completions`, `/v1/completions`, `/v1/models` and `/health`, in front of a running
Triton server. Why a separate process-side layer: Triton speaks its own protocol, while most
clients, benchmarks and UIs speak OpenAI's. The front end

- templates chat messages with the target tokenizer's chat template (`trtllm_dflash.chat`, the
  same code `generate --chat` runs offline) and checks limits before Triton sees the request;
- sends the prompt text to the model over Triton's async gRPC stream (`text_input`,
  `sampling_param_*`: the protocol of serving/protocol.py) and turns the per-step responses into
  OpenAI chunks (server-sent events) or one response;
- cancels the gRPC call when its HTTP client goes away: Triton marks the request cancelled and
  the model's loop drops it from the batch between decoding steps (its decoder row is freed);
- is safe to expose (`Gate`): an optional API key, a bounded request body, a bounded number of
  requests in flight (429 past it), a drain on shutdown (503 to new requests while streams
  finish), strict request types and ranges, and an OpenAI error body on every error.

FastAPI + uvicorn serve the HTTP side; `tritonclient.grpc.aio` the Triton side.
"""


import asyncio
import dataclasses
import hmac
import ipaddress
import json
import logging
import threading
import time
import uuid
from pathlib import Path
from typing import Annotated, Any, AsyncIterator, Awaitable, Callable, Optional, Sequence, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.request_limits import (
    MAX_STOP_CHARS, MAX_STOP_STRINGS, PROMPT_CHARS_PER_TOKEN, SEED_MAX, TOP_K_MAX,
)
from trtllm_dflash.extras import require_installed
from trtllm_dflash.serving.model_parameters import ServingConfig

log = logging.getLogger("uvicorn.error")  # uvicorn's logger: its lines share uvicorn's format and level

INT32_MAX = 2**31 - 1  # max_tokens: far above any model's context, and OpenAI's own bound
DEFAULT_MAX_QUEUED = 256
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
DEFAULT_DRAIN_TIMEOUT = 30.0
GENERATE_PATHS = ("/v1/chat/completions", "/v1/completions")  # counted in flight, drained, queue-bounded
OPEN_PATHS = ("/health",)  # answered without the API key (load balancers, orchestrators)

STATS = ("mean_acceptance_length", "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens",
         "num_input_tokens", "num_output_tokens", "time_to_first_token", "tokens_per_second", "finish_reason")


def _require_extra():
    """FastAPI, uvicorn and tritonclient's asyncio gRPC client come with the `serve` extra."""
    require_installed(("fastapi", "uvicorn", "tritonclient"), "the OpenAI-compatible server")


class OpenAIError(Exception):
    """An error answered as OpenAI's `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
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
                raise OpenAIError(400, f"{path} is not valid Unicode text (a lone UTF-16 surrogate at character {exc.start}); send UTF-8 text",
                                  param, "invalid_unicode") from None
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


# Strict types: JSON `true` is not 1 and 1.5 is not an int. Ranges: what the model's input dtypes
# carry and what sampling means; out of range is a 400 naming the field, never a wrapped value.
MaxTokens = Annotated[StrictInt, Field(ge=1, le=INT32_MAX)]
Temperature = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0, le=2)]  # OpenAI's range
TopP = Annotated[float, Field(strict=True, allow_inf_nan=False, gt=0, le=1)]
TopK = Annotated[StrictInt, Field(ge=-1, le=TOP_K_MAX)]
Seed = Annotated[StrictInt, Field(ge=0, le=SEED_MAX)]
StopString = Annotated[str, Field(max_length=MAX_STOP_CHARS)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool = False


class _Sampling(BaseModel):
    """Fields shared by chat and completions; unknown fields are kept and checked (UNSUPPORTED)."""

    model_config = ConfigDict(extra="allow")
    model: str
    max_tokens: Optional[MaxTokens] = None
    temperature: Optional[Temperature] = None
    top_p: Optional[TopP] = None
    top_k: Optional[TopK] = None  # an extension (vLLM's); -1 or 0 = off
    seed: Optional[Seed] = None
    stop: Optional[Union[StopString, Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)]]] = None
    n: Optional[StrictInt] = None
    stream: Optional[StrictBool] = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None

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


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage]
    max_completion_tokens: Optional[MaxTokens] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    echo: Optional[StrictBool] = False


# OpenAI parameters this server does not implement: refused when set to anything but "off"
UNSUPPORTED = {
    "logprobs": lambda v: v in (None, False, 0),
    "top_logprobs": lambda v: v in (None, 0),
    "logit_bias": lambda v: not v,
    "tools": lambda v: not v,
    "functions": lambda v: not v,
    "tool_choice": lambda v: v in (None, "none"),
    "response_format": lambda v: not v or (isinstance(v, dict) and v.get("type") == "text"),
    "presence_penalty": lambda v: not v,
    "frequency_penalty": lambda v: not v,
    "best_of": lambda v: v in (None, 1),
    "suffix": lambda v: not v,
    "echo": lambda v: not v,
}


# ---------------------------------------------------------------------- the served models


@dataclasses.dataclass
class ModelInfo:
    """One Triton model as the front end exposes it."""

    name: str
    tokenizer: Any
    max_context: int | None  # prompt + generated tokens (None: not known, Triton checks)
    max_tokens: int | None  # largest max_tokens a request may ask for
    default_max_tokens: int
    speculative: bool
    created: int
    max_batch: int = 0  # requests the model decodes at once (0: not known); sizes the queue bound
    # one prompt tokenized at a time per tokenizer: a fast tokenizer used from two threads can
    # fail ("Already borrowed") when one of them touches its padding/truncation settings
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


def _tokenizer_dir(config: ServingConfig | None, name: str, override: str | None, repository: Path | None) -> Path:
    from trtllm_dflash.checkpoints import resolve_checkpoint

    if override:
        return resolve_checkpoint(override, "tokenizer")
    if config is None:
        raise DFlashError(f"model {name!r} is not a trtllm-dflash Python-backend model", "pass --tokenizer DIR (the target's tokenizer) to serve it")
    if config.runtime == "trt" and config.engines and config.target in ("", None):
        raise DFlashError(f"model {name!r} names no target checkpoint", "pass --tokenizer DIR")
    target = config.target
    if target != "demo" and not Path(target).is_absolute():
        if repository is None:
            raise DFlashError(
                f"model {name!r} names its target by a path relative to its repository ({target})",
                "pass --tokenizer DIR (the target's tokenizer) or --repository REPO",
            )
        target = str((repository / name / target).resolve())
    try:
        return resolve_checkpoint(target, "target")
    except DFlashError:
        raise DFlashError(
            f"model {name!r}'s target {target} is not on this machine (the front end tokenizes with it)",
            "pass --tokenizer DIR with a copy of the target's tokenizer files",
        ) from None


def load_model_info(name: str, parameters: dict, tokenizer: str | None, repository: Path | None) -> ModelInfo:
    """A ModelInfo from the model's config.pbtxt parameters (Triton's model-config API)."""
    from transformers import AutoTokenizer

    try:
        config = ServingConfig.from_parameters(parameters)
    except DFlashError:
        config = None
    folder = _tokenizer_dir(config, name, tokenizer, repository)
    try:
        tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - not a tokenizer folder
        raise DFlashError(f"cannot load a tokenizer from {folder} for model {name!r} ({type(exc).__name__})", "pass --tokenizer DIR with tokenizer.json") from None
    if config is None:
        return ModelInfo(name, tok, None, None, 128, False, int(time.time()))
    max_tokens = min(config.max_tokens, config.max_context - 1)
    default = min(config.default_max_tokens or 128, max_tokens)
    return ModelInfo(name, tok, config.max_context, max_tokens, default, config.speculative, int(time.time()), config.max_batch)


# ---------------------------------------------------------------------- talking to Triton


def _value(result, name: str) -> Any:
    array = result.as_numpy(name)
    if array is None:
        return None
    if array.dtype == np.object_:
        values = [v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]
    else:
        values = array.reshape(-1).tolist()
    return values if name == "output_ids" else (values[0] if values else None)


class TritonStream:
    """One request on Triton's gRPC stream: iterate the step responses; cancel() ends it there."""

    def __init__(self, client, model: str, body: dict) -> None:
        from trtllm_dflash.serving.client import grpc_inputs

        self._done = asyncio.Event()
        inputs = grpc_inputs(body)

        async def requests():
            yield {"model_name": model, "inputs": inputs, "request_id": uuid.uuid4().hex}
            await self._done.wait()  # keep the stream open until the last response

        self._call = client.stream_infer(requests())
        self.finished = False

    async def __aiter__(self) -> AsyncIterator[dict]:
        from tritonclient.utils import InferenceServerException

        try:
            async for result, error in self._call:
                if error is not None:
                    self.finished = True
                    raise OpenAIError(400, error.message() if isinstance(error, InferenceServerException) else str(error))
                response = {name: _value(result, name) for name in ("text_output", "output_ids", *STATS)}
                yield response
                if response.get("finish_reason"):
                    self.finished = True
                    return
        except InferenceServerException as exc:
            self.finished = True
            raise OpenAIError(502, f"Triton stream failed: {exc.message()}", kind="server_error") from None
        finally:
            self.close()

    def close(self) -> None:
        """Cancel the call unless it finished (Triton then cancels the request in the model)."""
        self._done.set()
        if not self.finished:
            self.finished = True
            self._call.cancel()


# ---------------------------------------------------------------------- the app


@dataclasses.dataclass
class FrontendConfig:
    triton_url: str  # gRPC host:port
    models: Sequence[str] = ()  # expose only these (default: every DFlash model Triton serves)
    tokenizer: str | None = None  # overrides the targets named in the model configs
    repository: Path | None = None  # resolves relative target paths of the model configs
    api_key: str | None = None  # required as `Authorization: Bearer KEY` on every route but /health
    max_queued: int = DEFAULT_MAX_QUEUED  # requests in flight beyond what the models decode at once
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # larger bodies get 413, unparsed
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT  # seconds in-flight requests get to finish on shutdown


class Frontend:
    """Model discovery, validation and request translation (the app's state)."""

    def __init__(self, config: FrontendConfig) -> None:
        self.config = config
        self.client = None
        self.models: dict[str, ModelInfo] = {}
        self.in_flight = 0  # generation requests being answered (counted by Gate, on the event loop)
        self.drain_deadline: float | None = None  # set when shutdown begins: new requests get 503

    @property
    def capacity(self) -> int:
        """Generation requests admitted at once: what the models decode together, plus the queue."""
        return sum(info.max_batch for info in self.models.values()) + self.config.max_queued

    @property
    def draining(self) -> bool:
        return self.drain_deadline is not None

    def drained(self) -> bool:
        """Start draining (first call); True once no request is in flight or the drain timed out."""
        if self.drain_deadline is None:
            self.drain_deadline = time.monotonic() + self.config.drain_timeout
            if self.in_flight:
                log.info("draining: %d request(s) in flight get up to %.0f s to finish", self.in_flight, self.config.drain_timeout)
        if self.in_flight and time.monotonic() >= self.drain_deadline:
            log.warning("drain timeout: cutting %d request(s) still in flight", self.in_flight)
            return True
        return self.in_flight == 0

    def discover(self) -> None:
        """Find the served models and load their tokenizers (before serving: errors are clear lines)."""
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        client = grpcclient.InferenceServerClient(self.config.triton_url)
        try:
            index = client.get_model_repository_index(as_json=True)
        except InferenceServerException as exc:
            raise DFlashError(f"cannot reach Triton's gRPC endpoint at {self.config.triton_url} ({exc.message()})",
                              "start `dflash-trt serve REPO` first or fix --triton-url (host:8001)") from None
        ready = [m["name"] for m in index.get("models", []) if m.get("state") == "READY"]
        for name in list(self.config.models) or ready:
            if name not in ready:
                raise DFlashError(f"model {name!r} is not ready on Triton at {self.config.triton_url} (ready: {', '.join(ready) or 'none'})",
                                  "pass a served model with --model")
            config = client.get_model_config(name, as_json=True)
            parameters = config.get("config", config).get("parameters", {})
            try:
                self.models[name] = load_model_info(name, parameters, self.config.tokenizer, self.config.repository)
            except DFlashError:
                if self.config.models:  # named explicitly: say why it cannot be served
                    raise
        client.close()
        if not self.models:
            raise DFlashError(f"Triton at {self.config.triton_url} serves no DFlash model", "serve a repository written by `dflash-trt repo`")

    async def start(self) -> None:
        """The async gRPC client, created on the serving event loop."""
        import tritonclient.grpc.aio as grpcaio

        self.client = grpcaio.InferenceServerClient(self.config.triton_url)

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.close()

    def model(self, name: str) -> ModelInfo:
        if name not in self.models:
            raise OpenAIError(404, f"The model '{name}' does not exist; this server has {', '.join(self.models)}", "model", "model_not_found")
        return self.models[name]

    # ------------------------------------------------------------------ validation

    def sampling(self, request: _Sampling, info: ModelInfo, max_tokens: int | None) -> dict:
        """The Triton request body's sampling fields, after OpenAI-style checks."""
        extra = {**(request.model_extra or {}), "echo": getattr(request, "echo", None)}
        for name, allowed in UNSUPPORTED.items():
            if name in extra and not allowed(extra[name]):
                raise OpenAIError(400, f"'{name}' is not supported by this server; leave it out", name, "unsupported_parameter")
        if request.n not in (None, 1):
            raise OpenAIError(400, f"n={request.n} is not supported: this server returns one choice per request; send n=1 and repeat the request for more", "n")
        if max_tokens is not None and info.max_tokens is not None and max_tokens > info.max_tokens:
            raise OpenAIError(400, f"max_tokens {max_tokens} is above this model's limit of {info.max_tokens}", "max_tokens")
        # ranges and types are checked by the request models (Temperature, TopP, ...)
        temperature = 1.0 if request.temperature is None else request.temperature
        top_p = 1.0 if request.top_p is None else request.top_p
        top_k = request.top_k or 0
        stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
        return {
            "max_tokens": max_tokens or info.default_max_tokens, "temperature": temperature, "top_p": top_p,
            "top_k": max(top_k, 0), "seed": request.seed, "stop": [s for s in stop if s],
        }

    def check_prompt(self, info: ModelInfo, text: str, param: str) -> int:
        """Prompt tokens (as the model will encode them); 400 when empty or over the context.

        Blocking (it tokenizes): call it in a worker thread. A prompt too long by its character
        count alone is refused before tokenizing, so a huge prompt costs nothing.
        """
        if not text.strip():
            raise OpenAIError(400, "the prompt is empty", param)
        if info.max_context is not None and len(text) > info.max_context * PROMPT_CHARS_PER_TOKEN:
            raise OpenAIError(
                400, f"This model's maximum context length is {info.max_context} tokens; the prompt has {len(text)} characters, "
                f"more than {info.max_context} tokens of text can hold. Shorten it.", param, "context_length_exceeded",
            )
        with info.lock:
            count = len(info.tokenizer(text, add_special_tokens=False)["input_ids"])
        if info.max_context is not None and count >= info.max_context:
            raise OpenAIError(
                400, f"This model's maximum context length is {info.max_context} tokens; the prompt has {count} tokens. Shorten it.",
                param, "context_length_exceeded",
            )
        return count

    def chat_prompt(self, request: ChatCompletionRequest, info: ModelInfo) -> str:
        from trtllm_dflash.chat import NoChatTemplateError, apply_chat_template

        if not request.messages:
            raise OpenAIError(400, "messages is empty; send at least one message", "messages")
        for i, message in enumerate(request.messages):
            if message.content is None and message.role != "assistant":
                raise OpenAIError(400, f"messages[{i}] ({message.role}) has no content; give every message a content", "messages")
        try:
            return apply_chat_template(info.tokenizer, [m.model_dump() for m in request.messages], request.chat_template_kwargs)
        except NoChatTemplateError:
            raise OpenAIError(
                400, f"model '{info.name}' has no chat template (its target tokenizer has none); use /v1/completions, "
                "or add a chat_template to the target's tokenizer_config.json", "messages", "no_chat_template",
            ) from None
        except DFlashError as exc:
            raise OpenAIError(400, str(exc), "messages") from None

    def open(self, info: ModelInfo, prompt: str, sampling: dict) -> TritonStream:
        from trtllm_dflash.serving.protocol import request_body

        return TritonStream(self.client, info.name, request_body(prompt, streaming=True, **sampling))


def _usage(last: dict) -> dict:
    prompt, completion = int(last.get("num_input_tokens") or 0), int(last.get("num_output_tokens") or 0)
    return {
        "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
        "dflash": {  # an extension: the acceptance of this request's speculative decoding
            "mean_acceptance_length": round(float(last.get("mean_acceptance_length") or 0.0), 4),
            "acceptance_rate": round(float(last.get("acceptance_rate") or 0.0), 4),
            "accepted_draft_tokens": int(last.get("total_accepted_draft_tokens") or 0),
            "draft_tokens": int(last.get("total_draft_tokens") or 0),
            "time_to_first_token": round(float(last.get("time_to_first_token") or 0.0), 6),
        },
    }


def _finish_reason(value: str | None) -> str:
    return "stop" if value == "stop" else "length"  # "context": the context ran out


def _sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


# ---------------------------------------------------------------------- the gate (safe to expose)

ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


class Gate:
    """ASGI middleware in front of every route: API key, drain, body size, queue bound, in order.

    Plain ASGI rather than FastAPI dependencies because it must answer before the body is read
    or parsed, and it must count a streamed answer as in flight until its last byte is sent.
    Everything runs on the event loop, so the counter needs no lock.
    """

    def __init__(self, app: ASGIApp, frontend: "Frontend") -> None:
        self.app, self.frontend = app, frontend

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        frontend, config = self.frontend, self.frontend.config
        generate = scope["method"] == "POST" and scope["path"] in GENERATE_PATHS

        async def refuse(error: OpenAIError) -> None:
            await _error_response(error)(scope, receive, send)

        if config.api_key and scope["path"] not in OPEN_PATHS and (error := _auth_error(scope, config.api_key)):
            return await refuse(error)
        if generate and frontend.draining:
            return await refuse(OpenAIError(503, "the server is shutting down; send the request to another replica or retry after it restarts",
                                            None, "server_shutting_down", "server_error"))
        body = await _read_body(scope, receive, config.max_request_bytes)
        if body is None:
            return await refuse(OpenAIError(413, f"the request body is larger than this server's limit of {config.max_request_bytes} bytes",
                                            None, "request_too_large"))
        if generate and frontend.in_flight >= frontend.capacity:
            return await refuse(OpenAIError(429, f"this server has {frontend.in_flight} requests in flight, its limit; retry shortly",
                                            None, "rate_limit_exceeded", "rate_limit_error", {"Retry-After": "1"}))
        frontend.in_flight += generate
        try:
            await self.app(scope, _replay(body, receive), send)
        finally:
            frontend.in_flight -= generate


def _error_response(error: OpenAIError):
    from fastapi.responses import JSONResponse

    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def _auth_error(scope: dict, key: str) -> OpenAIError | None:
    """None when the request carries `Authorization: Bearer KEY` (compared in constant time)."""
    header = dict(scope["headers"]).get(b"authorization", b"")
    scheme, _, token = header.partition(b" ")
    if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), key.encode()):
        return None
    message = ("Incorrect API key provided." if header else
               "You didn't provide an API key. Send it in an Authorization header using Bearer auth (Authorization: Bearer KEY).")
    return OpenAIError(401, message, None, "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


async def _read_body(scope: dict, receive: Callable, limit: int) -> bytes | None:
    """The request body, or None when it is over `limit` bytes (or the client left mid-body).

    A body over the limit is read on without being kept, up to 4x the limit, before the 413 is
    sent: a client still writing its body when the server closes the connection gets a reset
    instead of the answer. A declared Content-Length past that is refused at once.
    """
    declared = dict(scope["headers"]).get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > 4 * limit:
        return None
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None  # http.disconnect: nobody to answer
        chunk = message.get("body", b"")
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
        if not message.get("more_body", False) or size > 4 * limit:
            return b"".join(chunks) if size <= limit else None


def _replay(body: bytes, receive: Callable) -> Callable:
    """A `receive` that hands the app the body read by Gate, then the client's later messages
    (the disconnect that cancels a stream)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> dict:
        return pending.pop() if pending else await receive()

    return replay


def is_loopback(host: str) -> bool:
    """Whether `host` only listens on this machine (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name or a wildcard ("", "0.0.0.0", "::" parse; other names may resolve anywhere)


def exposure_warning(host: str, port: int, api_key: str | None) -> str | None:
    """The one line to print when the API is reachable from the network without a key."""
    if api_key or is_loopback(host):
        return None
    return (f"the OpenAI API listens on {host or '*'}:{port} without an API key: anyone who can reach this port can use the model; "
            "set DFLASH_API_KEY (or pass --api-key) to require `Authorization: Bearer KEY`")


def create_app(frontend: "Frontend"):
    """The FastAPI app over a Frontend that has discovered its models."""
    _require_extra()
    from contextlib import asynccontextmanager

    from anyio import to_thread
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.background import BackgroundTask
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @asynccontextmanager
    async def lifespan(app):
        await frontend.start()
        yield
        await frontend.stop()

    app = FastAPI(title="trtllm-dflash OpenAI-compatible server", lifespan=lifespan)
    app.state.frontend = frontend
    app.add_middleware(Gate, frontend=frontend)

    @app.exception_handler(OpenAIError)
    async def openai_error(request: Request, exc: OpenAIError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception):
        """A bug or an unforeseen failure: still an OpenAI body (uvicorn logs the traceback)."""
        error = OpenAIError(500, "the server failed on this request (an internal error; its log has the details)", None, "internal_error", "server_error")
        return JSONResponse(error.body(), status_code=500)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":
            message, param = "the request body is not valid JSON", None
        elif not loc:  # the body as a whole: not an object, or not sent as JSON (curl -d sends a form)
            message, param = "the request body must be a JSON object sent with Content-Type: application/json", None
        else:
            message, param = f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid value')}", (loc[0] if loc else None)
        return JSONResponse(OpenAIError(400, message, param).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        """404, 405 (with Allow) and FastAPI's body errors (e.g. a body that is not UTF-8)."""
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        error = OpenAIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", kind=kind)
        return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)

    @app.get("/health")
    async def health():
        if frontend.draining:  # load balancers stop sending here while the streams finish
            return JSONResponse({"status": "draining"}, status_code=503)
        try:
            ok = frontend.client is not None and await frontend.client.is_server_ready()
        except Exception:  # noqa: BLE001 - Triton down or restarting (serve supervises it): not ready, not a 500
            ok = False
        return JSONResponse({"status": "ok" if ok else "triton not ready"}, status_code=200 if ok else 503)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model_card(m) for m in frontend.models.values()]}

    @app.get("/v1/models/{name}")
    async def model(name: str):
        return _model_card(frontend.model(name))

    # Templating and tokenizing run in worker threads: a long prompt must not stall the event loop
    # (and with it every other request's stream).

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request):
        info = frontend.model(body.model)
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        sampling = frontend.sampling(body, info, max_tokens)
        prompt = await to_thread.run_sync(frontend.chat_prompt, body, info)
        await to_thread.run_sync(frontend.check_prompt, info, prompt, "messages")
        return await _answer(request, body, info, frontend.open(info, prompt, sampling), chat=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        info = frontend.model(body.model)
        prompt = body.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1 or not isinstance(prompt[0], str):
                raise OpenAIError(400, "prompt must be one string (lists of prompts and token ids are not supported); send one request per prompt", "prompt")
            prompt = prompt[0]
        sampling = frontend.sampling(body, info, body.max_tokens)
        await to_thread.run_sync(frontend.check_prompt, info, prompt, "prompt")
        return await _answer(request, body, info, frontend.open(info, prompt, sampling), chat=False)

    async def _answer(request: Request, body: _Sampling, info: ModelInfo, stream: TritonStream, chat: bool):
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            # the first response comes before any byte is sent, so request errors are plain 400s
            iterator = stream.__aiter__()
            try:
                first = await iterator.__anext__()
            except OpenAIError:
                stream.close()
                raise
            events = _stream_events(iterator, first, ident, created, info.name, chat, usage)
            return StreamingResponse(events, media_type="text/event-stream", background=BackgroundTask(stream.close))
        task = asyncio.ensure_future(_collect(stream))
        while True:  # a client that hangs up cancels its request
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                break
            if await request.is_disconnected():
                stream.close()
                task.cancel()
                return JSONResponse({}, status_code=499)
        text, last = task.result()
        choice = {"index": 0, "finish_reason": _finish_reason(last.get("finish_reason"))}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice.update(text=text, logprobs=None)
        return {"id": ident, "object": kind, "created": created, "model": info.name, "choices": [choice], "usage": _usage(last)}

    return app


async def _collect(stream: TritonStream) -> tuple[str, dict]:
    parts, last = [], {}
    async for response in stream:
        parts.append(response.get("text_output") or "")
        last = response
    return "".join(parts), last


async def _stream_events(iterator, first: dict, ident: str, created: int, model: str, chat: bool, usage: bool) -> AsyncIterator[str]:
    """OpenAI chunks: role first (chat), one chunk per decoding step, finish, usage, [DONE]."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    extra = {"usage": None} if usage else {}

    def chunk(text: str | None, finish: str | None, role: bool = False) -> dict:
        if chat:
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text is not None else {})
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        return {"id": ident, "object": kind, "created": created, "model": model, "choices": [choice], **extra}

    if chat:
        yield _sse(chunk(None, None, role=True))
    last = first
    try:
        response = first
        while True:
            if response.get("text_output"):
                yield _sse(chunk(response["text_output"], None))
            last = response
            if response.get("finish_reason"):
                break
            response = await iterator.__anext__()
    except StopAsyncIteration:
        pass
    except OpenAIError as exc:  # mid-stream: the error travels as an event, then the stream ends
        yield _sse(exc.body())
        return
    except Exception:  # noqa: BLE001 - headers are sent: an error event is the only way to say it
        log.exception("the stream %s failed", ident)
        yield _sse(OpenAIError(500, "the server failed on this request (an internal error; its log has the details)", None, "internal_error", "server_error").body())
        return
    yield _sse(chunk(None if chat else "", _finish_reason(last.get("finish_reason"))))
    if usage:
        yield _sse({"id": ident, "object": kind, "created": created, "model": model, "choices": [], "usage": _usage(last)})
    yield _sse("[DONE]")


def _model_card(info: ModelInfo) -> dict:
    card = {"id": info.name, "object": "model", "created": info.created, "owned_by": "trtllm-dflash"}
    card["dflash"] = {"speculative": info.speculative, "max_context": info.max_context, "max_tokens": info.max_tokens}
    return card


# ---------------------------------------------------------------------- running it

GRACE = 2.0  # seconds uvicorn waits for connections after the drain before cancelling them


def _draining_server(config, frontend: Frontend):
    """A uvicorn Server whose exit (SIGTERM, Ctrl-C, OpenAIServer.stop) drains first.

    uvicorn's own shutdown closes the port at once; here the port stays open while the requests
    in flight finish (up to `drain_timeout`), new generation requests get 503 and /health says
    "draining", and only then does uvicorn shut down. A second Ctrl-C exits at once.
    """
    import uvicorn

    class DrainingServer(uvicorn.Server):
        async def on_tick(self, counter: int) -> bool:
            should_exit = await super().on_tick(counter)
            if not should_exit or self.force_exit:
                return should_exit
            return frontend.drained()

    return DrainingServer(config)


class OpenAIServer:
    """uvicorn serving the app in a background thread; a context manager (tests, `serve --openai-port`).

        with OpenAIServer("127.0.0.1:8001", port=free_port()) as front:
            openai.OpenAI(base_url=front.url, api_key="none").models.list()
    """

    def __init__(self, triton_url: str, host: str = "127.0.0.1", port: int = 8080, models: Sequence[str] = (),
                 tokenizer: str | None = None, repository: str | Path | None = None, log_level: str = "warning",
                 startup_timeout: float = 300.0, api_key: str | None = None, max_queued: int = DEFAULT_MAX_QUEUED,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, drain_timeout: float = DEFAULT_DRAIN_TIMEOUT) -> None:
        _require_extra()
        self.host, self.port = host, port
        self.config = FrontendConfig(triton_url, tuple(models), tokenizer, Path(repository).resolve() if repository else None,
                                     api_key or None, max_queued, max_request_bytes, drain_timeout)
        self.log_level = log_level
        self.startup_timeout = startup_timeout
        self.frontend: Frontend | None = None
        self._server = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The base URL OpenAI clients take (http://host:port/v1)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}/v1"

    def uvicorn_server(self):
        """A uvicorn server over the app; finds the models first (DFlashError if it cannot)."""
        import uvicorn

        from trtllm_dflash.serving.server import _port_free

        if self.port and not _port_free(self.port):
            raise DFlashError(f"port {self.port} is already in use", "pass another port for the OpenAI API or stop what listens there")
        self.frontend = Frontend(self.config)
        self.frontend.discover()
        app = create_app(self.frontend)
        config = uvicorn.Config(app, host=self.host, port=self.port, log_level=self.log_level, lifespan="on",
                                timeout_graceful_shutdown=GRACE)
        warning = exposure_warning(self.host, self.port, self.config.api_key)
        if warning:
            log.warning(warning)  # after uvicorn.Config, which sets up uvicorn's loggers
        self._server = _draining_server(config, self.frontend)
        return self._server

    def start(self) -> str:
        """Start serving and block until the front end has found its models (uvicorn_server()
        first when its app is to be changed before serving)."""
        if self._server is None:
            self.uvicorn_server()
        self._thread = threading.Thread(target=self._server.run, name="dflash-openai", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise DFlashError("the OpenAI front end stopped while starting", "read its log above")
            if time.monotonic() > deadline:
                self.stop()
                raise DFlashError(f"the OpenAI front end was not up after {self.startup_timeout:.0f} s", "check that Triton is ready")
            time.sleep(0.05)
        return self.url

    def stop(self) -> None:
        """Drain (requests in flight finish, up to drain_timeout; new ones get 503), then stop."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(self.config.drain_timeout + GRACE + 15)
        self._server = self._thread = None

    def __enter__(self) -> "OpenAIServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

"""The OpenAI front end's state: the served models it found, and each request's checks and translation.

`Frontend` discovers the DFlash models Triton serves (with their limits and tokenizers), turns an
OpenAI request into SamplingParams (whose checks are the only range checks; their errors become
400s naming the OpenAI field), checks the prompt against the model's context, and opens the
request on Triton's gRPC stream.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from trtllm_dflash.contracts.grammar_spec import GrammarSpec
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.sampling_params import PromptTooLongError, SamplingError, SamplingParams, check_prompt_text, check_prompt_tokens
from trtllm_dflash.served_model.model_parameters import DEFAULT_NEW_TOKENS, ServingConfig, ServingLimits
from trtllm_dflash.served_model.protocol import (
    INPUT_NAMES,
    LIMITS_OUTPUT,
    LLMAPI_MARKER,
    OWN_ONLY_INPUTS,
    LLMApiStream,
    llmapi_body,
    params_body,
)
from trtllm_dflash.serving.openai.schemas import (
    ACCEPTED_VALUES,
    GRAMMAR_FIELDS,
    IGNORED,
    UNSUPPORTED,
    ChatCompletionRequest,
    GenerationRequest,
    OpenAIError,
)
from trtllm_dflash.serving.openai.tool_calls import request_grammar, tool_format_of
from trtllm_dflash.serving.openai.triton import TritonStream

log = logging.getLogger("uvicorn.error")  # uvicorn's logger: its lines share uvicorn's format and level

DEFAULT_MAX_QUEUED = 256
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
DEFAULT_DRAIN_TIMEOUT = 30.0
DEFAULT_READ_TIMEOUT = 10.0  # seconds for a request's headers, and again for its body (slow-loris clients)
DEFAULT_MAX_CONNECTIONS = 1024  # open HTTP connections; above the in-flight bound (max_batch + max_queued)
INLINE_CHARS = 4096  # prompts (and chat bodies) this short are tokenized (rendered) on the event loop: Frontend.prompt_ids
LIMITS_TIMEOUT = 60.0  # seconds a loaded model gets to answer the probe that reads its limits (its process answers at once)


@dataclasses.dataclass
class ModelInfo:
    """One Triton model as the front end exposes it."""

    name: str
    tokenizer: Any
    max_context: int | None  # prompt + generated tokens (None: not known, Triton checks)
    max_new_tokens_limit: int | None  # largest max_tokens a request may ask for (None: not known)
    default_max_new_tokens: int  # what a request that does not say gets
    speculative: bool
    created: int
    max_batch: int = 0  # requests the model decodes at once (0: not known); sizes the queue bound
    # NVIDIA's LLM-API model (the trtllm backend's repository): its declared inputs; empty for ours
    llmapi_inputs: frozenset = frozenset()
    # the model takes the prompt as token ids (`input_ids`; repositories written before it take text only)
    takes_ids: bool = False
    # the model takes `cache_salt` (repositories written before it do not: they cannot isolate tenants)
    takes_salt: bool = False
    # the model follows a grammar (`guided_decoding`), and its family's tool-call format (tool_calls.py)
    takes_grammar: bool = False
    # the model can leave the running totals out of all but a stream's last response (`stream_totals`)
    takes_stream_totals: bool = False
    tool_format: str | None = None
    # one prompt tokenized at a time per tokenizer: a fast tokenizer used from two threads can
    # fail ("Already borrowed") when one of them touches its padding/truncation settings
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def encode(self, text: str, wait: bool = True) -> list[int] | None:
        """`text`'s token ids as the model encodes a prompt (it tokenizes, under `lock`); None when
        `wait` is False and another thread is tokenizing."""
        if not self.lock.acquire(blocking=wait):
            return None
        try:
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        finally:
            self.lock.release()

    def count_tokens(self, text: str) -> int:
        """How many tokens `text` is as a prompt (NVIDIA's LLM-API model does not report it)."""
        return len(self.encode(text))


def published_limits(client, name: str, timeout: float = LIMITS_TIMEOUT) -> ServingLimits:
    """The limits model `name` runs with, as it answers a health probe (protocol.LIMITS_OUTPUT);
    `client` is a tritonclient.grpc client with no stream open."""
    from trtllm_dflash.serving.client import health_probe

    answer = health_probe(client, name, timeout)
    if answer is None:
        raise DFlashError(f"model {name!r} did not say its limits within {timeout:.0f} s", "check that its process is alive")
    result, error = answer
    value = None if error is not None else result.as_numpy(LIMITS_OUTPUT)
    if value is None or value.size != 1:
        raise DFlashError(f"model {name!r} did not say its limits ({error or 'no ' + LIMITS_OUTPUT})", "rewrite its repository")
    text = value.reshape(-1)[0]
    return ServingLimits.from_json(text.decode() if isinstance(text, bytes) else str(text))


def _tokenizer_dir(config: ServingConfig | None, name: str, override: str | None, repository: Path | None) -> Path:
    from trtllm_dflash.checkpoints import resolve_checkpoint

    if override:
        return resolve_checkpoint(override, "tokenizer")
    if config is None:
        raise DFlashError(
            f"model {name!r} is not a trtllm-dflash Python-backend model", "pass --tokenizer DIR (the target's tokenizer) to serve it"
        )
    if config.engines and config.target in ("", None):  # an engines-only model: no tokenizer to borrow
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
        raise DFlashError(
            f"cannot load a tokenizer from {folder} for model {name!r} ({type(exc).__name__})", "pass --tokenizer DIR with tokenizer.json"
        ) from None
    if config is None:
        return ModelInfo(name, tok, None, None, DEFAULT_NEW_TOKENS, False, int(time.time()))
    limits = config.limits()
    return ModelInfo(
        name,
        tok,
        limits.max_context,
        limits.max_new_tokens,
        limits.default_new_tokens,
        config.speculative,
        int(time.time()),
        config.max_batch,
        tool_format=tool_format_of(folder),
    )


def with_limits(info: ModelInfo, limits: ServingLimits) -> ModelInfo:
    """`info` checking requests against `limits` (a model's published ones)."""
    if info.max_context is not None and limits.max_context != info.max_context:
        log.info("model %r runs with %d tokens of context (config.pbtxt asks %d)", info.name, limits.max_context, info.max_context)
    return dataclasses.replace(
        info, max_context=limits.max_context, max_new_tokens_limit=limits.max_new_tokens, default_max_new_tokens=limits.default_new_tokens
    )


@dataclasses.dataclass
class FrontendConfig:
    triton_url: str  # gRPC host:port
    models: Sequence[str] = ()  # expose only these (default: every DFlash model Triton serves)
    tokenizer: str | None = None  # overrides the targets named in the model configs
    repository: Path | None = None  # resolves relative target paths of the model configs
    api_keys: tuple[str, ...] = ()  # one of them required as `Authorization: Bearer KEY` on every route but /health
    max_queued: int = DEFAULT_MAX_QUEUED  # requests in flight beyond what the models decode at once
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # larger bodies get 413, unparsed
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT  # seconds in-flight requests get to finish on shutdown
    # chat_template_kwargs.chat_template replaces the model's template (a program run on this host): off by default
    allow_request_chat_template: bool = False
    read_timeout: float = DEFAULT_READ_TIMEOUT  # a client slower to send its headers (or its body) gets 408 and is cut off
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # connections past it get 503 and are closed at once
    # who shares prefix-cache blocks without a cache_salt: "server" (everyone), "key" (each API key
    # apart), "auto" ("key" when several keys are configured, else "server")
    prefix_cache_scope: str = "auto"
    # without an API key, the Host names requests must carry (empty or "*": any); see gate._host_error
    allowed_hosts: tuple[str, ...] = ()

    @property
    def per_key(self) -> bool:
        """Each API key is a tenant whose prefix-cache blocks no other key's requests reach."""
        return self.prefix_cache_scope == "key" or (self.prefix_cache_scope == "auto" and len(self.api_keys) > 1)


PREFIX_CACHE_SCOPES = ("auto", "server", "key")


def tenant_of(key: str) -> str:
    """A key's tenant name in cache salts: a digest, so the key itself never leaves the front end."""
    return hashlib.sha256(b"dflash-trt tenant\0" + key.encode()).hexdigest()[:32]


def cache_salt(config: FrontendConfig, salt: str | None, tenant: str | None) -> str | None:
    """The salt sent to the model: the request's own, inside its key's tenant when keys are
    tenants (so two keys never share blocks, even with equal salts); None shares server-wide."""
    if config.per_key and tenant is not None:
        return f"tenant:{tenant}" + ("" if salt is None else f"\0{salt}")
    return salt


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
            raise DFlashError(
                f"cannot reach Triton's gRPC endpoint at {self.config.triton_url} ({exc.message()})",
                "start `dflash-trt serve REPO` first or fix --triton-url (host:8001)",
            ) from None
        ready = [m["name"] for m in index.get("models", []) if m.get("state") == "READY"]
        for name in list(self.config.models) or ready:
            if name not in ready:
                raise DFlashError(
                    f"model {name!r} is not ready on Triton at {self.config.triton_url} (ready: {', '.join(ready) or 'none'})",
                    "pass a served model with --model",
                )
            config = client.get_model_config(name, as_json=True)
            parameters = config.get("config", config).get("parameters", {})
            metadata = client.get_model_metadata(name, as_json=True)
            inputs = frozenset(i["name"] for i in metadata.get("inputs", []))
            try:
                info = load_model_info(name, parameters, self.config.tokenizer, self.config.repository)
                if LIMITS_OUTPUT in {o["name"] for o in metadata.get("outputs", [])}:  # the limits it runs with, not config.pbtxt's
                    info = with_limits(info, published_limits(client, name))
                if LLMAPI_MARKER in inputs:  # NVIDIA's LLM-API model: asked for its finish reason and figures
                    info = dataclasses.replace(info, llmapi_inputs=inputs, speculative=True)
                else:
                    info = dataclasses.replace(
                        info,
                        takes_ids="input_ids" in inputs,
                        takes_salt="cache_salt" in inputs,
                        takes_grammar="guided_decoding" in inputs,
                        takes_stream_totals="stream_totals" in inputs,
                    )
                if self.config.per_key and not info.takes_salt:
                    raise DFlashError(
                        f"model {name!r} cannot keep API keys' prefix caches apart (its repository has no cache_salt input)",
                        "rewrite the repository with `dflash-trt repo`, or pass --prefix-cache-scope server to let the keys share it",
                    )
                self.models[name] = info
            except DFlashError:
                if self.config.models:  # named explicitly: say why it cannot be served
                    raise
        client.close()
        if not self.models:
            raise DFlashError(
                f"Triton at {self.config.triton_url} serves no DFlash model", "serve a repository written by `dflash-trt repo`"
            )

    async def start(self) -> None:
        """The async gRPC client, created on the serving event loop."""
        import tritonclient.grpc.aio as grpcaio

        self.client = grpcaio.InferenceServerClient(self.config.triton_url)

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.close()

    def model(self, name: str) -> ModelInfo:
        if name not in self.models:
            shown = name if len(name) <= 256 else name[:256] + "..."  # a client's megabyte is not echoed back
            raise OpenAIError(
                404, f"The model '{shown}' does not exist; this server has {', '.join(self.models)}", "model", "model_not_found"
            )
        return self.models[name]

    # ------------------------------------------------------------------ validation

    def sampling(self, request: GenerationRequest, info: ModelInfo, max_tokens_field: str = "max_tokens") -> SamplingParams:
        """The request's SamplingParams, checked by SamplingParams itself; OpenAI's defaults for
        what the request leaves out. `max_tokens_field` is the field that carries the length
        (chat requests may send max_completion_tokens instead)."""
        extra = {**(request.model_extra or {}), "echo": getattr(request, "echo", None)}
        for name, allowed in UNSUPPORTED.items():
            if name in extra and not allowed(extra[name]):
                accepted = f" or send {ACCEPTED_VALUES[name]}" if name in ACCEPTED_VALUES else ""
                raise OpenAIError(
                    400, f"'{name}' with this value is not supported by this server; leave it out{accepted}", name, "unsupported_parameter"
                )
        for name in extra:
            if name not in UNSUPPORTED and name not in IGNORED and name not in GRAMMAR_FIELDS:
                raise OpenAIError(
                    400,
                    f"'{name}' is not a parameter this server knows, so it would be ignored; leave it out",
                    name,
                    "unsupported_parameter",
                )
        if request.n not in (None, 1):
            raise OpenAIError(
                400,
                f"n={request.n} is not supported: this server returns one choice per request; send n=1 and repeat the request for more",
                "n",
            )
        max_tokens = getattr(request, max_tokens_field)
        stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
        params = SamplingParams(
            max_new_tokens=info.default_max_new_tokens if max_tokens is None else max_tokens,
            temperature=1.0 if request.temperature is None else request.temperature,
            top_k=0 if request.top_k in (None, -1) else request.top_k,
            top_p=1.0 if request.top_p is None else request.top_p,
            seed=request.seed,
            stop=tuple(s for s in stop if s),
            min_tokens=request.min_tokens or 0,
            ignore_eos=bool(request.ignore_eos),
            grammar=self.grammar(request, extra, info),
        )
        try:
            params.validate()
            if info.max_new_tokens_limit is not None:
                params.check_limit(info.max_new_tokens_limit)
        except SamplingError as exc:
            raise OpenAIError(
                400,
                str(exc.renamed({"max_new_tokens": max_tokens_field})),
                max_tokens_field if exc.field == "max_new_tokens" else exc.field,
            ) from None
        return params

    def grammar(self, request: GenerationRequest, extra: dict, info: ModelInfo) -> GrammarSpec | None:
        """The grammar the request asks for (tool_calls.request_grammar), if the model can follow one."""
        if "tools" in extra and not hasattr(request, "messages"):
            raise OpenAIError(400, "tools are taken on /v1/chat/completions; send the request there", "tools", "unsupported_parameter")
        spec = request_grammar(extra, info.tool_format, info.name)
        if spec is not None and not info.takes_grammar:
            asked = next(
                (name for name in ("tools", "structured_outputs", "guided_json", "guided_regex", "guided_choice") if extra.get(name)),
                "response_format",
            )
            raise OpenAIError(
                400,
                f"model '{info.name}' cannot follow a grammar (its repository was written before grammars, or it is "
                f"NVIDIA's LLM-API model); rewrite its repository with `dflash-trt repo`",
                asked,
                "unsupported_parameter",
            )
        return spec

    async def prompt_ids(self, info: ModelInfo, text: str, param: str) -> list[int]:
        """`check_prompt` on the event loop for a short prompt, else in a worker thread.

        A prompt of up to INLINE_CHARS characters tokenizes in well under a millisecond (~0.2 us a
        character), while a worker thread's round trip through the GIL and back to the loop took
        2.5 ms at the median and up to 39 ms at concurrency 8 (measured in the served benchmark):
        most of the front end's share of the time to first token. A long prompt, or one that finds
        the tokenizer busy in a worker thread, still goes to a thread, so the loop never waits.
        """
        from anyio import to_thread

        if len(text) <= INLINE_CHARS:
            ids = self.check_prompt(info, text, param, wait=False)
            if ids is not None:
                return ids
        return await to_thread.run_sync(self.check_prompt, info, text, param)

    def check_prompt(self, info: ModelInfo, text: str, param: str, wait: bool = True) -> list[int] | None:
        """The prompt's token ids (as the model encodes a prompt); 400 when empty or over the context.
        The request then carries these ids (`open`): a prompt is tokenized once, here.

        Blocking (it tokenizes; `prompt_ids` decides where it runs). With `wait` False, None when
        another thread holds the tokenizer. A prompt too long by its character count alone is
        refused before tokenizing, so a huge prompt costs nothing.
        """
        try:
            check_prompt_text(text, info.max_context)
            ids = info.encode(text, wait)
            if ids is None:
                return None
            check_prompt_tokens(len(ids), info.max_context)
        except PromptTooLongError as exc:  # in OpenAI's words, which clients look for
            held = f", more than {exc.max_context} tokens of text can hold" if exc.unit == "characters" else ""
            raise OpenAIError(
                400,
                f"This model's maximum context length is {exc.max_context} tokens; "
                f"the prompt has {exc.length} {exc.unit}{held}. Shorten it.",
                param,
                "context_length_exceeded",
            ) from None
        except SamplingError as exc:
            raise OpenAIError(400, str(exc), param) from None
        return ids

    def chat_prompt(self, request: ChatCompletionRequest, info: ModelInfo) -> str:
        from trtllm_dflash.chat import (
            RENDER_CHARS,
            NoChatTemplateError,
            RenderLimitError,
            TemplateKwargError,
            apply_chat_template,
            check_template_kwargs,
        )
        from trtllm_dflash.contracts.request_limits import PROMPT_CHARS_PER_TOKEN

        if not request.messages:
            raise OpenAIError(400, "messages is empty; send at least one message", "messages")
        for i, message in enumerate(request.messages):
            if message.content is None and message.role != "assistant":
                raise OpenAIError(400, f"messages[{i}] ({message.role}) has no content; give every message a content", "messages")
        try:
            check_template_kwargs(info.tokenizer, request.chat_template_kwargs, self.config.allow_request_chat_template)
        except TemplateKwargError as exc:
            raise OpenAIError(400, str(exc), "chat_template_kwargs", "unsupported_template_kwarg") from None
        # room for every message a body can carry, twice (templates repeat a system prompt), and for a
        # text the context check then refuses in its own words (context_length_exceeded)
        max_chars = max(RENDER_CHARS, 2 * self.config.max_request_bytes, (info.max_context or 0) * PROMPT_CHARS_PER_TOKEN + 1)
        try:
            kwargs = dict(request.chat_template_kwargs or {})
            tools = (request.model_extra or {}).get("tools")
            if tools and (request.model_extra or {}).get("tool_choice") != "none":
                kwargs["tools"] = tools  # the template shows the model its tools, as in the family's own format
            return apply_chat_template(info.tokenizer, [m.model_dump() for m in request.messages], kwargs, max_chars=max_chars)
        except RenderLimitError as exc:
            raise OpenAIError(400, str(exc), "messages", "chat_template_limit") from None
        except NoChatTemplateError:
            raise OpenAIError(
                400,
                f"model '{info.name}' has no chat template (its target tokenizer has none); use /v1/completions, "
                "or add a chat_template to the target's tokenizer_config.json",
                "messages",
                "no_chat_template",
            ) from None
        except DFlashError as exc:
            raise OpenAIError(400, str(exc), "messages") from None

    def open(
        self, info: ModelInfo, prompt: str, params: SamplingParams, prompt_ids: list[int] | None = None, salt: str | None = None
    ) -> TritonStream:
        """The request on Triton's stream: as `prompt_ids` (checked by `check_prompt`) where the model takes ids, else as text;
        `salt` from `cache_salt()`."""
        if salt is not None and not info.takes_salt:
            raise OpenAIError(
                400,
                f"'cache_salt' is not supported by model '{info.name}' (its repository was written before it, "
                "or it is NVIDIA's LLM-API model); leave it out",
                "cache_salt",
                "unsupported_parameter",
            )
        if not info.llmapi_inputs:
            return TritonStream(
                self.client,
                info.name,
                params_body(
                    prompt,
                    params,
                    streaming=True,
                    prompt_ids=prompt_ids if info.takes_ids else None,
                    cache_salt=salt,
                    stream_totals=not info.takes_stream_totals,  # the totals are read from the last response only
                ),
            )
        body = params_body(prompt, params, streaming=True)
        for field, wire in INPUT_NAMES.items():  # ours alone (min_tokens, ignore_eos): refused rather than dropped
            if wire in OWN_ONLY_INPUTS and wire in body and wire not in info.llmapi_inputs:
                raise OpenAIError(
                    400,
                    f"'{field}' is not supported by model '{info.name}' (NVIDIA's LLM-API model); leave it out",
                    field,
                    "unsupported_parameter",
                )
        return TritonStream(self.client, info.name, llmapi_body(body, info.llmapi_inputs), LLMApiStream(), info.count_tokens, prompt)

"""The OpenAI-compatible routes: `/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/health`.

Each generation request is checked and translated by the Frontend, sent on Triton's gRPC stream,
and answered as one OpenAI response or as server-sent events (one chunk per decoding step). Every
error, including FastAPI's own, is answered with OpenAI's error body.
"""

import asyncio
import json
import logging
import math
import time
import uuid
from typing import AsyncIterator, Callable

from trtllm_dflash.extras import require_installed
from trtllm_dflash.serving.openai.frontend import INLINE_CHARS, Frontend, ModelInfo, cache_salt
from trtllm_dflash.serving.openai.gate import TENANT, Gate
from trtllm_dflash.serving.openai.schemas import ChatCompletionRequest, CompletionRequest, GenerationRequest, OpenAIError
from trtllm_dflash.serving.openai.spec_stats import avg_decoded_tokens_per_iter, speculative_decoding
from trtllm_dflash.serving.openai.tool_calls import ToolCallStream, parse_tool_calls
from trtllm_dflash.serving.openai.triton import TritonStream

log = logging.getLogger("uvicorn.error")  # uvicorn's logger: its lines share uvicorn's format and level

HEALTH_TIMEOUT = 1.0  # seconds /health waits for Triton's readiness before answering 503


def require_extra() -> None:
    """FastAPI, uvicorn and tritonclient's asyncio gRPC client come with the `serve` extra."""
    require_installed(("fastapi", "uvicorn", "tritonclient"), "the OpenAI-compatible server")


def create_app(frontend: Frontend):
    """The FastAPI app over a Frontend that has discovered its models."""
    require_extra()
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
        error = OpenAIError(
            500, "the server failed on this request (an internal error; its log has the details)", None, "internal_error", "server_error"
        )
        return JSONResponse(error.body(), status_code=500)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":
            message, param = "the request body is not valid JSON", None
        elif not loc:  # the body as a whole: not an object, or not sent as JSON (curl -d sends a form)
            message, param = "the request body must be a JSON object sent with Content-Type: application/json", None
        elif isinstance(first.get("input"), float) and not math.isfinite(first["input"]):  # not "should be <= 2"
            value = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}[str(first["input"])]
            message, param = f"{'.'.join(loc)}: {value} is not a number this field takes; send a finite number", loc[0]
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
        """200 while Triton is ready, else 503 within HEALTH_TIMEOUT: a probe must not hang on a
        Triton that is stopped, restarting or wedged (a port that accepts but never answers)."""
        if frontend.draining:  # load balancers stop sending here while the streams finish
            return JSONResponse({"status": "draining"}, status_code=503)
        ok, why = False, "the front end's gRPC client is not started"
        try:
            if frontend.client is not None:
                ok, why = (
                    await asyncio.wait_for(  # the gRPC deadline, and a bound of our own
                        frontend.client.is_server_ready(client_timeout=HEALTH_TIMEOUT), HEALTH_TIMEOUT + 0.5
                    ),
                    "it says it is not ready",
                )
        except Exception as exc:  # noqa: BLE001 - Triton down or restarting (serve supervises it): not ready, not a 500
            why = _triton_failure(exc)
        if ok:
            return JSONResponse({"status": "ok"})
        error = OpenAIError(
            503,
            f"the model server (Triton at {frontend.config.triton_url}) is not ready: {why}; retry once it has started",
            None,
            "model_server_not_ready",
            "server_error",
        )
        return JSONResponse({"status": "not ready", **error.body()}, status_code=503)

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
        params = frontend.sampling(body, info, "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens")
        if _body_chars(request) <= INLINE_CHARS:  # a short conversation renders in well under a millisecond
            prompt = frontend.chat_prompt(body, info)
        else:
            prompt = await to_thread.run_sync(frontend.chat_prompt, body, info)
        ids = await frontend.prompt_ids(info, prompt, "messages")
        return await _answer(
            request, body, info, lambda: frontend.open(info, prompt, params, ids, _salt(frontend, body, request)), chat=True
        )

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        info = frontend.model(body.model)
        prompt = body.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1 or not isinstance(prompt[0], str):
                raise OpenAIError(
                    400,
                    "prompt must be one string (lists of prompts and token ids are not supported); send one request per prompt",
                    "prompt",
                )
            prompt = prompt[0]
        params = frontend.sampling(body, info)
        ids = await frontend.prompt_ids(info, prompt, "prompt")
        return await _answer(
            request, body, info, lambda: frontend.open(info, prompt, params, ids, _salt(frontend, body, request)), chat=False
        )

    async def _answer(request: Request, body: GenerationRequest, info: ModelInfo, open_stream: Callable[[], TritonStream], chat: bool):
        """Send the request to the model (unless its client already left: no prefill for nobody) and
        answer it; a client that leaves before its answer is complete cancels it there."""
        if await request.is_disconnected():
            return JSONResponse({}, status_code=499)
        stream = open_stream()
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        # vLLM's and TensorRT-LLM's per-request figures: only for our own drafting models (NVIDIA's
        # LLM-API model sends no acceptance lengths, an autoregressive model has none to tell)
        spec = info.speculative and not info.llmapi_inputs
        extra = body.model_extra or {}
        calls = info.tool_format if chat and extra.get("tools") and extra.get("tool_choice") != "none" else None  # read calls back
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            # the first response comes before any byte is sent, so request errors are plain 400s
            iterator = stream.__aiter__()
            first = await _first_response(iterator, stream, request)
            if first is None:  # the client left before its first token: the model drops the request at its next step
                return JSONResponse({}, status_code=499)
            events = _stream_events(iterator, first, ident, created, info.name, chat, usage, spec, calls)
            return StreamingResponse(events, media_type="text/event-stream", background=BackgroundTask(stream.close))
        collected = await _unless_disconnected(_collect(stream), stream, request)  # a client that hangs up cancels its request
        if collected is None:
            return JSONResponse({}, status_code=499)
        text, last, lengths = collected
        choice = {"index": 0, "finish_reason": _finish_reason(last.get("finish_reason"))}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
            if calls and (found := parse_tool_calls(text, calls))[1]:
                choice["message"] = {"role": "assistant", "content": found[0], "tool_calls": found[1]}
                choice["finish_reason"] = "tool_calls" if choice["finish_reason"] == "stop" else choice["finish_reason"]
        else:
            choice.update(text=text, logprobs=None)
        answer = {"id": ident, "object": kind, "created": created, "model": info.name, "choices": [choice], "usage": _usage(last)}
        if spec:
            choice["avg_decoded_tokens_per_iter"] = avg_decoded_tokens_per_iter(lengths)
            answer["metrics"] = _metrics(lengths, last)
        return answer

    return app


async def _first_response(iterator, stream: TritonStream, request) -> dict | None:
    """The stream's first response, or None when the client disconnects first (the stream is then
    closed, which cancels the request in the model); a request error closes it and is raised."""
    try:
        return await _unless_disconnected(iterator.__anext__(), stream, request)
    except OpenAIError:
        stream.close()
        raise


async def _unless_disconnected(awaitable, stream: TritonStream, request):
    """What `awaitable` gives, or None when the client disconnects first: the stream is then closed
    at once, which cancels the request in the model before (or during) its prefill.

    Waits on the connection's own disconnect message instead of polling for it (every 100 ms
    before, long enough for a short prompt to be prefilled for a client already gone)."""
    task = asyncio.ensure_future(awaitable)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        left = not task.done()  # the client left, or this coroutine was cancelled
        if left:
            stream.close()
            task.cancel()
    return None if left else task.result()


async def _disconnect(request) -> None:
    """Returns when the client has disconnected (the body was read already: nothing else comes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _body_chars(request) -> float:
    """The request body's length from its Content-Length header (infinite when not sent)."""
    try:
        return int(request.headers.get("content-length", ""))
    except ValueError:
        return float("inf")


def _salt(frontend: Frontend, body: GenerationRequest, request) -> str | None:
    """The cache salt of a request: its own cache_salt, in its API key's tenant (gate.TENANT)."""
    return cache_salt(frontend.config, body.cache_salt, request.scope.get(TENANT))


async def _collect(stream: TritonStream) -> tuple[str, dict, list[int]]:
    """The whole text, the last response (its totals) and every step's acceptance length."""
    parts, last, lengths = [], {}, []
    async for response in stream:
        parts.append(response.get("text_output") or "")
        lengths += response.get("acceptance_lengths") or []
        last = response
    return "".join(parts), last, lengths


async def _stream_events(
    iterator, first: dict, ident: str, created: int, model: str, chat: bool, usage: bool, spec: bool = False, calls: str | None = None
) -> AsyncIterator[str]:
    """OpenAI chunks: role first (chat), one chunk per decoding step, finish, usage, [DONE].

    With `calls` (a tool-call format) text is sent up to where a call starts; the calls follow as
    `tool_calls` deltas (one chunk each, arguments whole) once the answer is complete.

    With `spec`, the speculative statistics ride where vLLM and TensorRT-LLM put them: the finish
    chunk's choice carries avg_decoded_tokens_per_iter, and `metrics.speculative_decoding` goes on
    the usage chunk (on the finish chunk when no usage chunk was asked for): once per request.
    """
    kind = "chat.completion.chunk" if chat else "text_completion"
    extra = {"usage": None} if usage else {}

    def chunk(text: str | None, finish: str | None, role: bool = False, delta: dict | None = None) -> dict:
        if chat:
            delta = delta or ({"role": "assistant", "content": ""} if role else ({"content": text} if text is not None else {}))
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        return {"id": ident, "object": kind, "created": created, "model": model, "choices": [choice], **extra}

    if chat:
        yield _sse(chunk(None, None, role=True))
    last, lengths = first, []
    held = ToolCallStream(calls) if calls else None
    try:
        response = first
        while True:
            lengths += response.get("acceptance_lengths") or []
            text = response.get("text_output")
            if text and held is not None:
                text = held.feed(text)
            if text:
                yield _sse(chunk(text, None))
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
        yield _sse(
            OpenAIError(
                500,
                "the server failed on this request (an internal error; its log has the details)",
                None,
                "internal_error",
                "server_error",
            ).body()
        )
        return
    reason = _finish_reason(last.get("finish_reason"))
    if held is not None:
        rest, found = held.finish()
        if rest:
            yield _sse(chunk(rest, None))
        for index, call in enumerate(found):
            yield _sse(chunk(None, None, delta={"tool_calls": [{"index": index, **call}]}))
        reason = "tool_calls" if found and reason == "stop" else reason
    finish = chunk(None if chat else "", reason)
    if spec:
        finish["choices"][0]["avg_decoded_tokens_per_iter"] = avg_decoded_tokens_per_iter(lengths)
        if not usage:
            finish["metrics"] = _metrics(lengths, last)
    yield _sse(finish)
    if usage:
        tail = {"id": ident, "object": kind, "created": created, "model": model, "choices": [], "usage": _usage(last)}
        if spec:
            tail["metrics"] = _metrics(lengths, last)
        yield _sse(tail)
    yield _sse("[DONE]")


def _triton_failure(exc: Exception) -> str:
    """Why Triton's readiness probe failed, in a few words (a gRPC status, or the exception's type)."""
    status = getattr(exc, "status", None)
    code = str(status() or "") if callable(status) else ""
    if "DEADLINE_EXCEEDED" in code or isinstance(exc, asyncio.TimeoutError):
        return f"it did not answer within {HEALTH_TIMEOUT:g} s"
    if "UNAVAILABLE" in code:
        return "nothing answers on its gRPC port"
    return f"the probe failed ({code or type(exc).__name__})"


def _model_card(info: ModelInfo) -> dict:
    card = {"id": info.name, "object": "model", "created": info.created, "owned_by": "trtllm-dflash"}
    card["dflash"] = {"speculative": info.speculative, "max_context": info.max_context, "max_tokens": info.max_new_tokens_limit}
    return card


def _usage(last: dict) -> dict:
    prompt, completion = int(last.get("num_input_tokens") or 0), int(last.get("num_output_tokens") or 0)
    # OpenAI's (and vLLM's) prompt_tokens_details.cached_tokens: prompt tokens served from the prefix cache;
    # left out where the model does not report them (NVIDIA's LLM-API model)
    cached = last.get("num_cached_tokens")
    details = {"prompt_tokens_details": {"cached_tokens": int(cached)}} if cached is not None else {}
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        **details,
        "dflash": {  # an extension: the acceptance of this request's speculative decoding
            "mean_acceptance_length": round(float(last.get("mean_acceptance_length") or 0.0), 4),
            "acceptance_rate": round(float(last.get("acceptance_rate") or 0.0), 4),
            "accepted_draft_tokens": int(last.get("total_accepted_draft_tokens") or 0),
            "draft_tokens": int(last.get("total_draft_tokens") or 0),
            "time_to_first_token": round(float(last.get("time_to_first_token") or 0.0), 6),
        },
    }


def _metrics(lengths: list[int], last: dict) -> dict:
    """vLLM's top-level `metrics` object (spec_stats.py): what aiperf's spec-decode section reads."""
    return {"speculative_decoding": speculative_decoding(lengths, int(last.get("total_draft_tokens") or 0))}


def _finish_reason(value: str | None) -> str:
    return "stop" if value == "stop" else "length"  # "context": the context ran out


def _sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"

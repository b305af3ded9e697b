"""The gate in front of every route of the OpenAI front end: what makes it safe to expose.

An optional API key, a bounded request body (413) read within a deadline (408), only uncompressed
bodies (415), a bounded number of requests in flight (429 past it), and a drain on shutdown (503
to new requests while the streams in flight finish).
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Awaitable, Callable

from trtllm_dflash.serving.openai.frontend import Frontend
from trtllm_dflash.serving.openai.schemas import OpenAIError

GENERATE_PATHS = ("/v1/chat/completions", "/v1/completions")  # counted in flight, drained, queue-bounded
OPEN_PATHS = ("/health",)  # answered without the API key (load balancers, orchestrators)
ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


class Gate:
    """ASGI middleware in front of every route: API key, drain, body size, queue bound, in order.

    Plain ASGI rather than FastAPI dependencies because it must answer before the body is read
    or parsed, and it must count a streamed answer as in flight until its last byte is sent.
    Everything runs on the event loop, so the counter needs no lock.
    """

    def __init__(self, app: ASGIApp, frontend: Frontend) -> None:
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
        if error := _encoding_error(scope):
            return await refuse(error)
        try:
            body = await _read_body(scope, receive, config.max_request_bytes, config.read_timeout)
        except OpenAIError as error:
            return await refuse(error)
        if body is None:
            return  # the client left mid-body: nobody to answer
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


def _encoding_error(scope: dict) -> OpenAIError | None:
    """415 for a compressed body: it would be parsed as JSON and fail as "not valid JSON",
    which does not say why (and inflating it here would make the body bound meaningless)."""
    encoding = dict(scope["headers"]).get(b"content-encoding", b"").decode("latin-1").strip()
    if encoding.lower() in ("", "identity"):
        return None
    return OpenAIError(415, f"Content-Encoding: {encoding[:64]} is not supported; send the request body uncompressed "
                       "(plain JSON with Content-Type: application/json) and drop the Content-Encoding header",
                       None, "unsupported_content_encoding")


async def _read_body(scope: dict, receive: Callable, limit: int, timeout: float) -> bytes | None:
    """The request body, or None when the client left mid-body; OpenAIError 413 when it is over
    `limit` bytes, 408 when it takes longer than `timeout` seconds to arrive.

    A body over the limit is read on without being kept, up to 4x the limit, before the 413 is
    sent: a client still writing its body when the server closes the connection gets a reset
    instead of the answer. A declared Content-Length past that is refused at once. The deadline
    covers the whole body, so a client sending a byte a second (slow loris) is cut off.
    """
    too_large = OpenAIError(413, f"the request body is larger than this server's limit of {limit} bytes", None, "request_too_large")
    declared = dict(scope["headers"]).get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > 4 * limit:
        raise too_large
    deadline = asyncio.get_running_loop().time() + timeout
    chunks, size = [], 0
    while True:
        try:
            message = await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
        except asyncio.TimeoutError:
            raise OpenAIError(408, f"the request body did not arrive within {timeout:g} s ({size} bytes came); send it at once",
                              None, "request_timeout", headers={"Connection": "close"}) from None
        if message["type"] != "http.request":
            return None  # http.disconnect: nobody to answer
        chunk = message.get("body", b"")
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
        if not message.get("more_body", False) or size > 4 * limit:
            if size > limit:
                raise too_large
            return b"".join(chunks)


def _replay(body: bytes, receive: Callable) -> Callable:
    """A `receive` that hands the app the body read by Gate, then the client's later messages
    (the disconnect that cancels a stream)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> dict:
        return pending.pop() if pending else await receive()

    return replay

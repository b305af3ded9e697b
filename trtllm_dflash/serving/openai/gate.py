"""The gate in front of every route of the OpenAI front end: what makes it safe to expose.

An optional API key, a bounded request body (413) read within a deadline (408), only uncompressed
bodies (415), a bounded number of requests in flight (429 past it), and a drain on shutdown (503
to new requests while the streams in flight finish).
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Awaitable, Callable

from trtllm_dflash.serving.openai.frontend import Frontend, tenant_of
from trtllm_dflash.serving.openai.schemas import OpenAIError

GENERATE_PATHS = ("/v1/chat/completions", "/v1/completions")  # counted in flight, drained, queue-bounded
OPEN_PATHS = ("/health",)  # answered without the API key (load balancers, orchestrators)
TENANT = "dflash.tenant"  # the ASGI scope key where the gate leaves the request's tenant (frontend.tenant_of its key)
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

        if not config.api_keys and (error := _host_error(scope, config.allowed_hosts)):
            return await refuse(error)
        if config.api_keys and scope["path"] not in OPEN_PATHS:
            key = _matching_key(scope, config.api_keys)
            if isinstance(key, OpenAIError):
                return await refuse(key)
            scope[TENANT] = tenant_of(key)
        if generate and frontend.draining:
            return await refuse(
                OpenAIError(
                    503,
                    "the server is shutting down; send the request to another replica or retry after it restarts",
                    None,
                    "server_shutting_down",
                    "server_error",
                )
            )
        if error := _encoding_error(scope) or _content_type_error(scope):
            return await refuse(error)
        try:
            body = await _read_body(scope, receive, config.max_request_bytes, config.read_timeout)
        except OpenAIError as error:
            return await refuse(error)
        if body is None:
            return  # the client left mid-body: nobody to answer
        if generate and frontend.in_flight >= frontend.capacity:
            return await refuse(
                OpenAIError(
                    429,
                    f"this server has {frontend.in_flight} requests in flight, its limit; retry shortly",
                    None,
                    "rate_limit_exceeded",
                    "rate_limit_error",
                    {"Retry-After": "1"},
                )
            )
        frontend.in_flight += generate
        try:
            await self.app(scope, _replay(body, receive), send)
        finally:
            frontend.in_flight -= generate


def _error_response(error: OpenAIError):
    from fastapi.responses import JSONResponse

    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def _matching_key(scope: dict, keys: tuple[str, ...]) -> str | OpenAIError:
    """The key of `keys` the request carries as `Authorization: Bearer KEY` (every key compared, in
    constant time), else the 401 (or a 400 for several Authorization headers: which one counts
    would depend on the proxy in front)."""
    headers = [value for name, value in scope["headers"] if name == b"authorization"]
    if len(headers) > 1:
        return OpenAIError(
            400,
            f"the request has {len(headers)} Authorization headers; send exactly one (Authorization: Bearer KEY)",
            None,
            "invalid_authorization_header",
        )
    header = headers[0] if headers else b""
    scheme, _, token = header.partition(b" ")
    matches = [key for key in keys if hmac.compare_digest(token.strip(), key.encode())]
    if scheme.lower() == b"bearer" and matches:
        return matches[0]
    message = (
        "Incorrect API key provided."
        if header
        else "You didn't provide an API key. Send it in an Authorization header using Bearer auth (Authorization: Bearer KEY)."
    )
    return OpenAIError(401, message, None, "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def _encoding_error(scope: dict) -> OpenAIError | None:
    """415 for a compressed body: it would be parsed as JSON and fail as "not valid JSON",
    which does not say why (and inflating it here would make the body bound meaningless)."""
    encoding = dict(scope["headers"]).get(b"content-encoding", b"").decode("latin-1").strip()
    if encoding.lower() in ("", "identity"):
        return None
    return OpenAIError(
        415,
        f"Content-Encoding: {encoding[:64]} is not supported; send the request body uncompressed "
        "(plain JSON with Content-Type: application/json) and drop the Content-Encoding header",
        None,
        "unsupported_content_encoding",
    )


def _content_type_error(scope: dict) -> OpenAIError | None:
    """415 for a POST whose body is not declared JSON: a web page may send text/plain or a form to
    any address without asking first (a CORS "simple request"), never application/json."""
    if scope["method"] != "POST":
        return None
    declared = dict(scope["headers"]).get(b"content-type", b"").decode("latin-1")
    if declared.split(";")[0].strip().lower() == "application/json":
        return None
    return OpenAIError(
        415,
        f"the request body must be JSON sent with Content-Type: application/json (got {declared[:64] or 'none'})",
        None,
        "unsupported_media_type",
    )


def _host_error(scope: dict, allowed: tuple[str, ...]) -> OpenAIError | None:
    """Without an API key, a 400 for a Host this server does not go by: a web page that rebinds its
    own name to 127.0.0.1 (DNS rebinding) reaches the port, but with its own name as the Host."""
    if not allowed or "*" in allowed or scope["path"] in OPEN_PATHS:
        return None
    host = dict(scope["headers"]).get(b"host", b"").decode("latin-1").strip().lower()
    name = host[1 : host.index("]")] if host.startswith("[") and "]" in host else host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    if name in allowed:
        return None
    return OpenAIError(
        400,
        f"Host {host[:64]!r} is not a name this server answers to without an API key; "
        "use one of its names, or start it with --allowed-hosts NAME (or an API key)",
        None,
        "invalid_host",
    )


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
            raise OpenAIError(
                408,
                f"the request body did not arrive within {timeout:g} s ({size} bytes came); send it at once",
                None,
                "request_timeout",
                headers={"Connection": "close"},
            ) from None
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

"""An OpenAI-compatible HTTP front end for the served DFlash models (docs/serving.md).

`/v1/chat/completions`, `/v1/completions`, `/v1/models` and `/health`, in front of a running
Triton server. Why a separate process-side layer: Triton speaks its own protocol, while most
clients, benchmarks and UIs speak OpenAI's. The front end

- templates chat messages with the target tokenizer's chat template (`trtllm_dflash.chat`, the
  same code `generate --chat` runs offline) and checks the request with SamplingParams (the
  check the served model runs too) before Triton sees it;
- sends the prompt text to the model over Triton's async gRPC stream (`text_input`,
  `sampling_param_*`: the protocol of served_model/protocol.py) and turns the per-step responses into
  OpenAI chunks (server-sent events) or one response;
- cancels the gRPC call when its HTTP client goes away: Triton marks the request cancelled and
  the model's loop drops it from the batch between decoding steps (its decoder row is freed);
- is safe to expose (`Gate`): an optional API key, a bounded request body, a bounded number of
  requests in flight (429 past it), a drain on shutdown (503 to new requests while streams
  finish), strict request types and ranges, and an OpenAI error body on every error; and here,
  deadlines for a request's headers and body (slow clients get 408 and are cut off) and a bound
  on open connections.

FastAPI + uvicorn serve the HTTP side; `tritonclient.grpc.aio` the Triton side. The parts are
listed in this package's __init__.py.
"""

import ipaddress
import json
import logging
import socket
import threading
import time
from pathlib import Path
from typing import Sequence

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.serving.openai.app import create_app, require_extra
from trtllm_dflash.serving.openai.frontend import (
    DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_QUEUED,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_READ_TIMEOUT,
    PREFIX_CACHE_SCOPES,
    Frontend,
    FrontendConfig,
)
from trtllm_dflash.serving.openai.schemas import OpenAIError

log = logging.getLogger("uvicorn.error")  # uvicorn's logger: its lines share uvicorn's format and level

GRACE = 2.0  # seconds uvicorn waits for connections after the drain before cancelling them
HEALTH_LINES = (b"GET /health ", b"GET /health?")  # request lines answered past the connection cap
HEALTH_WAIT = 2.0  # seconds a connection past the cap has to send one


def is_loopback(host: str) -> bool:
    """Whether `host` only listens on this machine (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name or a wildcard ("", "0.0.0.0", "::" parse; other names may resolve anywhere)


def exposure_warning(host: str, port: int, keyed: bool) -> str | None:
    """The one line to print when the API is reachable from the network without a key."""
    if keyed or is_loopback(host):
        return None
    return (
        f"the OpenAI API listens on {host or '*'}:{port} without an API key: anyone who can reach this port can use the model; "
        "set DFLASH_API_KEY (or pass --api-key) to require `Authorization: Bearer KEY`"
    )


def host_names(host: str, extra: Sequence[str] | None = ()) -> tuple[str, ...]:
    """The Host names a keyless front end answers to: loopback names, the address it listens on,
    this machine's names and addresses, and `extra` (--allowed-hosts). A rebinding page carries a
    name of its own, never one of these."""
    names = ["localhost", "127.0.0.1", "::1", host.strip("[]"), socket.gethostname(), socket.getfqdn()]
    try:
        names += socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        pass
    return tuple(dict.fromkeys(name.lower() for name in [*names, *(extra or ())] if name and name not in ("0.0.0.0", "::")))


def api_keys(given: str | Sequence[str] | None, key_file: str | Path | None = None) -> tuple[str, ...]:
    """The API keys: those given (one or several) and those of `key_file`, one per line (blank lines
    and lines starting with # skipped). The file must not be readable by group or others, like an
    ssh key: it holds every tenant's secret. DFlashError names a bad file."""
    keys = [given] if isinstance(given, str) else list(given or ())
    if key_file is not None:
        path = Path(key_file)
        try:
            mode = path.stat().st_mode
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise DFlashError(
                f"cannot read the API key file {path} ({type(exc).__name__})", "pass a UTF-8 text file with one key per line"
            ) from None
        if mode & 0o077:
            raise DFlashError(f"the API key file {path} can be read by other users (mode {mode & 0o777:o})", f"chmod 600 {path}")
        keys += [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
        if not keys:
            raise DFlashError(f"the API key file {path} holds no key", "write one key per line")
    bad = [key for key in keys if not key or any(c.isspace() for c in key) or not key.isprintable()]
    if bad:
        raise DFlashError(
            "an API key is empty or has spaces or control characters", "use printable keys without spaces (e.g. `openssl rand -hex 32`)"
        )
    return tuple(dict.fromkeys(keys))


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


def _raw_response(status: int, reason: str, error: OpenAIError) -> bytes:
    """An HTTP/1.1 answer that closes the connection, written before (or without) a parsed request."""
    body = json.dumps(error.body()).encode()
    head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    return head.encode() + body


def guarded_protocol(read_timeout: float, max_connections: int) -> type:
    """uvicorn's h11 protocol with a deadline on each request's headers and a bound on connections.

    uvicorn times out idle keep-alive connections, but its timer restarts on every byte, and the
    first request of a connection has none: 200 clients sending a byte a second hold 200
    connections forever (slow loris). Here a request's headers must be in `read_timeout` seconds
    after the connection opens or the previous answer ends (and so must the rest of a body the
    answer did not wait for), else 408 and the connection is closed; Gate gives the body the same
    deadline. Connections past `max_connections` get 503 and are closed, except one whose request
    line is `GET /health` within HEALTH_WAIT s: that one is answered, then closed, so that idle
    sockets filling the cap do not fail a load balancer's health probe.
    """
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    warned = [0.0]  # when the last "too many connections" line was logged (one per 10 s)

    class GuardedProtocol(H11Protocol):
        _timer = None
        _bytes = 0  # received since the deadline was set: a request had begun
        _over_cap = False  # past max_connections: only a /health request line lets it through
        _health_only = False  # let through past the cap: closed after its one answer
        _head = b""

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                if time.monotonic() - warned[0] > 10:
                    warned[0] = time.monotonic()
                    log.warning("%d connections are open, the limit (--max-connections): new ones get 503 (but /health)", max_connections)
                self._over_cap = True
                self._timer = self.loop.call_later(min(read_timeout, HEALTH_WAIT), self._refuse)
                return
            self._arm()

        def _refuse(self) -> None:
            self._disarm()
            if not self.transport.is_closing():
                error = OpenAIError(
                    503,
                    f"this server has {max_connections} connections open, its limit; retry shortly",
                    None,
                    "too_many_connections",
                    "server_error",
                )
                self.transport.write(_raw_response(503, "Service Unavailable", error))
                self.transport.close()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._over_cap:
                self._head += data
                if self._head.startswith(HEALTH_LINES):
                    data, self._over_cap, self._health_only = self._head, False, True
                    self._arm()
                elif any(line.startswith(self._head) for line in HEALTH_LINES):
                    return  # a part of the line: wait for the rest (HEALTH_WAIT)
                else:
                    return self._refuse()
            self._bytes += len(data)
            super().data_received(data)
            if self.conn.our_state is h11.SEND_RESPONSE:  # the headers are in: the body's deadline is Gate's
                self._disarm()

        def on_response_complete(self) -> None:
            if self._health_only:  # past the cap: one /health answer, never a way in for other requests
                self.transport.close()
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.our_state is not h11.SEND_RESPONSE:
                self._arm()  # the next request's headers (or the rest of this one's body) are due

        def _arm(self) -> None:
            self._disarm()
            self._bytes = 0
            self._timer = self.loop.call_later(read_timeout, self._expired)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _expired(self) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            if self._bytes and self.conn.our_state is h11.IDLE:  # a request had begun: say why it is cut off
                error = OpenAIError(
                    408, f"the request headers did not arrive within {read_timeout:g} s; send them at once", None, "request_timeout"
                )
                self.transport.write(_raw_response(408, "Request Timeout", error))
            self.transport.close()

    return GuardedProtocol


class OpenAIServer:
    """uvicorn serving the app in a background thread; a context manager (tests, `serve --openai-port`).

    with OpenAIServer("127.0.0.1:8001", port=free_port()) as front:
        openai.OpenAI(base_url=front.url, api_key="none").models.list()
    """

    def __init__(
        self,
        triton_url: str,
        host: str = "127.0.0.1",
        port: int = 8080,
        models: Sequence[str] = (),
        tokenizer: str | None = None,
        repository: str | Path | None = None,
        log_level: str = "warning",
        startup_timeout: float = 300.0,
        api_key: str | Sequence[str] | None = None,
        max_queued: int = DEFAULT_MAX_QUEUED,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
        allow_request_chat_template: bool = False,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        api_key_file: str | Path | None = None,
        prefix_cache_scope: str = "auto",
        allowed_hosts: Sequence[str] = (),
    ) -> None:
        """`api_key`: one key or several (each a tenant, see FrontendConfig.prefix_cache_scope), plus
        those of `api_key_file` (one per line, readable by its owner only). `allowed_hosts`: without a
        key, Host names accepted beside this machine's own ("*": any)."""
        require_extra()
        if prefix_cache_scope not in PREFIX_CACHE_SCOPES:
            raise DFlashError(
                f"prefix cache scope {prefix_cache_scope!r} is not one of {', '.join(PREFIX_CACHE_SCOPES)}",
                "pass --prefix-cache-scope auto, server or key",
            )
        self.host, self.port = host, port
        self.config = FrontendConfig(
            triton_url,
            tuple(models),
            tokenizer,
            Path(repository).resolve() if repository else None,
            api_keys(api_key, api_key_file),
            max_queued,
            max_request_bytes,
            drain_timeout,
            allow_request_chat_template,
            read_timeout,
            max_connections,
            prefix_cache_scope,
            host_names(host, allowed_hosts),
        )
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
        config = uvicorn.Config(
            app,
            host=self.host,
            port=self.port,
            log_level=self.log_level,
            lifespan="on",
            timeout_graceful_shutdown=GRACE,
            http=guarded_protocol(self.config.read_timeout, self.config.max_connections),
        )
        warning = exposure_warning(self.host, self.port, bool(self.config.api_keys))
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

"""An OpenAI-compatible HTTP front end for the served DFlash models (docs/serving.md).

`/v1/chat/completions`, `/v1/completions`, `/v1/models` and `/health`, in front of a running
Triton server. Why a separate process-side layer: Triton speaks its own protocol, while most
clients, benchmarks and UIs speak OpenAI's. The front end

- templates chat messages with the target tokenizer's chat template (`trtllm_dflash.chat`, the
  same code `generate --chat` runs offline) and checks the request with SamplingParams (the
  check the served model runs too) before Triton sees it;
- sends the prompt text to the model over Triton's async gRPC stream (`text_input`,
  `sampling_param_*`: the protocol of serving/protocol.py) and turns the per-step responses into
  OpenAI chunks (server-sent events) or one response;
- cancels the gRPC call when its HTTP client goes away: Triton marks the request cancelled and
  the model's loop drops it from the batch between decoding steps (its decoder row is freed);
- is safe to expose (`Gate`): an optional API key, a bounded request body, a bounded number of
  requests in flight (429 past it), a drain on shutdown (503 to new requests while streams
  finish), strict request types and ranges, and an OpenAI error body on every error.

FastAPI + uvicorn serve the HTTP side; `tritonclient.grpc.aio` the Triton side. The parts:

    openai_schemas.py   request bodies (strict types) and OpenAIError (the body of every refusal)
    openai_frontend.py  Frontend: discovered models, SamplingParams and prompt checks, translation
    openai_triton.py    TritonStream: one request on Triton's async gRPC stream
    openai_gate.py      Gate: API key, body bound, in-flight bound, drain
    openai_app.py       the FastAPI routes, responses and server-sent events
    openai_server.py    OpenAIServer: uvicorn in a thread, draining on shutdown (this module)
"""

import ipaddress
import logging
import threading
import time
from pathlib import Path
from typing import Sequence

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.serving.openai_app import create_app, require_extra
from trtllm_dflash.serving.openai_frontend import (
    DEFAULT_DRAIN_TIMEOUT, DEFAULT_MAX_QUEUED, DEFAULT_MAX_REQUEST_BYTES, Frontend, FrontendConfig,
)

log = logging.getLogger("uvicorn.error")  # uvicorn's logger: its lines share uvicorn's format and level

GRACE = 2.0  # seconds uvicorn waits for connections after the drain before cancelling them


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
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
                 allow_request_chat_template: bool = False) -> None:
        require_extra()
        self.host, self.port = host, port
        self.config = FrontendConfig(triton_url, tuple(models), tokenizer, Path(repository).resolve() if repository else None,
                                     api_key or None, max_queued, max_request_bytes, drain_timeout, allow_request_chat_template)
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

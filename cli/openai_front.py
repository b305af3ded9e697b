"""`dflash-trt openai`: the OpenAI-compatible front end against a Triton server started elsewhere."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from trtllm_dflash.serving import DEFAULT_HOST
from trtllm_dflash.serving.openai.frontend import (
    DEFAULT_DRAIN_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_QUEUED, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_READ_TIMEOUT,
)


# The OpenAI front end's exposure options, shared with `dflash-trt serve --openai-port`.
API_KEY = typer.Option(
    None, "--api-key", envvar="DFLASH_API_KEY", show_envvar=True,
    help="Require `Authorization: Bearer KEY` on the OpenAI API (all but /health). Prefer the environment variable: flags show in `ps`.",
)
MAX_QUEUED = typer.Option(
    DEFAULT_MAX_QUEUED, "--max-queued", min=0,
    help="Requests admitted beyond what the models decode at once (their max_batch); past that, 429 with Retry-After.",
)
DRAIN_TIMEOUT = typer.Option(
    DEFAULT_DRAIN_TIMEOUT, "--drain-timeout", min=0.0,
    help="On SIGTERM / Ctrl-C, seconds the requests in flight get to finish (new ones get 503) before the OpenAI API stops.",
)
MAX_REQUEST_BYTES = typer.Option(
    DEFAULT_MAX_REQUEST_BYTES, "--max-request-bytes", min=1024, help="Largest request body accepted (413 past it, before parsing).",
)
READ_TIMEOUT = typer.Option(
    DEFAULT_READ_TIMEOUT, "--read-timeout", min=0.1,
    help="Seconds a client gets to send a request's headers, and again its body; slower ones get 408 and are disconnected.",
)
MAX_CONNECTIONS = typer.Option(
    DEFAULT_MAX_CONNECTIONS, "--max-connections", min=1,
    help="Open HTTP connections to the OpenAI API at once; past it, new ones get 503 and are closed. Keep it above max_batch + --max-queued.",
)

ALLOW_REQUEST_CHAT_TEMPLATE = typer.Option(
    False, "--allow-request-chat-template",
    help="Let requests replace the model's chat template (chat_template_kwargs.chat_template): a Jinja program from the client, "
    "run sandboxed and bounded in time and size. Off: such requests get 400.",
)


def openai_front(
    triton_url: str = typer.Option("127.0.0.1:8001", "--triton-url", help="Triton's gRPC endpoint, host:port."),
    model: Optional[list[str]] = typer.Option(None, "--model", help="Triton model to expose (repeatable; default: every DFlash model it serves)."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="Target tokenizer directory (default: the target named in each model's config)."),
    repository: Optional[Path] = typer.Option(None, "--repository", help="The served repository, to find targets named by relative paths."),
    host: str = typer.Option(DEFAULT_HOST, "--host", help="Address to listen on (0.0.0.0 for every interface)."),
    port: int = typer.Option(8080, "--port", help="HTTP port of the OpenAI API (/v1/...)."),
    api_key: Optional[str] = API_KEY,
    max_queued: int = MAX_QUEUED,
    drain_timeout: float = DRAIN_TIMEOUT,
    max_request_bytes: int = MAX_REQUEST_BYTES,
    allow_request_chat_template: bool = ALLOW_REQUEST_CHAT_TEMPLATE,
    read_timeout: float = READ_TIMEOUT,
    max_connections: int = MAX_CONNECTIONS,
) -> None:
    """Serve /v1/chat/completions, /v1/completions and /v1/models in front of a running Triton."""
    from trtllm_dflash.cli.common import quiet_libraries
    from trtllm_dflash.serving.openai.server import OpenAIServer

    quiet_libraries()
    console = Console(highlight=False)
    front = OpenAIServer(triton_url, host=host, port=port, models=model or (), tokenizer=tokenizer, repository=repository,
                         api_key=api_key, max_queued=max_queued, max_request_bytes=max_request_bytes, drain_timeout=drain_timeout,
                         allow_request_chat_template=allow_request_chat_template, read_timeout=read_timeout,
                         max_connections=max_connections)
    server = front.uvicorn_server()
    console.print(f"OpenAI API on {front.url} -> Triton {escape(triton_url)} (models: {', '.join(front.frontend.models)}); Ctrl-C stops it")
    server.run()  # in this thread: uvicorn handles Ctrl-C and SIGTERM (a drain first, then exit)


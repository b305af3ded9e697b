"""`dflash-trt openai`: the OpenAI-compatible front end against a Triton server started elsewhere."""

from __future__ import annotations

import functools
import inspect
import typing
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.console import Console
from rich.markup import escape

from trtllm_dflash.serving import DEFAULT_HOST
from trtllm_dflash.serving.openai.frontend import (
    DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_QUEUED,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_READ_TIMEOUT,
)

# The OpenAI front end's exposure options, shared with `dflash-trt serve --openai-port`: (parameter, type, option).
FRONT_END_OPTIONS = (
    (
        "api_key",
        Optional[list[str]],
        typer.Option(
            None,
            "--api-key",
            envvar="DFLASH_API_KEY",
            show_envvar=True,
            metavar="KEY",
            help="Require `Authorization: Bearer KEY` on the OpenAI API (all but /health); repeat it for several keys (the variable: "
            "keys separated by spaces). Prefer the environment variable or --api-key-file: flags show in `ps`.",
        ),
    ),
    (
        "api_key_file",
        Optional[Path],
        typer.Option(
            None,
            "--api-key-file",
            help="More API keys, one per line, in a file only its owner can read (chmod 600).",
        ),
    ),
    (
        "allowed_hosts",
        Optional[list[str]],
        typer.Option(
            None,
            "--allowed-hosts",
            metavar="NAME",
            help="Without an API key, the Host names requests may carry beside this machine's own (repeatable; * for any): "
            "a web page cannot reach a keyless API through a name of its own pointed at this machine.",
        ),
    ),
    (
        "prefix_cache_scope",
        str,
        typer.Option(
            "auto",
            "--prefix-cache-scope",
            metavar="auto|server|key",
            help="Who shares prefix-cache blocks among requests without a cache_salt: server (everyone), key (each API key apart), "
            "auto (key when several keys are given, else server). Requests with a cache_salt share only with the same salt (and key).",
        ),
    ),
    (
        "max_queued",
        int,
        typer.Option(
            DEFAULT_MAX_QUEUED,
            "--max-queued",
            min=0,
            help="Requests admitted beyond what the models decode at once (their max_batch); past that, 429 with Retry-After.",
        ),
    ),
    (
        "drain_timeout",
        float,
        typer.Option(
            DEFAULT_DRAIN_TIMEOUT,
            "--drain-timeout",
            min=0.0,
            help="On SIGTERM / Ctrl-C, seconds the requests in flight get to finish (new ones get 503) before the OpenAI API stops.",
        ),
    ),
    (
        "max_request_bytes",
        int,
        typer.Option(
            DEFAULT_MAX_REQUEST_BYTES,
            "--max-request-bytes",
            min=1024,
            help="Largest request body accepted (413 past it, before parsing).",
        ),
    ),
    (
        "allow_request_chat_template",
        bool,
        typer.Option(
            False,
            "--allow-request-chat-template",
            help="Let requests replace the model's chat template (chat_template_kwargs.chat_template): a Jinja program from the client, "
            "run sandboxed and bounded in time and size. Off: such requests get 400.",
        ),
    ),
    (
        "read_timeout",
        float,
        typer.Option(
            DEFAULT_READ_TIMEOUT,
            "--read-timeout",
            min=0.1,
            help="Seconds a client gets to send a request's headers, and again its body; slower ones get 408 and are disconnected.",
        ),
    ),
    (
        "max_connections",
        int,
        typer.Option(
            DEFAULT_MAX_CONNECTIONS,
            "--max-connections",
            min=1,
            help="Open HTTP connections to the OpenAI API at once; past it, new ones get 503 and are closed. "
            "Keep it above max_batch + --max-queued.",
        ),
    ),
)


def with_front_end_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give a typer command the front end's options, written once above: it declares a `front_end`
    parameter and receives them there as one dict, ready for `OpenAIServer(..., **front_end)`."""
    own = [p for p in inspect.signature(command).parameters.values() if p.name != "front_end"]
    added = [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=option, annotation=kind)
        for name, kind, option in FRONT_END_OPTIONS
    ]

    @functools.wraps(command)
    def run(**arguments: Any) -> Any:
        front_end = {name: arguments.pop(name) for name, _, _ in FRONT_END_OPTIONS}
        return command(**arguments, front_end=front_end)

    hints = {name: kind for name, kind in typing.get_type_hints(command).items() if name != "front_end"}
    run.__signature__ = inspect.Signature(own + added, return_annotation=None)
    run.__annotations__ = {**hints, **{name: kind for name, kind, _ in FRONT_END_OPTIONS}}
    return run


@with_front_end_options
def openai_front(
    triton_url: str = typer.Option("127.0.0.1:8001", "--triton-url", help="Triton's gRPC endpoint, host:port."),
    model: Optional[list[str]] = typer.Option(
        None, "--model", help="Triton model to expose (repeatable; default: every DFlash model it serves)."
    ),
    tokenizer: Optional[str] = typer.Option(
        None, "--tokenizer", help="Target tokenizer directory (default: the target named in each model's config)."
    ),
    repository: Optional[Path] = typer.Option(None, "--repository", help="The served repository, to find targets named by relative paths."),
    host: str = typer.Option(DEFAULT_HOST, "--host", help="Address to listen on (0.0.0.0 for every interface)."),
    port: int = typer.Option(8080, "--port", help="HTTP port of the OpenAI API (/v1/...)."),
    front_end: Optional[dict] = None,
) -> None:
    """Serve /v1/chat/completions, /v1/completions and /v1/models in front of a running Triton."""
    from trtllm_dflash.cli.common import quiet_libraries
    from trtllm_dflash.serving.openai.server import OpenAIServer

    quiet_libraries()
    console = Console(highlight=False)
    front = OpenAIServer(triton_url, host=host, port=port, models=model or (), tokenizer=tokenizer, repository=repository, **front_end)
    server = front.uvicorn_server()
    console.print(f"OpenAI API on {front.url} -> Triton {escape(triton_url)} (models: {', '.join(front.frontend.models)}); Ctrl-C stops it")
    server.run()  # in this thread: uvicorn handles Ctrl-C and SIGTERM (a drain first, then exit)

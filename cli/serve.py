"""`dflash-trt serve`: run tritonserver on a repository written by `dflash-trt repo`."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from trtllm_dflash.cli.openai_front import with_front_end_options
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.serving import DEFAULT_HOST


@with_front_end_options
def serve(
    repository: Path = typer.Argument(..., help="Model repository (from `dflash-trt repo`)."),
    http_port: int = typer.Option(8000, "--http-port", help="HTTP/REST port (generate, generate_stream, health)."),
    grpc_port: int = typer.Option(8001, "--grpc-port", help="gRPC port (tritonclient streaming)."),
    metrics_port: int = typer.Option(8002, "--metrics-port", help="Prometheus metrics port."),
    host: str = typer.Option(
        DEFAULT_HOST, "--host", help="Address to listen on: this machine only by default; 0.0.0.0 opens it to the network."
    ),
    log_file: Optional[Path] = typer.Option(None, "--log-file", help="Server log (default: a file in a temporary folder)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show the server's log here instead of in a file."),
    openai_port: Optional[int] = typer.Option(
        None, "--openai-port", help="Also serve the OpenAI API (/v1/chat/completions, ...) on this port."
    ),
    openai_host: str = typer.Option(DEFAULT_HOST, "--openai-host", help="Address the OpenAI API listens on."),
    tokenizer: Optional[str] = typer.Option(
        None, "--tokenizer", help="With --openai-port: target tokenizer directory (default: each model's target)."
    ),
    triton_http: Optional[bool] = typer.Option(
        None,
        "--triton-http/--no-triton-http",
        help="Open Triton's own HTTP port (generate, generate_stream). Default: open, but closed with --openai-port, where Triton's "
        "ports listen on loopback behind the OpenAI API and its HTTP port would be a second, keyless way in. gRPC and metrics stay.",
    ),
    triton_restricted_http: Optional[str] = typer.Option(
        None,
        "--triton-restricted-http",
        metavar="GROUPS",
        help="Triton API groups that answer on its HTTP port only to requests with the header `dflash-admin-token: TOKEN` "
        "(TOKEN random per server, in the file `serve` prints; `python -m trtllm_dflash.serving.triton_access FILE` prints the header). "
        "Default: shared-memory, model-repository, statistics, trace, logging (comma-separated; `none` opens all). "
        "health, metadata, inference (/generate) and model-config stay open.",
    ),
    triton_restricted_grpc: Optional[str] = typer.Option(
        None,
        "--triton-restricted-grpc",
        metavar="GROUPS",
        help="The same on Triton's gRPC port (metadata `triton-grpc-protocol-dflash-admin-token: TOKEN`). "
        "Default: shared-memory, statistics, trace, logging; health, metadata, inference, model-config and "
        "model-repository stay open (the OpenAI front end reads the last two there without the header).",
    ),
    front_end: Optional[dict] = None,
) -> None:
    """Start tritonserver, wait until every model is ready, print the endpoints; Ctrl-C stops it.

    tritonserver is supervised: if it, or a model's process, dies on its own it is restarted on the
    same ports (at most 5 times in 10 minutes; then `serve` exits with an error). Nothing of it
    outlives `serve`, however `serve` ends (a watchdog kills what is left).
    """
    from trtllm_dflash.serving.openai.server import is_loopback
    from trtllm_dflash.serving.server import TritonServer

    console = Console(highlight=False)
    if openai_port is not None and not is_loopback(host):
        raise DFlashError(
            f"--host {host} would open Triton's ports beside the OpenAI API, and they take no API key",
            "leave --host out (Triton listens on loopback; --openai-host sets where the OpenAI API listens), "
            "or run `dflash-trt serve` and `dflash-trt openai` apart",
        )
    http = triton_http if triton_http is not None else openai_port is None
    server = TritonServer(
        repository,
        http_port,
        grpc_port,
        metrics_port,
        host=host,
        log_file=log_file,
        verbose=verbose,
        http=http,
        http_restricted=triton_restricted_http,
        grpc_restricted=triton_restricted_grpc,
    )
    front = None
    if openai_port is not None:
        from trtllm_dflash.serving.openai.server import OpenAIServer

        if openai_port in (http_port, grpc_port, metrics_port):
            raise DFlashError(f"--openai-port {openai_port} is one of Triton's ports", "pick a different --openai-port")
        front = OpenAIServer(
            server.endpoints.grpc, host=openai_host, port=openai_port, tokenizer=tokenizer, repository=server.repository, **front_end
        )
    console.print(f"starting tritonserver on {escape(str(server.repository))} (models: {', '.join(server.models)}) ...")
    started = time.monotonic()
    for signum in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C and `kill` stop the server cleanly,
        signal.signal(signum, _interrupt)  # even where SIGINT was inherited as ignored (`cmd &`)
    try:
        endpoints = server.start()
        console.print(f"[green]ready[/] in {time.monotonic() - started:.0f} s; log: {escape(str(server.log_path))}")
        for folder in server.cleaned_leftovers:  # what a killed server (and its watchdog) left behind
            console.print(f"[yellow]cleaned up after a server whose owner is gone: {escape(str(folder))}[/]")
        if endpoints.http is not None:
            console.print(f"  HTTP     {endpoints.http}  (POST /v2/models/<model>/generate, /generate_stream)")
            if openai_port is not None:
                console.print(
                    "[yellow]  Triton's HTTP port is open beside the OpenAI API (--triton-http): it takes no API key; "
                    "keep it on loopback[/]"
                )
        else:
            console.print(
                "  HTTP     off"
                + (" (behind the OpenAI API; --triton-http opens it)" if openai_port is not None else " (--no-triton-http)")
            )
        console.print(f"  gRPC     {endpoints.grpc}")
        console.print(f"  metrics  {endpoints.metrics}")
        console.print(f"  admin    token for Triton's restricted APIs in {escape(str(server.admin_token_path))} (readable by you only)")
        if front is not None:
            console.print(f"  OpenAI   {front.start()}  (/chat/completions, /completions, /models; /health)")
        model = server.models[0] if "dflash" not in server.models else "dflash"
        if endpoints.http is not None:
            console.print(
                f"try: curl -s -X POST {endpoints.http}/v2/models/{model}/generate "
                '-d \'{"text_input": "def fib(n):", "sampling_param_max_tokens": 32, "sampling_param_temperature": 0}\''
            )
            console.print(f"  or: dflash-trt generate --url {endpoints.http} --model-name {model} --prompt 'def fib(n):' --stream")
        # until Ctrl-C: a tritonserver that dies on its own is restarted (one line each time);
        # one that dies too often ends `serve` with a DFlashError (one line, exit status 2)
        server.supervise(log=lambda line: console.print(f"[yellow]{escape(line)}[/]", soft_wrap=True))
    except KeyboardInterrupt:
        console.print("stopping tritonserver ...")
    finally:
        try:
            if front is not None:
                front.stop()
        finally:  # a second Ctrl-C during the drain still stops tritonserver
            code = server.stop()
        if code is not None:
            console.print(f"tritonserver stopped (status {code})")


def _interrupt(*_) -> None:
    raise KeyboardInterrupt

"""`dflash-trt openai`: the OpenAI-compatible front end against a Triton server started elsewhere."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from trtllm_dflash.serving import DEFAULT_HOST


def openai_front(
    triton_url: str = typer.Option("127.0.0.1:8001", "--triton-url", help="Triton's gRPC endpoint, host:port."),
    model: Optional[list[str]] = typer.Option(None, "--model", help="Triton model to expose (repeatable; default: every DFlash model it serves)."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="Target tokenizer directory (default: the target named in each model's config)."),
    repository: Optional[Path] = typer.Option(None, "--repository", help="The served repository, to find targets named by relative paths."),
    host: str = typer.Option(DEFAULT_HOST, "--host", help="Address to listen on (0.0.0.0 for every interface)."),
    port: int = typer.Option(8080, "--port", help="HTTP port of the OpenAI API (/v1/...)."),
) -> None:
    """Serve /v1/chat/completions, /v1/completions and /v1/models in front of a running Triton."""
    from trtllm_dflash.cli.common import quiet_libraries
    from trtllm_dflash.serving.openai_server import OpenAIServer

    quiet_libraries()
    console = Console(highlight=False)
    front = OpenAIServer(triton_url, host=host, port=port, models=model or (), tokenizer=tokenizer, repository=repository)
    server = front.uvicorn_server()
    console.print(f"OpenAI API on {front.url} -> Triton {escape(triton_url)} (models: {', '.join(front.frontend.models)}); Ctrl-C stops it")
    server.run()  # in this thread: uvicorn handles Ctrl-C

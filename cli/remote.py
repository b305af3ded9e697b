"""`dflash-trt generate --url`: the same prompts, sent to a running server through the client."""

from __future__ import annotations

import json
from urllib.parse import urlparse

from rich.console import Console
from rich.markup import escape

from trtllm_dflash.cli.common import tau_hint
from trtllm_dflash.errors import DFlashError


def generate_remote(
    url: str,
    model: str,
    prompts: list[str],
    sampling: dict,
    stream: bool,
    protocol: str,
    grpc_url: str | None,
    as_json: bool,
) -> None:
    from trtllm_dflash.serving.client import Completion, DFlashClient

    if protocol not in ("http", "grpc"):
        raise DFlashError(f"unknown --protocol {protocol!r}", "use http or grpc")
    if protocol == "grpc" and grpc_url is None:
        grpc_url = f"{urlparse(url if '://' in url else 'http://' + url).hostname}:8001"
    client = DFlashClient(url, model=model, grpc_url=grpc_url)
    console = Console(highlight=False)
    for prompt in prompts:
        if stream:
            if not as_json:
                console.print(f"[bold]{escape(prompt)}[/]", end="")
            chunks = []
            for chunk in client.stream(prompt, protocol=protocol, **sampling):
                chunks.append(chunk)
                if not as_json:
                    console.print(escape(chunk.text), end="")
            out = Completion.from_chunks(chunks)
            if not as_json:
                console.print()
        else:
            out = client.generate(prompt, **sampling)
            if not as_json:
                console.print(f"[bold]{escape(prompt)}[/]{escape(out.text)}")
        if as_json:
            print(json.dumps({"prompt": prompt, **out.to_json()}), flush=True)
            continue
        console.print(f"[dim]{escape(_figures(out))}[/]")
        hint = tau_hint(out.mean_acceptance_length) if out.mean_acceptance_length else None
        if hint:
            console.print(f"[yellow]{escape(hint)}[/]")
        console.print()


def _figures(out) -> str:
    """What the server reported: NVIDIA's LLM-API model sends no token counts or tau, only an acceptance rate."""
    parts = []
    if out.num_output_tokens:
        parts.append(f"{out.num_output_tokens} tokens")
    if out.mean_acceptance_length:
        parts.append(f"tau {out.mean_acceptance_length:.2f}")
    elif out.acceptance_rate:
        parts.append(f"draft acceptance {out.acceptance_rate:.0%}")
    if out.time_to_first_token:
        parts.append(f"TTFT {out.time_to_first_token * 1000:.0f} ms")
    if out.tokens_per_second:
        parts.append(f"{out.tokens_per_second:.1f} tok/s (server)")
    return ", ".join(parts + [f"finish: {out.finish_reason or 'not reported'}"])

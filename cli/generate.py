"""`dflash-trt generate`: decode prompts with DFlash (or autoregressively without a drafter)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from trtllm_dflash.cli.common import quiet_libraries, read_prompts, tau_hint
from trtllm_dflash.contracts.defaults import DEFAULT_NEW_TOKENS, GENERATE_MAX_CONTEXT
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.sampling_params import SamplingError, SamplingParams

# SamplingParams' fields as this command's flags (its errors name the flag to fix)
FLAGS = {"max_new_tokens": "--max-new-tokens", "temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p", "seed": "--seed"}


def generate(
    target: Optional[str] = typer.Option(None, "--target", help="Target model directory (Hugging Face layout) or 'demo'."),
    drafter: Optional[str] = typer.Option(
        None, "--drafter", help="DFlash drafter directory (z-lab layout) or 'demo'. Without it: autoregressive decoding."
    ),
    prompt: Optional[list[str]] = typer.Option(None, "--prompt", "-p", help="Prompt text; repeat for a batch."),
    prompt_file: Optional[Path] = typer.Option(None, "--prompt-file", help="One prompt per line, or JSONL with 'prompt'."),
    max_new_tokens: int = typer.Option(DEFAULT_NEW_TOKENS, "--max-new-tokens", "-n", help="Tokens to generate per prompt (> 0)."),
    temperature: float = typer.Option(0.0, "--temperature", "-t", help="0 = greedy; > 0 samples (lossless)."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling mass in (0, 1]."),
    top_k: int = typer.Option(0, "--top-k", help="Keep the k most likely tokens (0 = off)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Per-request sampling seed (reproducible on every runtime)."),
    block_size: Optional[int] = typer.Option(None, "--block-size", "-b", help="Draft block size (default: the drafter's)."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    threads: int = typer.Option(0, "--threads", min=0, help="torch CPU threads (0 = the cores not busy now, at least 1)."),
    max_context: Optional[int] = typer.Option(
        None,
        "--max-context",
        help="Prompt + generated tokens limit (default: a build's max_seq_len; with --target, the "
        f"target's max_position_embeddings, at most {GENERATE_MAX_CONTEXT}).",
    ),
    chat: bool = typer.Option(
        False, "--chat", help="Each prompt is one user message, templated with the target's chat template (as /v1/chat/completions does)."
    ),
    chat_template_kwargs: Optional[str] = typer.Option(
        None, "--chat-template-kwargs", help="With --chat: JSON variables for the template, e.g. '{\"enable_thinking\": false}'."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per prompt, one per line."),
    url: Optional[str] = typer.Option(None, "--url", help="Send the prompts to a running server (http://host:8000) instead."),
    model_name: str = typer.Option("dflash", "--model-name", help="With --url: the Triton model to call."),
    stream: bool = typer.Option(False, "--stream", help="With --url: print tokens as the server streams them."),
    protocol: str = typer.Option("http", "--protocol", help="With --url --stream: http (server-sent events) or grpc."),
    grpc_url: Optional[str] = typer.Option(None, "--grpc-url", help="With --protocol grpc: host:port (default: --url's host, port 8001)."),
    engines: Optional[Path] = typer.Option(
        None, "--engines", help="Run the TensorRT engines of a build (its engines/ folder or --out directory; GPU)."
    ),
    onnx: Optional[Path] = typer.Option(None, "--onnx", help="Run a build's ONNX graphs on CPU with onnxruntime (its --out directory)."),
    cuda_graphs: Optional[bool] = typer.Option(
        None,
        "--cuda-graphs/--no-cuda-graphs",
        help="--target on a GPU: replay each step's passes from CUDA graphs (default: wherever the runtime can).",
    ),
    attention_choice: str = typer.Option(
        "dflash",
        "--attention-choice",
        help="--target on a GPU: the target attention's kernel in decode passes: dflash, flash, sdpa, or measure "
        "(the fastest exact one per batch bucket, timed at load).",
    ),
    verify_choice: str = typer.Option(
        "positions",
        "--verify-choice",
        help="--target on a GPU: the kernels verifying sampled steps: positions, spread, shortlist (the same decisions), or measure.",
    ),
    linear_choice: str = typer.Option(
        "torch",
        "--linear-choice",
        help="--target on a GPU: the kernels of the decode passes' projections: torch (cuBLAS), skinny, or measure.",
    ),
    dependent_launch: bool = typer.Option(
        False,
        "--dependent-launch",
        help="--target on a Hopper or later GPU: a decoding step's Triton kernels (passes, verification, sampling) as "
        "programmatic dependent launches.",
    ),
) -> None:
    """Generate text for one or more prompts; prints tokens, acceptance lengths and speed."""
    template_kwargs = _template_kwargs(chat, chat_template_kwargs)
    _check_sampling(SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed))
    if url is not None:  # through a server: the client does the rest
        if chat:
            raise DFlashError(
                "--chat with --url is not supported (the Triton models take text)",
                "drop --chat, or send chat requests to the OpenAI front end (`dflash-trt serve --openai-port`)",
            )
        from trtllm_dflash.cli.remote import generate_remote

        prompts = read_prompts(prompt, prompt_file)
        sampling = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
        return generate_remote(url, model_name, prompts, sampling, stream, protocol, grpc_url, as_json)
    if sum(x is not None for x in (target, engines, onnx)) > 1:
        raise DFlashError("name one model source: --target, --engines or --onnx", "drop the others")
    if target is None and engines is None and onnx is None:
        raise DFlashError(
            "no model to run", "pass --target DIR (and --drafter DIR), --target demo --drafter demo, --engines BUILD or --onnx BUILD"
        )
    if device not in ("cpu", "cuda"):
        raise DFlashError(f"unknown device {device!r}", "use --device cpu or --device cuda")
    if (engines is not None or onnx is not None) and (
        cuda_graphs is not None
        or attention_choice != "dflash"
        or verify_choice != "positions"
        or linear_choice != "torch"
        or dependent_launch
    ):
        raise DFlashError(
            "--cuda-graphs, --attention-choice, --verify-choice, --linear-choice and --dependent-launch are options of --target models",
            "drop them with --engines or --onnx",
        )
    if block_size is not None and block_size < 2:
        raise DFlashError(f"--block-size must be >= 2, got {block_size}", "use the drafter's block size")
    prompts = read_prompts(prompt, prompt_file)

    quiet_libraries()
    if chat and (engines is not None or onnx is not None):
        raise DFlashError("--chat runs on --target models only", "pass --target DIR (the chat template comes from its tokenizer)")
    from trtllm_dflash.backends import PipelineSource, get_backend
    from trtllm_dflash.runtime.threads import set_threads

    set_threads(threads)
    if engines is not None:  # the TensorRT engines of a build (GPU)
        pipe = get_backend("trt").open_pipeline(PipelineSource(build=engines), device="cuda", max_context=max_context)
    elif onnx is not None:  # the exported graphs on CPU (what the engines were built from)
        pipe = get_backend("trt").open_pipeline(PipelineSource(build=onnx, onnx=True), device="cpu", max_context=max_context)
        Console(stderr=True, highlight=False).print("[dim]running the build's ONNX graphs on CPU with onnxruntime[/]")
    else:
        source = PipelineSource(
            target,
            drafter,
            cuda_graphs=cuda_graphs,
            attention_choice=attention_choice,
            verify_choice=verify_choice,
            linear_choice=linear_choice,
            dependent_launch=dependent_launch,
        )
        pipe = get_backend("torch").open_pipeline(source, device=device, max_context=max_context)
    outputs = pipe.generate(
        prompts,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        block_size=block_size,
        **({"chat": True, "chat_template_kwargs": template_kwargs} if chat else {}),
    )
    if as_json:
        for prompt_text, out in zip(prompts, outputs):
            print(json.dumps({"prompt": prompt_text, **out.to_json()}), flush=True)
        return
    console = Console(highlight=False)
    for prompt_text, out in zip(prompts, outputs):
        console.print(f"[bold]{prompt_text}[/]{out.text}")
        mode = f"tau {out.mean_acceptance_length:.2f}" if pipe.speculative else "autoregressive"
        console.print(
            f"[dim]{len(out.token_ids)} tokens, {mode}, {out.num_target_forwards} target forwards, "
            f"{out.tokens_per_second:.1f} tok/s, finish: {out.finish_reason}[/]"
        )
        hint = tau_hint(out.mean_acceptance_length) if pipe.speculative and len(out.token_ids) > 1 else None
        if hint:
            console.print(f"[yellow]{hint}[/]")
        console.print()


def _check_sampling(params: SamplingParams) -> None:
    """The sampling flags checked before a model loads, by the same check the decoder runs."""
    try:
        params.validate()
    except SamplingError as exc:
        raise exc.renamed(FLAGS) from None


def _template_kwargs(chat: bool, text: Optional[str]) -> Optional[dict]:
    """--chat-template-kwargs as a dict (a JSON object), only with --chat."""
    if text is None:
        return None
    if not chat:
        raise DFlashError("--chat-template-kwargs needs --chat", "add --chat")
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise DFlashError(
            f"--chat-template-kwargs {text!r} is not a JSON object", "e.g. --chat-template-kwargs '{\"enable_thinking\": false}'"
        )
    return value

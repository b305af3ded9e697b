"""`dflash-trt repo`: write a Triton model repository for a model, a recipe or a build."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from trtllm_dflash.contracts.defaults import SERVED_MAX_BATCH, SERVED_MAX_CONTEXT, SERVED_PREFIX_CACHE_MIB
from trtllm_dflash.contracts.request_limits import DEFAULT_PREFILL_CHUNK, DEFAULT_PREFILL_SHARE
from trtllm_dflash.errors import DFlashError


def repo(
    out: Path = typer.Option(..., "--out", "-o", help="Repository directory to write."),
    model: Optional[str] = typer.Option(
        None, "--model", "-m", help="'demo', a recipe's model name (with --gpu), or a target checkpoint directory."
    ),
    build: Optional[Path] = typer.Option(None, "--build", help="A `dflash-trt build` output directory (engines on a GPU)."),
    gpu: Optional[str] = typer.Option(None, "--gpu", "-g", help="GPU of the recipe (b300, h100, ..., cpu)."),
    recipe: Optional[str] = typer.Option(None, "--recipe", help="Recipe file or '<model>/<gpu>' name."),
    drafter: Optional[str] = typer.Option(
        None, "--drafter", help="Drafter directory: the pair to serve with --model DIR; a local copy for a trtllm recipe."
    ),
    name: str = typer.Option("dflash", "--name", help="Triton model name of the DFlash model."),
    baseline: Optional[str] = typer.Option(
        "ar", "--baseline", help="Also serve the target alone (autoregressive) under this name; '' for none."
    ),
    max_batch: Optional[int] = typer.Option(
        None, "--max-batch", help=f"Requests per decoding step (default: the recipe's, else {SERVED_MAX_BATCH})."
    ),
    max_context: Optional[int] = typer.Option(
        None, "--max-context", help=f"Prompt + generated tokens (default: the recipe's, else {SERVED_MAX_CONTEXT})."
    ),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="Largest sampling_param_max_tokens accepted."),
    block_size: Optional[int] = typer.Option(None, "--block-size", "-b", help="Draft block size (default: the drafter's)."),
    device: str = typer.Option("auto", "--device", help="auto (cuda when present), cpu or cuda."),
    threads: int = typer.Option(
        0, "--threads", help="torch CPU threads per model (0 = the cores not busy when the model loads, at least 1)."
    ),
    prefix_cache_mib: Optional[int] = typer.Option(
        None,
        "--prefix-cache-mib",
        help=f"Prefix cache per model in MiB (default {SERVED_PREFIX_CACHE_MIB}; 0 turns it off): prompts that "
        "start with a prefix seen before skip its prefill.",
    ),
    prefill_chunk: Optional[int] = typer.Option(
        None,
        "--prefill-chunk",
        help="Prompt tokens prefilled per decoding step, so long prompts do not stall live streams "
        f"(default {DEFAULT_PREFILL_CHUNK}; 0 = whole prompts).",
    ),
    prefill_share: Optional[float] = typer.Option(
        None,
        "--prefill-share",
        help="While streams decode, prefills take about this share of the decoding time on average, "
        "in chunks of at most --prefill-chunk tokens, shortest prompt first "
        f"(default {DEFAULT_PREFILL_SHARE}; 0 = always --prefill-chunk tokens).",
    ),
    adaptive_drafting: Optional[bool] = typer.Option(
        None,
        "--adaptive-drafting/--no-adaptive-drafting",
        help="Skip the drafter in steps where its drafts do not pay (prompts unlike its training data, large batches on a "
        "compute-bound device); measured per batch size, lossless (default: off, every step drafts).",
    ),
    async_scheduling: Optional[bool] = typer.Option(
        None,
        "--async-scheduling/--no-async-scheduling",
        help="Launch each decoding step before reading the one before it, so a GPU computes while the host schedules "
        "and streams; lossless; on a CPU it only costs a finishing request one extra step (default: off).",
    ),
    cuda_graphs: Optional[bool] = typer.Option(
        None,
        "--cuda-graphs/--no-cuda-graphs",
        help="Replay each decoding step's passes from CUDA graphs (default: wherever the runtime can, that is on a GPU).",
    ),
    attention_choice: Optional[str] = typer.Option(
        None,
        "--attention-choice",
        help="On a GPU: the kernel of the target's attention in decode passes: dflash (ours), flash (torch's "
        "FlashAttention), sdpa, or measure (the fastest exact one per batch bucket, timed when the model loads). Default: dflash.",
    ),
    verify_choice: Optional[str] = typer.Option(
        None,
        "--verify-choice",
        help="On a GPU: the kernels verifying steps with sampled rows: positions (one program per position), spread "
        "(every pass spread over the vocabulary), shortlist (two reads of the logits for rows with top-k <= 64; the "
        "same decisions either way), or measure (the fastest per batch bucket, at load). Default: positions.",
    ),
    linear_choice: Optional[str] = typer.Option(
        None,
        "--linear-choice",
        help="On a GPU: the kernels of the decode passes' projections: torch (cuBLAS), skinny (few rows, the weight "
        "streamed once, where they cover a call), or measure (the faster per row count and weight shape, at load). Default: torch.",
    ),
    dependent_launch: Optional[bool] = typer.Option(
        None,
        "--dependent-launch/--no-dependent-launch",
        help="On a Hopper or later GPU: launch a decoding step's Triton kernels (its passes, verification and sampling) as "
        "programmatic dependent launches (each waits on the GPU for the kernel ahead; the same arithmetic). Default: off.",
    ),
    force: bool = typer.Option(False, "--force", help="Replace an existing --out."),
    llmapi_model: Optional[Path] = typer.Option(
        None,
        "--llmapi-model",
        help="trtllm recipes and builds: NVIDIA's LLM-API Triton model folder (TensorRT-LLM's "
        "triton_backend/all_models/llmapi/tensorrt_llm at your container's tag); default: $DFLASH_TRT_LLMAPI_MODEL, ./TensorRT-LLM, /app.",
    ),
) -> None:
    """Write a Triton Inference Server model repository that serves DFlash (and its AR baseline)."""
    from trtllm_dflash.backends import get_backend, read_build_artifact, write_build_repository
    from trtllm_dflash.served_model import repository
    from trtllm_dflash.served_model.model_parameters import RecipeLimits, ServingSource, serving_configs

    sources = [s for s in (model, build, recipe) if s is not None]
    if len(sources) != 1:
        raise DFlashError("name exactly one of --model, --recipe or --build", "for example `dflash-trt repo --model demo --out REPO`")
    console = Console(highlight=False)
    runtime_flags = [flag for flag, value in (("--cuda-graphs", cuda_graphs), ("--attention-choice", attention_choice),
                     ("--verify-choice", verify_choice), ("--linear-choice", linear_choice),
                     ("--dependent-launch", dependent_launch)) if value is not None]  # fmt: skip
    if build is not None:
        _torch_runtime_only(runtime_flags, "--build")
        artifact = read_build_artifact(build)
        if llmapi_model is not None:
            _trtllm_only(get_backend(artifact.backend), "--build")
            from trtllm_dflash.backends.trtllm.repository import require_llmapi_model

            artifact = artifact.model_copy(update={"llmapi_model": str(require_llmapi_model(llmapi_model))})
        path = write_build_repository(artifact, out, force=force)
        console.print(
            f"wrote {escape(str(path))} from the build in {escape(str(build))}; "
            f"serve it with `dflash-trt serve {escape(shlex.quote(str(path)))}`"
        )
        return
    found = _recipe_for(model, gpu, recipe)
    backend = get_backend(found.backend) if found is not None else None
    if llmapi_model is not None:
        _trtllm_only(backend, "the recipe" if found is not None else "--model DIR")
    if backend is not None and backend.needs_build:  # its own repository (trtllm), or built first (trt)
        _torch_runtime_only(runtime_flags, f"recipe {found.name} ({backend.name} backend)")
        extra = {"llmapi_model": llmapi_model} if llmapi_model is not None else {}
        path, notes = backend.write_recipe_repository(out, found, drafter_dir=drafter, force=force, **extra)
        console.print(f"wrote {backend.repository_title} for [bold]{escape(found.name)}[/] to {escape(str(path))}")
        for note in notes:
            console.print(f"[yellow]note:[/] {escape(note)}")
        console.print(escape(backend.serve_hint(path)))
        return
    if found is not None:
        target, draft, limits = found.model.checkpoint, found.drafter.checkpoint, RecipeLimits.of(found)
        written_from = {"recipe": found.name}
    else:
        target, draft, limits = model, drafter, RecipeLimits()
        written_from = {"model": model, "drafter": drafter}
    target, draft = repository.check_checkpoints(target, draft)
    models = serving_configs(
        ServingSource(target, draft, limits=limits),
        name=name,
        baseline=baseline,
        device=device,
        num_threads=threads,
        max_batch=max_batch,
        max_context=max_context,
        max_tokens=max_tokens,
        block_size=block_size,
        prefix_cache_mib=prefix_cache_mib,
        prefill_chunk=prefill_chunk,
        prefill_share=prefill_share,
        adaptive_drafting=adaptive_drafting,
        async_scheduling=async_scheduling,
        cuda_graphs=cuda_graphs,
        attention_choice=attention_choice,
        verify_choice=verify_choice,
        linear_choice=linear_choice,
        dependent_launch=dependent_launch,
    )
    path = repository.write_repository(out, models, source=written_from, force=force)
    for model_name, config in models:
        kind = "DFlash" if config.speculative else "autoregressive"
        console.print(
            f"[bold]{escape(model_name)}[/]: {kind}, {escape(config.target)} on the {config.backend} backend, max batch {config.max_batch}"
        )
    console.print(f"wrote {escape(str(path))}; serve it with `dflash-trt serve {escape(shlex.quote(str(path)))}`")


def _torch_runtime_only(flags: list[str], what: str) -> None:
    """Refuse the torch runtime's options where the repository serves engines (they carry their own)."""
    if flags:
        raise DFlashError(
            f"{', '.join(flags)} {'is an option' if len(flags) == 1 else 'are options'} of the torch runtime, which {what} does not use",
            f"drop {'it' if len(flags) == 1 else 'them'}, or write the repository from checkpoints (--model DIR or a torch-backend recipe)",
        )


def _trtllm_only(backend, what: str) -> None:
    """--llmapi-model names the model of a trtllm repository; elsewhere it would be silently ignored."""
    if backend is None or backend.name != "trtllm":
        raise DFlashError(
            f"--llmapi-model is for trtllm repositories, and {what} is served by {'this toolkit' if backend is None else backend.name}",
            "drop --llmapi-model",
        )


def _recipe_for(model: str | None, gpu: str | None, recipe: str | None):
    """The recipe named by --recipe, or by --model NAME --gpu GPU (None for a checkpoint directory)."""
    from trtllm_dflash.catalog.models import check_model_link
    from trtllm_dflash.recipes import find_recipe, resolve_recipe

    if recipe is not None:
        return resolve_recipe(recipe)
    check_model_link(model)  # a broken link is neither a directory nor a recipe name
    if Path(model).expanduser().is_dir():
        if gpu is not None:
            raise DFlashError("--gpu selects a recipe, but --model is a checkpoint directory", "drop --gpu, or name the model")
        return None
    if model == "demo" and gpu is None:
        gpu = "cpu"
    if gpu is None:
        raise DFlashError(
            f"--model {model} is neither 'demo' nor a directory, so it names a recipe", "add --gpu GPU (see `dflash-trt recipes list`)"
        )
    return find_recipe(model, gpu)

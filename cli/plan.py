"""`dflash-trt plan`: the memory budget per GPU, how many users fit, and what `build` will run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table


def _gib(value: int) -> str:
    return f"{value / 1024**3:,.2f} GiB"


def print_plan(plan, console: Console | None = None) -> None:
    """Human-readable plan (also used by `dflash-trt build --dry-run`)."""
    from trtllm_dflash.catalog.gpus import CPU, resolve_gpu

    console = console or Console(highlight=False)
    p, layout, b = plan.precision, plan.layout, plan.budget
    where = f"{layout.num_gpus}x {plan.gpu}" if plan.gpu != CPU else "cpu"
    recipe = f" (recipe {plan.recipe})" if plan.recipe else ""
    console.print(f"[bold]Plan[/]: {plan.model} + {plan.drafter} (block {plan.block_size}) on {where}{recipe}")
    experts = f", experts {p.moe_experts}" if p.moe_experts != p.weights else ""
    console.print(
        f"  backend {plan.backend} | tp {layout.tp}, ep {layout.ep}{', attention DP' if layout.attention_dp else ''} | "
        f"weights {p.weights}{experts}, KV {p.kv_cache}, drafter {p.drafter} | context {plan.context} tokens"
    )
    if plan.gpu != CPU:
        gpu = resolve_gpu(plan.gpu)
        capacity = f"{gpu.full_name}, {gpu.memory_gb:g} GB = {_gib(b.capacity)}, SM {gpu.compute_capability_str}"
    else:
        capacity = f"host memory {_gib(b.capacity)}"
    console.print(f"  backend {plan.backend}: {escape(plan.backend_reason)}")
    # the title as a line of its own: a table title wraps at the table's narrow width
    console.print(f"Memory per {'GPU' if plan.gpu != CPU else 'device'} ({capacity})")
    table = Table()
    table.add_column("item")
    table.add_column("size", justify="right")
    for label, value in (
        ("target weights", b.target_weights),
        ("drafter weights", b.drafter_weights),
        ("activations + workspace", b.activations),
        ("CUDA graphs", b.cuda_graphs),
        ("runtime reserve (context, NCCL)", b.runtime_reserve),
        *((("prefix cache", b.prefix_cache),) if b.prefix_cache else ()),
        ("KV cache budget", b.kv_cache),
    ):
        table.add_row(label, _gib(value))
    console.print(table)
    console.print(
        f"  KV cache: {plan.kv_bytes_per_token:,} bytes per token of context (full-attention layers), "
        f"{_gib(plan.kv_bytes_per_sequence)} per sequence of {plan.context} tokens "
        f"(drafter {_gib(plan.drafter_kv_bytes_per_sequence)})"
    )
    if plan.linear_state_bytes_per_sequence:
        console.print(
            f"  linear-attention state: {_gib(plan.linear_state_bytes_per_sequence)} per sequence (Gated DeltaNet "
            f"recurrent + conv state with {plan.block_size} rollback copies; independent of context, included above)"
        )
    if plan.budget.prefix_cache:
        console.print(
            f"  prefix cache: {_gib(plan.budget.prefix_cache)} holds {plan.prefix_cache_tokens:,} prompt tokens (target + drafter K/V)"
        )
    console.print(f"  [bold]max concurrency[/] at {plan.context} tokens: {plan.max_concurrency} sequences")
    console.print("[bold]dflash-trt build steps[/]:")
    for index, step in enumerate(plan.steps, 1):
        needs = f"  [dim](needs {', '.join(step.needs)})[/]" if step.needs else ""
        console.print(f"  {index}. {step.name}: {escape(step.description)}{needs}")
    for note in plan.notes:
        console.print(f"  note: {escape(note)}")
    # the first refusal is the command's one error line (Plan.check); only the others are printed here
    for refusal in plan.refusals[1:]:
        console.print(f"[bold red]also refused ({refusal.kind})[/]: {escape(refusal.problem)}; {escape(refusal.fix)}")


def plan(
    model: Optional[str] = typer.Option(
        None, "--model", "-m", help="Catalog name (see `dflash-trt recipes list`), HF id, or model directory."
    ),
    gpu: Optional[str] = typer.Option(None, "--gpu", "-g", help="h100, h200, b200, b300, gb200, gb300, rtx-pro-6000, a100, or cpu."),
    num_gpus: Optional[int] = typer.Option(None, "--num-gpus", "-n", help="GPUs in the node (default: recipe, else the fewest that fit)."),
    quant: Optional[str] = typer.Option(None, "--quant", "-q", help="bf16 | fp16 | fp8 | nvfp4 (gpt-oss: the experts; mxfp4 as shipped)."),
    kv_cache: Optional[str] = typer.Option(None, "--kv-cache", help="KV cache precision: bf16 | fp16 | fp8."),
    context: Optional[int] = typer.Option(None, "--context", "-L", help="Tokens per sequence (prompt + output) to budget KV for."),
    max_batch: Optional[int] = typer.Option(None, "--max-batch", help="Engine max batch (activations, CUDA graphs)."),
    backend: Optional[str] = typer.Option(
        None, "--backend", help="Deployment backend: trt | trtllm | torch (default: recipe, else by model)."
    ),
    recipe_file: Optional[str] = typer.Option(
        None, "--recipe", help="Plan from this recipe (file or '<model>/<gpu>'); --model/--gpu then default to it."
    ),
    prefix_cache_mib: int = typer.Option(0, "--prefix-cache-mib", help="A served model's prefix cache (MiB), taken before the KV caches."),
    drafter: Optional[str] = typer.Option(
        None,
        "--drafter",
        help="Your DFlash drafter directory (z-lab layout): planned with its block size, taps and memory instead of the catalog's.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as one JSON object."),
) -> None:
    """Plan a deployment: memory per GPU, max concurrency, layout, build steps; refuse what cannot work."""
    from trtllm_dflash.errors import DFlashError
    from trtllm_dflash.planning import plan_deployment

    recipe = None
    if recipe_file is not None:
        from trtllm_dflash.recipes import resolve_recipe

        recipe = resolve_recipe(recipe_file)
        model, gpu = model or recipe.model.name, gpu or recipe.gpu
    if model is None or gpu is None:
        raise DFlashError(
            "plan needs a model and a GPU", "pass --model NAME --gpu GPU (or --recipe FILE); `dflash-trt recipes list` names them"
        )
    if drafter is not None and not (Path(drafter).expanduser() / "config.json").is_file():
        raise DFlashError(
            f"--drafter {drafter} is not a drafter directory (no config.json)", "pass the directory of a z-lab layout drafter"
        )
    result = plan_deployment(
        model,
        gpu,
        num_gpus=num_gpus,
        quant=quant,
        kv_cache=kv_cache,
        context=context,
        max_batch=max_batch,
        backend=backend,
        recipe=recipe,
        prefix_cache_mib=prefix_cache_mib,
        drafter=drafter,
    )
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print_plan(result)
    result.check()  # a refusal exits 2 with one line: the reason and the nearest combination that works

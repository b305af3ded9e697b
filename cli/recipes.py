"""`dflash-trt recipes list|show|validate`: the shipped deployments and checking your own."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

app = typer.Typer(
    help="Recipes: one YAML per model x GPU (engine_recipes/<model>/<gpu>.yaml). List, show, validate.",
    no_args_is_help=True,
)


def _quant(recipe) -> str:
    q = recipe.quantization
    if q.moe_experts and q.moe_experts != q.weights:
        return f"{q.weights}, experts {q.experts}"
    return q.weights


@app.command("list")
def list_(as_json: bool = typer.Option(False, "--json", help="One JSON object per recipe, one per line.")) -> None:
    """List the recipes shipped with the toolkit."""
    from trtllm_dflash.recipes import list_recipes

    recipes = list_recipes()
    if as_json:
        for recipe in recipes:
            print(json.dumps({"name": recipe.name, "path": str(recipe.path), **recipe.model_dump(mode="json")}))
        return
    # two narrow tables rather than one wide one: every value whole in 80 columns (a pipe, a CI log)
    console = Console(highlight=False)
    table = Table(title="engine_recipes", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for column in ("recipe", "backend", "GPUs", "weights", "KV", "block"):
        table.add_column(column, no_wrap=column != "weights", overflow="fold")
    drafters: dict[str, list[str]] = {}
    for recipe in recipes:
        table.add_row(
            recipe.name,
            recipe.backend,
            str(recipe.parallelism.num_gpus),
            _quant(recipe),
            recipe.quantization.kv_cache,
            str(recipe.drafter.block_size),
        )
        drafters.setdefault(recipe.drafter.checkpoint, []).append(recipe.model.name)
    console.print(table)
    used = Table(title="drafters", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    used.add_column("drafter", overflow="fold")
    used.add_column("recipes of", overflow="fold")
    for checkpoint, models in drafters.items():
        used.add_row(checkpoint, ", ".join(dict.fromkeys(models)))
    console.print(used)
    console.print("[dim]`dflash-trt recipes show NAME` prints one recipe whole[/]")


@app.command("show")
def show(
    name: str = typer.Argument(..., help="'<model>/<gpu>' (e.g. gpt-oss-120b/b300) or a recipe file."),
    as_json: bool = typer.Option(False, "--json", help="The validated recipe as JSON (defaults filled in)."),
) -> None:
    """Print a recipe: the YAML file, then what it resolves to."""
    from trtllm_dflash.recipes import resolve_recipe

    recipe = resolve_recipe(name)
    if as_json:
        payload = {"name": recipe.name, "path": str(recipe.path), **recipe.model_dump(mode="json")}
        if recipe.trtllm is not None:  # the LLM-API options of a trtllm recipe
            payload["llm_api_options"] = recipe.llm_api_options()
        print(json.dumps(payload, indent=2))
        return
    console = Console(highlight=False)
    console.print(f"[bold]{recipe.name}[/]  ({recipe.path})")
    console.print(Path(recipe.path).read_text().rstrip(), markup=False)
    console.print("\n[bold]resolved[/]")
    console.print(f"  max draft length: {recipe.max_draft_len} (block size {recipe.drafter.block_size})")
    schedule = recipe.drafter.draft_len_schedule or {1: recipe.max_draft_len}
    console.print("  drafts per step by concurrency: " + ", ".join(f">={c}: {n}" for c, n in schedule.items()))
    if recipe.trt_flavour():
        console.print(f"  TensorRT flavour: {recipe.trt_flavour()}")
    if recipe.trtllm is not None:
        import yaml

        console.print("  TensorRT-LLM LLM-API options (model.yaml / trtllm-serve --config):")
        text = yaml.safe_dump(recipe.llm_api_options(), sort_keys=False, default_flow_style=None)
        console.print("\n".join("    " + line for line in text.rstrip().splitlines()), markup=False)


@app.command("validate")
def validate(files: list[Path] = typer.Argument(..., help="Recipe YAML files to check.")) -> None:
    """Check recipe files: every problem with its file, key and line. Exits 2 if any is invalid."""
    from trtllm_dflash.errors import DFlashError
    from trtllm_dflash.recipes import load_recipe

    console, err = Console(highlight=False), Console(stderr=True, highlight=False)
    failed = 0
    for path in files:
        try:
            recipe = load_recipe(path)
        except DFlashError as exc:
            failed += 1
            for line in getattr(exc, "errors", None) or [exc.problem]:
                err.print(f"[bold red]error:[/] {escape(line)}", soft_wrap=True)
            continue
        console.print(f"ok: {path} ({recipe.name}, backend {recipe.backend})")
    if failed:
        raise typer.Exit(2)

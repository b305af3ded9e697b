"""`dflash-trt doctor`: what is installed here, and which build stages this machine can run."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table


def doctor(
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON object."),
    deep: bool = typer.Option(False, "--deep", help="Also import torch/TensorRT/TensorRT-LLM to confirm they load (slow)."),
    recipe: Optional[str] = typer.Option(None, "--recipe", help="Also check the build steps of this recipe ('<model>/<gpu>' or file)."),
) -> None:
    """Report the GPU and driver, TensorRT flavour, TensorRT-LLM, ModelOpt, Triton, torch/CUDA, and runnable stages."""
    from trtllm_dflash.checks.doctor import collect, stage_status

    report = collect(deep=deep)
    recipe_steps = []
    if recipe is not None:
        from trtllm_dflash.planning import plan_deployment
        from trtllm_dflash.recipes import resolve_recipe

        chosen = resolve_recipe(recipe)
        plan = plan_deployment(chosen.model.name, chosen.gpu, recipe=chosen)
        recipe_steps = [stage_status(s.name, s.description, s.needs, report.capabilities) for s in plan.steps]
    if as_json:
        payload = report.to_dict()
        payload["capabilities"] = report.capabilities
        if recipe is not None:
            payload["recipe_steps"] = [s.__dict__ for s in recipe_steps]
        print(json.dumps(payload, indent=2, default=str))
        return
    console = Console(highlight=False)
    console.print(f"Python {report.python} on {report.platform}")
    table = Table(title="toolchain", title_justify="left")
    for column in ("component", "found", "version", "where / how to get it"):
        table.add_column(column, overflow="fold")  # a long path or pip command wraps whole, never cut with "…"
    for c in report.components:
        table.add_row(c.name, "[green]yes[/]" if c.found else "[red]no[/]", c.version or "", escape(c.detail))
    console.print(table)
    stages = Table(title="build stages on this machine", title_justify="left")
    for column in ("stage", "runs here", "missing"):
        stages.add_column(column, overflow="fold")
    for s in report.stages:
        stages.add_row(s.name, "[green]yes[/]" if s.can_run else "[red]no[/]", ", ".join(s.missing))
    console.print(stages)
    if recipe_steps:
        console.print(f"[bold]steps of {recipe}[/]:")
        for s in recipe_steps:
            state = "[green]runs here[/]" if s.can_run else f"[red]needs {', '.join(s.missing)}[/]"
            console.print(f"  {s.name}: {state}")

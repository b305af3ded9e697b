"""`dflash-trt explain-bytes`: the bytes each engine reads and writes per verify step, per variant.

Counted from a build's exported graphs (`trtllm_dflash/builder/traffic.py`: weights, caches as the
nodes that read them read them, boundary tensors, the runtime around the engines), or from a
model's shape alone with `--model` (no export). An estimate of DRAM traffic, not a profile.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trtllm_dflash.contracts.defaults import PLANNED_CONTEXT, PLANNED_MAX_BATCH
from trtllm_dflash.errors import DFlashError

VARIANTS = ("native", "plugin", "all")


def human_bytes(value: int) -> str:
    """Decimal units, as memory bandwidth is quoted (GB/s)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= size:
            return f"{value / size:,.2f} {unit}"
    return f"{value:,} B"


def print_traffic(report: dict, console: Console | None = None) -> None:
    """One table: categories x (read, written) of every variant, then totals per engine."""
    from trtllm_dflash.builder.traffic import CATEGORIES

    console = console or Console(highlight=False)
    step = next(iter(report.values())).step
    console.print(
        f"[bold]Bytes per verify step[/] at batch {step.batch}, context {step.context}, capacity {step.capacity}, "
        f"block {step.block}, {step.rows} new context rows, {step.sampled} sampled rows "
        "[dim](a model of DRAM traffic from the graphs, not a profile)[/]"
    )
    table = Table(title_justify="left")
    table.add_column("category")
    for variant in report:
        table.add_column(f"{variant} read", justify="right")
        table.add_column(f"{variant} written", justify="right")
    per_variant = {variant: traffic.by_category() for variant, traffic in report.items()}
    for category in CATEGORIES:
        cells = []
        for variant in report:
            cells += [human_bytes(per_variant[variant][category]["read"]), human_bytes(per_variant[variant][category]["written"])]
        table.add_row(category, *cells)
    totals = []
    for traffic in report.values():
        totals += [f"[bold]{human_bytes(traffic.read)}[/]", f"[bold]{human_bytes(traffic.written)}[/]"]
    table.add_row("[bold]total[/]", *totals, end_section=True)
    console.print(table)
    for variant, traffic in report.items():
        console.print(
            f"  {variant}: {human_bytes(traffic.total)} per step (target engine {human_bytes(traffic.graph_total('target'))}, "
            f"drafter engine {human_bytes(traffic.graph_total('drafter'))}, runtime {human_bytes(traffic.graph_total('runtime'))})"
        )
    v2 = [item for item in next(iter(report.values())).items if item.what.startswith("V2 ")]
    if v2:
        parts = ", ".join(f"{item.what[3:]} {human_bytes(item.read + item.written)}" for item in v2)
        console.print(f"  DFlash V2 drafter, included above (every variant): {escape(parts)}")
    if "native" in report and "plugin" in report and report["native"].total:
        console.print(f"  plugin / native: {report['plugin'].total / report['native'].total:.3f}")


def print_build_traffic(out_dir: Path, console: Console) -> None:
    """The table of `explain-bytes OUT` at the build's own bounds (what `build --explain-bytes` prints)."""
    from trtllm_dflash.builder import traffic

    graphs_json = traffic.find_graphs_json(out_dir)
    step = traffic.default_step(json.loads(graphs_json.read_text())["bounds"])
    print_traffic(traffic.explain(out_dir, step, None), console)


def _step(defaults, **given):
    """The build's (or model's) default step with the options the user gave."""
    chosen = {name: value for name, value in given.items() if value is not None}
    step = dataclasses.replace(defaults, **chosen)
    if "capacity" in chosen and "context" not in chosen:
        step = dataclasses.replace(step, context=max(1, min(step.capacity - step.block, step.capacity // 2)))
    return step


def explain_bytes(
    build_dir: Optional[Path] = typer.Argument(None, help="A `dflash-trt build --out` directory (or its export/ folder)."),
    model: Optional[str] = typer.Option(
        None, "--model", "-m", help="Instead of a build: a catalog name or model directory (shape only, nothing exported)."
    ),
    batch: Optional[int] = typer.Option(
        None, "--batch", help=f"Rows per step (default: the build's max batch; --model: {PLANNED_MAX_BATCH})."
    ),
    context: Optional[int] = typer.Option(None, "--context", help="Committed tokens per row (default: half the capacity)."),
    capacity: Optional[int] = typer.Option(
        None, "--capacity", help=f"Cache slots bound per row (default: the build's max_seq_len; --model: {2 * PLANNED_CONTEXT})."
    ),
    block: Optional[int] = typer.Option(None, "--block", help="Tokens verified per row (default: the build's block size)."),
    new_rows: Optional[int] = typer.Option(None, "--new-rows", help="Context rows the drafter appends per row (default: the block)."),
    sampled: int = typer.Option(0, "--sampled", help="Rows with temperature > 0 (their draft distributions move too)."),
    variant: str = typer.Option("all", "--variant", help="native | plugin | all (every variant the build exported)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (every item) instead of the table."),
) -> None:
    """Bytes each engine reads and writes per verify step (weights, caches, logits), native vs plugin."""
    from trtllm_dflash.builder import traffic

    if variant not in VARIANTS:
        raise DFlashError(f"unknown --variant {variant!r}", f"use one of {', '.join(VARIANTS)}")
    if (build_dir is None) == (model is None):
        raise DFlashError("explain-bytes needs a build directory or --model (not both)", "pass BUILD_DIR, or --model NAME")
    wanted = None if variant == "all" else [variant]
    notes = []
    if model is not None:
        from trtllm_dflash.catalog.models import resolve_model

        spec = resolve_model(model)
        shape = traffic.ModelShape.from_catalog(spec)
        defaults = traffic.Step(block=spec.drafter.block_size if spec.drafter else 16)
        step = _step(defaults, batch=batch, context=context, capacity=capacity, block=block, new_rows=new_rows, sampled=sampled)
        report = traffic.explain_model(shape, step, wanted or ("native", "plugin"))
    else:
        graphs_json = traffic.find_graphs_json(build_dir)
        try:
            bounds = json.loads(graphs_json.read_text())["bounds"]
            defaults = traffic.default_step(bounds)
        except (OSError, json.JSONDecodeError, KeyError, TypeError):
            raise DFlashError(f"{graphs_json} is not a graphs.json of `dflash-trt build`", "re-run the export stage") from None
        step = _step(defaults, batch=batch, context=context, capacity=capacity, block=block, new_rows=new_rows, sampled=sampled)
        if step.batch > bounds["max_batch"] or step.capacity > bounds["max_seq_len"] + bounds["block_size"]:
            notes.append(
                f"batch {step.batch} x capacity {step.capacity} is beyond this build's engines (max batch "
                f"{bounds['max_batch']}, max_seq_len {bounds['max_seq_len']}): the figures apply its graphs at that size"
            )
        report = traffic.explain(build_dir, step, wanted)
    if as_json:
        print(json.dumps({"variants": {name: t.to_dict() for name, t in report.items()}, "notes": notes}, indent=2))
        return
    console = Console(highlight=False)
    print_traffic(report, console)
    for note in notes:
        console.print(f"  note: {escape(note)}")

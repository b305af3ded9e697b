"""`dflash-trt selftest --gpu`: the GPU check (`make gpu-check`), steps and report in trtllm_dflash/checks/selftest.py.

Exit status: 0 when no step failed (skipped steps say why), 1 when one failed, 2 with one line
where the check cannot start (no CUDA device, or no --gpu).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trtllm_dflash.errors import DFlashError

STATUS_STYLE = {"pass": "[green]✓ pass[/]", "fail": "[red]✗ fail[/]", "skip": "[yellow]- skip[/]"}


def selftest(
    gpu: bool = typer.Option(False, "--gpu", help="Run the GPU check (the only check selftest has so far)."),
    out: Path = typer.Option(Path("benchmarks/RESULTS.md"), "--out", "-o", help="Markdown file the results section is appended to."),
    quick: bool = typer.Option(False, "--quick", help="Fewer kernel shapes, prompts and tokens (a few minutes)."),
    step: Optional[list[str]] = typer.Option(
        None,
        "--step",
        help="Run only this step (repeatable): warmup, tests (brings warmup), kernels, decode-demo, decode-qwen3-8b, tensorrt.",
    ),
) -> None:
    """GPU tests, kernel benchmark vs the bandwidth floor and SDPA, torch-runtime decode (DFlash vs AR, \
CUDA graphs off/on); appends the results to RESULTS.md."""
    from trtllm_dflash.checks import selftest as check

    if not gpu:
        raise DFlashError(
            "selftest has only the GPU check so far", "run `dflash-trt selftest --gpu` (or `make gpu-check`) on a GPU machine"
        )
    keys = list(step or [])
    check.check_step_keys(keys)
    check.require_cuda()  # before anything slow: one line and exit 2 on a machine without CUDA
    from trtllm_dflash.cli.common import quiet_libraries

    quiet_libraries()
    console = Console(highlight=False)
    started = time.perf_counter()
    env = check.gpu_environment()
    console.print(
        f"[bold]GPU check[/] on {escape(env.gpu)} (compute capability {env.compute_capability}, {env.sm_count} SMs), driver {env.driver}"
    )
    console.print(f"torch {env.torch} (CUDA {env.cuda}), triton {env.triton}, {env.date}")
    if env.tensorrt is None:
        console.print("[yellow]TensorRT is not installed[/]: the engine step is skipped; every other step runs.")
    else:
        console.print(f"TensorRT {env.tensorrt}")

    def say(text: str) -> None:
        console.print(f"  [dim]{escape(text)}[/]")

    def on_start(step) -> None:
        console.print(f"[bold]▶ {escape(step.name)}[/]")

    def on_result(result) -> None:
        console.print(f"{STATUS_STYLE[result.status]} {escape(result.name)} ({result.seconds:.1f} s): {escape(result.summary)}")
        if result.error:
            console.print(f"[dim]{escape(''.join(result.error.strip().splitlines(keepends=True)[-12:]))}[/]")

    budget = check.QUICK if quick else check.FULL
    results = check.run_steps(check.select_steps(check.gpu_steps(env, budget, say), keys), on_start, on_result)
    seconds = time.perf_counter() - started

    table = Table(title=f"GPU check, {seconds:.0f} s", title_justify="left")
    for column in ("step", "result", "time"):
        table.add_column(column)
    for r in results:
        table.add_row(escape(r.name), STATUS_STYLE[r.status], f"{r.seconds:.1f} s")
    console.print(table)
    command = "dflash-trt selftest --gpu" + (" --quick" if quick else "") + "".join(f" --step {k}" for k in keys) + f" --out {out}"
    check.append_section(out, check.format_section(env, results, command, seconds))
    console.print(f"results appended to {escape(str(out))}")
    if check.any_failed(results):
        raise typer.Exit(1)

"""`dflash-trt build`: plan and run the build of one model for one GPU type.

Exit status: 0 when every stage finished (or was unchanged), 2 on bad input or a full disk (one
line), 3 when the build stopped cleanly before a stage this machine cannot run (no GPU, no
TensorRT): the finished stages stay valid and the same command on a suitable machine continues
from there. A killed or failed stage leaves manifest.json incomplete (that stage `running` or
`failed`); rerunning the same command finishes it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from trtllm_dflash.errors import DFlashError

EXIT_STOPPED = 3


class RichReporter:
    """Stage progress for the terminal and plain lines in CI logs.

    In a terminal a running stage is one live line: what it does now, a bar and `done/total`
    inside counted loops (graphs exported, engines built, calibration samples), and the time the
    stage has taken. A counted step that took a second or more leaves a line with its time when
    the next one starts. In a log every status is a line of its own."""

    def __init__(self, console: Console, clock: Callable[[], float] = time.perf_counter) -> None:
        self.console = console
        self.clock = clock
        self._live: Progress | None = None
        self._task = None
        self._started = 0.0
        self._step: tuple[str, float] | None = None  # the counted step running: its text and start

    def stage_started(self, stage) -> None:
        self._started = self.clock()
        self._step = None
        self.console.print(f"[bold]▶ {stage.name}[/]: {stage.title}")
        if self.console.is_terminal:
            self._live = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(bar_width=20),
                TextColumn("{task.fields[count]}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self._task = self._live.add_task(f"{stage.name}: starting", total=None, count="")
            self._live.start()

    def _stop(self, finished: bool) -> float:
        if finished and self._step is not None:
            self._step_done()
        self._step = None
        if self._live is not None:
            self._live.stop()
            self._live = None
        return self.clock() - self._started

    def _step_done(self) -> None:
        text, started = self._step
        self._step = None
        seconds = self.clock() - started
        if seconds >= 1.0:
            self.console.print(f"  [dim]done: {escape(text)} ({seconds:.0f} s)[/]")

    def status(self, text: str, done: int | None = None, total: int | None = None) -> None:
        counted = done is not None and total is not None
        if self._step is not None and self._step[0] != text:
            self._step_done()
        if counted and done < total and self._step is None:
            self._step = (text, self.clock())
        count = f"{done}/{total}" if counted else ""
        if self._live is not None:
            self._live.update(
                self._task, description=escape(text), total=total if counted else None, completed=done if counted else 0, count=count
            )
        else:
            self.console.print(f"  [dim]{escape(text)}{f' ({count} done)' if counted else ''}[/]")

    def stage_skipped(self, stage, record) -> None:
        self.console.print(f"[green]= {stage.name}[/]: unchanged since {record['finished']}, skipped")

    def stage_finished(self, stage, record) -> None:
        seconds = self._stop(finished=True)
        self.console.print(f"[green]✓ {stage.name}[/] ({seconds:.1f} s){escape(_short(record['summary']))}")

    def stage_blocked(self, stage, error) -> None:
        self._stop(finished=False)
        self.console.print(f"[yellow]■ {stage.name}[/]: cannot run here: {escape(error.problem)}")

    def stage_failed(self, stage, error) -> None:
        self._stop(finished=False)
        self.console.print(f"[red]✗ {stage.name}[/] failed")


def _command_line() -> str | None:
    """The build command as typed (recorded in the manifest: what a refusal of the unfinished build tells to rerun)."""
    import shlex
    import sys

    if sys.argv[1:2] != ["build"]:  # called in-process (tests, other commands): no command line to repeat
        return None
    return "dflash-trt " + shlex.join(sys.argv[1:])


def _short(summary: dict) -> str:
    keys = [k for k in ("quant", "dtype", "variants", "status", "flavour", "file", "note") if k in summary]
    if not keys:
        return ""
    return ": " + ", ".join(f"{k} {summary[k]}" for k in keys[:3])


def render(plan, console: Console) -> None:
    """The deployment plan, then the build's stages on this machine (also `build --dry-run`)."""
    from trtllm_dflash.cli.plan import print_plan

    print_plan(plan.spec.plan, console)
    console.print(f"[bold]On this machine[/] ({escape(plan.spec.source)}):")
    for stage in plan.stages:
        # ↓: checkpoints not on this machine, fetched when the build runs (and a failure offline): no check mark
        mark = (
            "[yellow]✗[/]"
            if not stage.runs_here and not stage.optional
            else ("[dim]-[/]" if not stage.runs_here else "[yellow]↓[/]" if stage.downloads else "[green]✓[/]")
        )
        console.print(f"  {mark} [bold]{stage.name:12}[/] {escape(stage.action)}")
        console.print(f"    {'':12} [dim]where:[/] {escape(stage.where)}; [dim]output:[/] {escape(stage.output)}")
    for note in plan.notes:
        console.print(f"  [dim]note:[/] {escape(note)}")
    if plan.stops_before:
        console.print(f"  [yellow]here the build stops before: {plan.stops_before} (finished stages are kept)[/]")


def build(
    model: Optional[str] = typer.Option(
        None, "--model", "-m", help="Model name from the catalog (e.g. demo, qwen3-8b, gpt-oss-120b) or a target checkpoint directory."
    ),
    gpu: Optional[str] = typer.Option(None, "--gpu", "-g", help="GPU type to build for (e.g. rtx-pro-6000, h100, b300)."),
    drafter: Optional[str] = typer.Option(
        None, "--drafter", help="DFlash drafter directory (z-lab layout); default: the catalog's drafter."
    ),
    target: Optional[str] = typer.Option(
        None,
        "--target",
        help="Local target checkpoint directory standing in for --model's "
        "(the catalog model's recipe and memory plan are kept; another family is refused).",
    ),
    recipe: Optional[str] = typer.Option(
        None, "--recipe", help="Recipe YAML file or '<model>/<gpu>' name (docs/recipes.md); flags override it."
    ),
    quant: Optional[str] = typer.Option(
        None, "--quant", "-q", help="bf16, fp16, fp8 or nvfp4 (gpt-oss: the experts, mxfp4 as shipped); default: the recipe's."
    ),
    backend: Optional[str] = typer.Option(
        None,
        "--backend",
        help="Deployment backend: trt (our engines) or trtllm (TensorRT-LLM); default: the recipe's. "
        "One the target family cannot use is refused, naming the one that works.",
    ),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output directory (default: out/<model>-<gpu>)."),
    calibration: Optional[str] = typer.Option(
        None, "--calibration", help="Calibration text for FP8/NVFP4: .txt (a sample per line) or .jsonl with 'text'."
    ),
    max_batch: Optional[int] = typer.Option(None, "--max-batch", help="Largest batch the engines accept."),
    max_input_len: Optional[int] = typer.Option(None, "--max-input-len", help="Longest prompt (prefill) in tokens."),
    max_seq_len: Optional[int] = typer.Option(None, "--max-seq-len", help="Longest prompt + output in tokens."),
    native_only: bool = typer.Option(
        False,
        "--native-only",
        help="Export (and build engines from) the native graphs only, not the plugin variant: "
        "the recipe's trt.use_plugins: false. The plugin export is the long one.",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (stages, where they run, sizes) and stop."),
    force: bool = typer.Option(False, "--force", help="Rebuild every stage even if its inputs are unchanged."),
    as_json: bool = typer.Option(False, "--json", help="With --dry-run: print the plan as JSON."),
    explain_bytes: bool = typer.Option(
        False,
        "--explain-bytes",
        help="After the export: print the bytes each engine reads and writes per verify step (`dflash-trt explain-bytes OUT`).",
    ),
    llmapi_model: Optional[Path] = typer.Option(
        None,
        "--llmapi-model",
        help="trtllm builds: NVIDIA's LLM-API Triton model folder "
        "(TensorRT-LLM's triton_backend/all_models/llmapi/tensorrt_llm at your container's tag), "
        "recorded in the repository and mounted by the printed command; "
        "default: $DFLASH_TRT_LLMAPI_MODEL, ./TensorRT-LLM, /app.",
    ),
) -> None:
    """Build a DFlash deployment: checkpoints -> quantize -> ONNX -> validate -> engines -> repository."""
    from trtllm_dflash.builder.spec import resolve_spec
    from trtllm_dflash.builder.stage_plan import make_build_plan

    spec = resolve_spec(
        model,
        gpu,
        recipe,
        quant,
        drafter,
        max_batch=max_batch,
        max_input_len=max_input_len,
        max_seq_len=max_seq_len,
        calibration=calibration,
        backend=backend,
        target=target,
        native_only=native_only,
    )
    if llmapi_model is not None:  # checked before the build starts; the build's artifact carries it to the repository
        if spec.backend != "trtllm":
            raise DFlashError(f"--llmapi-model is for trtllm builds, and this build's backend is {spec.backend}", "drop --llmapi-model")
        from trtllm_dflash.backends.trtllm.repository import require_llmapi_model

        llmapi_model = require_llmapi_model(llmapi_model)
    console = Console(highlight=False)
    plan = make_build_plan(spec)
    if dry_run:
        if as_json:
            print(json.dumps(plan.to_dict(), indent=2, default=str))
        else:
            render(plan, console)
        return
    render(plan, console)
    out_dir = out or Path("out") / f"{spec.model}-{spec.gpu.name}"
    from trtllm_dflash.builder.stages import prepare_out_dir

    prepare_out_dir(out_dir)  # a file or a read-only place fails here, before anything is loaded

    from trtllm_dflash.builder.pipeline import run_build
    from trtllm_dflash.cli.common import quiet_libraries

    quiet_libraries()
    result = run_build(
        spec, out_dir, force=force, reporter=RichReporter(console), command=_command_line(), plan=plan, llmapi_model=llmapi_model
    )
    manifest = Path(out_dir) / "manifest.json"
    if explain_bytes and (Path(out_dir) / "export" / "graphs.json").is_file():
        from trtllm_dflash.cli.explain_bytes import print_build_traffic

        print_build_traffic(Path(out_dir), console)
    if result.complete:
        console.print(f"[bold green]build complete[/]: {escape(str(manifest))}")
        repository = Path(out_dir) / "repository" / "triton"
        if repository.is_dir():
            from trtllm_dflash.backends import get_backend

            console.print(escape(get_backend(spec.backend).serve_hint(repository)), soft_wrap=True)
        return
    for stage, blocked in result.blocked.items():
        console.print(f"[bold yellow]{stage} cannot run here[/]: {escape(blocked.problem)}; {escape(blocked.fix)}")
    for stage, needs in result.not_run.items():
        console.print(f"[yellow]{stage} not run[/]: it needs {needs}")
    console.print(f"the build stopped cleanly; finished stages are kept and recorded in {escape(str(manifest))}")
    raise typer.Exit(EXIT_STOPPED)

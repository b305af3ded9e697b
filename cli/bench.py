"""`dflash-trt bench`: autoregressive vs DFlash, side by side in one run; table, JSON and plots."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trtllm_dflash.cli.common import quiet_libraries
from trtllm_dflash.contracts.defaults import DEFAULT_NEW_TOKENS
from trtllm_dflash.errors import DFlashError


def _int_list(text: Optional[str], option: str) -> Optional[list[int]]:
    if not text:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise DFlashError(f"{option} {text!r} is not a comma-separated list of integers", f"e.g. {option} 1,2,4") from None


def bench(
    model: Optional[str] = typer.Option(
        None,
        "--model",
        help="'demo': the embedded target/drafter pair. With --openai-url: the served model(s), comma-separated (e.g. dflash,ar).",
    ),
    openai_url: Optional[str] = typer.Option(
        None,
        "--openai-url",
        help="Any OpenAI-compatible server's base URL (http://host:port/v1): streamed concurrency sweep, TTFT/ITL percentiles.",
    ),
    openai_api: str = typer.Option("chat", "--openai-api", help="With --openai-url: chat or completions."),
    target: Optional[str] = typer.Option(None, "--target", help="Target model directory (Hugging Face layout)."),
    drafter: Optional[str] = typer.Option(None, "--drafter", help="DFlash drafter directory (z-lab layout)."),
    build: Optional[Path] = typer.Option(
        None, "--build", help="A `dflash-trt build` output directory: its engines on a GPU (--device cuda), its ONNX graphs on CPU."
    ),
    url: Optional[str] = typer.Option(None, "--url", help="A running DFlash Triton server, e.g. http://localhost:8000."),
    server_model: str = typer.Option("dflash", "--server-model", help="With --url: the DFlash model's name."),
    ar_model: str = typer.Option("ar", "--ar-model", help="With --url: the autoregressive baseline model's name."),
    protocol: str = typer.Option("http", "--protocol", help="With --url: http (server-sent events) or grpc streaming."),
    prompts: str = typer.Option("code", "--prompts", help="Prompt set: code, math, chat, stdlib (demo held-out), or a JSONL file."),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", help="Use only the first N prompts of the set."),
    max_new_tokens: int = typer.Option(DEFAULT_NEW_TOKENS, "--max-new-tokens", "-n", help="Tokens generated per prompt."),
    block_size: Optional[int] = typer.Option(None, "--block-size", "-b", help="Headline block size (default: the drafter's)."),
    block_sizes: Optional[str] = typer.Option(
        None, "--block-sizes", help="Block-size sweep, e.g. 4,8,16 (default: 2,4,.. up to the drafter's)."
    ),
    concurrency: str = typer.Option("1,2,4,8", "--concurrency", help="Concurrency sweep levels."),
    repeats: int = typer.Option(1, "--repeats", help="Passes over the prompt set in the main comparison."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch CPU threads (default: the cores not busy now, at least 1)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Directory for bench.json and the PNG plots."),
    no_plots: bool = typer.Option(False, "--no-plots", help="Skip the PNG plots."),
) -> None:
    """Measure tokens/s, speedup, tau, step times and sweeps of DFlash vs autoregressive decoding."""
    if device not in ("cpu", "cuda"):
        raise DFlashError(f"unknown device {device!r}", "use --device cpu or --device cuda")
    if repeats < 1:
        raise DFlashError(f"--repeats must be >= 1, got {repeats}", "pass a positive number")
    if num_prompts is not None and num_prompts < 1:
        raise DFlashError(f"--num-prompts must be >= 1, got {num_prompts}", "pass a positive number")
    if out is not None and out.exists() and not out.is_dir():
        raise DFlashError(f"--out {out} is a file", "pass a directory")
    if openai_url is not None:
        return _bench_openai(
            openai_url,
            model,
            openai_api,
            prompts,
            num_prompts,
            max_new_tokens,
            concurrency,
            out,
            no_plots,
            others=[n for n, v in (("--target", target), ("--build", build), ("--url", url)) if v],
        )
    from trtllm_dflash.bench.measure import BenchConfig, run_bench
    from trtllm_dflash.bench.prompts import load_prompt_set

    config = BenchConfig(
        max_new_tokens=max_new_tokens,
        block_size=block_size,
        block_sizes=_int_list(block_sizes, "--block-sizes"),
        concurrency=_int_list(concurrency, "--concurrency") or [1],
        repeats=repeats,
    )
    prompt_texts = load_prompt_set(prompts, num_prompts)
    quiet_libraries()
    from trtllm_dflash.bench.report import print_report, write_plots
    from trtllm_dflash.bench.systems import open_system
    from trtllm_dflash.runtime.threads import set_threads

    set_threads(threads)
    backend = open_system(
        model=model,
        target=target,
        drafter=drafter,
        build=build,
        url=url,
        device=device,
        server_model=server_model,
        ar_model=ar_model,
        protocol=protocol,
    )
    console = Console(highlight=False)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        tasks: dict[str, int] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
            bar.update(tasks[phase], completed=done)

        report = run_bench(backend, prompt_texts, config, progress)
    _finish(report, prompts, console, out, no_plots, print_report, write_plots)


def _bench_openai(
    url: str,
    model: Optional[str],
    api: str,
    prompts: str,
    num_prompts: Optional[int],
    max_new_tokens: int,
    concurrency: str,
    out: Optional[Path],
    no_plots: bool,
    others: list[str],
) -> None:
    """bench --openai-url: the streamed sweep of trtllm_dflash.bench.openai_bench."""
    from trtllm_dflash.bench.openai_bench import print_openai_report, run_openai_bench, write_openai_plot
    from trtllm_dflash.bench.prompts import load_prompt_set

    if others:
        raise DFlashError(f"--openai-url and {' and '.join(others)} name two systems", "benchmark one at a time")
    if not model:
        raise DFlashError("--openai-url needs --model NAME", "name the served model(s), e.g. --model dflash,ar")
    if api not in ("chat", "completions"):
        raise DFlashError(f"unknown --openai-api {api!r}", "use chat or completions")
    prompt_texts = load_prompt_set(prompts, num_prompts)
    console = Console(highlight=False)
    report = run_openai_bench(
        url,
        [m.strip() for m in model.split(",") if m.strip()],
        prompt_texts,
        _int_list(concurrency, "--concurrency") or [1],
        max_new_tokens,
        chat=api == "chat",
    )
    _finish(report, prompts, console, out, no_plots, print_openai_report, write_openai_plot)


def _finish(
    report: dict,
    prompts: str,
    console: Console,
    out: Optional[Path],
    no_plots: bool,
    print_table: Callable[[dict, Console], None],
    write_plots: Callable[[dict, Path], list],
) -> None:
    """Both kinds of bench: name the prompt set in the report, print its table, write bench.json and plots under `out`."""
    from trtllm_dflash.bench.report import write_json

    report["settings"]["prompt_set"] = prompts
    print_table(report, console)
    if out is not None:
        written = [write_json(report, out / "bench.json")]
        if not no_plots:
            written += write_plots(report, out)
        console.print("wrote " + ", ".join(str(p) for p in written))

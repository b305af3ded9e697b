"""`dflash-trt demo`: the whole pipeline on the embedded demo pair, on whatever machine this is.

It runs the same commands a user would type, printing each one first, so the demo doubles as a
walk-through: doctor, plan, build (everything this machine can build; on a CPU machine that is
real TensorRT-RTX engines for an RTX PRO 6000, built ahead of time), generate from the built
graphs, write the Triton repository, serve it with a real tritonserver, stream a request, and
measure tau and the DFlash-over-autoregressive speedup through the server.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.rule import Rule

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.extras import require_installed

PROMPT = "def fibonacci(n):"
EXIT_BUILD_STOPPED = 3  # `dflash-trt build`: finished what this machine can build


def _cli() -> list[str]:
    return [sys.executable, "-m", "trtllm_dflash.cli.app"]


class Walkthrough:
    """Runs numbered steps, each a `dflash-trt` command shown before it runs."""

    def __init__(self, console: Console, steps: int) -> None:
        self.console = console
        self.steps = steps
        self.index = 0

    def step(self, title: str) -> None:
        self.index += 1
        self.console.print(Rule(f"[bold]{self.index}/{self.steps}  {escape(title)}", align="left"))

    def run(self, args: list[str], ok: tuple[int, ...] = (0,)) -> int:
        self.console.print(f"[bold cyan]$ dflash-trt {escape(shlex.join(args))}[/]")
        code = subprocess.call(_cli() + args)
        if code not in ok:
            raise DFlashError(f"`dflash-trt {args[0]}` failed (exit {code})", "see its output above")
        return code


def _default_gpu() -> str:
    """The local GPU when NVML sees a known one, else the RTX PRO 6000 (TensorRT-RTX builds it AOT)."""
    from trtllm_dflash.catalog import detect_local_gpus

    known = [gpu.catalog for gpu in detect_local_gpus().gpus if gpu.catalog is not None]
    return known[0].name if known else "rtx-pro-6000"


def _wait_ready(url: str, server: subprocess.Popen, timeout: float) -> None:
    from trtllm_dflash.serving.client import DFlashClient

    clients = [DFlashClient(url, model=name) for name in ("dflash", "ar")]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise DFlashError(f"tritonserver exited with status {server.returncode}", "see its log above")
        if all(client.ready() for client in clients):
            return
        time.sleep(1.0)
    raise DFlashError(f"the server was not ready after {timeout:.0f} s", "see its log above")


def demo(
    out: Path = typer.Option(Path("demo-out"), "--out", "-o", help="Where the build, repository and bench results go."),
    gpu: Optional[str] = typer.Option(
        None, "--gpu", help="GPU type to build for (default: the local GPU, else rtx-pro-6000, built ahead of time)."
    ),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", "-n", help="Tokens per request."),
    num_prompts: int = typer.Option(4, "--num-prompts", help="Code prompts in the speed measurement."),
    threads: int = typer.Option(1, "--threads", help="torch CPU threads per served model."),
) -> None:
    """Run plan, build, generate, repository, serve and bench on the embedded demo pair."""
    console = Console(highlight=False)
    out = out.expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise DFlashError(f"--out {out} is a file", "pass a directory")
    require_installed(("onnx", "onnxscript", "onnxruntime", "pytriton", "tritonclient", "prometheus_client"), "the demo")
    gpu = gpu or _default_gpu()
    build_dir, repo_dir, bench_dir = out / "build", out / "repo", out / "bench"
    walk = Walkthrough(console, 8)

    walk.step("What this machine has")
    walk.run(["doctor"])

    walk.step(f"Plan the demo deployment on {gpu}")
    walk.run(["plan", "--model", "demo", "--gpu", gpu])

    walk.step("Build everything this machine can build (skips stages that are unchanged)")
    code = walk.run(["build", "--model", "demo", "--gpu", gpu, "--out", str(build_dir)], ok=(0, EXIT_BUILD_STOPPED))
    engines_run_here = _engines_run_here(build_dir)

    walk.step("Generate from the built graphs")
    if engines_run_here:
        walk.run(["generate", "--engines", str(build_dir), "--prompt", PROMPT, "-n", str(max_new_tokens)])
    else:
        console.print("[dim]the engines target another GPU, so this machine runs the same build's ONNX graphs on CPU[/]")
        walk.run(["generate", "--onnx", str(build_dir), "--prompt", PROMPT, "-n", str(max_new_tokens)])

    walk.step("Write the Triton model repository (DFlash model + autoregressive baseline)")
    if engines_run_here:
        walk.run(["repo", "--build", str(build_dir), "--out", str(repo_dir), "--force"])
    else:
        console.print("[dim]no GPU for the engines here: the repository serves the demo pair on the torch runtime[/]")
        walk.run(["repo", "--model", "demo", "--out", str(repo_dir), "--force", "--threads", str(threads)])

    from trtllm_dflash.serving.server import free_port

    ports = [free_port() for _ in range(3)]
    url = f"http://127.0.0.1:{ports[0]}"
    serve_args = [
        "serve",
        str(repo_dir),
        "--http-port",
        str(ports[0]),
        "--grpc-port",
        str(ports[1]),
        "--metrics-port",
        str(ports[2]),
        "--host",
        "127.0.0.1",
    ]
    walk.step("Serve it with tritonserver")
    console.print(f"[bold cyan]$ dflash-trt {escape(shlex.join(serve_args))} &[/]")
    server = subprocess.Popen(_cli() + serve_args, start_new_session=True)
    try:
        _wait_ready(url, server, timeout=600)

        walk.step("Stream a request through the server")
        walk.run(["generate", "--url", url, "--prompt", PROMPT, "-n", str(max_new_tokens), "--stream"])

        walk.step("DFlash vs autoregressive through the server, side by side")
        walk.run(
            [
                "bench",
                "--url",
                url,
                "--prompts",
                "code",
                "--num-prompts",
                str(num_prompts),
                "-n",
                str(max_new_tokens),
                "--concurrency",
                "1,4",
                "--out",
                str(bench_dir),
                "--no-plots",
            ]
        )
    finally:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
    _summary(console, bench_dir / "bench.json", build_dir, code)


def _engines_run_here(build_dir: Path) -> bool:
    """True when the build has engines and this machine has a GPU and TensorRT to run them."""
    manifest = build_dir / "manifest.json"
    if not manifest.is_file():
        return False
    stages = json.loads(manifest.read_text()).get("stages", {})
    if stages.get("engines", {}).get("status") != "complete":
        return False
    import importlib.util

    import torch

    return importlib.util.find_spec("tensorrt") is not None and torch.cuda.is_available()


def _summary(console: Console, bench_json: Path, build_dir: Path, build_code: int) -> None:
    console.print(Rule("[bold]Summary", align="left"))
    report = json.loads(bench_json.read_text())
    summary = report["summary"]  # the keys trtllm_dflash.bench.measure.run_bench writes
    tau, speedup, lossless = summary.get("tau"), summary.get("speedup"), summary.get("lossless")
    built = "complete" if build_code == 0 else "stopped before the stages this machine cannot run"
    console.print(f"build: {built} ({escape(str(build_dir / 'manifest.json'))})")
    if tau is not None:
        console.print(f"mean acceptance length tau: [bold]{tau:.2f}[/]")
    if speedup is not None:
        console.print(
            f"the speedup a single user sees (served, one request at a time, interleaved with autoregressive): [bold]{speedup:.2f}x[/]"
        )
        console.print(
            "[dim]the concurrency table's ratios are throughput of all users at each level, each mode run in one block: "
            "at 1 user they measure the same thing less evenly, so on a busy machine they can differ[/]"
        )
    if lossless is not None:
        console.print(f"greedy outputs identical to autoregressive: [bold]{'yes' if lossless else 'NO'}[/]")

"""`dflash-trt plugins`: ahead-of-time builds of the DFlash plugin kernels."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trtllm_dflash.errors import DFlashError

app = typer.Typer(help="Build the DFlash TensorRT plugin kernels ahead of time.", no_args_is_help=True)
DTYPES = ("float16", "bfloat16", "float32")


@app.command("build")
def build(
    arch: str = typer.Option(..., "--arch", help="Comma-separated targets: sm_90a (H100/H200), sm_100a (B200), sm_103a (B300), sm_120 (RTX PRO Blackwell)."),
    out: Path = typer.Option(..., "--out", help="Output directory (new, empty, or a previous build, which is replaced)."),
    head_dim: Optional[list[int]] = typer.Option(None, "--head-dim", help="Drafter head dims to build (repeatable; default 64, 128, 256)."),
    dtype: Optional[list[str]] = typer.Option(None, "--dtype", help="Drafter activation dtypes (repeatable; default bfloat16, float16)."),
    block_size: Optional[list[int]] = typer.Option(None, "--block-size", help="Draft block sizes to cover (repeatable; default 2..16)."),
    gqa_group: Optional[list[int]] = typer.Option(None, "--gqa-group", help="Query heads per KV head (repeatable; default 1, 2, 4, 8)."),
    logits_dtype: Optional[list[str]] = typer.Option(None, "--logits-dtype", help="Target logits dtypes for verification (default float32, bfloat16, float16)."),
    fp8_kv_cache: bool = typer.Option(False, "--fp8-kv-cache", help="Also build attention over a float8 (e4m3) KV cache (SM >= 8.9)."),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Parallel compile processes."),
) -> None:
    """Compile every kernel variant for every architecture: PTX + cubin + manifest.json."""
    from trtllm_dflash.plugins import aot

    arches = aot.parse_arches(arch)  # validated before anything is touched
    for name, values in (("--dtype", dtype), ("--logits-dtype", logits_dtype)):
        for value in values or ():
            if value not in DTYPES:
                raise DFlashError(f"{name} {value!r} is not supported", f"use one of {', '.join(DTYPES)}")
    if jobs < 1:
        raise DFlashError(f"--jobs must be >= 1, got {jobs}", "pass a positive number")
    aot.check_output_dir(out)
    variants = aot.kernel_variants(
        head_dims=head_dim or (64, 128, 256),
        dtypes=dtype or ("bfloat16", "float16"),
        blocks=block_size or range(2, 17),
        groups=gqa_group or (1, 2, 4, 8),
        fp8_kv_cache=fp8_kv_cache,
        logits_dtypes=logits_dtype or ("float32", "bfloat16", "float16"),
    )
    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("compiling", total=len(variants) * len(arches))
        manifest = aot.build(arches, out, variants, jobs=jobs, progress=lambda label: progress.update(task, advance=1, description=label))
    console.print(f"built {len(manifest['kernels'])} kernels in {out}")
    for a in arches:
        info = manifest["arches"][a.name]
        console.print(f"  {a.name:8} PTX ISA {info['ptx_isa']}  driver >= {info['min_driver']}  ({info['gpus']})")
    console.print(f"  TensorRT >= {manifest['min_tensorrt']} embeds them through tensorrt.plugin (aot_impl)")

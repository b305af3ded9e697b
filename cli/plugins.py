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
    out: Path = typer.Option(..., "--out", help="Output directory (new, empty, or a previous build, which is replaced)."),
    arch: Optional[str] = typer.Option(
        None,
        "--arch",
        help="Comma-separated targets: sm_90a (H100/H200), sm_100a (B200), sm_103a (B300), sm_120 (RTX PRO Blackwell); "
        "default with --recipe: its GPU's.",
    ),
    recipe: Optional[str] = typer.Option(
        None,
        "--recipe",
        help="Build only the variants this recipe's drafter launches (head dim, GQA ratio, block sizes, dtypes): "
        "a '<model>/<gpu>' name or a YAML file.",
    ),
    head_dim: Optional[list[int]] = typer.Option(None, "--head-dim", help="Drafter head dims to build (repeatable; default 64, 128, 256)."),
    dtype: Optional[list[str]] = typer.Option(None, "--dtype", help="Drafter activation dtypes (repeatable; default bfloat16, float16)."),
    block_size: Optional[list[int]] = typer.Option(None, "--block-size", help="Draft block sizes to cover (repeatable; default 2..16)."),
    gqa_group: Optional[list[int]] = typer.Option(None, "--gqa-group", help="Query heads per KV head (repeatable; default 1, 2, 4, 8)."),
    logits_dtype: Optional[list[str]] = typer.Option(
        None, "--logits-dtype", help="Target logits dtypes for verification (default float32, bfloat16, float16)."
    ),
    fp8_kv_cache: bool = typer.Option(False, "--fp8-kv-cache", help="Also build attention over a float8 (e4m3) KV cache (SM >= 8.9)."),
    target_head_dim: Optional[list[str]] = typer.Option(
        None,
        "--target-head-dim",
        help="Target attention head dims: D, or KxV when keys and values differ (repeatable; default: the --head-dim values).",
    ),
    target_gqa_group: Optional[list[int]] = typer.Option(
        None, "--target-gqa-group", help="Target query heads per KV head (repeatable; default: the --gqa-group values)."
    ),
    attention_sinks: bool = typer.Option(False, "--attention-sinks", help="Also build target attention with attention sinks (gpt-oss)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Parallel compile processes (default: one per CPU)."),
    cache_dir: Optional[Path] = typer.Option(
        None,
        "--cache-dir",
        help="Compiled-kernel cache (default ~/.cache/trtllm-dflash/kernels); unchanged kernels are not compiled again.",
    ),
    no_cache: bool = typer.Option(False, "--no-cache", help="Compile everything; neither read nor write the cache."),
) -> None:
    """Compile the kernel variants for each architecture (in parallel, reusing cached ones): PTX + cubin + manifest.json."""
    import os
    import time

    from trtllm_dflash.plugins import aot

    space = None
    if recipe is not None:
        from trtllm_dflash.builder.kernel_space import recipe_kernel_space
        from trtllm_dflash.recipes.loader import resolve_recipe

        space = recipe_kernel_space(resolve_recipe(recipe))
        picked = {
            "--head-dim": head_dim,
            "--dtype": dtype,
            "--block-size": block_size,
            "--gqa-group": gqa_group,
            "--logits-dtype": logits_dtype,
            "--target-head-dim": target_head_dim,
            "--target-gqa-group": target_gqa_group,
        }
        flags = {"--fp8-kv-cache": fp8_kv_cache, "--attention-sinks": attention_sinks}
        clash = [flag for flag, value in picked.items() if value] + [flag for flag, value in flags.items() if value]
        if clash:
            raise DFlashError(
                f"--recipe picks the variants itself; {', '.join(clash)} cannot be combined with it", "drop them, or drop --recipe"
            )
    if arch is None and space is None:
        raise DFlashError("no architecture given", f"pass --arch (one or more of {', '.join(aot.ARCHES)}) or --recipe")
    arches = aot.parse_arches(arch or space.arch)  # validated before anything is touched
    for name, values in (("--dtype", dtype), ("--logits-dtype", logits_dtype)):
        for value in values or ():
            if value not in DTYPES:
                raise DFlashError(f"{name} {value!r} is not supported", f"use one of {', '.join(DTYPES)}")
    target_dims = [_head_dim_pair(text) for text in target_head_dim] if target_head_dim else None
    if jobs is not None and jobs < 1:
        raise DFlashError(f"--jobs must be >= 1, got {jobs}", "pass a positive number")
    jobs = jobs or os.cpu_count() or 1
    aot.check_output_dir(out)
    if space is not None:
        variants = aot.kernel_variants(**space.options())
    else:
        variants = aot.kernel_variants(
            head_dims=head_dim or (64, 128, 256),
            dtypes=dtype or ("bfloat16", "float16"),
            blocks=block_size or range(2, 17),
            groups=gqa_group or (1, 2, 4, 8),
            fp8_kv_cache=fp8_kv_cache,
            logits_dtypes=logits_dtype or ("float32", "bfloat16", "float16"),
            target_head_dims=target_dims,
            target_groups=target_gqa_group or None,
            target_sinks=(False, True) if attention_sinks else (False,),
        )
    cache = None if no_cache else (cache_dir or aot.DEFAULT_CACHE_DIR)
    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    stats = aot.BuildStats()
    started = time.monotonic()
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("compiling", total=len(variants) * len(arches))
        manifest = aot.build(
            arches,
            out,
            variants,
            jobs=jobs,
            cache_dir=cache,
            stats=stats,
            progress=lambda label: progress.update(task, advance=1, description=label),
        )
    cached = f"{stats.cached} from the cache ({cache})" if cache else "cache off"
    console.print(
        f"built {len(manifest['kernels'])} kernels in {out} in {time.monotonic() - started:.1f} s: "
        f"{stats.compiled} compiled ({jobs} jobs), {cached}"
    )
    for a in arches:
        info = manifest["arches"][a.name]
        console.print(f"  {a.name:8} PTX ISA {info['ptx_isa']}  driver >= {info['min_driver']}  ({info['gpus']})")
    console.print(f"  TensorRT >= {manifest['min_tensorrt']} embeds them through tensorrt.plugin (aot_impl)")


def _head_dim_pair(text: str) -> tuple[int, int]:
    """`128` -> (128, 128); `128x64` -> (128, 64): key and value head dims of a target layer."""
    from trtllm_dflash.ops.kernels.launch import ATTENTION_HEAD_DIMS

    parts = text.lower().split("x")
    try:
        dims = tuple(int(part) for part in parts)
    except ValueError:
        dims = ()
    if len(dims) not in (1, 2) or any(d not in ATTENTION_HEAD_DIMS for d in dims):
        raise DFlashError(f"--target-head-dim {text!r} is not a supported head dim", f"use D or KxV with D, K, V in {ATTENTION_HEAD_DIMS}")
    return (dims[0], dims[-1])


@app.command("audit")
def audit(
    arch: str = typer.Option("sm_90a,sm_100a", "--arch", help="Comma-separated targets to compile for (see `plugins build --arch`)."),
    path: list[str] = typer.Option(
        ["aot", "jit"], "--path", help="Launch paths: aot (TensorRT engines), jit (torch launches); repeatable."
    ),
    markdown: Optional[Path] = typer.Option(None, "--markdown", help="Also write the full per-kernel table to this file."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Parallel compile processes (default: one per CPU)."),
) -> None:
    """Compile every kernel variant for each target (no GPU needed) and check what ptxas reports:
    shared memory within the limit, no spills in 16-bit kernels, 16-byte global loads. Exit 1 on a problem."""
    from trtllm_dflash.plugins import aot, kernel_audit

    arches = aot.parse_arches(arch)
    for name in path:
        if name not in ("aot", "jit"):
            raise DFlashError(f"--path {name!r} is not a launch path", "use aot or jit")
    if jobs is not None and jobs < 1:
        raise DFlashError(f"--jobs must be >= 1, got {jobs}", "pass a positive number")
    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("compiling", total=None)
        reports = kernel_audit.audit(
            arches, path, jobs=jobs, progress=lambda r: progress.update(task, advance=1, description=f"{r.arch} {r.label}")
        )
    if markdown is not None:
        markdown.write_text(kernel_audit.markdown_table(reports))
    bad = [r for r in reports if r.problems()]
    for a in arches:
        for name in path:
            mine = [r for r in reports if r.arch == a.name and r.path == name]
            worst_shared = max(r.shared for r in mine)
            spills = sum(1 for r in mine if r.spill_stores)
            console.print(
                f"{a.name} {name}: {len(mine)} kernels, max shared {worst_shared} B (limit {mine[0].shared_limit} B), "
                f"{spills} spilling, {sum(1 for r in mine if r.problems())} with problems"
            )
    for r in bad:
        console.print(f"  {r.path} {r.arch} {r.label}: {'; '.join(r.problems())}")
    if bad:
        raise typer.Exit(1)

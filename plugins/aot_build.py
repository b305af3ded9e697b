"""Builds of many plugin kernels: a content-addressed cache, a process pool, the output directory
and its manifest (what `dflash-trt plugins build` writes and `tensorrt_plugins` reads back).

Builds are parallel (a process pool, one compile per variant x arch) and incremental: every
compiled kernel goes into a content-addressed cache keyed by everything that determines its
bytes (kernel source, Triton version, arch, PTX ISA, signature, constexprs, launch options), so
a rebuild with nothing changed compiles nothing.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Callable

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.extras import require
from trtllm_dflash.ops import kernels, rng
from trtllm_dflash.ops.kernels import launch
from trtllm_dflash.plugins import aot_compile
from trtllm_dflash.plugins.aot_compile import MIN_TENSORRT, Arch, CompiledKernel, compile_kernel
from trtllm_dflash.plugins.aot_variants import KernelVariant, kernel_variants

DEFAULT_CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trtllm-dflash" / "kernels"
CACHE_FORMAT = 2  # 2: pointer alignment attributes


@functools.cache
def source_digest(source: str) -> str:
    """sha256 of what a kernel's bytes are made from: its file, the jitted helpers kernel files share
    (kernels/counter_rng.py, over rng.py) and `aot_compile` (the compile options, PTX rewriting and
    ptxas flags)."""
    digest = hashlib.sha256()
    helpers = (kernels._HERE / "counter_rng.py", Path(rng.__file__))
    for path in (kernels._HERE / f"{source}.py", *helpers, Path(aot_compile.__file__)):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_key(variant: KernelVariant, arch: Arch, triton_version: str) -> str:
    """The content address of one compiled kernel."""
    parts = {
        "format": CACHE_FORMAT,
        "source": source_digest(variant.source),
        "triton": triton_version,
        "arch": arch.name,
        "capability": arch.capability,
        "ptx_isa": arch.ptx_isa,
        "function": variant.function,
        "signature": variant.signature,
        "constexprs": variant.constexprs,
        "attrs": sorted(variant.compile_attrs().items()),
        "num_warps": variant.num_warps,
        "num_stages": variant.num_stages,
        "fp_fusion": variant.enable_fp_fusion,
        "maxnreg": launch.MAX_REGISTERS,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class KernelCache:
    """Compiled kernels on disk, one folder per cache key (ptx, cubin, meta.json).

    An entry is written into a temporary folder and renamed into place, so a reader never sees
    half an entry and concurrent builds sharing the cache cannot corrupt it; an unreadable entry
    is a miss.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root).expanduser()

    def _entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get(self, key: str, variant: KernelVariant, arch: Arch) -> CompiledKernel | None:
        entry = self._entry(key)
        try:
            meta = json.loads((entry / "meta.json").read_text())
            ptx, cubin = (entry / "kernel.ptx").read_text(), (entry / "kernel.cubin").read_bytes()
        except (OSError, ValueError):
            return None
        return CompiledKernel(variant, arch, meta["name"], ptx, cubin, meta["num_warps"], meta["shared"], meta["triton_version"])

    def put(self, key: str, kernel: CompiledKernel) -> None:
        entry = self._entry(key)
        if entry.is_dir():
            return
        staging = self.root / f".tmp-{uuid.uuid4().hex}"
        try:
            staging.mkdir(parents=True)
            (staging / "kernel.ptx").write_text(kernel.ptx)
            (staging / "kernel.cubin").write_bytes(kernel.cubin)
            meta = {
                "name": kernel.name,
                "num_warps": kernel.num_warps,
                "shared": kernel.shared,
                "triton_version": kernel.triton_version,
                "label": kernel.variant.label,
                "arch": kernel.arch.name,
            }
            (staging / "meta.json").write_text(json.dumps(meta))
            entry.parent.mkdir(parents=True, exist_ok=True)
            os.rename(staging, entry)
        except OSError:  # another build put the same entry first, or the cache is not writable
            pass
        finally:
            shutil.rmtree(staging, ignore_errors=True)


@dataclasses.dataclass
class BuildStats:
    """What a build did: kernels compiled here, and taken from the cache."""

    compiled: int = 0
    cached: int = 0


def build(
    arches: list[Arch],
    out_dir: Path,
    variants: list[KernelVariant] | None = None,
    jobs: int | None = None,
    progress: Callable[[str], None] | None = None,
    cache_dir: Path | None = None,
    stats: BuildStats | None = None,
) -> dict:
    """Compile every variant for every architecture into `out_dir`; returns the manifest.

    Files: `<arch>/<label>.ptx` and `.cubin`, and `manifest.json`. The build happens in a staging
    directory that replaces `out_dir` only when everything compiled, so a failed build leaves a
    previous build untouched and never a half-written one. Kernels found in `cache_dir` are not
    compiled again; the others are compiled by `jobs` processes (default: one per CPU) and cached.
    """
    triton = require("triton", "kernels", "compiling the plugin kernels")

    variants = variants if variants is not None else kernel_variants()
    stats = stats if stats is not None else BuildStats()
    cache = KernelCache(cache_dir) if cache_dir is not None else None
    out_dir = Path(out_dir)
    check_output_dir(out_dir)
    staging = out_dir.with_name(f".{out_dir.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    tasks = [(variant, arch) for arch in arches for variant in variants]
    keys = [cache_key(variant, arch, triton.__version__) for variant, arch in tasks]
    compiled: dict[int, CompiledKernel] = {}
    try:
        for arch in arches:
            (staging / arch.name).mkdir(parents=True, exist_ok=True)
        todo = []
        for index, (variant, arch) in enumerate(tasks):
            kernel = cache.get(keys[index], variant, arch) if cache else None
            if kernel is None:
                todo.append(index)
                continue
            compiled[index] = kernel
            stats.cached += 1
            if progress:
                progress(f"{arch.name} {variant.node} (cached)")
        for index, kernel in _compile_all([tasks[i] for i in todo], todo, jobs or os.cpu_count() or 1):
            compiled[index] = kernel
            stats.compiled += 1
            if cache:
                cache.put(keys[index], kernel)
            if progress:
                progress(f"{kernel.arch.name} {kernel.variant.node}")
        entries = []
        for index, (variant, arch) in enumerate(tasks):
            kernel = compiled[index]
            files = {kind: Path(arch.name) / f"{variant.label}.{kind}" for kind in ("ptx", "cubin")}
            (staging / files["ptx"]).write_text(kernel.ptx)
            (staging / files["cubin"]).write_bytes(kernel.cubin)
            entries.append(manifest_entry(kernel, files))
        manifest = {
            "format": "trtllm-dflash-plugin-kernels/1",
            "triton_version": triton.__version__,
            "min_tensorrt": MIN_TENSORRT,
            "arches": {
                a.name: {"capability": a.capability, "ptx_isa": a.ptx_isa_text, "cuda": a.cuda, "min_driver": a.min_driver, "gpus": a.gpus}
                for a in arches
            },
            "kernels": entries,
        }
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if out_dir.exists():
        shutil.rmtree(out_dir)
    staging.rename(out_dir)
    return manifest


def _compile_all(tasks: list[tuple[KernelVariant, Arch]], ids: list[int], jobs: int):
    """(id, CompiledKernel) as each compile finishes: in this process for one job or one task,
    else in a process pool (Triton's compiler holds the GIL, so threads would not help)."""
    if jobs <= 1 or len(tasks) <= 1:
        for index, task in zip(ids, tasks):
            yield index, compile_kernel(*task)
        return
    with concurrent.futures.ProcessPoolExecutor(min(jobs, len(tasks))) as pool:
        futures = {pool.submit(_compile_task, task): index for index, task in zip(ids, tasks)}
        try:
            for future in concurrent.futures.as_completed(futures):
                yield futures[future], future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def check_output_dir(out_dir: Path) -> None:
    """Only a new or empty directory, or a previous kernel build, may be (re)placed."""
    if out_dir.exists() and not out_dir.is_dir():
        raise DFlashError(f"{out_dir} is a file", "pass a directory for --out")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / "manifest.json").is_file():
        raise DFlashError(f"{out_dir} is not empty and holds no kernel build", "pass a new or empty directory for --out")


def _compile_task(task: tuple[KernelVariant, Arch]) -> CompiledKernel:
    return compile_kernel(*task)


def manifest_entry(kernel: CompiledKernel, files: dict[str, Path]) -> dict:
    v = kernel.variant
    return {
        "node": v.node,
        "plugin": f"dflash::{v.node}",
        "kernel": kernel.name,
        "label": v.label,
        "arch": kernel.arch.name,
        "ptx_target": kernel.ptx_target,
        "ptx_isa": kernel.ptx_version,
        "min_driver": kernel.arch.min_driver,
        "num_warps": kernel.num_warps,
        "threads_per_block": kernel.threads,
        "shared_memory": kernel.shared,
        "shared_memory_opt_in": kernel.shared > 48 * 1024,  # above 48 KiB the launcher must raise the limit
        "triton_version": kernel.triton_version,
        "params": [f"{name}:{t}" for name, t in v.signature],
        "constexprs": {k: v for k, v in v.constexprs},
        "ptx": str(files["ptx"]),
        "cubin": str(files["cubin"]),
        "ptx_sha256": hashlib.sha256(kernel.ptx.encode()).hexdigest(),
    }


@functools.cache
def load_manifest(directory: str) -> dict:
    path = Path(directory) / "manifest.json"
    if not path.is_file():
        raise DFlashError(f"{directory} has no manifest.json", "build the kernels with `dflash-trt plugins build`")
    return json.loads(path.read_text())

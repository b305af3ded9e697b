"""What the compiler says about every plugin kernel variant, read without a GPU.

Triton compiles for an explicit target on a CPU machine, and its bundled `ptxas -v` reports what a
launch on that GPU would meet. For each variant and architecture this module records:

- shared memory (Triton's metadata) against what its launch gets: an engine's AOT launch at most
  48 KiB (`launch.ENGINE_SHARED_BUDGET`, docs/plugins.md), a torch (Triton JIT) launch the
  architecture's opt-in limit (`Arch.max_shared`); over it, the launch fails on the GPU;
- registers and spill bytes (`ptxas -v`): spills are local-memory traffic in the inner loop;
- how global memory is read, from the PTX: 16-byte vector loads (`ld.global.v4.b32`,
  `ld.global.v2.b64`), 16-byte `cp.async` copies, and loads narrower than 4 bytes (a 16-bit kernel
  reading K/V or logits two bytes at a time).

The AOT variants are what `dflash-trt plugins build` compiles (with a float8 cache and attention
sinks); the JIT variants are the configurations the torch path launches: the same tiles, in
float32 too (tests and reference runs use it). `dflash-trt plugins audit` prints the table and
tests/test_kernel_audit.py fails on any problem.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Iterable

from trtllm_dflash.ops.kernels import launch
from trtllm_dflash.plugins.aot_compile import Arch, CompiledKernel, _ptxas_path, compile_kernel
from trtllm_dflash.plugins.aot_variants import KernelVariant, kernel_variants

# Variants exempt from the 16-byte-load check, and why.
SMALL_READS = "reads <= 256 bytes per row: latency-bound, not bandwidth-bound"  # the commit kernel
UNALIGNED_ROWS = "vocabulary not a multiple of 16: its logits rows are not 16-byte aligned"
UNALIGNED_HIDDEN = "hidden size not a multiple of the channel tile: its rows are not 16-byte aligned"
SIXTEEN_BIT = ("fp16", "bf16")
# Narrow loads a streaming kernel may keep: single gathered elements (the draft token's logit).
MAX_GATHERS = 2


def streaming_exemption(variant: KernelVariant) -> str:
    """Why this variant need not read 16 bytes at a time ("" when it must)."""
    if variant.function == "verify_commit_kernel":
        return SMALL_READS
    if dict(variant.constexprs).get("VOCAB_DIVISIBLE") is False:
        return UNALIGNED_ROWS
    if dict(variant.constexprs).get("ALIGNED") is False:
        return UNALIGNED_HIDDEN
    return ""


@dataclasses.dataclass(frozen=True)
class KernelReport:
    """The compiler's numbers for one variant on one architecture and launch path."""

    label: str
    node: str
    function: str
    arch: str
    path: str  # "aot" (TensorRT engines) or "jit" (torch launches)
    data_dtype: str  # Triton name of the first pointer's dtype: fp16 | bf16 | fp32 | ...
    num_warps: int
    num_stages: int
    shared: int
    shared_limit: int
    registers: int
    spill_stores: int
    spill_loads: int
    vector_loads_16b: int  # ld.global of 16 bytes per thread
    cp_async_16b: int  # cp.async copies of 16 bytes
    narrow_loads: int  # ld.global of fewer than 4 bytes per thread
    exempt: str = ""  # why the 16-byte-load check does not apply (`streaming_exemption`)

    @property
    def sixteen_bit(self) -> bool:
        return self.data_dtype in SIXTEEN_BIT

    def problems(self) -> list[str]:
        """What would fail or crawl on the GPU: one phrase each; empty when the variant is sound."""
        found = []
        if self.shared > self.shared_limit:
            found.append(f"{self.shared} B of shared memory > {self.shared_limit} B")
        if self.sixteen_bit and (self.spill_stores or self.spill_loads):
            found.append(f"spills {self.spill_stores} B stores / {self.spill_loads} B loads")
        if not self.exempt:
            if self.vector_loads_16b + self.cp_async_16b == 0:
                found.append("no 16-byte vector load or cp.async")
            if self.narrow_loads > MAX_GATHERS:
                found.append(f"{self.narrow_loads} global loads narrower than 4 bytes")
        return found


def shared_limit(arch: Arch, path: str) -> int:
    """Shared memory one program may use: the engine budget for AOT launches, the opt-in limit for JIT ones."""
    return min(arch.max_shared, launch.ENGINE_SHARED_BUDGET) if path == "aot" else arch.max_shared


def aot_variants() -> list[KernelVariant]:
    """What `dflash-trt plugins build` compiles with no variant flags, plus attention sinks, a float8
    cache and the DFlash V2 drafter kernels."""
    return kernel_variants(fp8_kv_cache=True, target_sinks=(False, True), dflash2_dtypes=("bfloat16", "float16"))


def jit_variants(arch: Arch) -> list[KernelVariant]:
    """The configurations the torch path launches on `arch`: the same space and tiles in float16,
    bfloat16 and float32 (tests and reference runs use float32)."""
    return kernel_variants(
        dtypes=("bfloat16", "float16", "float32"),
        fp8_kv_cache=True,
        target_sinks=(False, True),
        dflash2_dtypes=("bfloat16", "float16", "float32"),
    )


def ptxas_report(ptx: str, arch: Arch) -> str:
    """`ptxas -v` (Triton's bundled ptxas, Triton's flags) on the final PTX: its resource lines."""
    gpu = re.search(r"^\.target (\S+)", ptx, re.MULTILINE).group(1)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "kernel.ptx"
        source.write_text(ptx)
        command = [_ptxas_path(arch), "-v", "--regAllocOptLevel=2", f"--gpu-name={gpu}", str(source), "-o", str(Path(tmp) / "kernel.cubin")]
        result = subprocess.run(command, capture_output=True, text=True, check=True)
    return result.stderr


_LOAD = re.compile(r"\bld\.global((?:\.[\w:]+)*)")
_CP_ASYNC_16 = re.compile(r"\bcp\.async\.c[ga]\.shared\.global\S*\s+\[[^\]]*\],\s*\[[^\]]*\],\s*(?:16|0x10)\b")


def load_widths(ptx: str) -> list[int]:
    """Bytes per thread of every `ld.global` instruction in the PTX (vector count x element bits / 8)."""
    widths = []
    for match in _LOAD.finditer(ptx):
        parts = match.group(1).split(".")
        lanes = next((int(p[1:]) for p in parts if re.fullmatch(r"v\d", p)), 1)
        bits = next((int(p[1:]) for p in reversed(parts) if re.fullmatch(r"[bfus]\d+", p)), 32)
        widths.append(lanes * bits // 8)
    return widths


def report(kernel: CompiledKernel, path: str) -> KernelReport:
    """Read one compiled kernel: metadata, PTX and `ptxas -v`."""
    resources = ptxas_report(kernel.ptx, kernel.arch)
    registers = re.search(r"Used (\d+) registers", resources)
    spill_stores = sum(int(x) for x in re.findall(r"(\d+) bytes spill stores", resources))
    spill_loads = sum(int(x) for x in re.findall(r"(\d+) bytes spill loads", resources))
    widths = load_widths(kernel.ptx)
    variant = kernel.variant
    data = next(kind for _, kind in variant.signature if kind.startswith("*")).lstrip("*")
    return KernelReport(
        label=variant.label,
        node=variant.node,
        function=variant.function,
        arch=kernel.arch.name,
        path=path,
        data_dtype=data,
        num_warps=variant.num_warps,
        num_stages=variant.num_stages,
        shared=kernel.shared,
        shared_limit=shared_limit(kernel.arch, path),
        registers=int(registers.group(1)) if registers else 0,
        spill_stores=spill_stores,
        spill_loads=spill_loads,
        vector_loads_16b=sum(1 for w in widths if w == 16),
        cp_async_16b=len(_CP_ASYNC_16.findall(kernel.ptx)),
        narrow_loads=sum(1 for w in widths if w < 4),
        exempt=streaming_exemption(variant),
    )


def _audit_task(task: tuple[KernelVariant, Arch, str]) -> KernelReport:
    variant, arch, path = task
    return report(compile_kernel(variant, arch), path)


def audit(
    arches: Iterable[Arch],
    paths: Iterable[str] = ("aot", "jit"),
    jobs: int | None = None,
    progress: Callable[[KernelReport], None] | None = None,
) -> list[KernelReport]:
    """Compile and read every variant of each launch path for each architecture (a process pool;
    a variant both paths launch is compiled once and reported under both)."""
    tasks: list[tuple[KernelVariant, Arch, str]] = []
    for arch in arches:
        for path in paths:
            variants = aot_variants() if path == "aot" else jit_variants(arch)
            tasks += [(variant, arch, path) for variant in variants]
    unique = list(dict.fromkeys((variant, arch) for variant, arch, _ in tasks))
    reports: dict[tuple[KernelVariant, Arch], KernelReport] = {}
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(unique) or 1))
    with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
        futures = {pool.submit(_audit_task, (variant, arch, "aot")): (variant, arch) for variant, arch in unique}
        for future in concurrent.futures.as_completed(futures):
            reports[futures[future]] = result = future.result()
            if progress:
                progress(result)
    return [
        dataclasses.replace(reports[(variant, arch)], path=path, shared_limit=shared_limit(arch, path)) for variant, arch, path in tasks
    ]


def markdown_table(reports: list[KernelReport]) -> str:
    """One row per (path, arch, variant): what the compiler reported and what is wrong with it."""
    lines = [
        "| path | arch | kernel | warps | stages | shared B (limit) | regs | spill B "
        "| 16-B loads | cp.async 16 B | narrow loads | problems |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in sorted(reports, key=lambda r: (r.path, r.arch, r.label)):
        lines.append(
            f"| {r.path} | {r.arch} | `{r.label}` | {r.num_warps} | {r.num_stages} | {r.shared} ({r.shared_limit}) | {r.registers} | "
            f"{r.spill_stores} | {r.vector_loads_16b} | {r.cp_async_16b} | {r.narrow_loads} | {'; '.join(r.problems()) or 'ok'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """`python -m trtllm_dflash.plugins.kernel_audit --arch sm_90a,sm_100a --json OUT`: the audit as
    JSON, for a process that runs beside something else (the test suite starts it in the background)."""
    import argparse
    import json

    from trtllm_dflash.plugins.aot_compile import parse_arches

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90a,sm_100a")
    parser.add_argument("--path", default="aot,jit")
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=None)
    args = parser.parse_args(argv)
    reports = audit(parse_arches(args.arch), args.path.split(","), jobs=args.jobs)
    staging = args.json.with_suffix(".partial")
    staging.write_text(json.dumps([dataclasses.asdict(r) for r in reports]))
    staging.rename(args.json)
    return 0


def read_reports(path: Path) -> list[KernelReport]:
    """The reports `main` wrote."""
    import json

    return [KernelReport(**fields) for fields in json.loads(Path(path).read_text())]


if __name__ == "__main__":
    raise SystemExit(main())

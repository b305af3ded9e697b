"""Compilation of one plugin kernel variant for one deployment GPU, without a GPU.

Triton compiles for an explicit `GPUTarget`, so PTX and cubin for every architecture can be built
on a CPU machine. Two choices make the output usable by the TensorRT and drivers users run:

- PTX ISA version. Triton stamps the PTX with the newest ISA its bundled ptxas knows (9.4 for
  Triton 3.9), which a CUDA 13.0 driver (R580, PTX <= 9.0) refuses to JIT: an engine embedding it
  would fail to load. Each target here is compiled for the OLDEST ISA that supports it, so the
  minimum driver is the one that introduced the architecture (`ARCHES`).
- Kernel parameters. Triton appends two pointer parameters (global and profile scratch) after
  the declared ones; TensorRT's AOT plugins pass exactly the declared ones (inputs, int scalars,
  outputs). The kernels need no scratch (checked), so the unused trailing parameters are removed
  from the PTX, and the cubin is assembled from that PTX, so both have the ABI in the manifest.

What to compile is `aot_variants`; building many variants with a cache and a manifest is `aot_build`.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import tempfile
from pathlib import Path

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.extras import require
from trtllm_dflash.ops import kernels
from trtllm_dflash.ops.kernels import launch
from trtllm_dflash.plugins.aot_variants import KernelVariant


@dataclasses.dataclass(frozen=True)
class Arch:
    """A deployment target and the oldest PTX ISA / driver that support it."""

    name: str  # as users write it: sm_90a, sm_100a, sm_103a, sm_120
    capability: int  # Triton GPUTarget arch
    ptx_isa: int  # 80 == PTX ISA 8.0
    cuda: str  # the CUDA toolkit that introduced this PTX ISA
    min_driver: str  # the Linux driver of that toolkit: the oldest that can JIT this PTX
    gpus: str
    max_shared: int  # shared memory one program may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin)

    @property
    def ptx_isa_text(self) -> str:
        return f"{self.ptx_isa // 10}.{self.ptx_isa % 10}"


ARCHES = {
    arch.name: arch
    for arch in (
        Arch("sm_90a", 90, 80, "12.0", "525.60.13", "Hopper: H100, H200", 232_448),
        Arch("sm_100a", 100, 87, "12.8", "570.26", "Blackwell: B200, GB200", 232_448),
        Arch("sm_103a", 103, 88, "12.9", "575.51.03", "Blackwell Ultra: B300, GB300", 232_448),
        Arch("sm_120", 120, 87, "12.8", "570.26", "RTX PRO 6000 Blackwell, GeForce RTX 50", 101_376),
    )
}
ALIASES = {"sm_120a": "sm_120", "sm90a": "sm_90a", "sm100a": "sm_100a", "sm103a": "sm_103a", "sm120": "sm_120"}
MIN_TENSORRT = "10.9"  # ahead-of-time Python plugins (tensorrt.plugin.aot_impl)


def parse_arches(text: str) -> list[Arch]:
    """`sm_90a,sm_100a,...` -> Arch list; an unknown name is a one-line error listing the known ones."""
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    if not names:
        raise DFlashError("no architecture given", f"pass --arch with one or more of {', '.join(ARCHES)}")
    arches = []
    for name in names:
        name = ALIASES.get(name, name)
        if name not in ARCHES:
            raise DFlashError(f"unknown GPU architecture {name!r}", f"use one of {', '.join(ARCHES)}")
        if ARCHES[name] not in arches:
            arches.append(ARCHES[name])
    return arches


@dataclasses.dataclass
class CompiledKernel:
    """PTX/cubin of one variant for one architecture, and what a launcher needs to know."""

    variant: KernelVariant
    arch: Arch
    name: str
    ptx: str
    cubin: bytes
    num_warps: int
    shared: int
    triton_version: str

    @property
    def ptx_version(self) -> str:
        return re.search(r"^\.version (\S+)", self.ptx, re.MULTILINE).group(1)

    @property
    def ptx_target(self) -> str:
        return re.search(r"^\.target (\S+)", self.ptx, re.MULTILINE).group(1)

    @property
    def threads(self) -> int:
        return self.num_warps * 32


def _ptxas_path(arch: Arch) -> str:
    get_ptxas = require("triton.backends.nvidia.compiler", "kernels", "ptxas").get_ptxas

    return get_ptxas(arch.capability).path


def strip_scratch_params(ptx: str, name: str, declared: int) -> str:
    """Remove Triton's trailing scratch-pointer parameters when the kernel body never reads them."""
    start = ptx.index(f".entry {name}(")
    end = ptx.index(")", start)
    header, body = ptx[start:end], ptx[end:]
    extra = [int(p) for p in re.findall(rf"\b{name}_param_(\d+)\b", header) if int(p) >= declared]
    for index in extra:
        if re.search(rf"\b{name}_param_{index}\b", body):
            raise DFlashError(f"kernel {name} reads its scratch parameter {index}", "this kernel cannot be launched by TensorRT")
        header = re.sub(rf",?\s*\.param \.u64 \.ptr \.global \.align \d+ {name}_param_{index}\b", "", header)
    return ptx[:start] + header + body


def compile_kernel(variant: KernelVariant, arch: Arch) -> CompiledKernel:
    """Compile one variant for one architecture with the pinned PTX ISA (no GPU needed)."""
    triton = require("triton", "kernels", "compiling the plugin kernels")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(kernels.load(variant.source, interpret=False), variant.function)
    # constexprs the variant leaves out take the kernel's defaults (PDL: an engine's launch is ordinary)
    defaults = {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}
    constexprs = defaults | dict(variant.constexprs)
    source = ASTSource(fn, signature=dict(variant.signature), constexprs=constexprs, attrs=variant.compile_attrs())
    options = dict(
        ptx_version=arch.ptx_isa,
        num_warps=variant.num_warps,
        num_stages=variant.num_stages,
        enable_fp_fusion=variant.enable_fp_fusion,
        maxnreg=launch.MAX_REGISTERS,
    )
    compiled = triton.compile(source, target=GPUTarget("cuda", arch.capability, 32), options=options)
    meta = compiled.metadata
    if meta.global_scratch_size or meta.profile_scratch_size:
        raise DFlashError(f"{variant.label} needs Triton scratch memory, which TensorRT plugins cannot provide")
    ptx = strip_scratch_params(compiled.asm["ptx"], meta.name, len(variant.signature))
    cubin = assemble(ptx, arch, fmad=variant.enable_fp_fusion)
    return CompiledKernel(variant, arch, meta.name, ptx, cubin, meta.num_warps, meta.shared, triton.__version__)


def assemble(ptx: str, arch: Arch, fmad: bool = True) -> bytes:
    """ptxas (Triton's bundled one, with Triton's flags) on the final PTX: proves it is valid for its
    ISA and target, and gives the cubin for consumers that take one."""
    gpu = re.search(r"^\.target (\S+)", ptx, re.MULTILINE).group(1)
    flags = ["-lineinfo", "--regAllocOptLevel=2"] + ([] if fmad else ["--fmad=false"])
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "kernel.ptx", Path(tmp) / "kernel.cubin"
        src.write_text(ptx)
        command = [_ptxas_path(arch), *flags, f"--gpu-name={gpu}", str(src), "-o", str(out)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise DFlashError(f"ptxas rejected the PTX for {arch.name}: {result.stderr.strip().splitlines()[-1]}")
        return out.read_bytes()

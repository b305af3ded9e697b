"""Ahead-of-time compilation of the plugin kernels for the deployment GPUs, without a GPU.

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
import re
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Callable, Iterable

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.extras import require
from trtllm_dflash.plugins import kernels, rng
from trtllm_dflash.plugins.kernels import launch


@dataclasses.dataclass(frozen=True)
class Arch:
    """A deployment target and the oldest PTX ISA / driver that support it."""

    name: str  # as users write it: sm_90a, sm_100a, sm_103a, sm_120
    capability: int  # Triton GPUTarget arch
    ptx_isa: int  # 80 == PTX ISA 8.0
    cuda: str  # the CUDA toolkit that introduced this PTX ISA
    min_driver: str  # the Linux driver of that toolkit: the oldest that can JIT this PTX
    gpus: str

    @property
    def ptx_isa_text(self) -> str:
        return f"{self.ptx_isa // 10}.{self.ptx_isa % 10}"


ARCHES = {
    arch.name: arch
    for arch in (
        Arch("sm_90a", 90, 80, "12.0", "525.60.13", "Hopper: H100, H200"),
        Arch("sm_100a", 100, 87, "12.8", "570.26", "Blackwell: B200, GB200"),
        Arch("sm_103a", 103, 88, "12.9", "575.51.03", "Blackwell Ultra: B300, GB300"),
        Arch("sm_120", 120, 87, "12.8", "570.26", "RTX PRO 6000 Blackwell, GeForce RTX 50"),
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


# ----------------------------------------------------------------------------- kernel variants

TORCH_TO_TRITON = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float8_e4m3fn": "fp8e4nv", "int32": "i32", "int64": "i64"}


@dataclasses.dataclass(frozen=True)
class KernelVariant:
    """One compilation unit: a kernel function with its pointer dtypes and compile-time constants."""

    node: str  # the ONNX node (TensorRT plugin) that launches it
    source: str  # kernel file: attention | verify
    function: str
    signature: tuple[tuple[str, str], ...]  # parameter -> Triton type, in kernel order
    constexprs: tuple[tuple[str, object], ...]
    num_warps: int
    num_stages: int
    enable_fp_fusion: bool

    @property
    def label(self) -> str:
        """A stable, readable identifier, e.g. `block_attention_kernel.bf16.head_dim128.block_m64...`."""
        dtypes = "-".join(sorted({t.lstrip("*") for _, t in self.signature if t.startswith("*") and not t.startswith("*i")}))
        consts = [f"{k.lower()}{int(v) if isinstance(v, bool) else v}" for k, v in self.constexprs]
        return ".".join(part for part in [self.function, dtypes, *consts] if part)


def _attention_signature(dtype: str, cache_dtype: str, split: bool) -> tuple:
    t, c = f"*{TORCH_TO_TRITON[dtype]}", f"*{TORCH_TO_TRITON[cache_dtype]}"
    outputs = (("partial_out_ptr", "*fp32"), ("partial_lse_ptr", "*fp32")) if split else (("out_ptr", t),)
    return (
        ("q_ptr", t), ("k_block_ptr", t), ("v_block_ptr", t), ("k_ctx_ptr", t), ("v_ctx_ptr", t),
        ("new_counts_ptr", "*i64"), ("k_cache_ptr", c), ("v_cache_ptr", c), ("cache_lens_ptr", "*i64"),
        ("block", "i32"), ("num_new", "i32"), ("capacity", "i32"), ("num_kv_heads", "i32"), ("group", "i32"),
        ("window", "i32"), ("scale_bits", "i32"), ("num_splits", "i32"),
        *outputs, ("k_cache_out_ptr", c), ("v_cache_out_ptr", c),
    )


def attention_variants(head_dim: int, dtype: str, cache_dtype: str, block_m: int) -> list[KernelVariant]:
    """The direct and split attention kernels and the merge kernel for one query-tile size."""
    config = launch.attention_config_for_tile(head_dim, block_m)
    constexprs = (
        ("HEAD_DIM", head_dim), ("BLOCK_M", block_m), ("BLOCK_N", config.block_n), ("BLOCK_T", config.block_t),
        ("IEEE", dtype == "float32"),
    )
    variants = [
        KernelVariant(node, "attention", function, _attention_signature(dtype, cache_dtype, split),
                      constexprs, config.num_warps, config.num_stages, True)
        for node, function, split in (
            ("DFlashBlockAttention", "block_attention_kernel", False),
            ("DFlashBlockAttentionSplit", "block_attention_split_kernel", True),
        )
    ]
    t = f"*{TORCH_TO_TRITON[dtype]}"
    merge_signature = (
        ("partial_out_ptr", "*fp32"), ("partial_lse_ptr", "*fp32"), ("like_ptr", t),
        ("block", "i32"), ("num_kv_heads", "i32"), ("group", "i32"), ("num_splits", "i32"), ("out_ptr", t),
    )
    variants.append(KernelVariant("DFlashAttentionMerge", "attention", "merge_kernel", merge_signature,
                                  (("HEAD_DIM", head_dim), ("BLOCK_M", block_m)), 4, 1, True))
    return variants


def _target_attention_signature(dtype: str, cache_dtype: str) -> tuple:
    t, c = f"*{TORCH_TO_TRITON[dtype]}", f"*{TORCH_TO_TRITON[cache_dtype]}"
    return (
        ("q_ptr", t), ("k_new_ptr", t), ("v_new_ptr", t), ("k_cache_ptr", c), ("v_cache_ptr", c),
        ("starts_ptr", "*i64"), ("sinks_ptr", "*fp32"),
        ("tokens", "i32"), ("capacity", "i32"), ("num_kv_heads", "i32"), ("group", "i32"), ("window", "i32"), ("scale_bits", "i32"),
        ("out_ptr", t), ("k_cache_out_ptr", c), ("v_cache_out_ptr", c),
    )


def target_attention_variant(
    head_dim_k: int, head_dim_v: int, dtype: str, cache_dtype: str, block_m: int, has_sinks: bool
) -> KernelVariant:
    """The DFlashTargetAttention kernel for one (key, value) head-dim pair, dtype, query tile and sinks flag
    (the window is a runtime scalar: full and sliding layers share a variant)."""
    config = launch.target_attention_config_for_tile(head_dim_k, head_dim_v, block_m)
    constexprs = (
        ("HEAD_DIM_K", head_dim_k), ("HEAD_DIM_V", head_dim_v), ("BLOCK_M", block_m), ("BLOCK_N", config.block_n),
        ("HAS_SINKS", bool(has_sinks)), ("IEEE", dtype == "float32"),
    )
    return KernelVariant("DFlashTargetAttention", "attention", "target_attention_kernel",
                         _target_attention_signature(dtype, cache_dtype), constexprs, config.num_warps, config.num_stages, True)


def target_query_tiles(head_dim_k: int, head_dim_v: int, blocks: Iterable[int], groups: Iterable[int]) -> list[int]:
    """The query tiles a target with these GQA groups launches for verify blocks of these sizes,
    and for a prefill or a dynamic token dimension (which take the MAX_BLOCK tile)."""
    tokens = set(blocks) | {launch.MAX_BLOCK}
    return sorted({launch.target_attention_config(head_dim_k, head_dim_v, t, g).block_m for t in tokens for g in groups})


def verify_variants(logits_dtype: str) -> list[KernelVariant]:
    positions = (
        ("logits_ptr", f"*{TORCH_TO_TRITON[logits_dtype]}"), ("tokens_ptr", "*i64"), ("draft_probs_ptr", "*fp32"),
        ("temperature_ptr", "*fp32"), ("top_k_ptr", "*i64"), ("top_p_ptr", "*fp32"), ("seed_ptr", "*i64"),
        ("start_ptr", "*i64"), ("block", "i32"), ("vocab", "i32"), ("has_draft_probs", "i32"), ("decisions_ptr", "*i32"),
    )
    return [KernelVariant("DFlashVerifyPositions", "verify", "verify_positions_kernel", positions,
                          (("BLOCK_V", launch.VERIFY_BLOCK_V),), 4, 1, False)]


def commit_variant() -> KernelVariant:
    signature = (
        ("decisions_ptr", "*i32"), ("tokens_ptr", "*i64"), ("start_ptr", "*i64"), ("stop_ids_ptr", "*i64"),
        ("block", "i32"), ("num_stop", "i32"), ("result_ptr", "*i64"),
    )
    return KernelVariant("DFlashVerifyCommit", "verify", "verify_commit_kernel", signature,
                         (("BLOCK_T", launch.MAX_BLOCK), ("BLOCK_S", launch.COMMIT_BLOCK_S)), 1, 1, False)


def query_tiles(head_dim: int, blocks: Iterable[int], groups: Iterable[int]) -> list[int]:
    """The query-tile sizes (BLOCK_M) that drafters with these block sizes and GQA groups use."""
    return sorted({launch.attention_config(head_dim, b, g).block_m for b in blocks for g in groups})


def kernel_variants(
    head_dims: Iterable[int] = (64, 128, 256),
    dtypes: Iterable[str] = ("bfloat16", "float16"),
    blocks: Iterable[int] = range(2, launch.MAX_BLOCK + 1),
    groups: Iterable[int] = (1, 2, 4, 8),
    fp8_kv_cache: bool = False,
    logits_dtypes: Iterable[str] = ("float32", "bfloat16", "float16"),
    target_head_dims: Iterable[tuple[int, int]] | None = None,
    target_groups: Iterable[int] | None = None,
    target_dtypes: Iterable[str] | None = None,
    target_sinks: Iterable[bool] = (False,),
) -> list[KernelVariant]:
    """Every kernel variant a drafter and its target in this space launch (default: the whole
    supported space, without attention-sink variants).

    The target's attention takes its (key, value) head dims, GQA groups and activation dtypes from
    `target_*`, defaulting to the drafter's (square head dims); its cache has the activation dtype.
    `target_sinks` lists the HAS_SINKS values to build: (True,) for gpt-oss, (False, True) for both.
    """
    blocks, groups = list(blocks), list(groups)
    variants = []
    for head_dim in head_dims:
        for dtype in dtypes:
            caches = [dtype] + (["float8_e4m3fn"] if fp8_kv_cache else [])
            for cache_dtype in caches:
                for block_m in query_tiles(head_dim, blocks, groups):
                    for variant in attention_variants(head_dim, dtype, cache_dtype, block_m):
                        if variant not in variants:
                            variants.append(variant)
    target_head_dims = list(target_head_dims) if target_head_dims is not None else [(d, d) for d in head_dims]
    target_groups = list(target_groups) if target_groups is not None else groups
    for head_dim_k, head_dim_v in target_head_dims:
        for dtype in (target_dtypes if target_dtypes is not None else dtypes):
            for block_m in target_query_tiles(head_dim_k, head_dim_v, blocks, target_groups):
                for has_sinks in target_sinks:
                    variant = target_attention_variant(head_dim_k, head_dim_v, dtype, dtype, block_m, has_sinks)
                    if variant not in variants:
                        variants.append(variant)
    for logits_dtype in logits_dtypes:
        variants += verify_variants(logits_dtype)
    return variants + [commit_variant()]


PRECISION_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclasses.dataclass(frozen=True)
class KernelSpace:
    """The kernel variants one deployment launches (kernel_variants(**space.options()))."""

    arch: str  # the recipe GPU's kernel target
    head_dims: tuple[int, ...]
    dtypes: tuple[str, ...]
    blocks: tuple[int, ...]
    groups: tuple[int, ...]
    fp8_kv_cache: bool
    logits_dtypes: tuple[str, ...]
    target_head_dims: tuple[tuple[int, int], ...] = ()  # (key, value) per target attention layer kind
    target_groups: tuple[int, ...] = ()
    target_dtypes: tuple[str, ...] = ()
    target_sinks: tuple[bool, ...] = (False,)

    def options(self) -> dict:
        fields = dataclasses.asdict(self)
        fields.pop("arch")
        return fields


def target_attention_shapes(model) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...]]:
    """((key, value) head dims, GQA groups) of a target's attention layers that the target-attention
    kernel covers. Layers it does not cover (linear attention, MLA, head dims like Gemma 4's 512)
    are left out: those layers keep the native path."""
    if model.is_mla:
        return (), ()
    dims, groups = set(), set()
    for layer in range(model.num_layers):
        shape = model.attention(layer)
        if shape.num_kv_heads == 0 or shape.head_dim not in launch.ATTENTION_HEAD_DIMS or model.num_heads % shape.num_kv_heads:
            continue
        dims.add((shape.head_dim, shape.head_dim))
        groups.add(model.num_heads // shape.num_kv_heads)
    return tuple(sorted(dims)), tuple(sorted(groups))


def recipe_kernel_space(recipe) -> KernelSpace:
    """Only what the recipe launches. The drafter: its head dim and GQA ratio (model catalog), the
    recipe's block size (and the shorter blocks of its draft-length schedule), the drafter's
    activation dtype, an FP8 KV cache if the recipe uses one, and the target's logits dtype. The
    target's attention: its layers' head dims and GQA ratios, its activation dtype and sinks (gpt-oss),
    over a cache in the activation dtype: the TensorRT engines keep the target's K/V in the graph's
    dtype even when the recipe's (TensorRT-LLM) KV cache is FP8 (see builder/plan.py)."""
    from trtllm_dflash.catalog.gpus import resolve_gpu
    from trtllm_dflash.catalog.models import resolve_model

    model = resolve_model(recipe.model.name)
    drafter = model.drafter
    if drafter is None:
        raise DFlashError(f"the model catalog has no drafter shape for {recipe.model.name}", "pass --head-dim/--gqa-group/... instead of --recipe")
    if recipe.gpu == "cpu":
        raise DFlashError(f"recipe {recipe.model.name}/cpu runs on CPU and needs no kernels", "pick a GPU recipe (`dflash-trt recipes list`)")
    block = min(recipe.drafter.block_size, launch.MAX_BLOCK)
    blocks = {block} | {d + 1 for d in (recipe.drafter.draft_len_schedule or {}).values() if 0 < d and d + 1 < block}
    dtype = PRECISION_DTYPES.get(recipe.quantization.drafter, "bfloat16")  # FP8 drafter weights: BF16 activations
    logits = PRECISION_DTYPES.get(recipe.quantization.weights, "bfloat16")
    target_dims, target_groups = target_attention_shapes(model)
    return KernelSpace(
        arch=resolve_gpu(recipe.gpu).sm_arch,
        head_dims=(drafter.head_dim,),
        dtypes=(dtype,),
        blocks=tuple(sorted(blocks)),
        groups=(drafter.num_heads // drafter.num_kv_heads,),
        fp8_kv_cache=recipe.quantization.kv_cache == "fp8",
        logits_dtypes=tuple(dict.fromkeys(("float32", logits))),
        target_head_dims=target_dims,
        target_groups=target_groups,
        target_dtypes=(logits,),  # the target's activations: BF16 unless its weights are FP16/FP32
        target_sinks=(model.attention_sinks,),
    )


# ----------------------------------------------------------------------------- compilation


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
    source = ASTSource(fn, signature=dict(variant.signature), constexprs=dict(variant.constexprs))
    options = dict(ptx_version=arch.ptx_isa, num_warps=variant.num_warps, num_stages=variant.num_stages,
                   enable_fp_fusion=variant.enable_fp_fusion)
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


# ----------------------------------------------------------------------------- build + manifest


DEFAULT_CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trtllm-dflash" / "kernels"
CACHE_FORMAT = 1


@functools.cache
def source_digest(source: str) -> str:
    """sha256 of what a kernel's bytes are made from: its file, the jitted helpers it imports
    (rng.py) and this module (the compile options, PTX rewriting and ptxas flags)."""
    digest = hashlib.sha256()
    for path in (kernels._HERE / f"{source}.py", Path(rng.__file__), Path(__file__)):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_key(variant: KernelVariant, arch: Arch, triton_version: str) -> str:
    """The content address of one compiled kernel."""
    parts = {
        "format": CACHE_FORMAT, "source": source_digest(variant.source), "triton": triton_version,
        "arch": arch.name, "capability": arch.capability, "ptx_isa": arch.ptx_isa,
        "function": variant.function, "signature": variant.signature, "constexprs": variant.constexprs,
        "num_warps": variant.num_warps, "num_stages": variant.num_stages, "fp_fusion": variant.enable_fp_fusion,
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
            meta = {"name": kernel.name, "num_warps": kernel.num_warps, "shared": kernel.shared,
                    "triton_version": kernel.triton_version, "label": kernel.variant.label, "arch": kernel.arch.name}
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

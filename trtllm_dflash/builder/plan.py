"""What a build will do, where each stage can run, and how big its outputs will be.

Computed from the resolved spec and cheap probes of this machine (installed packages by their
metadata, a CUDA driver through ctypes), without importing torch or downloading anything, so
`dflash-trt build --dry-run` answers instantly on any machine.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib.util
import json
import os
from pathlib import Path

from trtllm_dflash.builder import catalog
from trtllm_dflash.builder.spec import BuildSpec, _local_shape

BYTES_PER_PARAM = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "nvfp4": 0.5625, "mxfp4": 0.5625}


@dataclasses.dataclass
class StagePlan:
    name: str
    action: str
    where: str
    runs_here: bool
    output: str


@dataclasses.dataclass
class Plan:
    spec: BuildSpec
    facts: list[tuple[str, str]]
    stages: list[StagePlan]
    notes: list[str]

    @property
    def runs_fully_here(self) -> bool:
        return all(s.runs_here for s in self.stages)

    def to_dict(self) -> dict:
        return {
            "recipe": self.spec.to_dict(),
            "facts": dict(self.facts),
            "stages": [dataclasses.asdict(s) for s in self.stages],
            "notes": self.notes,
        }


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def cuda_devices() -> int:
    """Number of CUDA devices the driver reports (0 without a driver), without importing torch."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        if cuda.cuInit(0) != 0:
            return 0
        count = ctypes.c_int(0)
        return count.value if cuda.cuDeviceGetCount(ctypes.byref(count)) == 0 else 0
    except OSError:
        return 0


def gb(value: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def _hf_cached(repo: str) -> bool:
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")), "hub")
    return Path(hub, "models--" + repo.replace("/", "--")).is_dir()


def _drafter_shape(spec: BuildSpec) -> tuple[float, int | None, int | None, int | None]:
    """(params, layers, kv_heads, head_dim) of the drafter, from its files when local."""
    path = _local_dir(spec.drafter)
    if path is not None and (path / "config.json").is_file():
        raw = json.loads((path / "config.json").read_text())
        params = 0
        for file in path.glob("*.safetensors"):
            with open(file, "rb") as handle:
                header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
            for name, info in header.items():
                if name != "__metadata__":
                    n = 1
                    for d in info["shape"]:
                        n *= d
                    params += n
        heads = raw.get("num_attention_heads", 1)
        return params, raw.get("num_hidden_layers"), raw.get("num_key_value_heads", heads), raw.get("head_dim")
    model = catalog.find_model(spec.model)
    return (model.drafter_params_b * 1e9 if model else 0.0), None, None, None


def _local_dir(name: str | None) -> Path | None:
    if not name:
        return None
    if name == "demo":
        return None  # see _demo_dir
    path = Path(name).expanduser()
    return path if path.is_dir() else None


def _demo_dir(role: str) -> Path | None:
    from trtllm_dflash.demo import DEMO_DIR

    path = DEMO_DIR / role
    return path if (path / "config.json").is_file() else None


def make_plan(spec: BuildSpec) -> Plan:
    target_local = _demo_dir("target") if spec.target == "demo" else _local_dir(spec.target)
    drafter_local = _demo_dir("drafter") if spec.drafter == "demo" else _local_dir(spec.drafter)
    shape = spec.shape or (_local_shape(target_local) if target_local else None)
    if drafter_local is not None:
        spec_for_drafter = dataclasses.replace(spec, drafter=str(drafter_local))
    else:
        spec_for_drafter = spec
    drafter_params, d_layers, d_kv, d_head = _drafter_shape(spec_for_drafter)
    gpus = cuda_devices()
    facts: list[tuple[str, str]] = []
    notes: list[str] = []

    facts.append(("model", f"{spec.model}: target {spec.target}, drafter {spec.drafter}"))
    facts.append(("GPU", f"{spec.num_gpus} x {spec.gpu.label} (SM {spec.gpu.cc_text}, {spec.gpu.memory_gib:g} GB)"))
    runtime = "TensorRT engines (trt runtime)" if spec.runtime == "trt" else "TensorRT-LLM PyTorch backend with native DFlash (trtllm runtime)"
    facts.append(("runtime", runtime))
    weights = f"target {spec.quant.upper()}" + (" (published MXFP4 MoE experts)" if spec.quant == "mxfp4" else "")
    facts.append(("precision", f"{weights}; drafter {spec.drafter_dtype.upper()}; KV cache {'FP8' if spec.kv_cache_dtype == 'fp8' else spec.compute_dtype.upper()}"))
    facts.append(("limits", f"max batch {spec.max_batch}, max input {spec.max_input_len}, max sequence {spec.max_seq_len}, block size {spec.block_size or 'from the drafter'}"))
    if spec.runtime == "trt":
        facts.append(("engine builder", f"{spec.trt_flavour} " + ("(ahead of time, no GPU needed)" if spec.trt_flavour == "tensorrt-rtx" else f"(on a {spec.gpu.name})")))
    else:
        facts.append(("parallelism", ", ".join(f"{k} {v}" for k, v in spec.trtllm) or f"{spec.num_gpus} GPUs"))

    params = shape.params_b * 1e9 if shape else 0.0
    checkpoint_bytes = shape.checkpoint_gb * 1e9 if shape else 0.0
    weight_bytes = params * BYTES_PER_PARAM.get(spec.quant, 2.0)
    if spec.quant == "mxfp4" and shape:
        weight_bytes = checkpoint_bytes
    if shape:
        kv_token = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * (1 if spec.kv_cache_dtype == "fp8" else 2)
        kv_total = kv_token * spec.max_batch * spec.max_seq_len
        per_gpu = (weight_bytes + kv_total) / spec.num_gpus
        facts.append(("memory per GPU", f"~{gb(weight_bytes / spec.num_gpus)} target weights + ~{gb(kv_total / spec.num_gpus)} KV cache at max batch x max sequence ({gb(kv_token)} per token) = ~{gb(per_gpu)} of {spec.gpu.memory_gib:g} GB"))
        if per_gpu > spec.gpu.memory_gib * 1e9 * 0.9:
            notes.append(f"does not fit: ~{gb(per_gpu)} per GPU exceeds 90% of {spec.gpu.memory_gib:g} GB; lower max_batch or max_seq_len")

    stages: list[StagePlan] = []
    if target_local is not None:
        where, here = "here (local files)", True
    elif spec.target == "demo":
        where, here = "missing: the embedded demo pair is not installed", False
    else:
        cached = _hf_cached(spec.target)
        where = "here (Hugging Face cache)" if cached else f"here; downloads {spec.target} ({gb(checkpoint_bytes)}) and {spec.drafter} first"
        here = True
    stages.append(StagePlan("checkpoints", "validate the pair, check and hash every safetensors file", where, here, f"digests only (reads {gb(checkpoint_bytes) if checkpoint_bytes else 'the checkpoint'})"))

    if spec.quant in ("fp32", "bf16", "fp16"):
        stages.append(StagePlan("quantize", f"nothing to do ({spec.quant.upper()} weights are cast at export)", "here", True, "none"))
    elif spec.quant == "mxfp4":
        stages.append(StagePlan("quantize", "nothing to do: TensorRT-LLM runs the published MXFP4 experts natively", "here", True, "none"))
    elif spec.quant == "fp8":
        where = "here (GPU)" if gpus else "here on CPU (ModelOpt FP8 PTQ works on CPU; a GPU is much faster for large models)"
        stages.append(StagePlan("quantize", f"ModelOpt FP8 PTQ on {spec.calibration.dataset} calibration text ({spec.calibration.num_samples} samples)" + (", FP8 KV cache" if spec.kv_cache_dtype == "fp8" else ""), where, has_module("modelopt"), f"~{gb(weight_bytes)} FP8 checkpoint"))
    else:
        here = gpus > 0 and has_module("modelopt")
        where = "here (GPU)" if here else "needs a CUDA GPU: ModelOpt's NVFP4 calibration runs CUDA kernels (the build stops before this stage here)"
        stages.append(StagePlan("quantize", f"ModelOpt NVFP4 PTQ on {spec.calibration.dataset} calibration text", where, here, f"~{gb(weight_bytes)} NVFP4 checkpoint"))

    if spec.runtime == "trtllm":
        stages.append(StagePlan("trtllm", "write llm_api.yaml (speculative_config: DFlash, parallelism, KV cache, CUDA graphs, MoE backend) and check it", "here", True, "a few KB"))
        notes.append("no TensorRT engines: TensorRT-LLM's PyTorch backend loads the checkpoints directly (its engine flow has no DFlash)")
    else:
        graph_bytes = (spec.compute_dtype == "fp32" and 4 or 2)
        target_graph = params * graph_bytes
        drafter_graph = drafter_params * graph_bytes + (2 * shape.vocab_size * shape.hidden_size * graph_bytes if shape else 0)
        variants = list(spec.graphs)
        export_ok = spec.quant not in ("fp8", "nvfp4")
        stages.append(StagePlan(
            "export", f"ONNX graphs ({', '.join(variants)}): target prefill/verify with KV-cache I/O + hidden taps; drafter block step",
            "here (CPU)" if export_ok else f"not yet: {spec.quant} Q/DQ export is not implemented (use --quant bf16, or runtime trtllm)",
            export_ok, f"~{gb((target_graph + drafter_graph) * len(variants))}",
        ))
        too_big = params > 3e9
        stages.append(StagePlan("validate", "evaluate the graphs with onnxruntime on CPU against the torch runtime (prefill, verify, draft, greedy decode)",
                                "skipped: target too large for a CPU check (the GPU gate checks the engines)" if too_big else "here (CPU)", True, "report.json"))
        if spec.trt_flavour == "tensorrt-rtx":
            here = has_module("tensorrt_rtx_bindings")
            where = "here (TensorRT-RTX builds ahead of time without a GPU)" if here else "needs TensorRT-RTX: pip install 'trtllm-dflash[rtx]'"
        else:
            here = has_module("tensorrt") and gpus > 0
            if not has_module("tensorrt"):
                where = f"needs full TensorRT and a {spec.gpu.name}: pip install 'trtllm-dflash[trt]' on the GPU machine (or NVIDIA's TensorRT container)"
            elif gpus == 0:
                where = f"needs a {spec.gpu.name} GPU (full TensorRT builds on the GPU it targets)"
            else:
                where = "here (GPU)"
        stages.append(StagePlan("engines", f"{spec.trt_flavour} engines for SM {spec.gpu.cc_text}: target (verify + prefill profiles), drafter", where, here, f"~{gb(target_graph + drafter_graph)} (native variant)"))
        if "plugin" in variants:
            notes.append("plugin graph variant: exported when the DFlash plugin nodes are installed; TensorRT-RTX engines are built from the native graphs only")

    from trtllm_dflash.builder.pipeline import repository_writer  # light: imports no torch

    has_repo = repository_writer() is not None
    stages.append(StagePlan("repository", "Triton model repository", "here" if has_repo else "not installed (serving part): `dflash-trt repo --build OUT` later", has_repo, "a few KB + links"))
    return Plan(spec, facts, stages, notes)


def render(plan: Plan, console) -> None:
    from rich.markup import escape

    console.print(f"[bold]Build plan[/] ({plan.spec.source})")
    for key, value in plan.facts:
        console.print(f"  [cyan]{key:15}[/] {escape(value)}")
    console.print("[bold]Stages[/]")
    for stage in plan.stages:
        if stage.name == "repository" and not stage.runs_here:
            mark = "[dim]-[/]"
        else:
            mark = "[green]✓[/]" if stage.runs_here else "[yellow]✗[/]"
        console.print(f"  {mark} [bold]{stage.name:12}[/] {escape(stage.action)}")
        console.print(f"    {'':12} where: {escape(stage.where)}; output: {escape(stage.output)}")
    for note in plan.notes:
        console.print(f"  [dim]note:[/] {escape(note)}")
    blocked = [s.name for s in plan.stages if not s.runs_here and s.name != "repository"]
    if blocked:
        console.print(f"  [yellow]on this machine the build stops before: {blocked[0]}[/]")

"""The build's stage plan: what a build will do on THIS machine, each stage, where it runs, its output size.

The deployment plan (memory per GPU, concurrency, refusals) is the planner's (`trtllm_dflash.
planning`, printed by `dflash-trt plan`); this adds the build's view: where each stage can run
(probing installed packages by metadata and the CUDA driver through ctypes, never importing
torch) and how big its outputs will be. Nothing is downloaded, so `--dry-run` is instant.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib.util
import os
from pathlib import Path

from trtllm_dflash.builder.feasibility import backend_of, export_support, repository_writer, validation_skip_reason
from trtllm_dflash.builder.spec import BuildSpec
from trtllm_dflash.contracts import dtypes


@dataclasses.dataclass
class StagePlan:
    name: str
    action: str
    where: str
    runs_here: bool
    output: str
    optional: bool = False  # a stage whose absence does not stop the build (the repository)
    downloads: bool = False  # runs here only after a download (checkpoints not on this machine): no check mark


@dataclasses.dataclass
class BuildPlan:
    spec: BuildSpec
    stages: list[StagePlan]
    notes: list[str]

    @property
    def stops_before(self) -> str | None:
        return next((s.name for s in self.stages if not s.runs_here and not s.optional), None)

    def to_dict(self) -> dict:
        return {
            "recipe": self.spec.to_dict(),
            "deployment": self.spec.plan.to_dict(),
            "stages": [dataclasses.asdict(s) for s in self.stages],
            "stops_before": self.stops_before,
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


def size(value: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def hf_cached(repo: str) -> bool:
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")), "hub")
    return Path(hub, "models--" + repo.replace("/", "--")).is_dir()


def hf_offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it (1, true, yes, on)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _checkpoint_where(spec: BuildSpec, params) -> tuple[str, bool, bool]:
    """(where, runs here, needs a download first) of the checkpoints stage."""
    missing = []
    for role, name in (("target", spec.target), ("drafter", spec.drafter)):
        if name == "demo":
            from trtllm_dflash.demo import DEMO_DIR

            if not (DEMO_DIR / role / "config.json").is_file():
                return "missing: the embedded demo pair is not installed in this trtllm-dflash", False, False
        elif not Path(name).expanduser().is_dir() and not hf_cached(name):
            missing.append((role, name))
    if not missing:
        return "here (local files)", True, False
    names = ", ".join(name for _, name in missing)
    how = "; ".join(f"`hf download {name} --local-dir DIR` and pass --{role} DIR" for role, name in missing)
    if hf_offline():
        return f"needs {names} downloaded: not available locally, and HF_HUB_OFFLINE is set; where there is a network, {how}", False, True
    model = spec.recipe.model_spec()
    total = size(model.published_checkpoint_gib * 1024**3) if model.published_checkpoint_gib else size(params.total * 2)
    return (
        (
            f"not available locally: the build downloads {names} from Hugging Face (target ~{total}) and fails "
            f"without a network; offline, {how}"
        ),
        True,
        True,
    )


def make_build_plan(spec: BuildSpec) -> BuildPlan:
    """Each stage the build's backend needs, with where it can run here and what it writes."""
    backend = backend_of(spec)
    deployment = spec.plan
    model = spec.recipe.model_spec()
    params = model.params()
    gpus = cuda_devices()
    stages: list[StagePlan] = []
    notes: list[str] = list(spec.notes)

    where, here, downloads = _checkpoint_where(spec, params)
    stages.append(
        StagePlan(
            "checkpoints",
            "validate the target/drafter pair; check and hash every safetensors file",
            where,
            here,
            "digests",
            downloads=downloads,
        )
    )

    weights = deployment.budget.target_weights * deployment.layout.tp
    samples = f"{spec.calibration.num_samples} samples of {spec.calibration.dataset} text"
    precision = spec.precision
    drafter_too = "; the drafter in NVFP4 (fc kept BF16)" if precision.quantizes_drafter else ""
    nvfp4_here = gpus > 0 and has_module("modelopt")
    nvfp4_where = (
        "here (CUDA GPU)"
        if nvfp4_here
        else ("needs a CUDA GPU: ModelOpt computes NVFP4 scales with CUDA kernels (an H100/H200 emulates NVFP4; Blackwell serves it)")
    )
    if not precision.needs_modelopt:
        stages.append(StagePlan("quantize", f"nothing to do ({backend.unquantized_note(precision.weights)})", "here", True, "none"))
    elif precision.converts_experts:
        stages.append(
            StagePlan(
                "quantize",
                "cast the published MXFP4 experts to NVFP4 with ModelOpt (weights exact where the block scales fit "
                f"E4M3 under one tensor scale, else the error is reported; activation scales calibrated on {samples}){drafter_too}",
                nvfp4_where,
                nvfp4_here,
                f"~{size(weights)} NVFP4 checkpoint",
            )
        )
    elif precision.nvfp4_target or (not precision.quantized and precision.quantizes_drafter):
        what = "ModelOpt NVFP4 PTQ (weights, activation scales" + (", FP8 KV-cache scales" if precision.fp8_kv_cache else "")
        action = (
            f"{what}; {samples}){drafter_too}" if precision.quantized else f"ModelOpt NVFP4 PTQ of the drafter, fc kept BF16 ({samples})"
        )
        stages.append(
            StagePlan(
                "quantize",
                action,
                nvfp4_where,
                nvfp4_here,
                f"~{size(weights)} NVFP4 checkpoint" if precision.quantized else "NVFP4 drafter",
            )
        )
    elif precision.quantizes_drafter:  # FP8 target (calibrates anywhere) with an NVFP4 drafter (needs CUDA)
        stages.append(
            StagePlan(
                "quantize",
                f"ModelOpt FP8 PTQ of the target and NVFP4 PTQ of the drafter, fc kept BF16 ({samples})",
                nvfp4_where,
                nvfp4_here,
                f"~{size(weights)} FP8 checkpoint",
            )
        )
    else:
        where = "here (GPU)" if gpus else "here on CPU (ModelOpt FP8 PTQ runs on CPU; a GPU is much faster for large models)"
        kv = ", FP8 KV-cache scales" if precision.fp8_kv_cache else ""
        stages.append(
            StagePlan(
                "quantize",
                f"ModelOpt FP8 PTQ ({spec.calibration.num_samples} samples of {spec.calibration.dataset} text{kv})",
                where,
                has_module("modelopt"),
                f"~{size(weights)} FP8 checkpoint",
            )
        )

    for name in backend.build_stages:
        STAGE_PLANNERS[name](spec, stages, notes, gpus)
    writer = repository_writer()
    stages.append(
        StagePlan(
            "repository",
            "Triton model repository (Python backend over the engines, or the tensorrt_llm model)",
            "here" if writer else "not installed (serving part of the toolkit)",
            writer is not None,
            "a few KB",
            optional=True,
        )
    )
    return BuildPlan(spec, stages, notes)


def _plan_trtllm(spec: BuildSpec, stages: list[StagePlan], notes: list[str], gpus: int) -> None:
    from trtllm_dflash.backends.trtllm.llm_args_check import pinned_source

    local = spec.drafter if Path(spec.drafter).expanduser().is_dir() else None
    _, option_notes = backend_of(spec).checked_options(spec.recipe, local)
    notes.extend(option_notes)
    notes.append(f"TensorRT-LLM options checked against the llm_args of {pinned_source()}")
    stages.append(
        StagePlan(
            "trtllm",
            "write llm_api.yaml (DFlash speculative_config, parallel layout, KV cache, CUDA graphs, MoE backend) and check every key",
            "here",
            True,
            "a few KB",
        )
    )
    notes.append("no TensorRT engines: TensorRT-LLM's PyTorch backend runs the checkpoints (its engine flow has no DFlash)")


def _graph_bytes(spec: BuildSpec) -> tuple[float, float]:
    """Bytes of the target's and the drafter's graphs (one variant)."""
    model = spec.recipe.model_spec()
    params = model.params()
    graph_bytes = dtypes.bytes_per_element(spec.precision.compute_dtype)
    weights = spec.plan.budget.target_weights * spec.plan.layout.tp
    target_graph = weights if spec.precision.quantized else params.total * graph_bytes
    drafter_params = model.drafter.num_params() if model.drafter else 0
    return target_graph, (drafter_params + params.embedding + params.lm_head) * graph_bytes


def _plan_export(spec: BuildSpec, stages: list[StagePlan], notes: list[str], gpus: int) -> None:
    model = spec.recipe.model_spec()
    variants = list(spec.graphs)
    blocked = export_support(spec)
    stages.append(
        StagePlan(
            "export",
            f"ONNX graphs ({', '.join(variants)}): target prefill/verify with KV-cache I/O and hidden taps "
            f"{list(model.drafter.target_layer_ids) if model.drafter else []}; drafter block step",
            "here (CPU)" if blocked is None else f"not supported: {blocked}",
            blocked is None,
            f"~{size(sum(_graph_bytes(spec)) * len(variants))}",
        )
    )
    notes.append(variants_note(spec))


def variants_note(spec: BuildSpec) -> str:
    """Which graph variants the export writes and why (the plugin variant's export is the long one),
    with the option that chooses the native graphs only."""
    if "plugin" not in spec.graphs:
        return "export: the native graphs only (trt.use_plugins: false)"
    why = (
        "no recipe names this model, so the build takes the default trt.use_plugins: true"
        if spec.recipe.path is None
        else f"recipe {spec.recipe.name} sets trt.use_plugins: true"
    )
    unused = spec.trt_flavour == "tensorrt-rtx"  # its builder aborts on the plugins: engines from the native graphs only
    return (
        f"export: the native and the plugin graphs, because {why}; the plugin graphs carry the DFlash plugin nodes "
        "for full-TensorRT engines, and their export can take many minutes on CPU. "
        f"For the native graphs only, pass --native-only{' (TensorRT-RTX builds no engine from the plugin graphs)' if unused else ''}"
    )


def _plan_validate(spec: BuildSpec, stages: list[StagePlan], notes: list[str], gpus: int) -> None:
    stages.append(
        StagePlan(
            "validate",
            "evaluate the graphs with onnxruntime on CPU against the torch runtime (prefill, verify, draft, greedy decode)",
            "recorded as skipped: target too large for a CPU check (the GPU gate in docs/build.md checks the engines)"
            if validation_skip_reason(spec)
            else "here (CPU)",
            True,
            "report.json",
        )
    )


def _plan_engines(spec: BuildSpec, stages: list[StagePlan], notes: list[str], gpus: int) -> None:
    flavour = spec.trt_flavour
    if flavour == "tensorrt-rtx":
        here = has_module("tensorrt_rtx_bindings")
        where = (
            "here (TensorRT-RTX builds ahead of time, no GPU needed)" if here else "needs TensorRT-RTX: pip install 'trtllm-dflash[rtx]'"
        )
    else:
        here = has_module("tensorrt") and gpus > 0
        if not has_module("tensorrt"):
            where = (
                f"needs full TensorRT and a {spec.gpu.name}: pip install 'trtllm-dflash[trt]' on the GPU machine, "
                "or NVIDIA's TensorRT container"
            )
        elif gpus == 0:
            where = f"needs a {spec.gpu.name} (full TensorRT builds on the GPU it targets)"
        else:
            where = "here (GPU)"
    stages.append(
        StagePlan(
            "engines",
            f"{flavour} engines for SM {spec.gpu.compute_capability_str}: target (verify + prefill profiles) and drafter, "
            f"batch <= {spec.max_batch}, sequence <= {spec.max_seq_len}",
            where,
            here,
            f"~{size(sum(_graph_bytes(spec)))} per variant",
        )
    )
    if "plugin" in spec.graphs:
        from trtllm_dflash.builder.plugin_graphs import engine_support

        reason = engine_support("plugin", flavour)
        engines_note = "engines from them too" if reason is None else f"engines from the native graphs only ({reason})"
        notes.append(f"plugin graphs: the drafter with the DFlash block-attention plugin node, checked on CPU; {engines_note}")
    if spec.precision.fp8_kv_cache:
        notes.append("FP8 KV cache: the engines keep K/V in the graph's dtype (the FP8 KV cache is implemented for the trtllm backend)")


# how each backend-specific stage is planned (the backend says which stages it needs)
STAGE_PLANNERS = {"export": _plan_export, "validate": _plan_validate, "engines": _plan_engines, "trtllm": _plan_trtllm}

"""What this machine has, and which build stages it can run.

Fast by default: versions come from package metadata and file lookups, nothing heavy is
imported (torch, TensorRT, TensorRT-LLM take seconds to import). `deep=True` imports them to
confirm they load and asks torch whether CUDA works.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import platform
import runpy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterable

from trtllm_dflash.catalog.gpus import LocalGPUs, detect_local_gpus


@dataclasses.dataclass(frozen=True)
class Component:
    """One piece of the toolchain."""

    key: str  # capability name that build steps list in `needs`
    name: str
    found: bool
    version: str | None
    detail: str  # where it is, or how to get it


@dataclasses.dataclass(frozen=True)
class StageStatus:
    name: str
    description: str
    needs: tuple[str, ...]
    can_run: bool
    missing: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class DoctorReport:
    python: str
    platform: str
    gpus: LocalGPUs
    components: tuple[Component, ...]
    stages: tuple[StageStatus, ...]

    @property
    def capabilities(self) -> dict[str, bool]:
        return {c.key: c.found for c in self.components}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# What each `needs` token means, and how to get it when it is missing.
HOW_TO_GET = {
    "cuda-gpu": "an NVIDIA GPU with its driver (this step cannot run on a CPU-only machine)",
    "nvfp4-gpu": "a Blackwell GPU (SM >= 10.0: B200, B300, GB200, GB300, RTX PRO 6000) with its driver",
    "torch": "pip install 'trtllm-dflash' (torch; CPU build on machines without CUDA)",
    "transformers": "pip install transformers",
    "onnx": "pip install 'trtllm-dflash[export]'",
    "modelopt": "pip install 'trtllm-dflash[quant]' (nvidia-modelopt)",
    "triton": "pip install 'trtllm-dflash[kernels]' (triton)",
    "tensorrt": "pip install 'trtllm-dflash[trt]' on a GPU machine (downloads from NVIDIA's index), or NVIDIA's TensorRT container",
    "tensorrt-rtx": "pip install 'trtllm-dflash[rtx]' (tensorrt-rtx-cu13-libs, tensorrt-rtx-cu13-bindings)",
    "tensorrt-llm": "pip install 'trtllm-dflash[trtllm]' on a GPU machine, or NVIDIA's TensorRT-LLM container",
    "tritonserver": (
        "NVIDIA's Triton container (/opt/tritonserver), or pip install 'trtllm-dflash[serve]' (nvidia-pytriton bundles tritonserver)"
    ),
    "tritonclient": "pip install 'trtllm-dflash[serve]'",
}

# Stages of `dflash-trt build` / serving and what they need (the planner's BuildStep.needs use the same tokens).
STAGES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("plan", "memory plan and refusals (dflash-trt plan, build --dry-run)", ()),
    ("checkpoints", "load and validate target + drafter checkpoints", ("torch", "transformers")),
    ("quantize-fp8", "ModelOpt FP8 PTQ (runs on CPU)", ("modelopt", "torch")),
    (
        "quantize-nvfp4",
        "ModelOpt NVFP4 calibration (any CUDA GPU: Hopper emulates NVFP4; serving it needs SM >= 10.0)",
        ("modelopt", "torch", "cuda-gpu"),
    ),
    ("export", "ONNX export of target and drafter graphs", ("torch", "onnx")),
    ("plugins", "ahead-of-time compile of the DFlash Triton kernels (no GPU needed)", ("triton",)),
    ("engines-tensorrt-rtx", "TensorRT-RTX engines, built ahead of time for RTX GPUs (no GPU needed)", ("tensorrt-rtx",)),
    ("engines-tensorrt", "full TensorRT engines for Hopper/Blackwell (needs the GPU)", ("tensorrt", "cuda-gpu")),
    ("trtllm-config", "write and validate TensorRT-LLM LLM-API options", ()),
    ("trtllm-run", "run the trtllm backend (TensorRT-LLM PyTorch backend)", ("tensorrt-llm", "cuda-gpu")),
    ("repository", "write the Triton model repository", ()),
    ("serve", "start tritonserver on the repository", ("tritonserver", "tritonclient")),
)


def _version(*distributions: str) -> str | None:
    for dist in distributions:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _python_package(key: str, name: str, module: str, dists: tuple[str, ...], deep: bool) -> Component:
    found, version = _module(module), _version(*dists)
    detail = f"import {module}" if found else HOW_TO_GET[key]
    if found and deep:
        try:
            imported = __import__(module)
            version = getattr(imported, "__version__", version) or version
        except Exception as exc:  # noqa: BLE001 - a placeholder or broken install, reported as such
            return Component(key, name, False, version, f"installed but `import {module}` fails: {exc}")
    return Component(key, name, found, version, detail)


def _torch(deep: bool) -> Component:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return Component("torch", "PyTorch", False, None, HOW_TO_GET["torch"])
    version = _version("torch")
    cuda = None
    version_file = Path(list(spec.submodule_search_locations)[0]) / "version.py"
    if version_file.is_file():  # plain assignments: read without importing torch (seconds)
        try:
            cuda = runpy.run_path(str(version_file)).get("cuda")
        except Exception:  # noqa: BLE001 - an unreadable version file: the CUDA version is unknown
            cuda = None
    detail = f"CUDA {cuda} build" if cuda else "CPU-only build"
    if deep:
        import torch

        detail += f"; torch.cuda.is_available() = {torch.cuda.is_available()}"
    return Component("torch", "PyTorch", True, version, detail)


def _tritonserver() -> Component:
    candidates = []
    on_path = shutil.which("tritonserver")
    if on_path:
        candidates.append((Path(on_path), "on PATH"))
    candidates.append((Path("/opt/tritonserver/bin/tritonserver"), "NVIDIA Triton container"))
    spec = importlib.util.find_spec("pytriton")
    if spec is not None and spec.submodule_search_locations:
        bundled = Path(list(spec.submodule_search_locations)[0]) / "tritonserver" / "bin" / "tritonserver"
        candidates.append((bundled, f"bundled with nvidia-pytriton {_version('nvidia-pytriton') or ''}".strip()))
    for path, where in candidates:
        if path.is_file():
            version = None
            version_file = path.parent.parent / "TRITON_VERSION"
            if version_file.is_file():
                version = version_file.read_text().strip()
            elif "pytriton" in where:
                version = "2.51.0 (nvidia-pytriton 0.7 bundle)" if _version("nvidia-pytriton") == "0.7.0" else None
            return Component("tritonserver", "Triton Inference Server", True, version, f"{path} ({where})")
    return Component("tritonserver", "Triton Inference Server", False, None, HOW_TO_GET["tritonserver"])


def _nvcc() -> Component:
    path = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file() else None)
    if path is None:
        return Component("nvcc", "CUDA compiler (nvcc)", False, None, "CUDA toolkit (only needed for C++ plugins)")
    version = None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
        version = next((line.split("release")[-1].split(",")[0].strip() for line in out.splitlines() if "release" in line), None)
    except (OSError, subprocess.SubprocessError):
        pass
    return Component("nvcc", "CUDA compiler (nvcc)", True, version, path)


def _gpu_component(gpus: LocalGPUs) -> Component:
    if not gpus.gpus:
        return Component("cuda-gpu", "NVIDIA GPU", False, None, str(gpus.reason))
    names = ", ".join(
        f"{g.index}: {g.name} (SM {g.compute_capability[0]}.{g.compute_capability[1]}, {g.memory_bytes / 1024**3:.0f} GiB"
        + (f", catalog {g.catalog.name})" if g.catalog else ", not in the catalog)")
        for g in gpus.gpus
    )
    return Component("cuda-gpu", "NVIDIA GPU", True, f"driver {gpus.driver_version}", names)


def _nvfp4_component(gpus: LocalGPUs) -> Component:
    capable = [g for g in gpus.gpus if g.compute_capability >= (10, 0)]
    if capable:
        return Component("nvfp4-gpu", "GPU with NVFP4 (SM >= 10.0)", True, None, ", ".join(g.name for g in capable))
    return Component("nvfp4-gpu", "GPU with NVFP4 (SM >= 10.0)", False, None, HOW_TO_GET["nvfp4-gpu"])


def collect(deep: bool = False) -> DoctorReport:
    """Inspect the machine (fast unless deep=True)."""
    gpus = detect_local_gpus()
    components = (
        _gpu_component(gpus),
        _nvfp4_component(gpus),
        _torch(deep),
        _python_package("transformers", "transformers", "transformers", ("transformers",), deep),
        _python_package("onnx", "ONNX (onnx + onnxscript)", "onnxscript", ("onnx",), deep),
        _python_package("modelopt", "NVIDIA ModelOpt", "modelopt", ("nvidia-modelopt",), deep),
        _python_package("triton", "Triton (kernel language)", "triton", ("triton",), deep),
        _python_package("tensorrt", "TensorRT (full)", "tensorrt", ("tensorrt", "tensorrt-cu13", "tensorrt-cu12"), deep),
        _python_package(
            "tensorrt-rtx",
            "TensorRT-RTX",
            "tensorrt_rtx_bindings",
            ("tensorrt-rtx-cu13-bindings", "tensorrt-rtx-cu12-bindings", "tensorrt-rtx"),
            deep,
        ),
        _python_package("tensorrt-llm", "TensorRT-LLM", "tensorrt_llm", ("tensorrt-llm", "tensorrt_llm"), deep),
        _tritonserver(),
        _python_package("tritonclient", "Triton client", "tritonclient", ("tritonclient",), deep),
        _nvcc(),
    )
    have = {c.key: c.found for c in components}
    stages = tuple(stage_status(name, description, needs, have) for name, description, needs in STAGES)
    return DoctorReport(sys.version.split()[0], platform.platform(), gpus, components, stages)


def stage_status(name: str, description: str, needs: Iterable[str], have: dict[str, bool]) -> StageStatus:
    needs = tuple(needs)
    missing = tuple(n for n in needs if not have.get(n, False))
    return StageStatus(name, description, needs, not missing, missing)

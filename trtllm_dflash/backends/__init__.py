"""Deployment backends behind one interface (base.py); `get_backend` is the only place that picks one by name.

    base.py     Backend (families served, build stages, Triton repository, opening a pipeline), PipelineSource
    torch.py    the checkpoints on the torch runtime (no build)
    trt.py      this toolkit's TensorRT engines (ONNX graphs on CPU)
    trtllm.py   TensorRT-LLM's native DFlash mode (its LLM-API Triton model)

A recipe's `backend:` (spelled `runtime:` before) and `--backend` (`--runtime`) name one of these.
"""

from __future__ import annotations

from pathlib import Path

from trtllm_dflash.backends.base import Backend, PipelineSource
from trtllm_dflash.backends.torch import TorchBackend
from trtllm_dflash.backends.trt import TrtBackend
from trtllm_dflash.backends.trtllm import TrtllmBackend
from trtllm_dflash.errors import UnknownNameError

BACKENDS: dict[str, Backend] = {b.name: b for b in (TrtBackend(), TrtllmBackend(), TorchBackend())}
BACKEND_NAMES = tuple(BACKENDS)


def get_backend(name: str) -> Backend:
    """The backend called `name` (trt, trtllm or torch)."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise UnknownNameError(f"unknown backend {name!r}", f"use {', '.join(BACKEND_NAMES[:-1])} or {BACKEND_NAMES[-1]}") from None


def multi_gpu_backend() -> str:
    """The backend that spreads a model over several GPUs (what `plan` proposes when one GPU is too few)."""
    return next(name for name, backend in BACKENDS.items() if backend.multi_gpu)


def backend_of_build(manifest: dict) -> Backend:
    """The backend a build was made for: the one whose own stage finished, else the one its recipe names."""
    stages = manifest.get("stages") or {}
    for backend in BACKENDS.values():
        if any((stages.get(name) or {}).get("status") == "complete" for name in backend.build_stages):
            return backend
    recipe = manifest.get("recipe") or {}
    name = recipe.get("backend") or recipe.get("runtime")
    return BACKENDS.get(name, BACKENDS[TrtBackend.name])


def write_build_repository(build_dir: str | Path, out: str | Path | None = None, force: bool = False) -> Path:
    """The Triton repository of a `dflash-trt build` (BUILD/repository by default), written by the build's backend."""
    from trtllm_dflash.serving.repository import read_build

    build_dir = Path(build_dir).expanduser().resolve()
    out = Path(out) if out is not None else build_dir / "repository"
    manifest = read_build(build_dir)
    return backend_of_build(manifest).write_build_repository(build_dir, manifest, out, force)


__all__ = ["BACKENDS", "BACKEND_NAMES", "Backend", "PipelineSource", "backend_of_build", "get_backend", "multi_gpu_backend", "write_build_repository"]

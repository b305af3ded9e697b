"""Deployment backends behind one interface (base.py); `get_backend` is the only place that picks one by name.

    base.py          Backend (families served, build stages, Triton repository, opening a pipeline), PipelineSource
    torch.py         the checkpoints on the torch runtime (no build)
    trt.py           this toolkit's TensorRT engines (ONNX graphs on CPU)
    trtllm/          TensorRT-LLM's native DFlash mode (its LLM-API options, drafters and Triton repository)
    triton_model.py  the Triton Python-backend model the trt and torch repositories run: it opens the
                     pipeline (open_served_pipeline) and hands it to serving's BatchingLoop
    artifact.py      BuildArtifact: what a build hands to its repository (manifest.json's `artifact`)

A recipe's `backend:` and `--backend` name one of these.
Backends may use serving's repository helpers and batching loop; serving never imports backends.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_dflash.backends.artifact import BuildArtifact, artifact_of, read_manifest
from trtllm_dflash.backends.base import Backend, PipelineSource
from trtllm_dflash.backends.torch import TorchBackend
from trtllm_dflash.backends.trt import TrtBackend
from trtllm_dflash.backends.trtllm.backend import TrtllmBackend
from trtllm_dflash.errors import DFlashError, UnknownNameError

if TYPE_CHECKING:
    from trtllm_dflash.api import DFlashPipeline
    from trtllm_dflash.served_model.model_parameters import ServingConfig

BACKENDS: dict[str, Backend] = {b.name: b for b in (TrtBackend(), TrtllmBackend(), TorchBackend())}
BACKEND_NAMES = tuple(BACKENDS)


def get_backend(name: str) -> Backend:
    """The backend called `name` (trt, trtllm or torch)."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise UnknownNameError(f"unknown backend {name!r}", f"use {', '.join(BACKEND_NAMES[:-1])} or {BACKEND_NAMES[-1]}") from None


def open_served_pipeline(config: ServingConfig) -> DFlashPipeline:
    """The pipeline a served model's config.pbtxt parameters name, opened by their backend: torch
    here; TensorRT engines on a GPU (loaded lazily). The Triton model hands it to serving's BatchingLoop."""
    import torch

    from trtllm_dflash.runtime.threads import set_threads

    set_threads(config.num_threads)  # 0: the cores not busy when the model loads
    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    source = PipelineSource(
        config.target,
        config.drafter,
        build=config.engines,
        speculative=config.speculative,
        cuda_graphs=config.cuda_graphs,
        attention_choice=config.attention_choice,
        verify_choice=config.verify_choice,
        linear_choice=config.linear_choice,
        dependent_launch=config.dependent_launch,
    )
    return get_backend(config.backend).open_pipeline(source, device=device, max_context=config.max_context)


def multi_gpu_backend() -> str:
    """The backend that spreads a model over several GPUs (what `plan` proposes when one GPU is too few)."""
    return next(name for name, backend in BACKENDS.items() if backend.multi_gpu)


# a planned stage in one of these states stopped cleanly: blocked on this machine (no GPU, no TensorRT)
# and what needs it; the build says so and its repository serves the torch runtime meanwhile
SETTLED = ("complete", "blocked", "not run")


def unfinished_stages(manifest: dict) -> list[tuple[str, str]]:
    """(stage, status) of every planned stage a build did not settle: `running` (killed, or still
    going), `failed`, `pending` (never reached) or `missing` from the manifest."""
    stages = manifest.get("stages") or {}
    unfinished = []
    for name in manifest.get("planned") or []:
        status = (stages.get(name) or {}).get("status", "missing")
        if status not in SETTLED:
            unfinished.append((name, status))
    return unfinished


def build_in_progress(build_dir: Path) -> bool:
    """Whether a `dflash-trt build` holds the build's lock now (its `running` stage is really running)."""
    import fcntl

    lock = build_dir / ".build.lock"
    if not lock.is_file():
        return False
    with open(lock, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def check_build_finished(build_dir: Path, manifest: dict) -> None:
    """Refuse, in one line, a build whose planned stages did not all finish or stop cleanly."""
    unfinished = unfinished_stages(manifest)
    if not unfinished:
        return
    listed = ", ".join(f"{name} ({status})" for name, status in unfinished)
    if build_in_progress(build_dir):
        raise DFlashError(f"the build in {build_dir} is still running ({listed})", "wait for it to finish, then rerun this command")
    command = manifest.get("command")
    rerun = f"`{command}`" if command else f"the same `dflash-trt build ... --out {build_dir}` command"
    raise DFlashError(
        f"the build in {build_dir} is unfinished: {listed} (killed or failed)",
        f"rerun {rerun} (finished stages are skipped), then this command",
    )


def read_build_artifact(build_dir: str | Path) -> BuildArtifact:
    """The artifact of a finished `dflash-trt build` (`repo --build`).

    An unfinished build (a stage killed, failed or never reached) is refused: its repository would
    silently serve less than the build promised (the torch runtime instead of missing engines)."""
    build_dir = Path(build_dir).expanduser().resolve()
    manifest = read_manifest(build_dir)
    check_build_finished(build_dir, manifest)
    return artifact_of(build_dir, manifest)


def write_build_repository(artifact: BuildArtifact, out: str | Path, force: bool = False) -> Path:
    """The Triton repository of a build, written by the backend it was made for."""
    return get_backend(artifact.backend).write_build_repository(artifact, Path(out), force)


__all__ = [
    "BACKENDS",
    "BACKEND_NAMES",
    "Backend",
    "BuildArtifact",
    "PipelineSource",
    "check_build_finished",
    "get_backend",
    "multi_gpu_backend",
    "open_served_pipeline",
    "read_build_artifact",
    "unfinished_stages",
    "write_build_repository",
]

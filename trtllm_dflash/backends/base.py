"""What a deployment backend is: the one interface `plan`, `build`, `repo`, `serve`, `generate` and `bench` use.

A backend is what a build produces and what serves it (`trt`: this toolkit's TensorRT engines;
`trtllm`: TensorRT-LLM's own DFlash mode; `torch`: the checkpoints on the torch runtime). It says
which target families it serves (and why not), which build stages it needs, how it writes its
Triton repository and how it opens a pipeline. The `Runtime` executors (torch / onnx / trt, in
trtllm_dflash/runtime/) are a different thing: how the decoding loop runs one forward pass.
Nothing here imports torch at module level, so planning stays instant.
"""

from __future__ import annotations

import abc
import dataclasses
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_dflash.catalog.families import FamilySpec, Support
from trtllm_dflash.errors import DFlashError

if TYPE_CHECKING:
    from trtllm_dflash.api import DFlashPipeline
    from trtllm_dflash.backends.artifact import BuildArtifact

# build stages every backend runs, around its own (`Backend.build_stages`)
FIRST_STAGES = ("checkpoints", "quantize")
LAST_STAGE = "repository"


@dataclasses.dataclass(frozen=True)
class BuildStep:
    """One stage `dflash-trt build` runs; `needs` lists what must be present (doctor checks them)."""

    name: str
    description: str
    needs: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class PipelineSource:
    """Where a pipeline's weights come from: checkpoints (`target`, `drafter`) or a build directory."""

    target: str | Path | None = None
    drafter: str | Path | None = None
    build: str | Path | None = None  # a `dflash-trt build` --out directory, or its engines/ folder
    speculative: bool = True  # False: the target alone (the autoregressive baseline)
    onnx: bool = False  # a build's ONNX graphs on CPU (onnxruntime) instead of its engines
    # how the torch backend runs checkpoints (TorchRuntime's options; the engine backends have their own)
    cuda_graphs: bool | None = None  # None: wherever the runtime can replay its passes (on a GPU)
    attention_choice: str = "dflash"  # the target attention's kernel in decode passes (runtime/attention_choice.py)
    verify_choice: str = "positions"  # the kernels verifying sampled steps (runtime/verify_choice.py)
    linear_choice: str = "torch"  # the kernels of the decode passes' projections (runtime/linear_choice.py)
    dependent_launch: bool = False  # a decoding step's Triton kernels as programmatic dependent launches (ops/kernels/dependent_launch.py)


class Backend(abc.ABC):
    """One deployment backend; `trtllm_dflash.backends.get_backend(name)` is the only way to get one."""

    name: str
    title: str  # what it is, for messages
    multi_gpu: bool = False  # whether it spreads a model over several GPUs (tensor / expert parallelism)
    needs_build: bool = True  # False: it serves the checkpoints as they are
    runs_on_cpu: bool = False  # whether it decodes without a GPU
    default_kv_fraction: float | None = None  # share of free memory for KV caches, where it differs from the planner's
    build_stages: tuple[str, ...] = ()  # the stages between quantize and repository
    repository_title = "the Triton model repository"  # what `dflash-trt repo` says it wrote

    def support(self, family: FamilySpec) -> Support:
        """Whether it serves this target family, and why (the catalog's column for this backend)."""
        return family.support(self.name)

    def stage_names(self) -> tuple[str, ...]:
        """Every stage of its build, in order."""
        return FIRST_STAGES + self.build_stages + (LAST_STAGE,)

    def unquantized_note(self, weights: str) -> str:
        """What happens to 16-bit weights when the quantize stage has nothing to do."""
        return f"{weights} weights are used as published"

    def uses_cuda_graphs(self, recipe: Any) -> bool:
        """Whether the deployment captures CUDA graphs (they take memory in the plan)."""
        return False

    def drafter_refusal(self, kind: str, drafter: str) -> tuple[str, str] | None:
        """(problem, fix) when this backend cannot decode the drafter `drafter` of kind `kind` (a
        trtllm_dflash.drafters name), else None."""
        return None

    def serve_hint(self, repository: Path) -> str:
        """How to serve the repository it writes."""
        return f"serve it with `dflash-trt serve {shlex.quote(str(repository))}`"

    @abc.abstractmethod
    def plan_steps(self, cfg: Any) -> list[BuildStep]:
        """The build steps after the checkpoints for a planned deployment (`dflash-trt plan`):
        `cfg` is a trtllm_dflash.planning.candidate.Candidate, the result BuildSteps."""

    def write_build_repository(self, artifact: BuildArtifact, out: Path, force: bool = False) -> Path:
        """The Triton repository of a build (`dflash-trt repo --build`, the build's repository stage):
        Python-backend models over our runtimes (the engines when built, else the checkpoints on torch),
        unless the backend serves with something else."""
        from trtllm_dflash.served_model.model_parameters import serving_configs
        from trtllm_dflash.served_model.repository import write_repository

        models = serving_configs(artifact.serving_source())
        return write_repository(out, models, source={"build": artifact.build_dir}, force=force)

    def write_recipe_repository(
        self, out: Path, recipe: Any, drafter_dir: str | None = None, force: bool = False
    ) -> tuple[Path, list[str]]:
        """The Triton repository of a recipe, where no build is needed first; returns (repository, notes)."""
        raise DFlashError(
            f"recipe {recipe.name} serves {self.title}, which must be built first",
            f"run `dflash-trt build --recipe {recipe.name} --out BUILD` on a GPU machine, then `dflash-trt repo --build BUILD --out {out}`",
        )

    @abc.abstractmethod
    def open_pipeline(self, source: PipelineSource, device: str = "cpu", max_context: int | None = None) -> DFlashPipeline:
        """A DFlashPipeline over this backend's artifacts (what `generate`, the Triton model and `bench` decode with)."""


# shared by the plan_steps of the backends that quantize (trt, trtllm); what they quantize is the candidate's
# precision (trtllm_dflash.recipes.precision.Precision, a layer above: read, never imported here)


def quantize_samples(cfg: Any) -> str:
    """The calibration text of the quantize step, for its description."""
    calibration = cfg.recipe.quantization.calibration if cfg.recipe is not None else None
    return f"{calibration.num_samples} samples of {calibration.dataset}" if calibration else "builtin calibration text"


def quantize_needs(quantized: set[str]) -> tuple[str, ...]:
    """What the quantize step needs (NVFP4 calibration also needs a CUDA GPU; Hopper runs ModelOpt's emulation)."""
    return ("modelopt", "torch", "cuda-gpu") if "nvfp4" in quantized else ("modelopt", "torch")

"""The `torch` backend: the checkpoints themselves, on the torch runtime (the reference; the CPU default).

Nothing is built: the Triton repository's Python-backend models load the target and the drafter
with transformers when the server starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_dflash.backends.base import Backend, BuildStep, PipelineSource
from trtllm_dflash.errors import DFlashError

if TYPE_CHECKING:
    from trtllm_dflash.api import DFlashPipeline


class TorchBackend(Backend):
    name = "torch"
    title = "the checkpoints on the torch runtime"
    needs_build = False
    runs_on_cpu = True

    def plan_steps(self, cfg: Any) -> list[BuildStep]:
        return [BuildStep("repository", "write the Triton model repository (Python backend, torch runtime, decoupled)")]

    def write_recipe_repository(
        self, out: Path, recipe: Any, drafter_dir: str | None = None, force: bool = False
    ) -> tuple[Path, list[str]]:
        raise DFlashError(
            f"recipe {recipe.name} serves its checkpoints directly", "write it with `dflash-trt repo --recipe` (the Python-backend models)"
        )

    def open_pipeline(self, source: PipelineSource, device: str = "cpu", max_context: int | None = None) -> DFlashPipeline:
        from trtllm_dflash.api import DFlashPipeline

        if source.target is None:
            raise DFlashError("the torch backend runs checkpoints, and no target was named", "pass --target DIR (or demo)")
        drafter = source.drafter if source.speculative else None
        return DFlashPipeline.load(
            source.target,
            drafter,
            device=device,
            max_context=max_context,
            cuda_graphs=source.cuda_graphs,
            attention_choice=source.attention_choice,
            verify_choice=source.verify_choice,
            linear_choice=source.linear_choice,
            dependent_launch=source.dependent_launch,
        )

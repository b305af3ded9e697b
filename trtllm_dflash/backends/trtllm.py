"""The `trtllm` backend: TensorRT-LLM's PyTorch backend with its native DFlash mode (large MoE, several GPUs).

TensorRT-LLM runs the checkpoints itself; the build writes and checks its LLM-API options, and
the Triton repository is the `tensorrt_llm` model of NVIDIA's Triton TensorRT-LLM container.
This toolkit does not decode with it, so it opens no pipeline here.

DFlash V2 drafters are refused (serving/trtllm.py says why and what was read).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_dflash.backends.base import Backend, BuildStep, PipelineSource, quantize_needs, quantize_samples, quantized_precisions
from trtllm_dflash.errors import DFlashError

if TYPE_CHECKING:
    from trtllm_dflash.api import DFlashPipeline


class TrtllmBackend(Backend):
    name = "trtllm"
    title = "TensorRT-LLM's DFlash mode"
    multi_gpu = True
    default_kv_fraction = 0.85  # as a trtllm recipe's kv_cache_free_gpu_memory_fraction defaults
    build_stages = ("trtllm",)
    repository_title = "the TensorRT-LLM LLM-API repository"

    def unquantized_note(self, quant: str) -> str:
        return "TensorRT-LLM loads the checkpoint as published"

    def uses_cuda_graphs(self, recipe: Any) -> bool:
        return recipe is None or recipe.trtllm is None or recipe.trtllm.cuda_graph is not None

    def plan_steps(self, cfg: Any) -> list[BuildStep]:
        model, p, steps = cfg.model, cfg.precision, []
        quantized = quantized_precisions(cfg)
        if model.native_expert_precision == "mxfp4" and p.experts == "nvfp4" and p.weights == "bf16":
            steps.append(BuildStep("quantize", "cast the MXFP4 experts to NVFP4 with ModelOpt (weights exact where the block scales "
                                   f"fit E4M3, activation scales calibrated on {quantize_samples(cfg)}; needs a CUDA GPU)",
                                   ("modelopt", "torch", "cuda-gpu")))
        elif quantized:
            steps.append(BuildStep("quantize", f"ModelOpt {'/'.join(sorted(quantized))} PTQ of the target ({quantize_samples(cfg)}); "
                                   "export a Hugging Face checkpoint TensorRT-LLM loads", quantize_needs(quantized)))
        steps.append(BuildStep("config", f"write and validate the TensorRT-LLM LLM-API options (DFlash speculative_config, "
                               f"tp {cfg.layout.tp} / ep {cfg.layout.ep}, KV {p.kv_cache}); model.yaml and trtllm-serve config"))
        steps.append(BuildStep("repository", "write the Triton repository (tensorrt_llm Python model, decoupled)"))
        return steps

    def checked_options(self, recipe: Any, drafter_dir: str | Path | None = None) -> tuple[dict[str, Any], list[str]]:
        """The recipe's LLM-API options, checked key by key (the build's plan and its trtllm stage both use these)."""
        from trtllm_dflash.serving.trtllm import LLMApiOptions, llm_api_options, validate_options

        options, notes = llm_api_options(recipe, drafter_dir)
        validate_options(options, LLMApiOptions, f"TensorRT-LLM options of {recipe.name}")
        return options, notes

    def v2_refusal(self, drafter: str) -> tuple[str, str] | None:
        from trtllm_dflash.serving.trtllm import v2_refusal

        return v2_refusal(drafter)

    def serve_hint(self, repository: Path) -> str:
        return f"start it on the GPU node (Triton's TensorRT-LLM container, TensorRT-LLM {_checked_release()} or later): {serve_command(repository)}"

    def write_build_repository(self, build_dir: Path, manifest: dict, out: Path, force: bool = False) -> Path:
        from trtllm_dflash.serving.trtllm import write_build_llm_api_repository

        return write_build_llm_api_repository(build_dir, manifest, out, force)

    def write_recipe_repository(self, out: Path, recipe: Any, drafter_dir: str | None = None, force: bool = False) -> tuple[Path, list[str]]:
        from trtllm_dflash.serving.trtllm import write_trtllm_repository

        return write_trtllm_repository(out, recipe, drafter_dir=drafter_dir, force=force)

    def open_pipeline(self, source: PipelineSource, device: str = "cuda", max_context: int | None = None) -> DFlashPipeline:
        raise DFlashError(
            "a trtllm deployment is decoded by TensorRT-LLM, not by this toolkit's pipeline",
            "serve its repository in NVIDIA's Triton TensorRT-LLM container and pass --url",
        )


# NVIDIA's Triton container with TensorRT-LLM and its LLM-API model (all_models/llmapi); pick the
# month whose TensorRT-LLM is the release the options were checked against, or newer
TRITON_TRTLLM_IMAGE = "nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3"


def _checked_release() -> str:
    from trtllm_dflash.serving.llm_args_check import pinned_version

    return pinned_version() or "1.4"


def serve_command(repository: Path) -> str:
    """The one command that starts a written LLM-API repository: the checkpoints it names are mounted at their paths."""
    import yaml

    repository = Path(repository).resolve()
    mounts = [repository]
    try:
        options = yaml.safe_load((repository / "tensorrt_llm" / "1" / "model.yaml").read_text())
    except (OSError, yaml.YAMLError):
        options = {}
    for path in (options.get("model"), (options.get("speculative_config") or {}).get("speculative_model")):
        if isinstance(path, str) and Path(path).is_absolute():
            mounts.append(Path(path))
    volumes = " ".join(f"-v {m}:{m}" for m in dict.fromkeys(mounts))
    return (f"docker run --rm --gpus all --ipc host --shm-size 2g -p 8000:8000 -p 8001:8001 {volumes} "
            f"{TRITON_TRTLLM_IMAGE} tritonserver --model-repository {repository}")


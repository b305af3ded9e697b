"""The `trtllm` backend: TensorRT-LLM's PyTorch backend with its native DFlash mode (large MoE, several GPUs).

TensorRT-LLM runs the checkpoints itself; the build writes and checks its LLM-API options, and
the Triton repository is the `tensorrt_llm` model of NVIDIA's Triton TensorRT-LLM container.
This toolkit does not decode with it, so it opens no pipeline here.

DFlash V2 drafters run with drafter attention VANILLA or FA4; drafter_support in drafters.py says
which drafters run as published, which differently and which are refused, and what was read.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_dflash.backends.base import Backend, BuildStep, PipelineSource, quantize_needs, quantize_samples
from trtllm_dflash.errors import DFlashError

if TYPE_CHECKING:
    from trtllm_dflash.api import DFlashPipeline
    from trtllm_dflash.backends.artifact import BuildArtifact


class TrtllmBackend(Backend):
    name = "trtllm"
    title = "TensorRT-LLM's DFlash mode"
    multi_gpu = True
    default_kv_fraction = 0.85  # as a trtllm recipe's kv_cache_free_gpu_memory_fraction defaults
    build_stages = ("trtllm",)
    repository_title = "the TensorRT-LLM LLM-API repository"

    def unquantized_note(self, weights: str) -> str:
        return "TensorRT-LLM loads the checkpoint as published"

    def uses_cuda_graphs(self, recipe: Any) -> bool:
        return recipe is None or recipe.trtllm is None or recipe.trtllm.cuda_graph is not None

    def plan_steps(self, cfg: Any) -> list[BuildStep]:
        p, steps = cfg.precision, []
        quantized = p.ptq_formats
        if p.converts_experts:
            steps.append(
                BuildStep(
                    "quantize",
                    "cast the MXFP4 experts to NVFP4 with ModelOpt (weights exact where the block scales "
                    f"fit E4M3, activation scales calibrated on {quantize_samples(cfg)}; needs a CUDA GPU)",
                    ("modelopt", "torch", "cuda-gpu"),
                )
            )
        elif quantized:
            steps.append(
                BuildStep(
                    "quantize",
                    f"ModelOpt {'/'.join(sorted(quantized))} PTQ of the target ({quantize_samples(cfg)}); "
                    "export a Hugging Face checkpoint TensorRT-LLM loads",
                    quantize_needs(quantized),
                )
            )
        steps.append(
            BuildStep(
                "config",
                f"write and validate the TensorRT-LLM LLM-API options (DFlash speculative_config, "
                f"tp {cfg.layout.tp} / ep {cfg.layout.ep}, KV {p.kv_cache}); model.yaml and trtllm-serve config",
            )
        )
        steps.append(BuildStep("repository", "write the Triton repository (tensorrt_llm Python model, decoupled)"))
        return steps

    def checked_options(
        self, recipe: Any, drafter_dir: str | Path | None = None, overlay_at: str | Path | None = None
    ) -> tuple[dict[str, Any], list[str]]:
        """The recipe's LLM-API options, checked key by key (the build's plan and its trtllm stage both use these);
        `overlay_at`: where the drafter config overlay will be, when the drafter needs one."""
        from trtllm_dflash.backends.trtllm.options import LLMApiOptions, llm_api_options, validate_options

        options, notes = llm_api_options(recipe, drafter_dir, overlay_at)
        validate_options(options, LLMApiOptions, f"TensorRT-LLM options of {recipe.name}")
        return options, notes

    def drafter_refusal(self, kind: str, drafter: str) -> tuple[str, str] | None:
        """None: TensorRT-LLM runs both kinds (V2 with drafter attention VANILLA or FA4, checked with the options)."""
        return None

    def serve_hint(self, repository: Path) -> str:
        return (
            f"start it on the GPU node (Triton's TensorRT-LLM container, TensorRT-LLM {_checked_release()} or later): "
            f"{serve_command(repository)}"
        )

    def write_build_repository(self, artifact: BuildArtifact, out: Path, force: bool = False) -> Path:
        from trtllm_dflash.backends.trtllm.repository import write_build_llm_api_repository

        return write_build_llm_api_repository(artifact, out, force)

    def write_recipe_repository(
        self, out: Path, recipe: Any, drafter_dir: str | None = None, force: bool = False, llmapi_model: str | Path | None = None
    ) -> tuple[Path, list[str]]:
        """`llmapi_model`: NVIDIA's LLM-API model folder given with --llmapi-model (else found as find_llmapi_model says)."""
        from trtllm_dflash.backends.trtllm.repository import write_trtllm_repository

        return write_trtllm_repository(out, recipe, drafter_dir=drafter_dir, force=force, llmapi_model=llmapi_model)

    def open_pipeline(self, source: PipelineSource, device: str = "cuda", max_context: int | None = None) -> DFlashPipeline:
        raise DFlashError(
            "a trtllm deployment is decoded by TensorRT-LLM, not by this toolkit's pipeline",
            "serve its repository in NVIDIA's Triton TensorRT-LLM container and pass --url",
        )


# NVIDIA's Triton container with TensorRT-LLM. Which month ships TensorRT-LLM 1.4.0rc1 (the release the
# options were checked against) is unknown here: the Triton release notes read (26.06, 26.10) do not say in
# the stored text. So the command takes the image from $DFLASH_TRT_TRITON_IMAGE when set, else from the
# shell variable TRITON_IMAGE, which the shell refuses to leave empty with the line below.
TRITON_IMAGE_ENV = "DFLASH_TRT_TRITON_IMAGE"
TRITON_IMAGE_HINT = "nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3 whose tensorrt_llm.__version__ is the options' release"


def _checked_release() -> str:
    from trtllm_dflash.backends.trtllm.llm_args_check import pinned_version

    return pinned_version() or "1.4"


def serve_command(repository: Path) -> str:
    """The one command that starts a written LLM-API repository: the checkpoints it names, the drafter a
    config overlay links to and NVIDIA's LLM-API model folder are mounted at their own paths."""
    import json
    import os

    import yaml

    from trtllm_dflash.backends.trtllm.drafters import OVERLAY_RECORD
    from trtllm_dflash.backends.trtllm.repository import LLMAPI_MODEL_ENV

    repository = Path(repository).resolve()
    mounts = [repository]
    version_dir = repository / "tensorrt_llm" / "1"
    try:
        options = yaml.safe_load((version_dir / "model.yaml").read_text())
    except (OSError, yaml.YAMLError):
        options = {}
    for path in (options.get("model"), (options.get("speculative_config") or {}).get("speculative_model")):
        if isinstance(path, str) and Path(path).is_absolute():
            mounts.append(Path(path))
            record = Path(path) / OVERLAY_RECORD
            if record.is_file():
                mounts.append(Path(json.loads(record.read_text())["source"]))
    env = ""
    recorded = version_dir / "llmapi_model.txt"
    if recorded.is_file():
        llmapi = Path(recorded.read_text().strip())
        mounts.append(llmapi)
        env = f"-e {LLMAPI_MODEL_ENV}={llmapi} "
    volumes = " ".join(f"-v {m}:{m}" for m in dict.fromkeys(mounts))
    image = os.environ.get(TRITON_IMAGE_ENV) or f'"${{TRITON_IMAGE:?set TRITON_IMAGE to {TRITON_IMAGE_HINT} ({_checked_release()})}}"'
    return (
        f"docker run --rm --gpus all --ipc host --shm-size 2g -p 8000:8000 -p 8001:8001 {volumes} {env}"
        f"{image} tritonserver --model-repository {repository}"
    )

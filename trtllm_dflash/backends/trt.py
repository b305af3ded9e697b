"""The `trt` backend: this toolkit's TensorRT engines (on CPU: the ONNX graphs they are built from).

Its build exports the graphs, checks them against the torch runtime and builds the engines; its
Triton repository holds Python-backend models that drive the engines (or, until engines are
built, the build's checkpoints on the torch runtime). The runtimes (runtime/onnx_runtime.py,
runtime/trt_runtime.py) run the graphs and engines; the pipelines here wrap one with the build's
tokenizer and end-of-sequence ids, so the runtimes never import the API.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_dflash.backends.base import Backend, BuildStep, PipelineSource, quantize_needs, quantize_samples
from trtllm_dflash.errors import DFlashError, MissingDependencyError

if TYPE_CHECKING:
    from trtllm_dflash.api import DFlashPipeline


class TrtBackend(Backend):
    name = "trt"
    title = "TensorRT engines"
    build_stages = ("export", "validate", "engines")

    def unquantized_note(self, weights: str) -> str:
        return f"{weights} weights are cast at export"

    def uses_cuda_graphs(self, recipe: Any) -> bool:
        return recipe is None or recipe.trt is None or recipe.trt.cuda_graphs

    def plan_steps(self, cfg: Any) -> list[BuildStep]:
        model, p, gpu, steps = cfg.model, cfg.precision, cfg.gpu, []
        arch = f"{gpu.sm_arch} (SM {gpu.compute_capability_str})"
        flavour = cfg.recipe.trt_flavour() if cfg.recipe is not None else gpu.trt_flavour
        plugins = cfg.recipe is None or cfg.recipe.trt is None or cfg.recipe.trt.use_plugins
        quantized = p.ptq_formats
        if quantized:
            steps.append(
                BuildStep(
                    "quantize",
                    f"ModelOpt {'/'.join(sorted(quantized))} PTQ of the target ({quantize_samples(cfg)}); "
                    f"KV cache {p.kv_cache}; drafter stays {p.drafter}",
                    quantize_needs(quantized),
                )
            )
        steps.append(
            BuildStep(
                "export",
                f"ONNX graphs: target (prefill + verify, taps {list(model.drafter.target_layer_ids) if model.drafter else []}) "
                f"and drafter block forward ({'DFlash plugin nodes' if plugins else 'plugin-free'})",
                ("torch", "onnx"),
            )
        )
        if plugins:
            steps.append(BuildStep("plugins", f"compile the DFlash Triton kernels ahead of time for {gpu.sm_arch}", ("triton",)))
        engine_needs = ("tensorrt-rtx",) if flavour == "tensorrt-rtx" else ("tensorrt", "cuda-gpu")
        steps.append(
            BuildStep(
                "engines",
                f"{flavour} engines for {arch}: batch <= {cfg.max_batch}, tokens <= {cfg.max_num_tokens}, "
                f"sequence <= {cfg.context}, block {cfg.block_size}",
                engine_needs,
            )
        )
        steps.append(BuildStep("repository", "write the Triton model repository (Python backend driving the engines, decoupled)"))
        return steps

    def open_pipeline(self, source: PipelineSource, device: str = "cuda", max_context: int | None = None) -> DFlashPipeline:
        """The engines (on a GPU), or with `source.onnx` the graphs they were built from (on CPU, onnxruntime)."""
        if source.build is None:
            raise DFlashError(
                "the trt backend runs a build's engines, and no build was named", "pass --engines BUILD (or --onnx BUILD on CPU)"
            )
        build = Path(source.build).expanduser()
        if source.onnx:
            return load_onnx_pipeline(build, drafter=source.speculative, max_context=max_context)
        return load_engine_pipeline(engines_folder(build), drafter=source.speculative, device=device, max_context=max_context)


def engines_folder(build: Path) -> Path:
    """A build's engines/ folder, given the build directory or the folder itself."""
    return build / "engines" if (build / "engines" / "engines.json").is_file() else build


def load_onnx_pipeline(
    build_dir: str | Path, max_context: int | None = None, variant: str = "native", drafter: bool = True
) -> DFlashPipeline:
    """A DFlashPipeline that runs a build's ONNX graphs on CPU with onnxruntime (`drafter=False`: AR)."""
    from trtllm_dflash.api import DFlashPipeline
    from trtllm_dflash.runtime.artifacts import export_dir_of, tokenizer_and_stops
    from trtllm_dflash.runtime.onnx_runtime import OnnxRuntime

    export_dir = export_dir_of(build_dir)
    runtime = OnnxRuntime(export_dir, variant, drafter=drafter)
    tokenizer, stops = tokenizer_and_stops(export_dir / "tokenizer")
    limit = int(runtime.info["bounds"]["max_seq_len"])
    return DFlashPipeline(runtime, tokenizer, stops, max_context=min(max_context or limit, limit))


def load_engine_pipeline(
    engines_dir: str | Path, drafter: bool = True, device: str = "cuda", max_context: int | None = None, variant: str = "native"
) -> DFlashPipeline:
    """A DFlashPipeline over the engines of a build (the serving model and `generate --engines` use it).

    `drafter=False` runs the target engine alone (autoregressive: the serving baseline)."""
    from trtllm_dflash.api import DFlashPipeline
    from trtllm_dflash.runtime.artifacts import tokenizer_and_stops
    from trtllm_dflash.runtime.trt_runtime import TrtRuntime

    if device == "cpu":
        raise MissingDependencyError(
            "TensorRT engines run on a GPU, not on the CPU", "use --device cuda, or `generate --onnx BUILD` on CPU"
        )
    engines_dir = Path(engines_dir)
    runtime = TrtRuntime(engines_dir, variant, drafter)
    tokenizer, stops = tokenizer_and_stops(engines_dir / "tokenizer")
    limit = int(runtime.info["bounds"]["max_seq_len"])
    return DFlashPipeline(runtime, tokenizer, stops, max_context=min(max_context or limit, limit))

"""DFlashPipelines over what `dflash-trt build` wrote: the ONNX graphs (CPU) and the engines (GPU).

The runtimes (runtime/onnx_runtime.py, runtime/trt_runtime.py) run the graphs and engines; this
module, above them and beside the API, wraps one in a `DFlashPipeline` with the build's tokenizer
and end-of-sequence ids, so the runtimes never import the API.
"""

from __future__ import annotations

from pathlib import Path

from trtllm_dflash.api import DFlashPipeline
from trtllm_dflash.errors import MissingDependencyError
from trtllm_dflash.runtime.artifacts import export_dir_of, tokenizer_and_stops


def load_onnx_pipeline(build_dir: str | Path, max_context: int | None = None, variant: str = "native", drafter: bool = True) -> DFlashPipeline:
    """A DFlashPipeline that runs a build's ONNX graphs on CPU with onnxruntime (`drafter=False`: AR)."""
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
    from trtllm_dflash.runtime.trt_runtime import TrtRuntime

    if device == "cpu":
        raise MissingDependencyError("TensorRT engines run on a GPU, not on the CPU", "use --device cuda, or `generate --onnx BUILD` on CPU")
    engines_dir = Path(engines_dir)
    runtime = TrtRuntime(engines_dir, variant, drafter)
    tokenizer, stops = tokenizer_and_stops(engines_dir / "tokenizer")
    limit = int(runtime.info["bounds"]["max_seq_len"])
    return DFlashPipeline(runtime, tokenizer, stops, max_context=min(max_context or limit, limit))

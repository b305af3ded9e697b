"""The `plugin` graph variant: the drafter's block attention and the target's attention and
verification as DFlash plugin nodes.

The plugins part of the toolkit (`trtllm_dflash.plugins.onnx_nodes`) defines the nodes
(`DFlashBlockAttention`, `DFlashTargetAttention`, `DFlashVerifyPositions` + `DFlashVerifyCommit`;
domain `dflash`, with `plugin_namespace`/`plugin_version`/`aot`), the torch ops that stand for
them during export, their onnxscript translations and their CPU evaluators for `onnx.reference`.
The plugin target graph (`graphs.target.VerifyingTargetGraph`) keeps its caches in place and returns
verification results instead of logits; targets its attention node cannot express keep the
native target graph.

Where each variant is evaluated or built:
- native graphs: onnxruntime on CPU; TensorRT and TensorRT-RTX engines;
- plugin graphs: onnx's reference evaluator with the nodes' CPU evaluators (onnxruntime has no
  kernel for a custom domain); full TensorRT engines once the plugins are registered with it;
  never TensorRT-RTX (a Python-implemented plugin aborts its builder, PLATFORM.md).
"""

from __future__ import annotations

import importlib.util

from trtllm_dflash.errors import MissingDependencyError


def plugin_support() -> str | None:
    """None when plugin graphs can be exported and evaluated here, else why not."""
    try:
        importlib.import_module("trtllm_dflash.plugins.onnx_nodes")
    except ImportError as exc:
        return f"the DFlash plugin ONNX nodes are not available ({exc})"
    return None


def export_options(variant: str) -> tuple[bool, dict | None]:
    """(use the plugin op, custom translation table) for exporting the drafter of a variant."""
    if variant == "native":
        return False, None
    reason = plugin_support()
    if reason is not None:
        raise MissingDependencyError(f"cannot export the plugin graph variant: {reason}", "build with the native graphs only")
    from trtllm_dflash.plugins import onnx_nodes

    return True, onnx_nodes.custom_translation_table(kv_splits=1)


def engine_support(variant: str, flavour: str) -> str | None:
    """None when `flavour` can build engines of this variant here, else why not."""
    if variant == "native":
        return None
    if flavour == "tensorrt-rtx":
        return "TensorRT-RTX aborts on Python-implemented plugins (PLATFORM.md); its engines use the native graphs"
    if importlib.util.find_spec("trtllm_dflash.plugins.tensorrt_plugins") is None:
        return "the DFlash TensorRT plugin registration (plugins/tensorrt_plugins.py) is not installed"
    return None


def register_tensorrt_plugins(arch: str) -> list[str]:
    """Register the DFlash plugins (kernels compiled ahead of time for `arch`) before parsing plugin graphs."""
    from trtllm_dflash.plugins import tensorrt_plugins

    return tensorrt_plugins.register_plugins(arch=arch)

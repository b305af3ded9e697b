"""The `plugin` graph variant: the drafter's block attention as the DFlash plugin node.

The plugins issue defines the node (op type, `plugin_namespace`, `plugin_version`, attributes),
the torch custom op that stands for it during export, its onnxscript translation, and its CPU
evaluator for `onnx.reference`. This module is the one place the build looks for them; when they
are not installed, the plugin variant is reported as unavailable and only the `native` graphs
(plain ONNX ops) are exported.
"""

from __future__ import annotations

from typing import Callable

from trtllm_dflash.errors import MissingDependencyError


def plugin_support() -> str | None:
    """None when plugin graphs can be exported here, else why not."""
    return "the DFlash plugin ONNX nodes (plugins issue) are not part of this build of trtllm-dflash"


def drafter_attention(variant: str) -> tuple[Callable, dict | None]:
    """(attention function, custom translation table) for a graph variant."""
    from trtllm_dflash.builder.export import native_block_attention

    if variant == "native":
        return native_block_attention, None
    reason = plugin_support()
    raise MissingDependencyError(f"cannot export the plugin graph variant: {reason}", "build with graphs: [native]")


def cpu_evaluators(variant: str) -> list[type]:
    """`onnx.reference` OpRun classes for the plugin nodes of a graph variant (none for native)."""
    if variant == "native":
        return []
    raise MissingDependencyError(f"no CPU evaluators for the {variant} graphs: {plugin_support()}", "validate the native graphs")


def engine_support(variant: str, flavour: str) -> str | None:
    """None when `flavour` can build engines of this variant here, else why not."""
    if variant == "native":
        return None
    if flavour == "tensorrt-rtx":
        # PLATFORM.md: a Python IPluginV3 registered in TensorRT-RTX aborts the process during the build
        return "TensorRT-RTX aborts on Python-implemented plugins; the native graphs are built instead"
    return plugin_support()


def register_tensorrt_plugins(trt) -> None:
    """Register the DFlash plugins with TensorRT before parsing plugin graphs."""
    raise MissingDependencyError(f"cannot register the DFlash TensorRT plugins: {plugin_support()}", "build the native graphs")

"""Importing a TensorRT flavour (full TensorRT or TensorRT-RTX), for the builder and the engine runtime.

Both flavours share TensorRT's Python API; which one built a set of engines is recorded in
engines.json, and only that flavour (at that version) loads them.
"""

from __future__ import annotations

from types import ModuleType

INSTALL_HINT = {
    "tensorrt": (
        "install full TensorRT on the GPU machine: `pip install 'trtllm-dflash[trt]'` (the wheel comes from "
        "pypi.nvidia.com), or run the build inside NVIDIA's container nvcr.io/nvidia/tensorrt:25.10-py3"
    ),
    "tensorrt-rtx": "`pip install 'trtllm-dflash[rtx]'` (tensorrt-rtx-cu13-libs and tensorrt-rtx-cu13-bindings from PyPI)",
}


def import_tensorrt(flavour: str) -> ModuleType:
    """The Python bindings of `flavour`; raises ImportError when it is not installed."""
    if flavour == "tensorrt-rtx":
        # the `tensorrt_rtx` top package re-exports these bindings; its plugin subpackage is broken on Linux
        import tensorrt_rtx_bindings as trt
    else:
        import tensorrt as trt
    return trt

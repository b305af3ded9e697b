"""Triton kernels of the DFlash plugins, loaded in the form the caller needs.

Triton decides at decoration time whether `@triton.jit` builds a compiled kernel or a CPU
interpreter one (the `TRITON_INTERPRET` knob), and a kernel's jitted helpers must be of the same
kind. So each kernel source file is loaded here as two independent module instances: compiled
(GPU launches and ahead-of-time compilation) and interpreted (CPU tensors, used by the tests
and by `TRITON_INTERPRET=1`). Both come from the same source text, so what is tested on CPU is
exactly what is compiled for the GPU.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path
from types import ModuleType

from trtllm_dflash.extras import require

KERNEL_SOURCES = (
    "attention",
    "attention_merge",
    "verify",
    "verify_spread",
    "verify_shortlist",
    "dflash2",
    "fused_layer",
    "skinny_linear",
    "counter_rng",
    "last_split",
    "grid_dependency",
)  # counter_rng, last_split, grid_dependency: helpers, no kernel
_HERE = Path(__file__).parent


def triton_available() -> bool:
    """True when the `triton` package can be imported (it is an optional extra)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def interpreter_requested() -> bool:
    """`TRITON_INTERPRET=1`: run the kernels on CPU tensors through Triton's interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


@functools.cache
def load(name: str, interpret: bool = False) -> ModuleType:
    """The kernel module `name` with `@triton.jit` bound to the compiler or to the interpreter."""
    if name not in KERNEL_SOURCES:
        raise ValueError(f"unknown kernel source {name!r}; known: {', '.join(KERNEL_SOURCES)}")
    triton = require("triton", "kernels", "the DFlash plugin kernels")

    if interpret:
        _fix_interpreter_bf16_dot()
    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = interpret
        mode = "interpreted" if interpret else "compiled"
        spec = importlib.util.spec_from_file_location(f"trtllm_dflash.ops.kernels._{name}_{mode}", _HERE / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def for_tensor_device(name: str, device) -> ModuleType:
    """Compiled kernels for CUDA tensors, interpreted ones for anything else."""
    return load(name, interpret=getattr(device, "type", str(device)) != "cuda")


def _fix_interpreter_bf16_dot() -> None:
    """Make Triton's CPU interpreter compute `tl.dot` on bfloat16 operands correctly.

    The interpreter stores bfloat16 values as their uint16 bit patterns and (Triton 3.9) hands
    them to numpy's matmul as integers, so bf16 dots come out as garbage. Widening the bits to
    float32 first is exact, and bf16 x bf16 products are exact in float32, so the result is what a
    GPU computes with float32 accumulation. The patch is idempotent and touches nothing else.
    """
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "_dflash_bf16_fix", False):
        return
    original = builder.create_dot

    def widen(handle):
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        bits = handle.data.astype(np.uint32) << np.uint32(16)
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    create_dot._dflash_bf16_fix = True
    builder.create_dot = create_dot

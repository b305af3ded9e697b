"""Whether the kernels launched now are programmatic dependent launches (`grid_dependency.py`).

The choice belongs to whoever records the launches (a runtime capturing its passes into CUDA
graphs, a benchmark timing them), not to each op, so it is a context: inside
`dependent_launches(True)`, every launcher of a kernel that calls `wait_for_inputs` first passes
`launch_args(device)` to it, and the kernel is launched with the PDL attribute and compiled with
the wait. Outside (the default), nothing changes.

Only CUDA devices of compute capability 9.0 (Hopper) and later have grid dependency control;
elsewhere the context changes nothing. Launches that are not ours (cuBLAS, torch's elementwise
kernels) keep their ordinary launches, and an ordinary launch waits for the kernel ahead of it to
complete, so mixing the two stays in stream order.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Iterator

import torch

_ENABLED = contextvars.ContextVar("dflash_dependent_launches", default=False)


@contextlib.contextmanager
def dependent_launches(enabled: bool = True) -> Iterator[None]:
    """Launch the kernels that support it as programmatic dependent launches while inside."""
    token = _ENABLED.set(bool(enabled))
    try:
        yield
    finally:
        _ENABLED.reset(token)


def requested() -> bool:
    """Whether the current context asks for dependent launches."""
    return _ENABLED.get()


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def supported(device: torch.device) -> bool:
    """Whether kernels on `device` can be launched as dependent launches (CUDA, sm_90 on)."""
    if device.type != "cuda":
        return False
    return _capability(device.index if device.index is not None else torch.cuda.current_device()) >= (9, 0)


def launch_args(device: torch.device) -> dict:
    """The keyword arguments that make a launch on `device` dependent: the kernel's PDL constexpr
    (its wait) and Triton's launch attribute, always together; none when not requested or not
    supported (the kernels' PDL defaults to False)."""
    if not (requested() and supported(device)):
        return {}
    return {"PDL": True, "launch_pdl": True}

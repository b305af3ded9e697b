"""Keep the C allocator from handing a decoding step's buffers back to the OS (glibc on Linux).

Why: a CPU decoding step allocates and frees the same few hundred kilobytes to megabytes of
tensors every time (logits, activations, attention scores). glibc serves blocks above its mmap
threshold with a fresh mmap and unmaps them on free, and returns a heap's free top past its trim
threshold, so the next step touches new, zeroed pages again. In the served model process the
decoding loop took 97,554 page faults in 4.1 s at concurrency 8 (an in-process loop doing the same
work: 8,251) and ran about 2x the CPU time per step (benchmarks/RESULTS.md). With the thresholds
below the freed memory stays in the process for the next step: 26,530 faults, 3.6 s.

The process keeps its peak working set (the memory is reused, not returned); a serving process
does that anyway. Elsewhere (another C library, no `mallopt`) nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's largest on 64-bit: blocks below it come from the heap
TRIM_THRESHOLD = 1024 * 1024 * 1024  # free heap top kept before any is returned to the OS


def keep_freed_memory() -> str | None:
    """Set glibc's mmap and trim thresholds for this process; None when set, else why not."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it (and mallopt's parameters as above)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "the C library is not glibc"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return "glibc refused the thresholds"
    return None

"""What the kernel choices share (runtime/attention_choice.py, verify_choice.py, linear_choice.py):
timing a candidate the way a decoding step runs it, finding the choice measured for a call's shape,
and saying in one line why a candidate that raised was refused.

Timing, on a GPU: captured into a CUDA graph and replayed, so the Python launcher is not timed (a step's
passes are graphs), with the L2 cache flushed before each replay (a step finds its K/V and logits
in HBM: the weights it read since evict them), timed with device events, median. Elsewhere the
host clock, eagerly, after two warm-up calls.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Protocol

import torch

TIMED_RUNS = 20
L2_FLUSH_BYTES = 256 * 1024 * 1024  # written before each timed replay


def time_call(fn: Callable[[], object], device: torch.device, runs: int = TIMED_RUNS) -> float:
    """Median ms of `fn`: replayed from a CUDA graph with L2 flushed before each replay on CUDA (NaN
    where it cannot be captured), eagerly after two warm-up calls elsewhere."""
    if device.type != "cuda":
        fn(), fn()
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            fn()
            times.append((time.perf_counter() - started) * 1e3)
        return statistics.median(times)
    from trtllm_dflash.runtime import cuda_graphs

    try:
        replay, outputs = cuda_graphs.capture(fn, cuda_graphs.new_pool())
    except Exception:  # noqa: BLE001 - a candidate that cannot be captured has no in-graph time
        torch.cuda.synchronize()
        return math.nan
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(runs)]
    replay()
    for start, end in events:
        flush.zero_()
        start.record()
        replay()
        end.record()
    torch.cuda.synchronize()
    del replay, outputs
    return statistics.median(start.elapsed_time(end) for start, end in events)


def refusal(error: BaseException) -> str:
    """Why a candidate that raised (a kernel that does not compile or launch here, a library refusing
    the inputs) is refused, in one line of a choice's table: the error's first line, else its type."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:160]


class Measured(Protocol):
    tokens: int  # the call's tokens per row (a verified block's length)
    batch: int  # the batch bucket it was measured at
    chosen: str


def bucketed(choices: "tuple[Measured, ...]", tokens: int, batch: int, default: str) -> str:
    """The choice measured for `tokens` at the smallest batch bucket holding `batch` rows (`default`
    where none was: shapes not measured keep the default kernels)."""
    fits = [c for c in choices if c.tokens == tokens and c.batch >= batch]
    return min(fits, key=lambda c: c.batch).chosen if fits else default

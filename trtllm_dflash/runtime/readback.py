"""A decoding step's small result on its way to the host, and the device time the step took.

Why: on a GPU the host reads one small tensor per step (drafts, accepted count, bonus per row). A
blocking read stops the host until the GPU has finished the step, so the host's own work (the
scheduler, the stops, the next step's launches) and the GPU's never overlap. With async scheduling
(decoding.py) the host launches a step, starts this copy into pinned memory without waiting, and
reads it after launching the next step, by which time it has arrived.

Off a GPU the device work ran when it was launched: the values are the host's already, and the
step's time is the host clock's.
"""

from __future__ import annotations

import time

import torch


class Readback:
    """`values` copied to the host without blocking (pinned memory, an event marks its arrival)."""

    def __init__(self, values: torch.Tensor) -> None:
        if values.device.type == "cuda":
            self.host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self.host.copy_(values, non_blocking=True)
            self.arrived: torch.cuda.Event | None = torch.cuda.Event()
            self.arrived.record()
        else:
            self.host, self.arrived = values, None

    def tolist(self) -> list:
        """The values as lists; waits for the copy (and so for the work queued before it)."""
        if self.arrived is not None:
            self.arrived.synchronize()
        return self.host.tolist()


class DeviceClock:
    """The device time of work queued between `__init__` and `stop`: CUDA events on a GPU (read after
    the work has finished), the host clock elsewhere (where the work ran as it was queued)."""

    def __init__(self, device: torch.device) -> None:
        self.events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None
        if device.type == "cuda":
            self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self.events[0].record()
        self.started, self.stopped = time.perf_counter(), None

    def stop(self) -> None:
        if self.events is not None:
            self.events[1].record()
        self.stopped = time.perf_counter()

    def seconds(self) -> float:
        """Waits for the work on a GPU."""
        if self.events is not None:
            self.events[1].synchronize()
            return self.events[0].elapsed_time(self.events[1]) / 1e3
        return (self.stopped or time.perf_counter()) - self.started

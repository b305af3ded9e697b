"""How many CPU threads torch runs a model's passes with (issue 38).

Why: torch's default is one OpenMP thread per core, each spinning while it waits. On a machine
whose cores are busy with other work those threads fight the other work and each other: a demo
`generate` measured 0.9 tok/s on a loaded 2-core machine where one thread gave 65. The default here
is what is free: the cores this process may run on, less the machine's current load (the 1-minute
load average), and at least one. An explicit count always wins.
"""

from __future__ import annotations

import os

import torch


def available_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def default_threads() -> int:
    """The cores not already busy: available cores less the 1-minute load average, at least 1."""
    cores = available_cores()
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average on this OS: take every core
        load = 0.0
    return max(1, min(cores, int(cores - load)))


def set_threads(threads: int | None) -> int:
    """Run torch's CPU work on `threads` threads (None or 0: `default_threads()`); returns the count."""
    count = int(threads) if threads else default_threads()
    if count < 0:
        raise ValueError(f"threads must be >= 0, got {threads}")
    torch.set_num_threads(count)
    return count

"""The int32 tile counters of the kernels whose last program sums or merges a tile's splits.

The skinny projections (`skinny_launch.py`) and the one-launch split attention (`launch.py`,
`attention_merge.py`) each let the last split of a tile finish it: every split counts itself in on
the tile's counter, and the one that counts last reads the others' partials and sets the counter
back to zero. So the buffer is zero between launches, and one buffer per device serves every
such kernel, as long as their launches do not overlap: they run on one stream, as a runtime's
passes do (a CUDA graph's replay included).

It is allocated at the first launch that needs it, which must not be inside a CUDA graph capture
(the capture would record its zero-fill, not run it): the runtime's warm-up runs before every
capture see to that.
"""

from __future__ import annotations

import torch

MAX_TILES = 4096  # counters per device: column tiles of 64 up to N = 262,144 (vocabularies included)

_COUNTERS: dict[torch.device, torch.Tensor] = {}


def tile_counters(device: torch.device) -> torch.Tensor:
    """The device's MAX_TILES counters, all zero (see the module docstring)."""
    counters = _COUNTERS.get(device)
    if counters is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("a kernel's first split launch on a device was captured; run it once eagerly first")
        counters = _COUNTERS[device] = torch.zeros(MAX_TILES, dtype=torch.int32, device=device)
    return counters

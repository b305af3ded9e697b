"""Output memory of TensorRT engine calls, bounded whatever the prompt lengths.

Why: TensorRT writes each output into memory the caller binds. Allocating it per exact shape
keeps a new set of buffers for every new prompt length (a prefill's outputs grow with its span),
so memory grows with the number of distinct prompt lengths a server has seen. Here each
(profile, output name, role) has one flat buffer whose size is a power of two of elements (at
least MIN_ELEMENTS, at most the output's size at the profile's largest shapes where that is
known); a call gets a contiguous view of its exact shape at the buffer's start. A buffer is
replaced by a bigger one only when a call needs more, so a key allocates at most
log2(largest / MIN_ELEMENTS) + 2 times and holds at most twice the largest output it served.

A view is valid until the next call of the same key overwrites it; a replaced buffer lives on
as long as a view of it is referenced. The role keeps outputs that must outlive a call of the
other role apart: the decoding loop still holds the last verify step's features when it admits
new rows (a prefill, which may run on the same profile) and concatenates both afterwards.
"""

from __future__ import annotations

import math
from typing import Hashable

import torch

MIN_ELEMENTS = 1 << 12  # smallest buffer, so tiny outputs do not reallocate at every step


def bucket_elements(count: int, cap: int | None = None) -> int:
    """Elements allocated for an output of `count` elements: the next power of two, >= MIN_ELEMENTS,
    and no more than `cap` (the output's largest size) when that is given and holds `count`."""
    bucket = max(MIN_ELEMENTS, 1 << max(int(count) - 1, 0).bit_length())
    return min(bucket, cap) if cap is not None and cap >= count else bucket


class OutputBuffers:
    """Views of bucketed, reused buffers for engine outputs, one buffer per key.

    `allocations` counts the buffers ever allocated (what the tests bound); `live_bytes` is the
    memory the current buffers hold.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._buffers: dict[Hashable, torch.Tensor] = {}
        self.allocations = 0

    def view(self, key: Hashable, shape: tuple[int, ...], dtype: torch.dtype, cap: int | None = None) -> torch.Tensor:
        """A contiguous `[*shape]` tensor at the start of the key's buffer (grown to its bucket if too
        small); `cap`: the most elements this key's output can have (its profile's largest shapes)."""
        count = math.prod(shape)
        buffer = self._buffers.get(key)
        if buffer is None or buffer.dtype != dtype or buffer.numel() < count:
            buffer = torch.empty(bucket_elements(count, cap), dtype=dtype, device=self.device)
            self._buffers[key] = buffer
            self.allocations += 1
        return buffer[:count].view(shape)

    @property
    def live_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def __len__(self) -> int:
        return len(self._buffers)

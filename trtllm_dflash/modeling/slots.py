"""Which cache slots a forward pass works on.

A request owns one cache slot (target KV, drafter context KV, recurrent states) from admission to
finish; a pass is handed its batch's slots and reads and writes them in place. Nothing is moved
when requests finish, are cancelled or are reordered, as TensorRT-LLM's batch-to-slot indices and
vLLM's block tables do it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Iterator

import torch


@dataclasses.dataclass(frozen=True)
class Slots:
    """The cache slots of one pass's batch: batch row i reads and writes slot `ids[i]`.

    Where the ids are one ascending run, `select` is a slice (cache rows as views, and no device
    tensor is made: a CUDA-graph capture may not copy to the device); otherwise it is `index`, the
    ids on the device, and code that needs contiguous cache rows (an exported graph, an attention
    op) runs once per run of consecutive slots (`runs`).
    """

    ids: tuple[int, ...]
    device: torch.device = torch.device("cpu")

    @classmethod
    def of(cls, slots: "Slots | slice | list[int] | tuple[int, ...]", device: torch.device | str = "cpu") -> "Slots":
        """Slots from ids, or from a slice `slice(a, b)` (slots a..b-1)."""
        if isinstance(slots, Slots):
            return slots
        ids = tuple(range(slots.start or 0, slots.stop)) if isinstance(slots, slice) else tuple(int(i) for i in slots)
        return cls(ids, torch.device(device))

    def __len__(self) -> int:
        return len(self.ids)

    @functools.cached_property
    def run(self) -> slice | None:
        """The slots as `slice(first, last + 1)` where they are consecutive and ascending, else None."""
        first = self.ids[0] if self.ids else 0
        return slice(first, first + len(self.ids)) if all(s == first + i for i, s in enumerate(self.ids)) else None

    @functools.cached_property
    def index(self) -> torch.Tensor:
        """The ids as an int64 tensor on the device (made there for a run: no copy from the host)."""
        run = self.run
        if run is not None:
            return torch.arange(run.start, run.stop, dtype=torch.long, device=self.device)
        return index_tensor(self.ids, self.device)

    @property
    def select(self) -> "slice | torch.Tensor":
        """What indexes a `[max_batch, ...]` buffer at these slots: a slice (a view) where one run, else `index`."""
        run = self.run
        return run if run is not None else self.index

    def write(self, buffer: torch.Tensor, positions: torch.Tensor, values: torch.Tensor) -> None:
        """buffer[ids[r], positions[r, t]] = values[r, t] for a `[max_batch, capacity, ...]` buffer."""
        buffer[self.index.view(-1, 1), positions] = values.to(buffer.dtype)

    def runs(self) -> list[tuple[slice, slice]]:
        """(batch rows, slots) of each maximal run of consecutive slots, in batch order."""
        out, first = [], 0
        for i in range(1, len(self.ids) + 1):
            if i == len(self.ids) or self.ids[i] != self.ids[i - 1] + 1:
                out.append((slice(first, i), slice(self.ids[first], self.ids[i - 1] + 1)))
                first = i
        return out

    def parts(self) -> Iterator[tuple[slice, "Slots"]]:
        """(batch rows, their Slots) of each run."""
        for rows, _ in self.runs():
            yield rows, Slots(self.ids[rows], self.device)


def index_tensor(values: "list[int] | tuple[int, ...]", device: torch.device) -> torch.Tensor:
    """Host ints as an int64 tensor on `device`. To a GPU through pinned memory without blocking: a
    plain copy from the host waits for the device to finish its queued work, which would stop an
    async-scheduled loop (decoding.py) at every batch change."""
    if torch.device(device).type != "cuda":
        return torch.tensor(values, dtype=torch.long, device=device)
    return torch.tensor(values, dtype=torch.long).pin_memory().to(device, non_blocking=True)

"""KV caches of the torch runtime: one slot per absolute token position.

Because slot == position, a sequence's cache is valid up to its committed length and rolling
back rejected tokens costs nothing: the next step overwrites those slots before any query can
see them. Rows are sequences; when sequences leave a batch, `keep_rows` compacts the survivors
to the front so every forward pass works on a contiguous slice of rows.
"""

from __future__ import annotations

import dataclasses

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


@dataclasses.dataclass
class LayerCache:
    """One layer's keys and values, `[rows, capacity, kv_heads, head_dim]` (views of the buffers)."""

    keys: torch.Tensor
    values: torch.Tensor


class StaticKVCache:
    """Preallocated per-layer K/V buffers for up to `max_batch` sequences of `capacity` tokens."""

    def __init__(
        self,
        num_layers: int,
        max_batch: int,
        capacity: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (max_batch, capacity, kv_heads, head_dim)
        self.layers = [
            LayerCache(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(num_layers)
        ]
        self.capacity = capacity
        self.max_batch = max_batch

    def rows(self, rows: slice) -> list[LayerCache]:
        return [LayerCache(layer.keys[rows], layer.values[rows]) for layer in self.layers]

    def keep_rows(self, index: torch.Tensor) -> None:
        """Move rows `index` to the front (in that order)."""
        count = index.numel()
        for layer in self.layers:
            layer.keys[:count] = layer.keys.index_select(0, index)
            layer.values[:count] = layer.values.index_select(0, index)

    @property
    def nbytes(self) -> int:
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in self.layers)


class _RaggedLayer(CacheLayerMixin):
    """A Hugging Face cache layer that writes each row's new keys at that row's own positions."""

    is_compileable = False
    is_sliding = False

    def __init__(self, owner: "RaggedHFCache", layer: LayerCache) -> None:
        super().__init__()
        self.owner = owner
        self.buffers = layer
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        # key_states: [b, kv_heads, T, D] as Hugging Face attention modules produce them
        rows, positions, span = self.owner.rows, self.owner.positions, self.owner.span
        keys, values = self.buffers.keys[rows], self.buffers.values[rows]
        row_index = torch.arange(keys.shape[0], device=keys.device).view(-1, 1)
        keys[row_index, positions] = key_states.transpose(1, 2).to(keys.dtype)
        values[row_index, positions] = value_states.transpose(1, 2).to(values.dtype)
        return keys[:, :span].transpose(1, 2), values[:, :span].transpose(1, 2)

    def get_seq_length(self) -> int:
        return self.owner.span

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.span, 0

    def get_max_length(self) -> int:
        return self.owner.storage.capacity


class RaggedHFCache(Cache):
    """A `transformers` Cache over a StaticKVCache, bound to a slice of rows for each forward pass."""

    def __init__(self, storage: StaticKVCache) -> None:
        self.storage = storage
        self.rows: slice = slice(0, 0)
        self.positions = torch.zeros(0, 0, dtype=torch.long)
        self.span = 0
        super().__init__(layers=[_RaggedLayer(self, layer) for layer in storage.layers])

    def bind(self, rows: slice, positions: torch.Tensor, span: int) -> None:
        """Prepare a forward pass of `positions [b, T]` for rows `rows`; keys past `span` are unused."""
        self.rows = rows
        self.positions = positions
        self.span = span

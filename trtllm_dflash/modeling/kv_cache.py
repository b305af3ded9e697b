"""KV caches of the torch runtime: one slot per absolute token position.

Because slot == position, a sequence's cache is valid up to its committed length and rolling
back rejected tokens costs nothing: the next step overwrites those slots before any query can
see them. Rows are slots: a sequence owns one from admission to finish, and a pass reads and writes
its batch's slots in place (runtime/base.py `Slots`); nothing is moved when sequences come and go.
"""

from __future__ import annotations

import dataclasses

import torch

from trtllm_dflash.hf_compat import Cache, OwnedCacheLayer
from trtllm_dflash.modeling.slots import Slots


@dataclasses.dataclass
class LayerCache:
    """One layer's keys and values, `[rows, capacity, kv_heads, head_dim]` (views of the buffers).

    Keys and values may have different head dims (MLA caches decompressed 192-d keys and 128-d
    values); both are None for a layer that has not written yet (see StaticKVCache.lazy).
    """

    keys: torch.Tensor | None
    values: torch.Tensor | None


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
        self.dtype = dtype
        self.device = device

    @classmethod
    def lazy(cls, num_layers: int, max_batch: int, capacity: int, dtype: torch.dtype, device: torch.device) -> "StaticKVCache":
        """A cache whose layers are allocated by `allocate_layer` on their first write.

        For targets whose layers differ in shape (Gemma 4's global layers, MLA's key/value head
        dims) or keep no K/V at all (linear-attention layers, Gemma 4's KV-sharing layers): each
        layer gets exactly what its attention module writes, nothing is read from the config.
        """
        cache = cls(0, max_batch, capacity, 0, 0, dtype, device)
        cache.layers = [LayerCache(None, None) for _ in range(num_layers)]
        return cache

    def allocate_layer(self, layer: int, kv_heads: int, key_dim: int, value_dim: int) -> LayerCache:
        entry = self.layers[layer]
        with torch.inference_mode(False):  # first writes happen inside a forward pass; the buffers outlive it
            entry.keys = torch.zeros(self.max_batch, self.capacity, kv_heads, key_dim, dtype=self.dtype, device=self.device)
            entry.values = torch.zeros(self.max_batch, self.capacity, kv_heads, value_dim, dtype=self.dtype, device=self.device)
        return entry

    def rows(self, rows: slice) -> list[LayerCache]:
        return [
            LayerCache(layer.keys[rows], layer.values[rows]) if layer.keys is not None else LayerCache(None, None) for layer in self.layers
        ]

    @property
    def nbytes(self) -> int:
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in self.layers if layer.keys is not None)


class _RaggedLayer(OwnedCacheLayer):
    """A Hugging Face cache layer that writes each row's new keys at that row's own positions."""

    def __init__(self, owner: "RaggedHFCache", index: int) -> None:
        super().__init__(owner, index)
        self.buffers = owner.storage.layers[index]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        # key_states: [b, kv_heads, T, D] as Hugging Face attention modules produce them
        slots, positions, span = self.owner.slots, self.owner.positions, self.owner.span
        if self.buffers.keys is None:
            heads = key_states.shape[1]
            self.owner.storage.allocate_layer(self.index, heads, key_states.shape[-1], value_states.shape[-1])
        keys, values = self.buffers.keys, self.buffers.values
        slots.write(keys, positions, key_states.transpose(1, 2))
        slots.write(values, positions, value_states.transpose(1, 2))
        # the model's attention takes one tensor for the batch: views of one run of slots, else a gather
        rows = slots.select
        return keys[rows, :span].transpose(1, 2), values[rows, :span].transpose(1, 2)

    def get_seq_length(self) -> int:
        return self.owner.span

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.span, 0

    def get_max_length(self) -> int:
        return self.owner.storage.capacity


class RaggedHFCache(Cache):
    """A `transformers` Cache over a StaticKVCache, bound to a batch's slots for each forward pass.

    `linear_states` (hybrid targets) holds the linear-attention layers' recurrent and conv
    states; those layers read `slots`, `positions` and `valid` from here (see linear_attention.py).
    """

    def __init__(self, storage: StaticKVCache, linear_states=None) -> None:
        self.storage = storage
        self.linear_states = linear_states
        self.slots = Slots(())
        self.positions = torch.zeros(0, 0, dtype=torch.long)
        self.span = 0
        self.valid: torch.Tensor | None = None
        super().__init__(layers=[_RaggedLayer(self, i) for i in range(len(storage.layers))])

    def bind(self, slots: Slots | slice, positions: torch.Tensor, span: int, valid: torch.Tensor | None = None) -> None:
        """Prepare a forward pass of `positions [b, T]` for `slots`; keys past `span` are unused.

        `valid [b]` (prefill) says how many leading tokens of each row are real: the rest is
        padding, which attention never commits (slot == position) but a recurrent state would.
        """
        self.slots = Slots.of(slots, positions.device)
        self.positions = positions
        self.span = span
        self.valid = valid

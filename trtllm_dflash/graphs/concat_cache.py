"""The cache objects of one traced (or probed) target forward pass, and per-layer cache shapes.

A `ConcatCache` stands in for a transformers cache: past K/V come in as graph inputs, the new K/V
of each layer are recorded as graph outputs, and attention reads `[past; new]`. Running two tokens
through it without past inputs (`TargetGraph.probe_cache_layers`) tells which layers write K/V
and in which shape (`LayerCache`), from the model's own code rather than its config.
"""

from __future__ import annotations

import dataclasses

import torch

from trtllm_dflash.hf_compat import Cache, OwnedCacheLayer


class _ConcatLayer(OwnedCacheLayer):
    """A transformers cache layer that returns [past inputs; new K/V] and remembers the new K/V.

    A layer without past inputs (the shape probe, see TargetGraph.probe_cache_layers) returns the
    new K/V alone. A layer whose attention never calls `update` (Gemma 4's KV-sharing layers read
    the producer layer's [past; new] K/V) keeps no cache: the graph has no inputs or outputs for it.
    """

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        # Hugging Face attention hands over [b, kv_heads, T, D]; our caches are token-major
        self.owner.new[self.index] = (key_states.transpose(1, 2), value_states.transpose(1, 2))
        past = self.owner.past.get(self.index)
        if past is None:
            return key_states, value_states
        past_k, past_v = past
        keys = torch.cat([past_k.transpose(1, 2).to(key_states.dtype), key_states], dim=2)
        values = torch.cat([past_v.transpose(1, 2).to(value_states.dtype), value_states], dim=2)
        return keys, values

    def get_seq_length(self) -> int:
        return self.owner.total

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.total, 0

    def get_max_length(self) -> int:
        return self.owner.total


class ConcatCache(Cache):
    """Cache object for one traced forward pass: past K/V are graph inputs, new K/V graph outputs.

    `past` maps a decoder layer index to its past (keys, values) `[b, S, kv_heads, D]`; layers
    that own no cache are absent from it.
    """

    def __init__(self, past: dict[int, tuple[torch.Tensor, torch.Tensor]], total: int, num_layers: int) -> None:
        self.past = past
        self.total = total
        self.new: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers
        super().__init__(layers=[_ConcatLayer(self, i) for i in range(num_layers)])


@dataclasses.dataclass(frozen=True)
class LayerCache:
    """The per-token K/V shape one decoder layer writes: `[kv_heads, key_dim]` and `[kv_heads, value_dim]`."""

    kv_heads: int
    key_dim: int
    value_dim: int

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

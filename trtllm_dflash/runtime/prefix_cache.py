"""Prefix caching: what a prompt's prefix left in the caches, kept so a later prompt skips its prefill.

A prompt is cut into blocks of `block_tokens` tokens; block i is named by a hash of every token up
to its end (a chain: the block's own tokens and its parent's name), as in vLLM's automatic prefix
caching. Causal attention makes the K/V at a position a function of the tokens up to it, so a
block's target K/V, and the drafter's context K/V projected from the target's features there, are
the same for every prompt that starts with those tokens. A hybrid target's linear-attention layers
keep no per-position K/V but one recurrent / convolution state, so a block may also carry the state
after its last token; a hybrid prompt can only resume at a block that has one. The states kept are
those at a stored prompt's last whole block and at the block where a prompt left the cached blocks
(where prompts sharing a prefix part ways, e.g. after a system prompt): the first prompt of a
shared prefix stores its blocks, the second marks where they part, and the third resumes there.

Entries are copies (`PrefixBlock`, made by `Runtime.export_prefix`), not views of a live slot: a
request leaves and its slot is given to another at any time, and a restore (`Runtime.import_prefix`)
copies them into the joining request's own slot. Memory is bounded by `capacity_bytes`: the least recently used
blocks go first, and a lookup refreshes a chain from its deepest block to its root, so a root is
never evicted before the blocks that extend it.
"""

from __future__ import annotations

import array
import collections
import dataclasses
import hashlib
from typing import Sequence

import torch

DEFAULT_BLOCK_TOKENS = 64
_ROOT = b"dflash-prefix-v1"


@dataclasses.dataclass
class PrefixBlock:
    """Copies of one row's caches for token positions [start, end).

    `target[i]` / `drafter[i]`: keys `[end - start, kv_heads, key_dim]` and values of layer i (None
    for a layer that keeps no cache); `state`: a hybrid target's linear-attention states after
    token end - 1, by layer (None: none kept).
    """

    start: int
    end: int
    target: list[tuple[torch.Tensor, torch.Tensor] | None]
    drafter: list[tuple[torch.Tensor, torch.Tensor] | None] | None = None
    state: dict[int, tuple[torch.Tensor, ...]] | None = None

    @property
    def nbytes(self) -> int:
        tensors = [t for pair in self.target + (self.drafter or []) if pair is not None for t in pair]
        tensors += [t for states in (self.state or {}).values() for t in states]
        return sum(t.nbytes for t in tensors)


@dataclasses.dataclass
class PrefixCacheStats:
    lookups: int = 0
    hits: int = 0  # lookups that restored at least one block
    hit_tokens: int = 0  # prompt tokens restored instead of prefilled
    stored_blocks: int = 0
    evicted_blocks: int = 0


class PrefixCache:
    """An LRU of prompt blocks, bounded by `capacity_bytes` (the decoding loop fills and reads it)."""

    def __init__(self, capacity_bytes: int, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> None:
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        self.capacity_bytes = int(capacity_bytes)
        self.block_tokens = int(block_tokens)
        self.blocks: collections.OrderedDict[bytes, PrefixBlock] = collections.OrderedDict()  # oldest first
        self.nbytes = 0
        self.stats = PrefixCacheStats()

    def names(self, tokens: Sequence[int], count: int, salt: str | None = None) -> list[bytes]:
        """The chained names of the first `count` whole blocks of `tokens`; a `salt` (a request's
        cache_salt, or its tenant's) is mixed into the root, so only prompts with the same salt
        share blocks (vLLM's semantics): a tenant cannot tell from a hit what another one sent."""
        names, parent = [], _root(salt)
        for i in range(count):
            chunk = array.array("q", tokens[i * self.block_tokens : (i + 1) * self.block_tokens]).tobytes()
            parent = hashlib.blake2b(parent + chunk, digest_size=16).digest()
            names.append(parent)
        return names

    def storable(self, prompt_length: int) -> int:
        """Blocks of a prompt worth keeping: whole blocks, leaving at least its last token to prefill
        (the first generated token is sampled from that token's logits)."""
        return (prompt_length - 1) // self.block_tokens

    def match(self, tokens: Sequence[int], needs_state: bool = False, salt: str | None = None) -> list[PrefixBlock]:
        """The longest run of cached blocks that starts `tokens` (at least one token left over) under
        `salt`, ending at a block with a state when `needs_state`; refreshed in the LRU order."""
        self.stats.lookups += 1
        found = []
        for name in self.names(tokens, self.storable(len(tokens)), salt):
            block = self.blocks.get(name)
            if block is None:
                break
            found.append((name, block))
        if needs_state:
            while found and found[-1][1].state is None:
                found.pop()
        for name, _ in reversed(found):  # deepest first: the root ends up the most recently used
            self.blocks.move_to_end(name)
        if found:
            self.stats.hits += 1
            self.stats.hit_tokens += found[-1][1].end
        return [block for _, block in found]

    def depth(self, tokens: Sequence[int], salt: str | None = None) -> int:
        """Tokens of `tokens` covered by cached blocks under `salt`, states or not (no LRU refresh)."""
        count = 0
        for name in self.names(tokens, self.storable(len(tokens)), salt):
            if name not in self.blocks:
                break
            count += 1
        return count * self.block_tokens

    def __contains__(self, name: bytes) -> bool:
        return name in self.blocks

    def has_state(self, name: bytes) -> bool:
        block = self.blocks.get(name)
        return block is not None and block.state is not None

    def insert(self, name: bytes, block: PrefixBlock) -> None:
        """Keep `block` under `name` (a state is added to a block kept without one), then evict
        least recently used blocks until the cache fits its capacity again."""
        old = self.blocks.pop(name, None)
        if old is not None:
            self.nbytes -= old.nbytes
            if old.state is not None and block.state is None:
                block = old
        if block.nbytes > self.capacity_bytes:
            return
        self.blocks[name] = block
        self.nbytes += block.nbytes
        self.stats.stored_blocks += old is None
        while self.nbytes > self.capacity_bytes:
            _, evicted = self.blocks.popitem(last=False)
            self.nbytes -= evicted.nbytes
            self.stats.evicted_blocks += 1

    def clear(self) -> None:
        self.blocks.clear()
        self.nbytes = 0


def _root(salt: str | None) -> bytes:
    """The parent name of a chain's first block: one for unsalted prompts, one per salt."""
    if salt is None:
        return _ROOT
    return hashlib.blake2b(_ROOT + b"\0salt\0" + salt.encode("utf-8", "surrogatepass"), digest_size=16).digest()

"""The interface between the decoding loop and the thing that runs forward passes.

A runtime owns the weights and the KV caches of the target and the drafter for up to
`max_batch` sequences, one cache slot each. The decoding loop owns everything else: which
requests hold which slot, their lengths, their tokens. A request keeps its slot from admission to
finish, so every call is handed its batch's slots (`Slots`: batch row i works on slot ids[i]) and
nothing is ever moved to keep a batch packed; a plain `slice(a, b)` means slots a..b-1. Caches are
indexed by absolute position, so the loop rolls back rejected tokens simply by not advancing lengths.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from typing import Callable, Protocol

import torch

from trtllm_dflash import ops
from trtllm_dflash.config import DrafterConfig
from trtllm_dflash.contracts import names
from trtllm_dflash.modeling.slots import Slots
from trtllm_dflash.ops import reference, rng
from trtllm_dflash.runtime.prefix_cache import PrefixBlock


@dataclasses.dataclass
class TargetOutput:
    """Logits `[b, T, V]` (or `[b, 1, V]` when only one position per row was asked for) and the
    tapped hidden states `[b, T, taps * H]` (None without a drafter)."""

    logits: torch.Tensor
    features: torch.Tensor | None


@dataclasses.dataclass
class VerifyOutput:
    """One target pass with its verification: accepted drafts `[b]`, bonus token `[b]` (both on the
    device) and the tapped hidden states of every position `[b, T, taps * H]` (None without a drafter)."""

    accepted: torch.Tensor
    bonus: torch.Tensor
    features: torch.Tensor | None


class LogitMask(Protocol):
    """Masks a verify pass's logits (a grammar's: runtime/grammar.py BlockMasks)."""

    def apply(self, logits: torch.Tensor) -> torch.Tensor: ...


class DraftConstraint(Protocol):
    """Masks a drafter pass's logits `[b, B-1, V]` position by position (runtime/grammar.py)."""

    def __call__(self, logits: torch.Tensor) -> torch.Tensor: ...


class Runtime(abc.ABC):
    """Forward passes of a target (and optionally a DFlash drafter) over a batch of rows."""

    device: torch.device
    vocab_size: int
    drafter_config: DrafterConfig | None
    max_batch: int = 0
    capacity: int = 0

    @property
    def has_drafter(self) -> bool:
        return self.drafter_config is not None

    @property
    def is_hybrid(self) -> bool:
        """Whether some target layers carry a recurrent state (linear attention) that `commit` selects per row."""
        return False

    @abc.abstractmethod
    def allocate(self, max_batch: int, capacity: int) -> None:
        """(Re)allocate caches for `max_batch` slots of `capacity` token positions each."""

    @abc.abstractmethod
    def target_forward(
        self,
        slots: Slots | slice,
        tokens: torch.Tensor,
        starts: torch.Tensor,
        span: int,
        logits_at: torch.Tensor | None = None,
    ) -> TargetOutput:
        """Run the target on `tokens [b, T]` at positions starts[r] + t, writing their K/V into slots.ids[r].

        Queries see keys at positions <= their own (slots before starts[r] hold the committed
        prefix). `span` bounds the positions touched (max over rows of starts + T), so the
        runtime need not read the lengths back from the device. With `logits_at [b]`, logits are
        computed only at that index of each row (prefill), and the row's tokens after it are padding.
        """

    def commit(self, slots: Slots | slice, kept: torch.Tensor) -> None:
        """After a verify pass: batch row r keeps the first kept[r] (>= 1) of its tokens.

        Attention caches need nothing (slots past a row's length are overwritten later); layers
        with a recurrent state (linear attention) take the state after the kept tokens here.
        """

    # ------------------------------------------------------------------ prefix caching (runtime/prefix_cache.py)

    @property
    def masks_logits(self) -> bool:
        """Whether target_verify applies a grammar's mask (`allowed`): not where the target verifies
        inside its graph or engine and hands no logits out."""
        return True

    def prefix_cache_refusal(self) -> str | None:
        """Why this runtime cannot export and import prompt prefixes (None: it can)."""
        return f"the {type(self).__name__} runtime does not export its caches"

    def keep_prefix_state(self, slots: Slots | slice, lengths: list[tuple[int, ...]]) -> None:
        """Before a prefill of `slots`: keep each slot's recurrent state after each of lengths[r] prompt
        tokens (at most two), for `export_prefix(..., state=True)`. Only hybrid targets keep such a state."""

    def export_prefix(self, slot: int, start: int, end: int, state: bool = False) -> PrefixBlock:
        """Copies of slot `slot`'s target and drafter caches at positions [start, end) (and, for a hybrid
        target with `state`, the recurrent state `keep_prefix_state` kept at `end`)."""
        raise NotImplementedError(self.prefix_cache_refusal())

    def import_prefix(self, slot: int, blocks: list[PrefixBlock]) -> None:
        """Write consecutive blocks from position 0 into slot `slot`'s caches (the last block's state
        becomes the slot's recurrent state), so that a prefill can start at blocks[-1].end."""
        raise NotImplementedError(self.prefix_cache_refusal())

    @abc.abstractmethod
    def draft_forward(
        self,
        slots: Slots | slice,
        block: torch.Tensor,
        ctx_features: torch.Tensor,
        new_counts: torch.Tensor,
        cache_lens: torch.Tensor,
    ) -> torch.Tensor:
        """One drafter pass over `block [b, B]` (anchor + masks); returns logits `[b, B-1, V]`.

        The first new_counts[r] rows of `ctx_features [b, n, F]` are appended to the draft cache
        at positions cache_lens[r]...; the block's own keys/values are not kept.
        """

    def propose(
        self,
        slots: Slots | slice,
        block: torch.Tensor,
        ctx_features: torch.Tensor,
        new_counts: torch.Tensor,
        cache_lens: torch.Tensor,
        sampling: "SamplingTensors",
        constrain: "DraftConstraint | None" = None,
    ) -> "Proposal":
        """Draft tokens for block positions 1..B-1 of `block [b, B]` and their distribution q.

        The drafter's pass is `draft_forward` (same arguments); the block's anchor sits at
        position cache_lens + new_counts. The default is DFlash V1's head: argmax of the draft
        logits, or a sample from their processed distribution. Runtimes of V2 drafters override it
        with the candidate selector. `constrain` (a grammar's, runtime/grammar.py) masks the draft
        logits of its rows before the head (V1 heads only; a V2 selector proposes unconstrained).
        """
        logits = self.draft_forward(slots, block, ctx_features, new_counts, cache_lens)
        if constrain is not None:
            logits = constrain(logits)
        return self.draft_head(logits, sampling, draft_positions(cache_lens + new_counts, logits.shape[1]))

    def draft_head(self, logits: torch.Tensor, sampling: "SamplingTensors", positions: torch.Tensor) -> "Proposal":
        """DFlash V1's head on draft logits `[b, B-1, V]` at absolute `positions`: `sample_drafts`.
        Runtimes with their own sampling kernels override it (the torch runtime's shortlist)."""
        return sample_drafts(logits, sampling, positions)

    def target_verify(
        self,
        slots: Slots | slice,
        tokens: torch.Tensor,
        starts: torch.Tensor,
        span: int,
        draft_probs: torch.Tensor | None,
        sampling: "SamplingTensors",
        logits_at: torch.Tensor | None = None,
        allowed: "LogitMask | None" = None,
    ) -> VerifyOutput:
        """The target pass and its verification, as the decoding loop needs them.

        Verify: `tokens` is the block (anchor + drafts) at positions starts[r] + t. Prefill
        (`logits_at`): the block is one token, the last prompt token at position starts[r] +
        logits_at[r], so the result's bonus is the first generated token. The default runs
        `target_forward` then `verify`; runtimes whose target verifies inside (the plugin target
        graph) override it and never materialise the logits.

        `allowed` (runtime/grammar.py BlockMasks): the tokens a grammar allows at each position
        (T = 1 with `logits_at`); the rest get probability 0 before verification.
        """
        out = self.target_forward(slots, tokens, starts, span, logits_at)
        logits = out.logits if allowed is None else allowed.apply(out.logits)
        if logits_at is None:
            block, start = tokens, starts
        else:
            block, start = tokens.gather(1, logits_at.view(-1, 1)), starts + logits_at
        accepted, bonus = self.verify(logits, block, draft_probs, sampling, start)
        return VerifyOutput(accepted, bonus, out.features)

    def verify(
        self,
        target_logits: torch.Tensor,
        block: torch.Tensor,
        draft_probs: torch.Tensor | None,
        sampling: "SamplingTensors",
        starts: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Accepted draft count and bonus token per row (on the device)."""
        return ops.verify_block(
            target_logits,
            block,
            draft_probs,
            sampling.temperature,
            sampling.top_k,
            sampling.top_p,
            sampling.seed,
            starts,
        )


@dataclasses.dataclass(frozen=True)
class LayerShape:
    """Per-token K/V shape of one layer: keys `[kv_heads, key_dim]`, values `[kv_heads, value_dim]`."""

    kv_heads: int
    key_dim: int
    value_dim: int


@dataclasses.dataclass(frozen=True)
class CacheShape:
    """Per-token K/V shape of one model: layers x kv_heads x head_dim.

    `layers`, when given, is the shape of each layer (None: the layer keeps no cache, e.g. Gemma 4's
    KV-sharing layers) and overrides the uniform kv_heads/head_dim.
    """

    num_layers: int
    kv_heads: int
    head_dim: int
    layers: tuple[LayerShape | None, ...] | None = None

    @classmethod
    def of(cls, graph: dict) -> "CacheShape":
        """From a build's graph description: `cache_layers` per layer, or (older builds) the uniform
        `num_layers`, `kv_heads`, `head_dim`."""
        num_layers, kv_heads, head_dim = int(graph["num_layers"]), int(graph["kv_heads"]), int(graph["head_dim"])
        per_layer = graph.get("cache_layers")
        if not per_layer:
            return cls(num_layers, kv_heads, head_dim)
        layers = tuple(LayerShape(**layer) if layer is not None else None for layer in per_layer)
        return cls(num_layers, kv_heads, head_dim, layers)

    def layer_shapes(self) -> tuple[LayerShape | None, ...]:
        if self.layers is not None:
            return self.layers
        return (LayerShape(self.kv_heads, self.head_dim, self.head_dim),) * self.num_layers


class CachedRuntime(Runtime):
    """A runtime whose target and drafter keep their K/V in StaticKVCaches (slot == position)."""

    target_cache = None
    draft_cache = None

    def allocate_caches(
        self,
        max_batch: int,
        capacity: int,
        target: CacheShape,
        drafter: CacheShape | None,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        from trtllm_dflash.modeling.kv_cache import StaticKVCache

        def cache(shape: CacheShape) -> StaticKVCache:
            layers = shape.layer_shapes()
            allocated = StaticKVCache.lazy(len(layers), max_batch, capacity, dtype, device)
            for i, layer in enumerate(layers):
                if layer is not None:  # layers without a cache stay unallocated (keys/values None)
                    allocated.allocate_layer(i, layer.kv_heads, layer.key_dim, layer.value_dim)
            return allocated

        self.target_cache = cache(target)
        self.draft_cache = cache(drafter) if drafter is not None else None
        self.max_batch, self.capacity = max_batch, capacity

    def attention_reads_span(self, length: int, batch: int) -> bool:
        """Whether a decode pass of `length` tokens over `batch` rows reads its `span` (else each row
        reads its own length, and a CUDA graph of the pass serves every span: runtime/cuda_graphs.py)."""
        return True

    def padding_start(self, length: int) -> int:
        """Where a CUDA graph's padding row starts its block of `length` (runtime/cuda_graphs.py): the
        row's last slots, which no prompt reaches."""
        return self.capacity - length

    def prefix_cache_refusal(self) -> str | None:
        if self.drafter_config is not None and self.drafter_config.history > 0:
            return (
                f"the drafter sees only its last {self.drafter_config.history} context positions and does not "
                "keep the others, so a prefix's drafter context cannot be reused"
            )
        if self.is_hybrid:
            return f"the {type(self).__name__} runtime does not export the recurrent states of linear-attention layers"
        return None

    def export_prefix(self, slot: int, start: int, end: int, state: bool = False) -> PrefixBlock:
        positions = slice(start, end)
        copy = lambda cache: [  # noqa: E731
            (layer.keys[slot, positions].clone(), layer.values[slot, positions].clone()) if layer.keys is not None else None
            for layer in cache.layers
        ]
        drafter = copy(self.draft_cache) if self.draft_cache is not None else None
        return PrefixBlock(start, end, copy(self.target_cache), drafter)

    def import_prefix(self, slot: int, blocks: list[PrefixBlock]) -> None:
        for block in blocks:
            _write_slots(self.target_cache, slot, block.start, block.end, block.target)
            if self.draft_cache is not None:
                _write_slots(self.draft_cache, slot, block.start, block.end, block.drafter)


def contiguous_slots(method):
    """For runtimes whose graphs or engines take contiguous cache rows (ONNX Runtime, TensorRT): the
    method gets its slots as a slice; a batch whose slots are not one run is run as one call per run
    of consecutive slots, every batch-first argument cut to the run's rows, the outputs joined in
    batch order. Costs a call per run; the decoding loop keeps a batch in slot order and hands out
    the lowest free slot, so a batch has as many runs as gaps between its slots."""

    @functools.wraps(method)
    def wrapper(self, slots, *args, **kwargs):
        slots = Slots.of(slots, self.device)
        if slots.run is not None:
            return method(self, slots.run, *args, **kwargs)
        parts = list(slots.parts())
        outputs = []
        for i, (rows, part) in enumerate(parts):
            out = method(self, part.run, *(_rows_of(a, rows) for a in args), **{k: _rows_of(v, rows) for k, v in kwargs.items()})
            # a runtime may hand out views of output buffers the next call reuses: keep copies
            outputs.append(out if i == len(parts) - 1 else _copied(out))
        return join_rows(outputs)

    return wrapper


def _rows_of(value, rows: slice):
    """Batch rows `rows` of an argument: tensors and sampling tensors batch-first, dicts of them,
    objects that select their own rows (grammar masks); anything else as is."""
    if hasattr(value, "select_rows"):
        return value.select_rows(rows)
    if isinstance(value, torch.Tensor):
        return value[rows]
    if isinstance(value, SamplingTensors):
        return value.slice(rows)
    if isinstance(value, dict):
        return {k: _rows_of(v, rows) for k, v in value.items()}
    return value


def _copied(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if dataclasses.is_dataclass(value):
        return type(value)(**{f.name: _copied(getattr(value, f.name)) for f in dataclasses.fields(value)})
    return value


def join_rows(parts: list):
    """Concatenate per-run outputs along the batch: tensors, None, or dataclasses of those."""
    first = parts[0]
    if first is None:
        return None
    if isinstance(first, torch.Tensor):
        return torch.cat(parts)
    fields = {f.name: join_rows([getattr(p, f.name) for p in parts]) for f in dataclasses.fields(first)}
    return type(first)(**fields)


def _write_slots(cache, row: int, start: int, end: int, layers: list) -> None:
    """Copy saved per-layer K/V into a StaticKVCache slot at [start, end); a lazy cache's layer is
    allocated with the saved shape if it has not written yet."""
    for i, saved in enumerate(layers):
        if saved is None:
            continue
        keys, values = saved
        if cache.layers[i].keys is None:
            cache.allocate_layer(i, keys.shape[1], keys.shape[2], values.shape[2])
        cache.layers[i].keys[row, start:end] = keys
        cache.layers[i].values[row, start:end] = values


def verifying_graph_inputs(
    tokens: torch.Tensor,
    starts: torch.Tensor,
    draft_probs: torch.Tensor | None,
    sampling: "SamplingTensors",
    logits_at: torch.Tensor | None,
    zero_draft_probs: Callable[[int, int], torch.Tensor],
) -> dict[str, torch.Tensor]:
    """The inputs of a verifying (plugin) target graph other than its caches, by name.

    The verified block is every position of `tokens`, or at prefill (`logits_at`) the last prompt
    token; rows without draft distributions read q = 0 from `zero_draft_probs(batch, rows)`, which
    has at least one row (a block of one verifies no drafts).
    """
    batch, count = tokens.shape
    index = logits_at.view(-1, 1) if logits_at is not None else torch.arange(count, device=tokens.device).expand(batch, -1)
    if draft_probs is None:
        draft_probs = zero_draft_probs(batch, max(index.shape[1] - 1, 1))
    return {
        names.INPUT_IDS: tokens,
        names.STARTS: starts,
        names.LOGIT_INDEX: index,
        names.DRAFT_PROBS: draft_probs,
        names.TEMPERATURE: sampling.temperature,
        names.TOP_K: sampling.top_k,
        names.TOP_P: sampling.top_p,
        names.SEED: sampling.seed,
    }


@dataclasses.dataclass
class Proposal:
    """A drafted block: tokens `[b, B-1]` at block positions 1..B-1 and the draft distribution q
    `[b, B-1, V]` verification tests them against (None when every row is greedy)."""

    tokens: torch.Tensor
    probs: torch.Tensor | None


def draft_positions(anchor_positions: torch.Tensor, count: int) -> torch.Tensor:
    """Absolute positions `[b, count]` of the drafted tokens after each row's anchor."""
    return anchor_positions.view(-1, 1) + torch.arange(1, count + 1, device=anchor_positions.device)


def sample_drafts(logits: torch.Tensor, sampling: "SamplingTensors", positions: torch.Tensor) -> Proposal:
    """DFlash V1's head: argmax of the draft logits `[b, B-1, V]`, or a sample from the processed q."""
    if sampling.all_greedy:
        return Proposal(reference.argmax(logits), None)
    s = sampling
    tokens, probs = reference.sample_tokens(
        logits, s.temperature, s.top_k, s.top_p, s.seed, positions, rng.STREAM_DRAFT, branches=s.branches
    )
    return Proposal(tokens, probs)


@dataclasses.dataclass
class SamplingTensors:
    """Per-row sampling parameters on the runtime's device.

    The host's copies of the rows' parameters (`greedy`, `top_ks`, `top_ps`), kept by whoever knows
    them (the decoding loop), let sampling choose its branches (`all_greedy`, `branches`) without
    reading the tensors back: on a GPU each such read stalls the host until the device has caught up,
    between the draft and the verify pass, and would stop an async-scheduled loop (decoding.py).
    """

    temperature: torch.Tensor  # float32 [b]; 0 = greedy
    top_k: torch.Tensor  # int64 [b]; 0 = off
    top_p: torch.Tensor  # float32 [b]; 1 = off
    seed: torch.Tensor  # int64 [b]
    greedy: tuple[bool, ...] | None = dataclasses.field(default=None, compare=False)
    top_ks: tuple[int, ...] | None = dataclasses.field(default=None, compare=False)
    top_ps: tuple[float, ...] | None = dataclasses.field(default=None, compare=False)

    @property
    def all_greedy(self) -> bool:
        if self.greedy is not None:
            return all(self.greedy)
        return bool((self.temperature <= 0).all())

    @property
    def branches(self) -> reference.SamplingBranches | None:
        """Which parts of sampling some row needs, from the host's copies (None where one is missing)."""
        if self.greedy is None or self.top_ks is None or self.top_ps is None:
            return None
        return reference.SamplingBranches(any(self.greedy), max(self.top_ks, default=0), any(p < 1 for p in self.top_ps))

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.temperature, self.top_k, self.top_p, self.seed)

    def _host(self) -> tuple[tuple | None, ...]:
        return (self.greedy, self.top_ks, self.top_ps)

    def select(self, index: torch.Tensor, host_index: list[int] | None = None) -> "SamplingTensors":
        """Rows `index`; `host_index` (the same rows as a list) keeps the host's copies."""
        keep = lambda rows: tuple(rows[i] for i in host_index) if rows is not None and host_index is not None else None  # noqa: E731
        return SamplingTensors(*(t.index_select(0, index) for t in self.tensors()), *(keep(rows) for rows in self._host()))

    def slice(self, rows: slice) -> "SamplingTensors":
        return SamplingTensors(*(t[rows] for t in self.tensors()), *(h[rows] if h is not None else None for h in self._host()))

    @staticmethod
    def cat(parts: list["SamplingTensors"]) -> "SamplingTensors":
        def joined(column: list) -> tuple | None:
            return tuple(value for part in column for value in part) if all(c is not None for c in column) else None

        host = [joined(list(column)) for column in zip(*(p._host() for p in parts))]
        return SamplingTensors(*(torch.cat(ts) for ts in zip(*(p.tensors() for p in parts))), *host)

"""Which requests a decoding step serves, and what becomes of them: the queues, the cache slots, the
prefill budget, the prefix cache, cancellation, and the stops and limits of each request.

The scheduler owns the requests and the batch's device state; the speculative step (decoding.py)
owns the arithmetic over a batch and never sees a request. Per step the decoder asks for a prefill
chunk (`plan_prefill`), runs its pass and hands the result back (`prefilled`); then, if requests
are live, it runs one speculative step over `batch` / `live_slots` and hands back each row's
tokens (`decoded`). Between steps requests join (in-flight batching) and leave.

A request owns one cache slot from admission to finish, the lowest free one (runtime/base.py
`Slots`), and the batch is the live requests in slot order: a finish, a cancellation or a
shortest-first reorder moves no cache, only rows of the small per-request tensors in `batch`.
A long prompt joins in chunks (step_schedule.py `PrefillBudget`), so live rows keep decoding
while it is written; with a prefix cache (prefix_cache.py) a joining prompt first restores its
longest cached prefix into its slot and prefills only the rest.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import secrets
import time
from collections import deque
from typing import Any, Iterable

import torch

from trtllm_dflash.contracts.request_limits import MIN_TEMPERATURE
from trtllm_dflash.modeling.slots import index_tensor
from trtllm_dflash.runtime.base import Runtime, SamplingTensors, Slots
from trtllm_dflash.runtime.prefix_cache import PrefixCache
from trtllm_dflash.runtime.requests import Request, SequenceResult, StepEvent
from trtllm_dflash.runtime.step_schedule import PrefillBudget, Prefilling
from trtllm_dflash.sampling_params import SamplingParams


class Live:
    """Host-side state of a live request."""

    def __init__(self, request: Request, result: SequenceResult, slot: int) -> None:
        self.request = request
        self.result = result
        self.slot = slot  # its cache slot, from admission to finish
        self.started = request.arrival
        self.start = len(request.prompt_ids)  # position of the anchor == committed target length
        self.drafted = False  # a drafter pass has read its prompt's features (its prompt blocks can be stored)


@dataclasses.dataclass
class BatchState:
    """Device state of the live requests, batch row i <-> Scheduler.live[i]: what a speculative step reads."""

    anchor: torch.Tensor  # [b] the last committed token: the next block's first
    starts: torch.Tensor  # [b] its position, the committed target length
    ctx_features: torch.Tensor | None  # [b, n, F] target features the drafter has not read yet
    ctx_counts: torch.Tensor  # [b] how many of those n rows are real
    sampling: SamplingTensors | None

    @classmethod
    def empty(cls, device: torch.device) -> "BatchState":
        none = torch.zeros(0, dtype=torch.long, device=device)
        return cls(none, none, None, none, None)

    def select(self, keep: list[int]) -> None:
        """Keep batch rows `keep`, in that order."""
        index = index_tensor(keep, self.anchor.device)
        self.anchor, self.starts = self.anchor.index_select(0, index), self.starts.index_select(0, index)
        self.sampling = self.sampling.select(index, keep)
        if self.ctx_features is not None:
            self.ctx_features = self.ctx_features.index_select(0, index)
            self.ctx_counts = self.ctx_counts.index_select(0, index)

    def append(self, joining: "BatchState") -> None:
        """Rows of requests that went live, after the others."""
        self.anchor = torch.cat([self.anchor, joining.anchor])
        self.starts = torch.cat([self.starts, joining.starts])
        self.sampling = joining.sampling if self.sampling is None else SamplingTensors.cat([self.sampling, joining.sampling])
        if joining.ctx_features is not None:
            self.ctx_features = _cat_padded(self.ctx_features, joining.ctx_features)
            self.ctx_counts = torch.cat([self.ctx_counts, joining.ctx_counts])


@dataclasses.dataclass
class PrefillChunk:
    """One prefill pass: the first `len(counts)` prefilling requests, counts[i] prompt tokens each."""

    pending: list[Prefilling]
    counts: list[int]

    def inputs(self, device: torch.device) -> tuple[Slots, torch.Tensor, torch.Tensor, int, SamplingTensors, torch.Tensor]:
        """slots, tokens `[b, widest chunk]` (padded), starts, span, sampling, and the index of each row's last token."""
        tokens = torch.zeros(len(self.pending), max(self.counts), dtype=torch.long)
        for i, (pending, count) in enumerate(zip(self.pending, self.counts)):
            tokens[i, :count] = torch.tensor(pending.request.prompt_ids[pending.done : pending.done + count])
        starts = torch.tensor([p.done for p in self.pending], device=device)
        span = max(p.done + c for p, c in zip(self.pending, self.counts))
        last = torch.tensor(self.counts, device=device) - 1
        slots = Slots.of([p.slot for p in self.pending], device)
        return slots, tokens.to(device), starts, span, SamplingTensors.cat([p.sampling for p in self.pending]), last


class Scheduler:
    """The requests of one Decoder (see the module docstring)."""

    def __init__(
        self,
        runtime: Runtime,
        max_batch: int,
        max_context: int,
        speculative: bool,
        prefill_budget: PrefillBudget,
        prefix_cache: PrefixCache | None,
    ) -> None:
        self.runtime = runtime  # for its caches' slots (prefix import/export), never a forward pass
        self.max_context = max_context
        self.speculative = speculative
        self.prefill_budget = prefill_budget
        self.prefix_cache = prefix_cache
        self.device = runtime.device
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Prefilling] = []
        self.live: list[Live] = []  # in slot order: the step's batch
        self.live_slots = Slots.of((), self.device)
        self.free_slots = list(range(max_batch))  # a heap: admission takes the lowest
        self.batch = BatchState.empty(self.device)
        self._ids = itertools.count()
        self._prefix_stores: dict[int, tuple[int, int, tuple[int, ...]]] = {}  # id(request) -> prompt positions to store

    # ------------------------------------------------------------------ requests

    def submit(self, request: Request) -> Any:
        if request.request_id is None:
            request.request_id = next(self._ids)
        request.arrival = time.perf_counter()
        self.waiting.append(request)
        return request.request_id

    def cancel(self, request_id: Any) -> SequenceResult | None:
        """See Decoder.cancel."""
        for request in self.waiting:
            if request.request_id == request_id:
                self.waiting.remove(request)
                return None
        for i, pending in enumerate(self.prefilling):
            if pending.request.request_id == request_id:
                del self.prefilling[i]
                self._prefix_stores.pop(id(pending.request), None)
                heapq.heappush(self.free_slots, pending.slot)
                return None
        for i, live in enumerate(self.live):
            if live.request.request_id == request_id:
                live.result.finish_reason = "cancelled"
                live.result.elapsed = time.perf_counter() - live.started
                self._drop([i])
                return live.result
        return None

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.live or self.prefilling)

    # ------------------------------------------------------------------ prefill

    def plan_prefill(self) -> PrefillChunk | None:
        """Admit waiting requests into free slots, then size this step's chunk: at most the budget's
        prompt tokens, in the prefilling requests' order (shortest remaining first with a prefill share)."""
        self._start_prefills()
        if self.prefill_budget.share is not None:
            # the step's budget goes to the prompts that finish soonest: a short prompt that arrived behind
            # a long one goes live without waiting for it (a stable sort; the slots stay)
            self.prefilling.sort(key=lambda p: p.remaining)
        counts, budget = [], self.prefill_budget.tokens(decoding=bool(self.live))
        for index, pending in enumerate(self.prefilling):
            if budget <= 0:
                break
            if pending.chunks == 0 and pending.done == 0:  # its first chunk: restore its cached prefix now, the latest moment
                pending.done = pending.cached = self._restore_prefix(pending.slot, pending.request)
            count = min(pending.remaining, budget)
            # every row of the pass is padded to the widest chunk at its own positions: a row near the end of
            # its cache slot next to a wider chunk would write past it, so such a row waits for the next step
            width = max(counts + [count])
            if any(p.done + width > self.runtime.capacity for p in self.prefilling[: index + 1]):
                break
            counts.append(count)
            budget -= count
        return PrefillChunk(self.prefilling[: len(counts)], counts) if counts else None

    def prefilled(self, chunk: PrefillChunk, first_tokens: torch.Tensor, features: torch.Tensor | None) -> list[StepEvent]:
        """The chunk's pass ran: `first_tokens [b]` sampled at each row's last token, `features` its taps.
        Requests whose prompt is complete go live (they lead: the budget went in their order)."""
        for i, (pending, count) in enumerate(zip(chunk.pending, chunk.counts)):
            pending.done += count
            pending.chunks += 1
            if self.speculative:  # copied: a runtime may reuse its output buffers in the next pass
                pending.features.append(features[i, :count].clone())
        complete = sum(1 for p in chunk.pending if p.remaining == 0)
        return self._go_live(complete, first_tokens[:complete]) if complete else []

    def _start_prefills(self) -> None:
        """Waiting requests take the free slots, lowest first, nothing prefilled yet: oldest first, or
        with a prefill share shortest first (a short prompt is not queued behind long ones)."""
        while self.waiting and self.free_slots:
            if self.prefill_budget.share is None:
                request = self.waiting.popleft()
            else:
                request = min(self.waiting, key=lambda r: len(r.prompt_ids))
                self.waiting.remove(request)
            slot = heapq.heappop(self.free_slots)
            self.prefilling.append(Prefilling(request, _sampling_tensors([request.params], self.device), slot))

    def _go_live(self, count: int, first_token: torch.Tensor) -> list[StepEvent]:
        """The first `count` prefilling requests (complete prompts) become live, joining the batch in slot order."""
        joining, self.prefilling = self.prefilling[:count], self.prefilling[count:]
        first = len(self.live)
        lengths = torch.tensor([len(p.request.prompt_ids) for p in joining], device=self.device)
        features = counts = None
        if self.speculative:  # the drafter reads the prefilled prompt's features at the row's first draft
            prompts = [torch.cat(p.features) for p in joining]
            width = max(f.shape[0] for f in prompts)
            features = torch.stack([torch.nn.functional.pad(f, (0, 0, 0, width - f.shape[0])) for f in prompts])
            counts = lengths - torch.tensor([p.cached for p in joining], device=self.device)  # a restored prefix is in the drafter's cache
        self.batch.append(BatchState(first_token, lengths, features, counts, SamplingTensors.cat([p.sampling for p in joining])))
        events, finished = [], []
        for i, (pending, token) in enumerate(zip(joining, first_token.tolist())):
            request = pending.request
            result = SequenceResult(
                request.request_id, list(request.prompt_ids), num_target_forwards=pending.chunks, cached_prompt_tokens=pending.cached
            )
            result.time_to_first_token = time.perf_counter() - request.arrival
            live = Live(request, result, pending.slot)
            self.live.append(live)
            new = self._commit(live, [token])
            events.append(StepEvent(request.request_id, new, result.finish_reason is not None, result))
            if result.finish_reason is not None:
                finished.append(first + i)
        self._drop(finished)
        self._select(sorted(range(len(self.live)), key=lambda i: self.live[i].slot))  # slot order: few gaps, few runs
        return events

    # ------------------------------------------------------------------ decoding

    def span(self, verified: int) -> int:
        """The positions a verify pass of `verified` tokens per row touches (from the host's lengths)."""
        return max(live.start for live in self.live) + verified

    def decoded(
        self, tokens: list[list[int]], draft_len: int, drafter_ran: bool = True, rows: list[Live] | None = None
    ) -> tuple[list[StepEvent], int]:
        """A speculative step committed tokens[i] (accepted drafts + bonus) to batch row i: append them
        to the requests, end those at a stop or a limit (their slots are freed). Returns the events
        and the tokens committed. `drafter_ran`: the step's drafter pass read every row's context.
        `rows`: the step's batch when it was launched, if the batch has changed since (async
        scheduling): rows no longer live (finished or cancelled meanwhile) are skipped."""
        events, finished, committed = [], [], 0
        index = {id(live): i for i, live in enumerate(self.live)}
        for live, row in zip(self.live if rows is None else rows, tokens):
            i = index.get(id(live))
            if i is None:
                continue  # it ended while the step ran: what the step decoded for it is dropped
            live.drafted = live.drafted or drafter_ran
            live.start += len(row)
            live.result.num_target_forwards += 1
            new = self._commit(live, row)
            live.result.acceptance_lengths.append(len(new))
            live.result.draft_lengths.append(draft_len)
            committed += len(new)
            events.append(StepEvent(live.request.request_id, new, live.result.finish_reason is not None, live.result))
            if live.result.finish_reason is not None:
                finished.append(i)
        self._drop(sorted(finished))
        self._store_prefixes(range(len(self.live)))
        return events, committed

    def _commit(self, live: Live, tokens: list[int]) -> list[int]:
        """Append this step's tokens to a sequence, cutting at a stop token or a length limit."""
        result, params = live.result, live.request.params
        room = min(params.max_new_tokens - len(result.token_ids), self.max_context - len(result.prompt_ids) - len(result.token_ids))
        new = tokens[: max(room, 0)]
        for k, token in enumerate(new):
            # a stop token is kept and decoding goes on while min_tokens / ignore_eos say it may not end the request
            if token in params.stop_token_ids and params.stops_at(len(result.token_ids) + k + 1):
                new = new[: k + 1]
                result.finish_reason = "stop"
                break
        result.token_ids.extend(new)
        if result.finish_reason is None:
            if len(result.token_ids) >= params.max_new_tokens:
                result.finish_reason = "length"
            elif len(result.prompt_ids) + len(result.token_ids) >= self.max_context:
                result.finish_reason = "context"
        if result.finish_reason is not None:
            result.elapsed = time.perf_counter() - live.started
        return new

    def _drop(self, finished: list[int]) -> None:
        """Finished or cancelled live requests (batch rows `finished`) leave; their slots are free, no cache moves."""
        if not finished:
            return
        self._store_prefixes(finished)  # before their slots are given to others
        for i in finished:
            self._prefix_stores.pop(id(self.live[i].request), None)  # one that never drafted stores nothing
            heapq.heappush(self.free_slots, self.live[i].slot)
        gone = set(finished)
        self._select([i for i in range(len(self.live)) if i not in gone])

    def _select(self, keep: list[int]) -> None:
        """Keep the live requests `keep` (batch rows, in that order) and their rows of device state."""
        self.live = [self.live[i] for i in keep]
        self.batch.select(keep)
        self.live_slots = Slots.of([live.slot for live in self.live], self.device)

    # ------------------------------------------------------------------ prefix caching

    def _restore_prefix(self, slot: int, request: Request) -> int:
        """Copy the prompt's longest cached prefix into its slot; returns the restored length.

        Also notes which of the prompt's blocks to store once the request has drafted (its drafter
        context is projected by the first draft step), and for hybrid targets asks the prefill to
        keep the recurrent state where the stored blocks end.
        """
        cache = self.prefix_cache
        if cache is None:
            return 0
        hybrid = self.runtime.is_hybrid
        blocks = cache.match(request.prompt_ids, needs_state=hybrid, salt=request.cache_salt)
        cached = blocks[-1].end if blocks else 0
        if cached:
            self.runtime.import_prefix(slot, blocks[: cached // cache.block_tokens])
        end = cache.storable(len(request.prompt_ids)) * cache.block_tokens
        # hybrid: also keep the state where the prompt leaves the cached blocks, for the next prompt sharing them
        parting = cache.depth(request.prompt_ids, request.cache_salt) if hybrid else 0
        states = tuple(p for p in {end, parting} if cached < p <= end) if hybrid else ()
        if end > cached:
            self._prefix_stores[id(request)] = (cached, end, states)
        if hybrid:
            self.runtime.keep_prefix_state(Slots.of([slot], self.device), [states])
        return cached

    def _store_prefixes(self, indices: Iterable[int]) -> None:
        """Store the noted prompt blocks of live rows `indices` whose prompt a drafter pass has read
        (its drafter context K/V is projected there; a step that skips the drafter does not)."""
        cache = self.prefix_cache
        if cache is None or not self._prefix_stores:
            return
        size = cache.block_tokens
        for i in indices:
            live = self.live[i]
            if self.speculative and not live.drafted:
                continue  # kept for after its first drafter pass (dropped with the request if none comes)
            noted = self._prefix_stores.pop(id(live.request), None)
            if noted is None:
                continue
            start, end, states = noted
            names = cache.names(live.request.prompt_ids, end // size, live.request.cache_salt)
            for b in reversed(range(start // size, end // size)):  # deepest first: the root is evicted last
                state = (b + 1) * size in states
                if names[b] not in cache or (state and not cache.has_state(names[b])):
                    cache.insert(names[b], self.runtime.export_prefix(live.slot, b * size, (b + 1) * size, state=state))


def _sampling_tensors(params: list[SamplingParams], device: torch.device) -> SamplingTensors:
    seeds = [p.seed if p.seed is not None else secrets.randbits(31) for p in params]
    return SamplingTensors(
        greedy=tuple(p.temperature < MIN_TEMPERATURE for p in params),
        # colder than MIN_TEMPERATURE is argmax (dividing float32 logits by it would overflow)
        temperature=torch.tensor(
            [p.temperature if p.temperature >= MIN_TEMPERATURE else 0.0 for p in params], dtype=torch.float32, device=device
        ),
        top_k=torch.tensor([p.top_k for p in params], dtype=torch.long, device=device),
        top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
        seed=torch.tensor(seeds, dtype=torch.long, device=device),
        top_ks=tuple(int(p.top_k) for p in params),
        top_ps=tuple(float(p.top_p) for p in params),
    )


def _cat_padded(existing: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """Concatenate `[b, n, F]` tensors along rows, zero-padding the token axis to the longer one."""
    if existing is None or existing.shape[0] == 0:
        return new
    width = max(existing.shape[1], new.shape[1])
    pad = lambda t: torch.nn.functional.pad(t, (0, 0, 0, width - t.shape[1]))  # noqa: E731
    return torch.cat([pad(existing), pad(new)])

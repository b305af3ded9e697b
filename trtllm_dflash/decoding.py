"""The decoding loop: prefill, draft, verify, commit, roll back. Written once, for every runtime.

Per step and for the whole batch: the drafter proposes a block from `[anchor, MASK, ...]`, the
target scores the block in one pass, verification (on the device) returns how many drafts each
row accepts and its bonus token, and the host reads that one small tensor. Rows then advance by
different amounts; their caches need no rollback because slots past a row's length are simply
overwritten next step (see runtime/base.py). Rows that finish leave between steps and new
requests join between steps (in-flight batching). A long prompt joins in chunks of at most
`prefill_chunk` tokens per step (chunked prefill), so live rows keep decoding while it is written.
With a prefix cache (runtime/prefix_cache.py) a joining prompt first restores its longest cached
prefix into its row and prefills only the rest.

Without a drafter the same loop decodes autoregressively: the block is just the anchor.
"""

from __future__ import annotations

import dataclasses
import itertools
import secrets
import time
from collections import deque
from typing import Any, Iterable, Mapping

import torch

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.runtime.base import Runtime, SamplingTensors
from trtllm_dflash.runtime.prefix_cache import PrefixCache
from trtllm_dflash.runtime.step_schedule import WHOLE_PROMPTS, Prefilling, PrefillBudget, check_draft_len_schedule, scheduled_draft_len
from trtllm_dflash.contracts.request_limits import DEFAULT_PREFILL_CHUNK, MIN_TEMPERATURE
from trtllm_dflash.sampling_params import SamplingParams, check_prompt_tokens  # SamplingParams is re-exported: decoding.SamplingParams


@dataclasses.dataclass
class Request:
    prompt_ids: list[int]
    params: SamplingParams = SamplingParams()
    request_id: Any = None
    arrival: float = 0.0  # set by Decoder.submit; time to first token counts from here


@dataclasses.dataclass
class SequenceResult:
    """What one request produced."""

    request_id: Any
    prompt_ids: list[int]
    token_ids: list[int] = dataclasses.field(default_factory=list)
    acceptance_lengths: list[int] = dataclasses.field(default_factory=list)
    # draft tokens the target verified in each of those steps (block size - 1, or fewer under a draft_len_schedule)
    draft_lengths: list[int] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None  # "stop", "length" (max_new_tokens) or "context"
    cached_prompt_tokens: int = 0  # prompt tokens restored from the prefix cache instead of prefilled
    num_target_forwards: int = 0
    time_to_first_token: float = 0.0
    elapsed: float = 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return sum(self.acceptance_lengths) / len(self.acceptance_lengths) if self.acceptance_lengths else 0.0

    @property
    def tokens_per_second(self) -> float:
        return len(self.token_ids) / self.elapsed if self.elapsed > 0 else 0.0


@dataclasses.dataclass
class StepEvent:
    """Tokens committed for one request in one step (for streaming)."""

    request_id: Any
    new_token_ids: list[int]
    finished: bool
    result: SequenceResult


@dataclasses.dataclass
class StepStats:
    """One decoding step of the whole batch."""

    batch_size: int
    draft_seconds: float
    verify_seconds: float
    committed: int


class _Live:
    """Host-side state of a live row."""

    def __init__(self, request: Request, result: SequenceResult) -> None:
        self.request = request
        self.result = result
        self.started = request.arrival
        self.start = len(request.prompt_ids)  # position of the anchor == committed target length


class Decoder:
    """Batched DFlash speculative decoding (or autoregressive decoding without a drafter).

    `max_context` bounds prompt + generated tokens per sequence; `block_size` defaults to the
    drafter's. `draft_len_schedule` ({live rows from: draft tokens}, e.g. {1: 15, 8: 7, 32: 0})
    verifies fewer drafted tokens when many rows share a step, where verifying long blocks costs
    more than it gains; 0 verifies the anchor alone (the drafter still runs, on its smallest
    block, so its context cache stays complete). Call `submit` to queue requests and `step` to
    advance every live request by one verify pass; `generate` does both until everything is
    finished.

    `prefill_chunk` bounds the prompt tokens prefilled per step (chunked prefill, oldest request
    first): a long prompt joins over several steps and the live rows decode in each of them. 0
    prefills every joining prompt whole before the step (a long one then stalls every row).
    `prefix_cache` (runtime/prefix_cache.py) keeps what prompts' prefixes left in the caches, so a
    prompt that starts with a prefix seen before prefills only the rest. `prefill_share` sizes the
    chunks beside decoding rows by time instead (runtime/step_schedule.py): prefills take about
    that share of the decoding time on average, in chunks of at most `prefill_chunk` tokens,
    shortest prompt first; None keeps `prefill_chunk` tokens, oldest first.
    """

    def __init__(
        self,
        runtime: Runtime,
        max_batch: int = 8,
        max_context: int = 2048,
        block_size: int | None = None,
        profile: bool = False,
        draft_len_schedule: Mapping[int, int] | None = None,
        prefix_cache: PrefixCache | None = None,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        prefill_share: float | None = None,
    ) -> None:
        self.runtime = runtime
        self.speculative = runtime.has_drafter
        if self.speculative:
            config = runtime.drafter_config
            self.block_size = int(block_size or config.block_size)
            if self.block_size < 2:
                raise DFlashError(f"block size must be >= 2, got {self.block_size}", "use the drafter's block size")
            self.mask_token_id = config.mask_token_id
        else:
            self.block_size = 1
        self.draft_len_schedule = check_draft_len_schedule(draft_len_schedule, self.block_size) if self.speculative else {}
        if prefill_chunk < 0:
            raise DFlashError(f"prefill_chunk must be >= 0, got {prefill_chunk}", "use a token count such as 512, or 0 for whole prompts")
        self.prefill_chunk = int(prefill_chunk)
        if prefill_share is not None and not 0 < prefill_share:
            raise DFlashError(f"prefill_share must be > 0, got {prefill_share}", "use a fraction of a decoding step such as 0.5, or None")
        # prefill_chunk 0: whole prompts, every waiting one that has a row, in one pass before the step
        self.prefill_budget = PrefillBudget(self.prefill_chunk or WHOLE_PROMPTS, prefill_share if self.prefill_chunk else None)
        self.max_batch = max_batch
        self.max_context = max_context
        self.profile = profile
        self.device = runtime.device
        runtime.allocate(max_batch, max_context + self.block_size)
        self.waiting: deque[Request] = deque()
        self.live: list[_Live] = []
        self.prefilling: list[Prefilling] = []  # rows len(live)..len(live)+len(prefilling)-1
        self.stats: list[StepStats] = []
        self._ids = itertools.count()
        # device state of the live rows, row i <-> self.live[i]
        self.anchor = torch.zeros(0, dtype=torch.long, device=self.device)
        self.starts = torch.zeros(0, dtype=torch.long, device=self.device)
        self.ctx_features: torch.Tensor | None = None
        self.ctx_counts = torch.zeros(0, dtype=torch.long, device=self.device)
        self.sampling: SamplingTensors | None = None
        if prefix_cache is not None and runtime.prefix_cache_refusal() is not None:
            raise DFlashError(f"prefix caching is not available: {runtime.prefix_cache_refusal()}", "turn the prefix cache off")
        self.prefix_cache = prefix_cache
        self._prefix_stores: dict[Any, tuple[int, int]] = {}  # request id -> prompt positions [restored, end) to store

    # ------------------------------------------------------------------ public

    def submit(self, request: Request) -> Any:
        """Queue a request; it joins the batch at the next step. Returns its request id."""
        self.check(request)
        if request.request_id is None:
            request.request_id = next(self._ids)
        request.arrival = time.perf_counter()
        self.waiting.append(request)
        return request.request_id

    def check(self, request: Request) -> None:
        """Raise DFlashError if the request cannot be decoded (before it is queued)."""
        request.params.validate()
        check_prompt_tokens(len(request.prompt_ids), self.max_context)
        vocab = self.runtime.vocab_size
        if min(request.prompt_ids) < 0 or max(request.prompt_ids) >= vocab:
            raise DFlashError(f"prompt token ids must be in [0, {vocab})", "tokenize with the target's tokenizer")

    def cancel(self, request_id: Any) -> SequenceResult | None:
        """Drop a request between steps (its client went away); its row is freed for others.

        Returns what the request had produced (finish_reason "cancelled"), or None if it was
        still waiting or being prefilled (nothing produced yet), or is unknown.
        """
        for request in self.waiting:
            if request.request_id == request_id:
                self.waiting.remove(request)
                return None
        for i, pending in enumerate(self.prefilling):
            if pending.request.request_id == request_id:
                self._drop_prefilling(i)
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

    def step(self) -> list[StepEvent]:
        """Admit waiting requests (whole, or a chunk of prompt), then one draft + verify pass over all live rows."""
        started = time.perf_counter()
        decoding = bool(self.live)  # rows that decode in this step, beside the chunk
        events, prefilled_tokens = self._prefill_chunk()
        if prefilled_tokens and self.prefill_budget.share is not None:
            _synchronize(self.device)  # time the chunk's own pass, not the decoding step that would wait for it
        prefilled = time.perf_counter()
        self.prefill_budget.prefilled(prefilled_tokens, prefilled - started, decoding)
        if self.live:
            events += self._decode_step()
            self.prefill_budget.decoded(time.perf_counter() - prefilled)
        self._store_prefixes(range(len(self.live)))
        return events

    def generate(self, requests: Iterable[Request]) -> list[SequenceResult]:
        """Run requests to completion; results in submission order."""
        requests = list(requests)
        for request in requests:
            self.check(request)
        ids = [self.submit(r) for r in requests]
        done: dict[Any, SequenceResult] = {}
        while self.has_work:
            for event in self.step():
                if event.finished:
                    done[event.request_id] = event.result
        return [done[i] for i in ids]

    # ------------------------------------------------------------------ admission (prefill)

    # ------------------------------------------------------------------ prefix caching

    def _restore_prefix(self, row: int, request: Request) -> int:
        """Copy the prompt's longest cached prefix into its row; returns the restored length.

        Also notes which of the prompt's blocks to store once the row has drafted (its drafter
        context is projected by the first draft step), and for hybrid targets asks the prefill to
        keep the recurrent state where the stored blocks end.
        """
        cache = self.prefix_cache
        if cache is None:
            return 0
        hybrid = self.runtime.is_hybrid
        blocks = cache.match(request.prompt_ids, needs_state=hybrid)
        cached = blocks[-1].end if blocks else 0
        if cached:
            self.runtime.import_prefix(row, blocks[: cached // cache.block_tokens])
        end = cache.storable(len(request.prompt_ids)) * cache.block_tokens
        # hybrid: also keep the state where the prompt leaves the cached blocks, for the next prompt sharing them
        parting = cache.depth(request.prompt_ids) if hybrid else 0
        states = tuple(p for p in {end, parting} if cached < p <= end) if hybrid else ()
        if end > cached:
            self._prefix_stores[id(request)] = (cached, end, states)
        if hybrid:
            self.runtime.keep_prefix_state(slice(row, row + 1), [states])
        return cached

    def _store_prefixes(self, indices: Iterable[int]) -> None:
        """Store the noted prompt blocks of live rows `indices` that have drafted at least once."""
        cache = self.prefix_cache
        if cache is None or not self._prefix_stores:
            return
        size = cache.block_tokens
        for i in indices:
            live = self.live[i]
            noted = self._prefix_stores.pop(id(live.request), None)
            if noted is None or (self.speculative and not live.result.acceptance_lengths):
                continue
            start, end, states = noted
            names = cache.names(live.request.prompt_ids, end // size)
            for b in reversed(range(start // size, end // size)):  # deepest first: the root is evicted last
                state = (b + 1) * size in states
                if names[b] not in cache or (state and not cache.has_state(names[b])):
                    cache.insert(names[b], self.runtime.export_prefix(i, b * size, (b + 1) * size, state=state))

    # ------------------------------------------------------------------ chunked admission (prefill)

    def _prefill_chunk(self) -> tuple[list[StepEvent], int]:
        """Prefill at most `prefill_chunk` prompt tokens of the prefilling rows in their order; rows
        whose prompt is complete become live (first token and drafter context as a whole prefill).
        Returns their events and the prompt tokens prefilled."""
        self._start_prefills()
        if self.prefill_budget.share is not None:
            self._shortest_first()
        counts, budget = [], self.prefill_budget.tokens(decoding=bool(self.live))
        for index, pending in enumerate(self.prefilling):
            if budget <= 0:
                break
            if pending.chunks == 0 and pending.done == 0:  # its first chunk: restore its cached prefix now, the latest moment
                row = len(self.live) + index
                pending.done = pending.cached = self._restore_prefix(row, pending.request)
            count = min(pending.remaining, budget)
            # every row of the pass is padded to the widest chunk at its own positions: a row near the end of
            # its cache row next to a wider chunk would write past it, so such a row waits for the next step
            width = max(counts + [count])
            if any(p.done + width > self.runtime.capacity for p in self.prefilling[: index + 1]):
                break
            counts.append(count)
            budget -= count
        if not counts:
            return [], 0
        batch, first = self.prefilling[: len(counts)], len(self.live)
        tokens = torch.zeros(len(batch), max(counts), dtype=torch.long)
        for i, (pending, count) in enumerate(zip(batch, counts)):
            tokens[i, :count] = torch.tensor(pending.request.prompt_ids[pending.done : pending.done + count])
        starts = torch.tensor([p.done for p in batch], device=self.device)
        count_t = torch.tensor(counts, device=self.device)
        span = max(p.done + c for p, c in zip(batch, counts))
        sampling = SamplingTensors.cat([p.sampling for p in batch])
        # a chunk is a prefill that starts at the row's prefilled length; its logits are those of its last
        # token, which for a completed prompt is where a whole prefill samples the first token
        out = self.runtime.target_verify(
            slice(first, first + len(batch)), tokens.to(self.device), starts, span, None, sampling, logits_at=count_t - 1
        )
        for i, (pending, count) in enumerate(zip(batch, counts)):
            pending.done += count
            pending.chunks += 1
            if self.speculative:  # copied: a runtime may reuse its output buffers in the next pass
                pending.features.append(out.features[i, :count].clone())
        complete = sum(1 for p in batch if p.remaining == 0)  # the budget went in row order: the complete ones lead
        return (self._go_live(complete, out.bonus[:complete]) if complete else []), sum(counts)

    def _start_prefills(self) -> None:
        """Waiting requests take the free rows (after the live and prefilling ones), nothing prefilled yet:
        oldest first, or with a prefill share shortest first (a short prompt is not queued behind long ones)."""
        free = self.max_batch - len(self.live) - len(self.prefilling)
        while self.waiting and free > 0:
            if self.prefill_budget.share is None:
                request = self.waiting.popleft()
            else:
                request = min(self.waiting, key=lambda r: len(r.prompt_ids))
                self.waiting.remove(request)
            self.prefilling.append(Prefilling(request, _sampling_tensors([request.params], self.device)))
            free -= 1

    def _shortest_first(self) -> None:
        """Put the prefilling rows in order of the prompt tokens they have left (a stable sort), moving
        their cache rows: the step's budget then goes to the prompts that finish soonest, and a short
        prompt that arrived behind a long one goes live without waiting for it."""
        order = sorted(range(len(self.prefilling)), key=lambda i: self.prefilling[i].remaining)
        if order == list(range(len(self.prefilling))):
            return
        first = len(self.live)
        self.prefilling = [self.prefilling[i] for i in order]
        rows = list(range(first)) + [first + i for i in order]
        self.runtime.keep_rows(torch.tensor(rows, dtype=torch.long, device=self.device))

    def _go_live(self, count: int, first_token: torch.Tensor) -> list[StepEvent]:
        """The first `count` prefilling rows (complete prompts, right after the live rows) become live."""
        joining, self.prefilling = self.prefilling[:count], self.prefilling[count:]
        first = len(self.live)
        length_t = torch.tensor([len(p.request.prompt_ids) for p in joining], device=self.device)
        self.anchor = torch.cat([self.anchor, first_token])
        self.starts = torch.cat([self.starts, length_t])
        sampling = SamplingTensors.cat([p.sampling for p in joining])
        self.sampling = sampling if self.sampling is None else SamplingTensors.cat([self.sampling, sampling])
        if self.speculative:  # the drafter reads the prefilled prompt's features at the row's first draft
            prompts = [torch.cat(p.features) for p in joining]
            width = max(f.shape[0] for f in prompts)
            features = torch.stack([torch.nn.functional.pad(f, (0, 0, 0, width - f.shape[0])) for f in prompts])
            self.ctx_features = _cat_padded(self.ctx_features, features)
            cached_t = torch.tensor([p.cached for p in joining], device=self.device)
            self.ctx_counts = torch.cat([self.ctx_counts, length_t - cached_t])  # the drafter has a restored prefix already
        events, finished = [], []
        for i, (pending, token) in enumerate(zip(joining, first_token.tolist())):
            request = pending.request
            result = SequenceResult(request.request_id, list(request.prompt_ids), num_target_forwards=pending.chunks,
                                    cached_prompt_tokens=pending.cached)
            result.time_to_first_token = time.perf_counter() - request.arrival
            live = _Live(request, result)
            self.live.append(live)
            new = self._commit(live, [token])
            events.append(StepEvent(request.request_id, new, result.finish_reason is not None, result))
            if result.finish_reason is not None:
                finished.append(first + i)
        self._drop(finished)
        return events

    def _drop_prefilling(self, index: int) -> None:
        """Forget prefilling row `index` (cancelled); the rows after it move up."""
        live = len(self.live)
        self._prefix_stores.pop(id(self.prefilling[index].request), None)
        del self.prefilling[index]
        keep = list(range(live)) + [live + i for i in range(len(self.prefilling) + 1) if i != index]
        self.runtime.keep_rows(torch.tensor(keep, dtype=torch.long, device=self.device))

    # ------------------------------------------------------------------ one speculative step

    def draft_len(self, live_rows: int) -> int:
        """Draft tokens verified in a step with `live_rows` rows (the schedule, else block size - 1)."""
        return scheduled_draft_len(self.draft_len_schedule, live_rows, self.block_size)

    def _decode_step(self) -> list[StepEvent]:
        n, block_size = len(self.live), self.block_size
        rows = slice(0, n)
        draft_len = self.draft_len(n) if self.speculative else 0
        verified_len = draft_len + 1  # anchor + drafts
        span = max(live.start for live in self.live) + verified_len

        started = time.perf_counter()
        draft_probs = None
        if self.speculative:
            # the drafter always sees the block it was trained on (a shorter block of masks drafts worse);
            # a schedule only shortens what the target verifies. Draft length 0 still runs the smallest
            # block, for the context rows the drafter's cache needs.
            drafted_len = block_size if draft_len > 0 else 2
            block = torch.full((n, drafted_len), self.mask_token_id, dtype=torch.long, device=self.device)
            block[:, 0] = self.anchor
            proposal = self.runtime.propose(
                rows, block, self.ctx_features, self.ctx_counts, self.starts - self.ctx_counts, self.sampling
            )
            block[:, 1:], draft_probs = proposal.tokens, proposal.probs
            block = block[:, :verified_len]
            if draft_probs is not None:
                draft_probs = draft_probs[:, :draft_len]
        else:
            block = self.anchor.view(-1, 1)
        if self.profile:
            _synchronize(self.device)
        drafted = time.perf_counter()

        out = self.runtime.target_verify(rows, block, self.starts, span, draft_probs, self.sampling)
        accepted, bonus = out.accepted, out.bonus
        self.runtime.commit(rows, accepted + 1)  # anchor + accepted drafts (recurrent states roll back here)
        # the one host read of the step: drafts, accepted count and bonus of every row
        packed = torch.cat([block[:, 1:], accepted.view(-1, 1), bonus.view(-1, 1)], dim=1).tolist()
        verified = time.perf_counter()

        self.anchor = bonus
        self.starts = self.starts + accepted + 1
        if self.speculative:
            self.ctx_features = out.features  # verify features of anchor + accepted drafts
            self.ctx_counts = accepted + 1

        events, finished, committed = [], [], 0
        for i, live in enumerate(self.live):
            num_accepted = packed[i][draft_len]
            tokens = packed[i][:num_accepted] + [packed[i][draft_len + 1]]
            live.start += num_accepted + 1
            live.result.num_target_forwards += 1
            new = self._commit(live, tokens)
            live.result.acceptance_lengths.append(len(new))
            live.result.draft_lengths.append(draft_len)
            committed += len(new)
            events.append(StepEvent(live.request.request_id, new, live.result.finish_reason is not None, live.result))
            if live.result.finish_reason is not None:
                finished.append(i)
        self.stats.append(StepStats(n, drafted - started, verified - drafted, committed))
        self._drop(finished)
        return events

    # ------------------------------------------------------------------ bookkeeping

    def _commit(self, live: _Live, tokens: list[int]) -> list[int]:
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
        if not finished:
            return
        self._store_prefixes(finished)  # before their rows are given to others
        keep = [i for i in range(len(self.live)) if i not in set(finished)]
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        # prefilling rows (after the live ones) keep their caches and move up behind the kept live rows
        rows = keep + list(range(len(self.live), len(self.live) + len(self.prefilling)))
        self.live = [self.live[i] for i in keep]
        self.anchor = self.anchor.index_select(0, index)
        self.starts = self.starts.index_select(0, index)
        self.sampling = self.sampling.select(index, keep)
        if self.speculative:
            self.ctx_features = self.ctx_features.index_select(0, index)
            self.ctx_counts = self.ctx_counts.index_select(0, index)
        if rows:
            self.runtime.keep_rows(torch.tensor(rows, dtype=torch.long, device=self.device))


def _sampling_tensors(params: list[SamplingParams], device: torch.device) -> SamplingTensors:
    seeds = [p.seed if p.seed is not None else secrets.randbits(31) for p in params]
    return SamplingTensors(
        greedy=tuple(p.temperature < MIN_TEMPERATURE for p in params),
        # colder than MIN_TEMPERATURE is argmax (dividing float32 logits by it would overflow)
        temperature=torch.tensor([p.temperature if p.temperature >= MIN_TEMPERATURE else 0.0 for p in params], dtype=torch.float32, device=device),
        top_k=torch.tensor([p.top_k for p in params], dtype=torch.long, device=device),
        top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
        seed=torch.tensor(seeds, dtype=torch.long, device=device),
    )


def _cat_padded(existing: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """Concatenate `[b, n, F]` tensors along rows, zero-padding the token axis to the longer one."""
    if existing is None or existing.shape[0] == 0:
        return new
    width = max(existing.shape[1], new.shape[1])
    pad = lambda t: torch.nn.functional.pad(t, (0, 0, 0, width - t.shape[1]))  # noqa: E731
    return torch.cat([pad(existing), pad(new)])


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)

"""The decoding loop: a scheduler plans each step, one speculative step runs it. Written once, for every runtime.

`launch_step` is DFlash for a batch of cache slots, z-lab's `dflash_generate` loop body: the
drafter proposes a block from `[anchor, MASK, ...]`, the target verifies it in one pass
(verification on the device returns how many drafts each row accepts and its bonus token), the
runtime commits the accepted prefix (recurrent states roll back there), and the host reads one
small tensor (`LaunchedStep.tokens`: at once, or a step later with async scheduling). Rows then
advance by different amounts; their caches need no rollback because positions past a row's length
are simply overwritten next step (see runtime/base.py).

Everything about requests is the scheduler's (runtime/scheduler.py): queues, cache slots (a
request keeps one from admission to finish), chunked prefill under a budget, the prefix cache,
cancellation, stop tokens and limits. `Decoder` joins the two: per step it runs the scheduler's
prefill chunk, then the speculative step over the live slots, and hands the tokens back.

Without a drafter the same loop decodes autoregressively: the block is just the anchor.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterable, Mapping

import torch

from trtllm_dflash.contracts.defaults import DECODER_MAX_BATCH, DECODER_MAX_CONTEXT
from trtllm_dflash.contracts.request_limits import DEFAULT_PREFILL_CHUNK
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.runtime.base import Runtime, Slots
from trtllm_dflash.runtime.grammar import GrammarState, block_masks, draft_constraint
from trtllm_dflash.runtime.prefix_cache import PrefixCache
from trtllm_dflash.runtime.readback import DeviceClock, Readback
from trtllm_dflash.runtime.requests import Request, SequenceResult, StepEvent
from trtllm_dflash.runtime.scheduler import BatchState, Scheduler
from trtllm_dflash.runtime.step_schedule import WHOLE_PROMPTS, DraftPolicy, PrefillBudget, check_draft_len_schedule, scheduled_draft_len
from trtllm_dflash.sampling_params import SamplingParams, check_prompt_tokens

__all__ = [
    "Decoder",
    "LaunchedStep",
    "Request",
    "SamplingParams",
    "SequenceResult",
    "StepEvent",
    "StepStats",
    "launch_step",
]


@dataclasses.dataclass
class StepStats:
    """One decoding step of the whole batch."""

    batch_size: int
    draft_seconds: float
    verify_seconds: float
    committed: int


@dataclasses.dataclass
class LaunchedStep:
    """A speculative step whose device work is queued and whose small result is on its way to the host.

    `tokens()` reads it: per batch row the accepted drafts and the bonus token. `clock` has the
    device's time of the whole step once it is read."""

    readback: Readback  # [b, draft_len + 2]: the block's drafts, the accepted count and the bonus per row
    draft_len: int
    drafted: bool  # the drafter ran (its pass read every row's context)
    clock: DeviceClock
    started: float  # host clock: the launch began
    drafted_at: float  # ... the draft pass was queued (with `profile`: had run)
    rows: list[Any] = dataclasses.field(default_factory=list)  # the scheduler's live requests, per batch row

    @property
    def verified(self) -> int:
        """Tokens per row the verify pass wrote (the anchor and the drafts)."""
        return self.draft_len + 1

    def tokens(self) -> list[list[int]]:
        n = self.draft_len
        return [row[: row[n]] + [row[n + 1]] for row in self.readback.tolist()]

    def seconds(self, read_at_once: bool) -> tuple[float, float]:
        """(draft, verify) seconds. Read at once: the host's, from the launch to the read (the read
        waits for the device). Read a step later: the device's time of the step, split where the host
        had queued the draft pass."""
        if read_at_once:
            return self.drafted_at - self.started, time.perf_counter() - self.drafted_at
        total = self.clock.seconds()
        draft = min(self.drafted_at - self.started, total)
        return draft, total - draft


def launch_step(
    runtime: Runtime,
    batch: BatchState,
    slots: Slots,
    span: int,
    draft_len: int,
    block_size: int,
    mask_token_id: int | None,
    profile: bool = False,
    grammars: list[GrammarState | None] | None = None,
    draft: bool = True,
) -> LaunchedStep:
    """Propose -> verify -> commit over the batch's slots; advances `batch` on the device and starts
    the step's one host read (`LaunchedStep.tokens`) without waiting for it.

    `draft_len` drafts are verified (0: the anchor alone); the drafter still sees the block it was
    trained on (a shorter block of masks drafts worse), or its smallest at draft length 0, for the
    context its cache needs. `mask_token_id` None decodes autoregressively. `span` bounds the
    positions the verify pass touches (the host knows the lengths). `grammars` (per row, None for
    a row without one) mask the target at every block position (runtime/grammar.py); they cost a
    blocking host read, of the drafts, before the verify pass. `draft` False skips the drafter: the
    anchor alone is verified and its features are kept for the drafter's next pass (DraftPolicy).
    """
    started = time.perf_counter()
    clock = DeviceClock(batch.anchor.device)
    draft_probs = None
    if mask_token_id is not None and draft:
        block = torch.full((len(slots), block_size if draft_len > 0 else 2), mask_token_id, dtype=torch.long, device=batch.anchor.device)
        block[:, 0] = batch.anchor
        constrain = draft_constraint(grammars, batch.sampling.greedy) if grammars is not None else None
        proposal = runtime.propose(
            slots,
            block,
            batch.ctx_features,
            batch.ctx_counts,
            batch.starts - batch.ctx_counts,
            batch.sampling,
            **({"constrain": constrain} if constrain is not None else {}),
        )
        block[:, 1:] = proposal.tokens
        block = block[:, : draft_len + 1]
        draft_probs = proposal.probs[:, :draft_len] if proposal.probs is not None else None
    else:
        block = batch.anchor.view(-1, 1)
    if profile:
        _synchronize(block.device)
    drafted = time.perf_counter()

    masks = {}  # passed only when set: runtimes written before grammars take no `allowed`
    if grammars is not None and any(g is not None for g in grammars):
        masks["allowed"] = block_masks(grammars, block.tolist(), block.shape[1], runtime.vocab_size)
    out = runtime.target_verify(slots, block, batch.starts, span, draft_probs, batch.sampling, **masks)
    runtime.commit(slots, out.accepted + 1)  # anchor + accepted drafts (recurrent states roll back here)
    # the one host read of the step: drafts, accepted count and bonus of every row
    readback = Readback(torch.cat([block[:, 1:], out.accepted.view(-1, 1), out.bonus.view(-1, 1)], dim=1))

    batch.anchor, batch.starts = out.bonus, batch.starts + out.accepted + 1
    if mask_token_id is not None and draft:
        batch.ctx_features, batch.ctx_counts = out.features, out.accepted + 1  # verify features of anchor + accepted drafts
    elif mask_token_id is not None:  # the drafter did not run: the anchor's features wait with the others it has not read
        batch.ctx_features, batch.ctx_counts = _kept(batch.ctx_features, batch.ctx_counts, out.features)
    clock.stop()
    return LaunchedStep(readback, draft_len, mask_token_id is not None and draft, clock, started, drafted)


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

    `async_scheduling` launches each step before reading the one before it, so on a GPU the host
    plans, launches and handles stops while the device computes (the step's result reaches pinned
    memory on its own, runtime/readback.py). Tokens and acceptance lengths are those of reading each
    step at once (where the draft length does not follow the row count: a schedule, adaptive
    drafting). The cost: a request that finishes is decoded for one step more (that step's tokens
    are dropped), and its finish is seen a step later. Steps that prefill, rows with a
    grammar and rows near the end of their cache slot read the step before first. Off a GPU it
    gains nothing (the device work ran when it was launched) and the extra steps are pure cost.
    """

    def __init__(
        self,
        runtime: Runtime,
        max_batch: int = DECODER_MAX_BATCH,
        max_context: int = DECODER_MAX_CONTEXT,
        block_size: int | None = None,
        profile: bool = False,
        draft_len_schedule: Mapping[int, int] | None = None,
        prefix_cache: PrefixCache | None = None,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        prefill_share: float | None = None,
        adaptive_drafting: bool = False,
        async_scheduling: bool = False,
    ) -> None:
        self.runtime = runtime
        self.speculative = runtime.has_drafter
        self.mask_token_id = runtime.drafter_config.mask_token_id if self.speculative else None
        self.block_size = int(block_size or runtime.drafter_config.block_size) if self.speculative else 1
        if self.speculative and self.block_size < 2:
            raise DFlashError(f"block size must be >= 2, got {self.block_size}", "use the drafter's block size")
        if self.speculative and self.mask_token_id is None:
            raise DFlashError(
                "the drafter has no mask token id", "load it with checkpoints.load_drafter, which reads it from the target's tokenizer"
            )
        self.draft_len_schedule = check_draft_len_schedule(draft_len_schedule, self.block_size) if self.speculative else {}
        if prefill_chunk < 0:
            raise DFlashError(f"prefill_chunk must be >= 0, got {prefill_chunk}", "use a token count such as 512, or 0 for whole prompts")
        if prefill_share is not None and not 0 < prefill_share:
            raise DFlashError(f"prefill_share must be > 0, got {prefill_share}", "use a fraction of a decoding step such as 0.5, or None")
        if prefix_cache is not None and runtime.prefix_cache_refusal() is not None:
            raise DFlashError(f"prefix caching is not available: {runtime.prefix_cache_refusal()}", "turn the prefix cache off")
        self.prefill_chunk = int(prefill_chunk)
        # prefill_chunk 0: whole prompts, every waiting one that has a slot, in one pass before the step
        self.prefill_budget = PrefillBudget(self.prefill_chunk or WHOLE_PROMPTS, prefill_share if self.prefill_chunk else None)
        self.max_batch, self.max_context = max_batch, max_context
        self.profile = profile
        self.device = runtime.device
        self.prefix_cache = prefix_cache
        runtime.allocate(max_batch, max_context + self.block_size)
        self.scheduler = Scheduler(runtime, max_batch, max_context, self.speculative, self.prefill_budget, prefix_cache)
        self.stats: list[StepStats] = []
        # skip the drafter in steps where it does not pay (step_schedule.DraftPolicy); off: every step drafts
        self.draft_policy = DraftPolicy() if adaptive_drafting and self.speculative else None
        self.async_scheduling = async_scheduling
        self._pending: LaunchedStep | None = None  # with async scheduling: the step launched and not read yet

    # ------------------------------------------------------------------ the scheduler's state, for callers that watch it

    @property
    def waiting(self):
        return self.scheduler.waiting

    @property
    def prefilling(self):
        return self.scheduler.prefilling

    @property
    def live(self):
        """The live requests, in slot order: the step's batch."""
        return self.scheduler.live

    @property
    def live_slots(self) -> Slots:
        return self.scheduler.live_slots

    @property
    def batch(self) -> BatchState:
        return self.scheduler.batch

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work or self._pending is not None

    @property
    def in_flight(self) -> bool:
        """Whether a step has been launched and not read yet (async scheduling)."""
        return self._pending is not None

    # ------------------------------------------------------------------ requests

    def submit(self, request: Request, checked: bool = False) -> Any:
        """Queue a request; it joins the batch at the next step. Returns its request id.
        `checked`: the caller has run `check` (or validated the params and run `check_prompt`)
        on this request against a decoder of the same runtime and limits, so it is not run again."""
        if not checked:
            self.check(request)
        return self.scheduler.submit(request)

    def check(self, request: Request) -> None:
        """Raise DFlashError if the request cannot be decoded (before it is queued)."""
        request.params.validate()
        self.check_prompt(request)

    def check_prompt(self, request: Request) -> None:
        """`check` less the params' own validation (for callers that ran it already): the prompt
        against the context and the vocabulary, and a grammar against the runtime."""
        check_prompt_tokens(len(request.prompt_ids), self.max_context)
        vocab = self.runtime.vocab_size
        if min(request.prompt_ids) < 0 or max(request.prompt_ids) >= vocab:
            raise DFlashError(f"prompt token ids must be in [0, {vocab})", "tokenize with the target's tokenizer")
        if request.params.grammar is not None:
            if request.grammar is None:
                raise DFlashError(
                    "the request has a grammar but no matcher", "generate through DFlashPipeline, which compiles it with the tokenizer"
                )
            if not self.runtime.masks_logits:
                raise DFlashError(
                    "this runtime's target verifies inside its graph or engine, so a grammar cannot mask it",
                    "serve grammar-constrained requests on the torch runtime or a native (not plugin) target",
                )

    def cancel(self, request_id: Any) -> SequenceResult | None:
        """Drop a request between steps (its client went away); its slot is freed for others.

        Returns what the request had produced (finish_reason "cancelled"), or None if it was
        still waiting or being prefilled (nothing produced yet), or is unknown. With async
        scheduling, what a step in flight decodes for it is dropped: the result holds the tokens
        its events delivered.
        """
        return self.scheduler.cancel(request_id)

    def generate(self, requests: Iterable[Request]) -> list[SequenceResult]:
        """Run requests to completion; results in submission order."""
        requests = list(requests)
        for request in requests:
            self.check(request)
        ids = [self.submit(r, checked=True) for r in requests]
        done: dict[Any, SequenceResult] = {}
        while self.has_work:
            for event in self.step():
                if event.finished:
                    done[event.request_id] = event.result
        return [done[i] for i in ids]

    # ------------------------------------------------------------------ one step

    def _grammars(self) -> list[GrammarState | None] | None:
        """The live rows' grammar matchers, advanced over what earlier steps committed; None if no row has one."""
        if not any(live.request.grammar is not None for live in self.scheduler.live):
            return None
        return [_caught_up(live) for live in self.scheduler.live]

    def draft_len(self, live_rows: int) -> int:
        """Draft tokens verified in a step with `live_rows` rows (the schedule, else block size - 1)."""
        return scheduled_draft_len(self.draft_len_schedule, live_rows, self.block_size)

    def step(self, emit: Callable[[list[StepEvent]], None] | None = None) -> list[StepEvent]:
        """The scheduler's prefill chunk (if any), then one speculative step over every live request.

        `emit` (a server's delivery) gets the events of requests the chunk completed (their first
        tokens) before the speculative step runs, instead of with its events: a first token does
        not wait for a decoding step.

        With async scheduling the events are those of the step before (read after this one was
        launched), and a call may launch nothing and only read (the last step of a batch).
        """
        started = time.perf_counter()
        scheduler = self.scheduler
        events, prefilled_tokens = [], 0
        if self._pending is not None and self._reads_first():
            events += self._read(self._take_pending())
        decoding = bool(scheduler.live)  # rows that decode in this step, beside the chunk
        chunk = scheduler.plan_prefill()
        if chunk is not None:
            slots, tokens, starts, span, sampling, last = chunk.inputs(self.device)
            # a chunk is a prefill that starts at the row's prefilled length; its logits are those of its last
            # token, which for a completed prompt is where a whole prefill samples the first token
            grammars = [p.request.grammar for p in chunk.pending]
            allowed = block_masks(grammars, [[0]] * len(grammars), 1, self.runtime.vocab_size)  # the first token's
            masks = {} if allowed is None else {"allowed": allowed}
            out = self.runtime.target_verify(slots, tokens, starts, span, None, sampling, logits_at=last, **masks)
            prefilled_tokens = sum(chunk.counts)
            events += scheduler.prefilled(chunk, out.bonus, out.features)
            if self.prefill_budget.share is not None:
                _synchronize(self.device)  # time the chunk's own pass, not the decoding step that would wait for it
        prefilled = time.perf_counter()
        self.prefill_budget.prefilled(prefilled_tokens, prefilled - started, decoding)
        if emit is not None and events:
            emit(events)
            events, prefilled = [], time.perf_counter()
        pending = self._take_pending()
        if scheduler.live:
            rows = len(scheduler.live)
            draft = self.draft_policy.drafts(rows) if self.draft_policy is not None else True
            draft_len = self.draft_len(rows) if self.speculative and draft else 0
            grammars = self._grammars()
            in_flight = pending.verified if pending is not None else 0  # tokens per row the host has not read yet
            launched = launch_step(
                self.runtime,
                scheduler.batch,
                scheduler.live_slots,
                scheduler.span(draft_len + 1 + in_flight),
                draft_len,
                self.block_size,
                self.mask_token_id,
                self.profile,
                grammars,
                draft,
            )
            launched.rows = list(scheduler.live)
            if self.async_scheduling and grammars is None:
                self._pending = launched
            else:
                events += self._read(launched, at_once=True, since=prefilled)
        if pending is not None:
            events += self._read(pending)
        return events

    def _take_pending(self) -> LaunchedStep | None:
        pending, self._pending = self._pending, None
        return pending

    def _reads_first(self) -> bool:
        """Whether the step launched before must be read before this one is planned (async scheduling):
        a prompt will be prefilled (its first token's read would wait for the device anyway, and the
        slots and prefixes the read frees are then the prefill's, as without async scheduling); a row
        has a grammar (its matcher needs every committed token); or a row may be near the end of its
        cache slot (the unread step and this one could write past it)."""
        scheduler = self.scheduler
        if scheduler.prefilling or (scheduler.waiting and scheduler.free_slots):
            return True
        if any(live.request.grammar is not None for live in scheduler.live):
            return True
        return bool(scheduler.live) and scheduler.span(self._pending.verified + self.block_size) > self.runtime.capacity

    def _read(self, launched: LaunchedStep, at_once: bool = False, since: float | None = None) -> list[StepEvent]:
        """A launched step's tokens, committed to its rows' requests (rows that finished or were cancelled
        since it was launched are skipped: what it decoded for them is dropped). `at_once`: read right
        after its launch (`since`: when the step began, for the prefill budget's clock)."""
        tokens = launched.tokens()
        draft_seconds, verify_seconds = launched.seconds(read_at_once=at_once)
        rows = len(launched.rows)
        if self.draft_policy is not None:  # read at once: the read waited for the device; else the device's time
            per_row = sum(len(row) for row in tokens) / rows
            self.draft_policy.record(launched.drafted, rows, draft_seconds + verify_seconds, per_row)
        decoded, committed = self.scheduler.decoded(tokens, launched.draft_len, launched.drafted, launched.rows)
        self.stats.append(StepStats(rows, draft_seconds, verify_seconds, committed))
        self.prefill_budget.decoded(time.perf_counter() - since if since is not None else draft_seconds + verify_seconds)
        return decoded


def _kept(features: torch.Tensor | None, counts: torch.Tensor, new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Features `[b, n, F]` the drafter has not read (counts[r] of them in row r) with one more per
    row, `new [b, 1, F]`, written at counts[r] (no host read: the token axis grows by one)."""
    if features is None:
        return new, torch.ones_like(counts)
    grown = torch.cat([features, torch.zeros_like(new)], dim=1)
    grown.scatter_(1, counts.view(-1, 1, 1).expand(-1, 1, new.shape[-1]), new)
    return grown, counts + 1


def _caught_up(live) -> GrammarState | None:
    grammar = live.request.grammar
    if grammar is not None:
        grammar.catch_up(live.result.token_ids)
    return grammar


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)

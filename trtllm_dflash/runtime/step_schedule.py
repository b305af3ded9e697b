"""What a decoding step does beside its live rows: how many prompt tokens it prefills, the state of
the prompts being prefilled, and how many drafts it verifies (a draft-length schedule).

The prefill budget. A fixed chunk (`prefill_chunk`) bounds a step's prefill in tokens, but what
live streams feel is its time: on a GPU a 512-token chunk of a small model costs a fraction of a
decoding step, on a CPU several steps. With `share`, while rows decode, prefills may take about `share` of the decoding
time on average, so the streams' mean inter-token latency stays near (1 + share) x its value
without prefills (what aiperf and users measure per request), on any hardware.

It is a token bucket of time. Each decoding step adds `share` x its duration to a credit, capped at
`BURST_STEPS` steps' worth. A chunk spends its measured duration, and is sized from the credit
and a running estimate of one prefilled token's cost, at most `cap`, and at least `floor` tokens
(a short prompt whole) even where the credit buys fewer: that chunk runs into debt, and while the
credit is below zero nothing is prefilled, so the decoding steps after it pay it back and the
average stays at the share. A short prompt that joins a batch is therefore prefilled at the next
step unless the one before left a debt (waiting for the credit to buy it cost a concurrency-8
aiperf run ~4 ms of model-side TTFT at the median, ~85 ms at worst), and no pass is paid for a
handful of tokens. A long prompt that arrives now and then is prefilled from the saved credit in
large chunks. Prompts that keep arriving faster than the share can absorb are held to it, and
queue. With no row decoding, or no `share`, the chunk is `cap` and costs no credit.

Timing is wall clock on the host: the decoder synchronizes the device after a chunk's pass when a
share is set, so a GPU's chunk is timed as itself and not in the decoding step that would wait
for it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import torch

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.runtime.base import SamplingTensors

WHOLE_PROMPTS = 1 << 62  # the cap that means no cap: every prefilling prompt whole in one pass
FLOOR = 64  # the smallest chunk beside decoding rows (a short prompt whole), paid out of debt if need be
PROBE = 64  # the first chunk beside decoding rows, before a token's cost was measured
BURST_STEPS = 64  # the credit saved up, in decoding steps' worth (about one short request's length)
SMOOTHING = 0.3  # weight of the newest measurement in the running estimates


@dataclasses.dataclass
class PrefillBudget:
    """Prompt tokens per step: `cap`, or while rows decode what the saved `share` of decoding time buys."""

    cap: int
    share: float | None = None
    floor: int = FLOOR
    credit: float = 0.0  # seconds of prefill the decoding so far has earned and not spent
    decode_seconds: float | None = None  # running estimate of a decoding step without prefill
    token_seconds: float | None = None  # running estimate of one prefilled token (in chunks of the sizes used)

    def tokens(self, decoding: bool) -> int:
        """The step's prefill budget in tokens (`decoding`: live rows will decode in this step)."""
        if self.share is None or not decoding:
            return self.cap
        if self.token_seconds is None:
            return min(self.cap, PROBE)
        if self.credit < 0:
            return 0  # the last chunk's debt: the decoding steps pay it back first
        return min(self.cap, max(int(self.credit / self.token_seconds), self.floor))

    def prefilled(self, tokens: int, seconds: float, decoding: bool) -> None:
        """A chunk pass of `tokens` took `seconds`; beside decoding rows it spends credit."""
        if tokens <= 0:
            return
        self.token_seconds = _blend(self.token_seconds, seconds / tokens)
        if decoding and self.share is not None:
            self.credit -= seconds

    def decoded(self, seconds: float) -> None:
        """A decoding step took `seconds`: it earns `share` of that, up to the burst."""
        self.decode_seconds = _blend(self.decode_seconds, seconds)
        if self.share is not None:
            self.credit = min(self.credit + self.share * seconds, self.share * self.decode_seconds * BURST_STEPS)


def _blend(estimate: float | None, measured: float) -> float:
    return measured if estimate is None else (1 - SMOOTHING) * estimate + SMOOTHING * measured


class Prefilling:
    """A request whose prompt is being written into its cache slot, a chunk per step; not decoded yet.

    It keeps the slot when its prompt is complete and it becomes live."""

    def __init__(self, request: Any, sampling: SamplingTensors, slot: int) -> None:
        self.request = request  # a decoding.Request
        self.slot = slot  # its cache slot, from admission to finish
        self.sampling = sampling  # one row; its seed is drawn once, the first token is sampled with it
        self.done = 0  # prompt tokens whose K/V (and recurrent state) are in the row
        self.cached = 0  # of those, restored from the prefix cache (the drafter's context cache has them too)
        self.chunks = 0  # target passes spent on the prompt
        self.features: list[torch.Tensor] = []  # tapped features of the prefilled positions: the drafter's context

    @property
    def remaining(self) -> int:
        return len(self.request.prompt_ids) - self.done


def check_draft_len_schedule(schedule: Mapping[int, int] | None, block_size: int) -> dict[int, int]:
    """A draft-length schedule as {live rows from: draft tokens}, checked against the block size."""
    if not schedule:
        return {}
    checked = {int(k): int(v) for k, v in schedule.items()}
    if min(checked) < 1 or min(checked.values()) < 0:
        raise DFlashError(
            f"draft_len_schedule {checked} has a row count < 1 or a negative length",
            "use {rows: draft tokens} with rows >= 1 and tokens >= 0",
        )
    if max(checked.values()) > block_size - 1:
        raise DFlashError(
            f"draft_len_schedule {checked} drafts more than block size - 1 = {block_size - 1} tokens",
            "lower the schedule's lengths or raise the block size",
        )
    return checked


def scheduled_draft_len(schedule: Mapping[int, int], live_rows: int, block_size: int) -> int:
    """Draft tokens verified in a step with `live_rows` rows (the schedule, else block size - 1)."""
    length = block_size - 1
    for threshold, value in sorted(schedule.items()):
        if live_rows >= threshold:
            length = value
    return length


class DraftPolicy:
    """Whether a step runs the drafter, from what drafting has been earning (adaptive drafting).

    A DFlash step costs a drafter pass and a verify pass of the block; when the drafts do not land
    (prompts unlike the drafter's training data, or a batch so large that a step is compute-bound)
    it commits little more than one token a row, at more than an autoregressive step's cost. Per
    batch size this keeps running means of a drafting step's seconds and of the tokens it commits
    per row, and of an autoregressive step's seconds, and drafts when tokens per second say so. A
    skipped step verifies the anchor alone and keeps its tapped features, which the drafter reads
    at its next pass (the catch-up: no token is lost to the drafter's context). While it skips, it
    drafts once every `probe_every` steps to see whether drafting pays again. Lossless either way;
    but a seeded request's sampled tokens depend on which positions a draft covered, so with this
    policy (which decides by measured time) a seed no longer reproduces a request exactly.
    """

    def __init__(self, probe_every: int = 16) -> None:
        self.probe_every = probe_every
        self.drafting: dict[int, tuple[float, float]] = {}  # rows -> (seconds, tokens per row) of drafting steps
        self.plain: dict[int, float] = {}  # rows -> seconds of steps without the drafter
        self.skipped = 0

    def drafts(self, rows: int) -> bool:
        if rows not in self.drafting:
            return True  # measure drafting first
        if rows not in self.plain:
            return False  # then a step without it, once
        seconds, tokens = self.drafting[rows]
        if tokens / seconds >= 1.0 / self.plain[rows]:
            self.skipped = 0
            return True
        self.skipped += 1
        if self.skipped >= self.probe_every:
            self.skipped = 0
            return True
        return False

    def record(self, drafted: bool, rows: int, seconds: float, tokens_per_row: float) -> None:
        if drafted:
            old = self.drafting.get(rows)
            self.drafting[rows] = (seconds, tokens_per_row) if old is None else (_blend(old[0], seconds), _blend(old[1], tokens_per_row))
        else:
            self.plain[rows] = _blend(self.plain.get(rows), seconds)

"""How many prompt tokens a decoding step may prefill (chunked prefill's scheduler).

A fixed chunk (`prefill_chunk`) bounds a step's prefill in tokens, but what live streams feel is
its time: on a GPU a 512-token chunk of a small model costs a fraction of a decoding step, on a
CPU several steps. With `share`, while rows decode, a step's prefill is sized from what the last
steps measured so that it takes about `share` of a decoding step's time: the streams' inter-token
latency stays near (1 + share) x its value without prefills, and prompts still advance every
step (at least `floor` tokens). With no row decoding, or no `share`, the chunk is `cap`.

The estimate converges on the right size even though a pass has a fixed cost: with cost(n) =
o + c * n, the per-token estimate (o + c * n) / n gives the next n = share * d / (o / n + c),
whose fixed point is o + c * n = share * d. Timing is wall clock on the host: the decoder
synchronizes the device after a chunk's pass when a share is set, so a GPU's chunk is timed as
itself and not in the decoding step that would wait for it.
"""

from __future__ import annotations

import dataclasses

FLOOR = 16  # tokens a prompt advances per step at least, however tight the budget
PROBE = 64  # the first chunk beside decoding rows, before anything was measured
SMOOTHING = 0.3  # weight of the newest measurement in the running estimates


@dataclasses.dataclass
class PrefillBudget:
    """Prompt tokens per step: `cap`, or while rows decode a `share` of a decoding step's time."""

    cap: int
    share: float | None = None
    floor: int = FLOOR
    decode_seconds: float | None = None  # running estimate of a decoding step without prefill
    token_seconds: float | None = None  # running estimate of one prefilled token (in chunks of the sizes used)

    def tokens(self, decoding: bool) -> int:
        """The step's prefill budget in tokens (`decoding`: live rows will decode in this step)."""
        if self.share is None or not decoding:
            return self.cap
        if self.decode_seconds is None or self.token_seconds is None:
            return min(self.cap, PROBE)
        sized = int(self.share * self.decode_seconds / self.token_seconds)
        return max(min(self.floor, self.cap), min(self.cap, sized))

    def prefilled(self, tokens: int, seconds: float) -> None:
        if tokens > 0:
            self.token_seconds = _blend(self.token_seconds, seconds / tokens)

    def decoded(self, seconds: float) -> None:
        self.decode_seconds = _blend(self.decode_seconds, seconds)


def _blend(estimate: float | None, measured: float) -> float:
    return measured if estimate is None else (1 - SMOOTHING) * estimate + SMOOTHING * measured

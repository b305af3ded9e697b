"""Incremental detokenization and stop strings for the serving loop (issue 38).

Why: decoding a request's whole output at every step costs O(n) per step and O(n^2) per request
(a 2,000-token answer decodes about a million tokens over its life), and searching the whole text
for stop strings at every step does the same. Here each step decodes only the tokens since the
last complete character, in a window that starts one chunk earlier so that tokenizers whose text
depends on the preceding token (SentencePiece's leading spaces) see their context: the method of
Hugging Face TGI and vLLM (`prefix_offset` / `read_offset`). A trailing incomplete character (a
multi-byte character split across steps decodes to U+FFFD) is decoded again at the next step;
stop strings are searched only in the new text plus the longest stop's tail before it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

REPLACEMENT = "\ufffd"  # what a byte-level tokenizer decodes an incomplete character to


@dataclasses.dataclass
class IncrementalDetokenizer:
    """The text of a growing list of token ids, decoding only its newest ids at each call."""

    tokenizer: Any
    text: str = ""  # text of ids[:read_offset], every character complete
    prefix_offset: int = 0  # the decoding window starts here (context for the ids after read_offset)
    read_offset: int = 0
    prefix_text: str = ""  # decode(ids[prefix_offset:read_offset])

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def tail(self, ids: Sequence[int], end: int | None = None) -> str:
        """The text that ids[read_offset:end] add after `text` (may end in an incomplete character)."""
        window = self._decode(ids[self.prefix_offset : len(ids) if end is None else end])
        return window[len(self.prefix_text) :]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of all of `ids`, which extend the ids of earlier calls. Text up to the last
        complete character is kept, and only the ids after it are decoded next time."""
        tail = self.tail(ids)
        end = len(ids)
        # an incomplete character at the end: keep what comes before it (a character spans at most
        # 4 bytes, so at most 4 byte-level ids), so the window does not grow step after step
        while tail.endswith(REPLACEMENT) and end > self.read_offset + 1 and len(ids) - end < 4:
            end -= 1
            tail = self.tail(ids, end)
        if tail and not tail.endswith(REPLACEMENT):
            self.prefix_text = self._decode(ids[self.read_offset : end])
            self.text, self.prefix_offset, self.read_offset = self.text + tail, self.read_offset, end
        return self.text if self.read_offset == len(ids) else self.text + self.tail(ids)


@dataclasses.dataclass
class StopScan:
    """Where a request's stop strings may still end: a stop only counts once it ends past the text
    of the first `min_tokens` tokens (`floor`, known once that many tokens exist)."""

    stops: tuple[str, ...]
    min_tokens: int
    floor: int | None = None  # characters; None until the output has more than min_tokens tokens

    @property
    def longest(self) -> int:
        return max((len(s) for s in self.stops), default=0)

    def first_hit(self, text: str, searched_before: int, tokenizer: Any, ids: Sequence[int]) -> int | None:
        """The start of the stop string in `text` that ends first, past the floor and past what was
        searched before (the first `searched_before` characters); None if none.

        The stop that *ends* first wins (ties: the longer one), as it does when tokens arrive one at
        a time: the cut is then a function of the text alone, not of how a speculative step grouped
        its tokens (with stops "Return the number" and "he", "...Return t|he" stops at "he")."""
        if not self.stops or len(ids) <= self.min_tokens:
            return None
        if self.floor is None:  # once per request: the text of the first min_tokens tokens
            self.floor = len(tokenizer.decode(ids[: self.min_tokens], skip_special_tokens=True)) if self.min_tokens else 0
        hits = [(hit + len(s), hit) for s in self.stops if (hit := text.find(s, self.start(s, searched_before))) >= 0]
        return min(hits)[1] if hits else None

    def start(self, stop: str, searched_before: int) -> int:
        """Where to search for `stop`: it must end past the floor and past what was searched before."""
        return max(0, (self.floor or 0) - len(stop) + 1, searched_before - len(stop) + 1)


def stop_cut(detokenizer: IncrementalDetokenizer, scan: StopScan, ids: list[int], first_new: int, searched_before: int) -> int:
    """How many ids to keep: up to the one whose text completes the first stop string. Only ids
    from `first_new` (the detokenizer's read offset when this step's text was searched) can do so."""
    for keep in range(max(first_new + 1, scan.min_tokens + 1, 1), len(ids) + 1):
        text = detokenizer.text + detokenizer.tail(ids, keep)
        if any(text.find(s, scan.start(s, searched_before)) >= 0 for s in scan.stops):
            return keep
    return len(ids)

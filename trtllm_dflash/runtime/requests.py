"""A request, what it produced, and what one step committed to it (the decoding loop's public types;
`trtllm_dflash.decoding` re-exports them)."""

from __future__ import annotations

import dataclasses
from typing import Any

from trtllm_dflash.sampling_params import SamplingParams


@dataclasses.dataclass
class Request:
    prompt_ids: list[int]
    params: SamplingParams = SamplingParams()
    request_id: Any = None
    arrival: float = 0.0  # set by Decoder.submit; time to first token counts from here
    cache_salt: str | None = None  # shares prefix-cache blocks only with requests of the same salt
    # the matcher of params.grammar (runtime/grammar.py GrammarState), made by whoever holds the tokenizer
    grammar: Any = None


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

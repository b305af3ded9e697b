"""A request's speculative statistics in the forms benchmark clients read, besides our `usage.dflash`.

- vLLM's (PR #48915, `--per-request-spec-decode-metrics detailed`): a top-level
  `metrics.speculative_decoding` object on the response body, or streamed on the trailing usage
  chunk. NVIDIA's aiperf (0.13: `endpoints/base_endpoint.extract_spec_decode_stats`,
  `spec_decode/vllm_adapter.py`) reads exactly this object and prints its "Spec Decode" section
  from it; its record rejects a payload whose histogram, per-step lists and totals disagree.
- TensorRT-LLM's (`trtllm-serve`, `serve/openai_protocol.py`): `avg_decoded_tokens_per_iter` on
  each choice, the tokens a request decoded per target iteration.

Both are computed from the acceptance lengths the model streams (tokens committed per verify step,
the target's bonus token included), so they agree with `usage.dflash` by construction.
"""

from __future__ import annotations

from typing import Sequence


def speculative_decoding(lengths: Sequence[int], draft_tokens: int) -> dict:
    """vLLM's `metrics.speculative_decoding` of one request.

    `lengths`: the acceptance length of each verify step (accepted drafts + 1); `draft_tokens`: the
    request's proposed draft tokens (the model's `total_draft_tokens`, draft length x steps).
    """
    steps = len(lengths)
    per_step_accepted = [length - 1 for length in lengths]
    draft_len = draft_tokens // steps if steps else 0
    accepted = sum(per_step_accepted)
    histogram = [0] * (max([draft_len, *per_step_accepted]) + 1)
    for count in per_step_accepted:
        histogram[count] += 1
    return {
        "mean_acceptance_length": 1.0 + accepted / steps if steps else 1.0,
        "draft_acceptance_rate": accepted / draft_tokens if draft_tokens else 0.0,
        "acceptance_histogram": histogram,
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": draft_tokens,
        "num_spec_tokens": len(histogram) - 1,
        "per_step_accepted": per_step_accepted,
        "per_step_drafted": [draft_len] * steps,
    }


def avg_decoded_tokens_per_iter(lengths: Sequence[int]) -> float:
    """TensorRT-LLM's per-choice figure: tokens committed per verify step (1.0 before any step)."""
    return sum(lengths) / len(lengths) if lengths else 1.0

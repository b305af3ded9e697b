"""Adaptive drafting (step_schedule.DraftPolicy, issue 38): steps that skip the drafter verify the
anchor alone and keep its features for the drafter's next pass.

Greedy tokens stay the target's whatever steps skip it, for dense and hybrid targets; the drafter
catches up on the skipped context (its drafting steps accept as many drafts as when it never
skipped); the prefix cache stores a prompt only after a drafter pass has read it; and the policy
skips the drafter exactly when its tokens per second lose to plain steps, probing now and then.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from trtllm_dflash.decoding import Decoder, Request, SamplingParams
from trtllm_dflash.runtime.prefix_cache import PrefixCache
from trtllm_dflash.runtime.step_schedule import DraftPolicy
from trtllm_dflash.testing.tiny import cycle_sequences

GREEDY = SamplingParams(max_new_tokens=40, stop_token_ids=())


class Scripted:
    """A policy that drafts by a fixed pattern, cycled (True: draft)."""

    def __init__(self, pattern: list[bool]) -> None:
        self.pattern = itertools.cycle(pattern)

    def drafts(self, rows: int) -> bool:
        return next(self.pattern)

    def record(self, *args) -> None:
        pass


def _prompts() -> list[list[int]]:
    windows = cycle_sequences(4, 40, torch.Generator().manual_seed(3)).tolist()
    return [w[: 12 + 5 * i] for i, w in enumerate(windows)]


def _decode(runtime, pattern: list[bool] | None, prompts, prefix_cache=None):
    decoder = Decoder(runtime, max_batch=4, max_context=128, prefix_cache=prefix_cache)
    if pattern is not None:
        decoder.draft_policy = Scripted(pattern)
    return decoder.generate([Request(p, GREEDY) for p in prompts])


def _drafting_tau(results) -> float:
    steps = [(a, d) for r in results for a, d in zip(r.acceptance_lengths, r.draft_lengths) if d > 0]
    return sum(a for a, _ in steps) / len(steps)


@pytest.mark.parametrize("target", ["dense", "hybrid"])
@pytest.mark.parametrize(
    "pattern", [[False, True], [True, False, False, False], [False, False, True]], ids=["alternate", "draft-1-in-4", "skip-first"]
)
def test_skipping_the_drafter_keeps_the_tokens_and_the_drafter_catches_up(request, target, pattern):
    runtime = request.getfixturevalue(target)
    prompts = _prompts()
    always = _decode(runtime, None, prompts)
    skipping = _decode(runtime, pattern, prompts)
    never = _decode(runtime, [False], prompts)  # the drafter never runs: the target alone, a token a step
    assert [r.token_ids for r in skipping] == [r.token_ids for r in always] == [r.token_ids for r in never]
    assert all(a == 1 for r in never for a in r.acceptance_lengths)
    assert any(d == 0 for r in skipping for d in r.draft_lengths)  # steps did skip the drafter
    # the drafter read the skipped context at its next pass: its blocks land as well as ever
    assert _drafting_tau(always) > 2.0
    assert _drafting_tau(skipping) >= 0.8 * _drafting_tau(always), (_drafting_tau(skipping), _drafting_tau(always))


def test_a_prompt_is_stored_in_the_prefix_cache_only_after_a_drafter_pass_read_it(dense):
    """A request that skips the drafter at first has no drafter context for its prompt yet; its
    blocks are stored once a drafter pass has read them, and a prompt restoring them drafts well."""
    prompts = _prompts()
    shared = prompts[3][:24]
    cache = PrefixCache(1 << 30, block_tokens=8)
    decoder = Decoder(dense, max_batch=2, max_context=128, prefix_cache=cache)
    decoder.draft_policy = Scripted([False] * 3 + [True])
    first = decoder.generate([Request(shared + [5, 6, 7], SamplingParams(max_new_tokens=2, stop_token_ids=()))])[0]
    assert first.draft_lengths == [0] and not cache.blocks  # ended before any drafter pass: nothing stored
    decoder.draft_policy = Scripted([False, True])
    decoder.generate([Request(shared + [5, 6, 7], GREEDY)])
    assert cache.blocks  # stored after its drafter pass
    decoder.draft_policy = None
    warm = decoder.generate([Request(shared + [9, 9], GREEDY)])[0]
    cold = Decoder(dense, max_batch=1, max_context=128).generate([Request(shared + [9, 9], GREEDY)])[0]
    assert warm.cached_prompt_tokens == 24 and warm.token_ids == cold.token_ids and warm.acceptance_lengths == cold.acceptance_lengths


def test_the_policy_skips_the_drafter_when_plain_steps_make_more_tokens_per_second():
    policy = DraftPolicy(probe_every=4)
    assert policy.drafts(8)  # drafting is measured first
    policy.record(True, 8, 0.010, 1.3)  # 130 tokens/s per row
    assert not policy.drafts(8)  # then a plain step
    policy.record(False, 8, 0.004, 1.0)  # 250 tokens/s per row: plain wins
    decisions = [policy.drafts(8) for _ in range(8)]
    assert decisions == [False, False, False, True] * 2  # skipping, probing every 4th step
    policy.record(True, 8, 0.010, 4.0)  # the drafts land again
    policy.record(True, 8, 0.010, 4.0)
    assert policy.drafts(8) and policy.drafts(8)
    assert policy.drafts(1)  # another batch size is measured on its own


def test_a_served_model_drafts_adaptively_when_its_repository_says_so(tmp_path):
    from support import cli

    from trtllm_dflash.backends import open_served_pipeline
    from trtllm_dflash.served_model.batching_loop import BatchingLoop
    from trtllm_dflash.served_model.model_parameters import ServingConfig

    out = tmp_path / "repo"
    cli("repo", "--model", "demo", "--out", str(out), "--adaptive-drafting", "--max-context", "128")
    parameters = (out / "dflash" / "config.pbtxt").read_text()
    assert 'key: "adaptive_drafting"' in parameters
    config = ServingConfig.from_parameters(
        dict(__import__("re").findall(r'key: "(\w+)"\s*value: \{\s*string_value: "([^"]*)"', parameters))
    )
    assert config.adaptive_drafting is True and ServingConfig(target="x").adaptive_drafting is False
    loop = BatchingLoop(config, open_served_pipeline(config))
    assert isinstance(loop.decoder.draft_policy, DraftPolicy)
    assert BatchingLoop(config.model_copy(update={"adaptive_drafting": False}), loop.pipeline).decoder.draft_policy is None

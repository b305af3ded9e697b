"""The chunked-prefill scheduler's budget (prefill_budget.py): chunk sizes from measured times."""

from __future__ import annotations

import pytest

from trtllm_dflash.prefill_budget import FLOOR, PROBE, PrefillBudget


def test_without_a_share_or_decoding_rows_the_chunk_is_the_cap():
    assert PrefillBudget(512).tokens(decoding=True) == 512
    budget = PrefillBudget(512, share=0.5, decode_seconds=0.02, token_seconds=0.01)
    assert budget.tokens(decoding=False) == 512  # nobody to protect: whole chunks


def test_before_any_measurement_a_probe_chunk():
    assert PrefillBudget(512, share=0.5).tokens(decoding=True) == PROBE
    assert PrefillBudget(32, share=0.5).tokens(decoding=True) == 32


@pytest.mark.parametrize("overhead", [0.0, 0.004])
def test_the_chunk_converges_to_the_share_of_a_decoding_step(overhead):
    """A pass that costs overhead + per_token * n: the chunk settles where its pass takes share x the
    decoding step, the fixed point of the running estimates, fixed cost included."""
    decode, per_token, share = 0.020, 0.0001, 0.5
    budget = PrefillBudget(512, share=share)
    for _ in range(40):
        n = budget.tokens(decoding=True)
        budget.prefilled(n, overhead + per_token * n)
        budget.decoded(decode)
    expected = (share * decode - overhead) / per_token  # 100 tokens, or 60 with the fixed cost
    assert abs(budget.tokens(decoding=True) - expected) <= 2


def test_the_floor_and_the_cap_bound_the_chunk():
    slow = PrefillBudget(512, share=0.5, decode_seconds=0.01, token_seconds=1.0)
    assert slow.tokens(decoding=True) == FLOOR  # a prompt still advances every step
    fast = PrefillBudget(512, share=0.5, decode_seconds=1.0, token_seconds=1e-6)
    assert fast.tokens(decoding=True) == 512
    assert PrefillBudget(8, share=0.5, decode_seconds=0.01, token_seconds=1.0).tokens(decoding=True) == 8  # cap below the floor


def test_no_tokens_leave_the_estimate_alone():
    budget = PrefillBudget(512, share=0.5)
    budget.prefilled(0, 0.3)
    assert budget.token_seconds is None

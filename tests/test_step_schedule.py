"""The chunked-prefill scheduler's budget (runtime/step_schedule.py): a token bucket of decoding time."""

from __future__ import annotations

import pytest

from trtllm_dflash.runtime.step_schedule import BURST_STEPS, FLOOR, PROBE, PrefillBudget


def test_without_a_share_or_decoding_rows_the_chunk_is_the_cap_and_costs_nothing():
    assert PrefillBudget(512).tokens(decoding=True) == 512
    budget = PrefillBudget(512, share=0.5, token_seconds=0.01)
    assert budget.tokens(decoding=False) == 512  # nobody to protect: whole chunks
    budget.prefilled(512, 5.0, decoding=False)
    assert budget.credit == 0.0


def test_before_a_token_was_timed_a_probe_chunk():
    assert PrefillBudget(512, share=0.5).tokens(decoding=True) == PROBE
    assert PrefillBudget(32, share=0.5).tokens(decoding=True) == 32


def simulate(
    budget: PrefillBudget, steps: int, decode: float, overhead: float, per_token: float, pending
) -> tuple[float, float, list[int]]:
    """Steps of a decoder whose chunk pass costs overhead + per_token * n; `pending(step)` says
    whether a prompt waits to be prefilled. Returns (prefill seconds, decode seconds, chunk sizes)."""
    prefill_time = decode_time = 0.0
    sizes = []
    for step in range(steps):
        if pending(step):
            n = budget.tokens(decoding=True)
            sizes.append(n)
            cost = overhead + per_token * n
            budget.prefilled(n, cost, decoding=True)
            prefill_time += cost
        budget.decoded(decode)
        decode_time += decode
    return prefill_time, decode_time, sizes


@pytest.mark.parametrize("share", [0.3, 0.5])
@pytest.mark.parametrize("overhead", [0.0, 0.002])
def test_sustained_prefills_take_the_share_of_the_decoding_time(share, overhead):
    """A prompt always waiting: over many steps the prefill time is share x the decoding time, a
    fixed cost per pass included (streams then average (1 + share) x their pace)."""
    budget = PrefillBudget(512, share=share)
    prefill, decode, _ = simulate(budget, 2000, decode=0.020, overhead=overhead, per_token=0.0001, pending=lambda step: True)
    assert prefill / decode == pytest.approx(share, rel=0.1)


def test_a_rare_long_prompt_is_prefilled_from_saved_credit_in_large_chunks():
    """After steps with nothing to prefill the credit is full: the next chunks are the cap, then they
    fall to what the share pays for as the credit is spent."""
    budget = PrefillBudget(512, share=0.3)
    _, _, sizes = simulate(
        budget, BURST_STEPS * 3, decode=0.020, overhead=0.0, per_token=0.0001, pending=lambda step: step == 0 or step >= 2 * BURST_STEPS
    )
    assert budget.credit <= 0.3 * 0.020 * BURST_STEPS
    burst, steady = sizes[1:4], sizes[-32:]
    assert burst[0] == 512  # 0.38 s of credit buys more than the cap (51 ms)
    assert max(steady) < 512 and all(n == 0 or n >= FLOOR for n in steady)
    assert sum(steady) / len(steady) == pytest.approx(0.3 * 0.020 / 0.0001, rel=0.1)  # the share pays 60 tokens a step


def test_a_chunk_waits_out_a_debt_takes_at_least_the_floor_and_stops_at_the_cap():
    token = 0.001
    assert PrefillBudget(512, share=0.5, credit=-1e-6, token_seconds=token).tokens(decoding=True) == 0  # in debt: wait
    assert PrefillBudget(512, share=0.5, credit=0.0, token_seconds=token).tokens(decoding=True) == FLOOR  # paid out of debt
    assert PrefillBudget(512, share=0.5, credit=(FLOOR - 1) * token, token_seconds=token).tokens(decoding=True) == FLOOR
    assert PrefillBudget(512, share=0.5, credit=(FLOOR + 10.5) * token, token_seconds=token).tokens(decoding=True) == FLOOR + 10
    assert PrefillBudget(512, share=0.5, credit=10.0, token_seconds=token).tokens(decoding=True) == 512
    assert PrefillBudget(8, share=0.5, credit=0.0, token_seconds=token).tokens(decoding=True) == 8  # a cap below the floor


def test_short_prompts_joining_now_and_then_go_in_at_once_and_stay_within_the_share():
    """A 64-token prompt every 4 steps, each costing more than the credit a step earns: every one is
    prefilled in the step it arrives (none waits for credit) and prefills stay near the share."""
    budget = PrefillBudget(512, share=0.3)
    prefill, decode, sizes = simulate(budget, 400, decode=0.020, overhead=0.002, per_token=0.00015, pending=lambda step: step % 4 == 0)
    assert all(n >= 64 for n in sizes[1:])  # after the first (probe) chunk
    assert prefill / decode <= 0.3 * 1.1


def test_a_waiting_prompt_advances_within_a_few_decoding_steps():
    """However deep the debt a large chunk left, decoding steps earn credit until a chunk is affordable."""
    budget = PrefillBudget(512, share=0.3, credit=-0.05, token_seconds=0.0001, decode_seconds=0.02)
    steps = 0
    while budget.tokens(decoding=True) == 0:
        budget.decoded(0.02)
        steps += 1
    assert steps == 9  # 50 ms of debt + 1.6 ms for 16 tokens = 51.6 ms, at 6 ms a step


def test_no_tokens_leave_the_estimate_alone():
    budget = PrefillBudget(512, share=0.5)
    budget.prefilled(0, 0.3, decoding=True)
    assert budget.token_seconds is None and budget.credit == 0.0

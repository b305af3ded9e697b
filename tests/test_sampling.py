"""Lossless at temperature > 0: speculative sampling reproduces the target's distribution.

The target's exact distribution over the first three generated tokens is computed by enumeration
on an 8-token vocabulary; thousands of seeded requests are decoded speculatively in one batch and
compared with a chi-square test. The same test rejects a decoder with the classic wrong residual
(resampling from p instead of normalize(max(0, p - q)) after a rejection).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chisquare
from support import SMALL_VOCAB, chi2_pvalue, exact_distribution, sample_speculatively

from trtllm_dflash import DFlashPipeline, ops
from trtllm_dflash.decoding import Decoder, Request, SamplingParams
from trtllm_dflash.ops import reference, rng, sampling_support
from trtllm_dflash.testing.tiny import make_tiny_drafter, make_tiny_target


def _small_vocab_pair(root, family: str, block_size: int = 4, **drafter_options):
    target = make_tiny_target(root / "target", family, seed=11, vocab_size=SMALL_VOCAB)
    drafter = make_tiny_drafter(
        root / "drafter",
        target,
        seed=12,
        block_size=block_size,
        mask_token_id=SMALL_VOCAB - 1,
        target_layer_ids=(1, 2),
        **drafter_options,
    )
    return target, drafter


# a drafter whose first layer is sliding with window 2: it cuts the 3-token prompt and the block of 4
SLIDING_DRAFTER = {"layer_types": ("sliding_attention", "full_attention"), "sliding_window": 2}


@pytest.fixture(scope="module")
def small_vocab_pair(tmp_path_factory):
    return _small_vocab_pair(tmp_path_factory.mktemp("small-vocab"), "llama")


# a hybrid (Gated DeltaNet states rolled back per row) and gpt-oss (sinks, sliding windows, MoE).
# Block 2 for them: the third token then comes from a second verify step, which starts from the
# state the first one rolled back to (with block 4 all three tokens come from one pass). This
# checks the sampling path on those families; the exactness of the rolled-back state itself is
# checked token for token (test_families.py), where a wrong state cannot hide in the noise.
# "llama-sliding-drafter": the llama pair with a sliding-window draft layer (tests/test_sliding_drafters.py).
@pytest.fixture(
    scope="module",
    params=[("llama", 4, {}), ("qwen3_5", 2, {}), ("gpt_oss", 2, {}), ("llama", 4, SLIDING_DRAFTER)],
    ids=["llama", "qwen3_5", "gpt_oss", "llama-sliding-drafter"],
)
def family_pair(request, tmp_path_factory):
    family, block_size, drafter_options = request.param
    return _small_vocab_pair(tmp_path_factory.mktemp(f"small-vocab-{family}"), family, block_size, **drafter_options)


SETTINGS = {"temperature-1": (1.0, 0, 1.0), "top-k-top-p": (0.8, 5, 0.9)}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_speculative_sampling_matches_target_distribution(family_pair, setting):
    temperature, top_k, top_p = SETTINGS[setting]
    samples = sample_speculatively(*family_pair, temperature, top_k, top_p)
    exact = exact_distribution(family_pair[0], temperature, top_k, top_p)
    for positions in [(0,), (1,), (2,), (0, 1), (0, 1, 2)]:
        assert chi2_pvalue(samples, exact, positions) > 1e-3, positions


def _kept_by_top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p written plainly (continuous random logits: no ties): a token is kept while the mass of
    the tokens more probable than it is below top_p; renormalised."""
    mass_above = torch.stack([probs[probs > x].sum() for x in probs])
    kept = torch.where(mass_above < top_p, probs, 0.0)
    return kept / kept.sum()


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_a_sampled_draft_is_accepted_as_often_as_the_overlap_of_p_and_q(top_p):
    """Equal output distributions prove the residual right, not the acceptance: a verifier that
    rejects too often stays lossless and only slows decoding. A draft drawn from q is accepted with
    probability min(1, p/q), so over many seeds the acceptance rate must be sum_x min(p(x), q(x)),
    here computed without the project's code (softmax, then top-p written plainly)."""
    g = torch.Generator().manual_seed(5)
    vocab, trials, temperature = 40, 6000, 0.8
    target_logits = torch.randn(1, 2, vocab, generator=g) * 2
    draft_logits = target_logits[:, :1] + torch.randn(1, 1, vocab, generator=g) * 0.7
    p = _kept_by_top_p(torch.softmax(target_logits[0, 0] / temperature, dim=-1), top_p)
    q = _kept_by_top_p(torch.softmax(draft_logits[0, 0] / temperature, dim=-1), top_p)
    overlap = float(torch.minimum(p, q).sum())
    rows = torch.ones(trials)
    settings = (rows * temperature, torch.zeros(trials, dtype=torch.long), rows * top_p)
    seeds, starts = torch.arange(trials) * 7 + 1, torch.full((trials,), 30)
    drafts, draft_probs = reference.sample_tokens(
        draft_logits.expand(trials, -1, -1), *settings, seeds, starts.view(-1, 1) + 1, rng.STREAM_DRAFT
    )
    torch.testing.assert_close(draft_probs[0, 0], q, rtol=1e-5, atol=1e-7)
    block = torch.cat([torch.zeros(trials, 1, dtype=torch.long), drafts], dim=1)
    accepted, _ = reference.verify_block(target_logits.expand(trials, -1, -1), block, draft_probs, *settings, seeds, starts)
    rate, sigma = float(accepted.float().mean()), (overlap * (1 - overlap) / trials) ** 0.5
    assert 0.3 < overlap < 0.95 and abs(rate - overlap) < 4.5 * sigma, (rate, overlap)


def _verify_with_wrong_residual(target_logits, block, draft_probs, temperature, top_k, top_p, seed, start):
    """The classic bug: after a rejection, resample from p instead of normalize(max(0, p - q))."""
    accepted, bonus = reference.verify_block(target_logits, block, draft_probs, temperature, top_k, top_p, seed, start)
    rows = torch.arange(block.shape[0])
    p = reference.process_logits(target_logits[rows, accepted], temperature, top_k, top_p)
    wrong = reference.sample_from_probs(p, rng.counter_key(seed, start + accepted + 1, rng.STREAM_BONUS))
    return accepted, torch.where(accepted < block.shape[1] - 1, wrong, bonus)


def test_the_test_rejects_a_wrong_residual(small_vocab_pair, monkeypatch):
    monkeypatch.setattr(ops, "verify_block", _verify_with_wrong_residual)
    samples = sample_speculatively(*small_vocab_pair, 1.0, 0, 1.0)
    exact = exact_distribution(small_vocab_pair[0], 1.0, 0, 1.0)
    assert chi2_pvalue(samples, exact, (0, 1, 2)) < 1e-6


# ----------------------------------------------------------------------------- reproducibility


def test_seeded_request_is_reproducible_alone_or_in_a_batch(tiny_qwen3, tiny_qwen3_drafter):
    pipe = DFlashPipeline.load(tiny_qwen3, tiny_qwen3_drafter, max_context=64)
    kwargs = dict(max_new_tokens=16, temperature=0.9, top_p=0.95, seed=1234, stop_token_ids=())
    alone = pipe.generate([[4, 5, 6]], **kwargs)[0].token_ids
    again = pipe.generate([[4, 5, 6]], **kwargs)[0].token_ids
    batched = pipe.generate([[9, 9], [4, 5, 6], [7, 1, 2, 3, 4]], **kwargs)[1].token_ids
    assert alone == again == batched
    other_seed = pipe.generate([[4, 5, 6]], **dict(kwargs, seed=99))[0].token_ids
    assert other_seed != alone


def test_greedy_rows_stay_exact_in_a_sampled_batch(tiny_qwen3, tiny_qwen3_drafter):
    pipe = DFlashPipeline.load(tiny_qwen3, tiny_qwen3_drafter, max_context=64, dtype=torch.float64)
    decoder = Decoder(pipe.runtime, max_batch=3, max_context=64)
    prompts = [[4, 5, 6], [7, 8], [10, 11, 12, 13]]
    temps = [0.0, 1.0, 0.0]
    results = decoder.generate(Request(p, SamplingParams(max_new_tokens=12, temperature=t, seed=3)) for p, t in zip(prompts, temps))
    greedy = DFlashPipeline.load(tiny_qwen3, None, max_context=64, dtype=torch.float64)
    for prompt, temp, result in zip(prompts, temps, results):
        if temp == 0:
            assert result.token_ids == greedy.generate([prompt], max_new_tokens=12, stop_token_ids=())[0].token_ids


# ----------------------------------------------------------------------------- the building blocks


def test_process_logits_matches_sort_based_top_k_top_p():
    torch.manual_seed(0)
    logits = torch.randn(6, 50) * 3
    temperature = torch.tensor([1.0, 0.7, 1.3, 1.0, 0.5, 2.0])
    top_k = torch.tensor([0, 5, 0, 10, 1, 3])
    top_p = torch.tensor([1.0, 1.0, 0.8, 0.5, 1.0, 0.9])
    probs = reference.process_logits(logits, temperature, top_k, top_p)
    for row in range(6):
        scaled = logits[row] / temperature[row]
        if top_k[row] > 0:
            kth = scaled.topk(int(top_k[row])).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        p = scaled.softmax(-1)
        order = p.argsort(descending=True)
        cumulative = p[order].cumsum(0)
        cut = int((cumulative < top_p[row]).sum()) + 1  # smallest prefix reaching top_p
        keep = torch.zeros_like(p, dtype=torch.bool)
        keep[order[:cut]] = True
        expected = torch.where(keep, p, torch.zeros_like(p))
        torch.testing.assert_close(probs[row], expected / expected.sum())


def spy_on_shortlists(monkeypatch, calls: list) -> None:
    """Record, per top-p call of process_logits, whether it sorted the top-k shortlist only."""
    real = reference._drop_top_p_
    monkeypatch.setattr(
        reference, "_drop_top_p_", lambda probs, p, shortlist: calls.append(shortlist is not None) or real(probs, p, shortlist)
    )


def _top_p_by_sorting_the_vocabulary(logits, temperature, top_k, top_p):
    """process_logits with top-p over the whole vocabulary's sort (what it did before the support)."""
    real = reference._drop_top_p_
    reference._drop_top_p_ = lambda probs, p, within: real(probs, p, None)
    try:
        return reference.process_logits(logits, temperature, top_k, top_p)
    finally:
        reference._drop_top_p_ = real


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_top_p_over_the_support_is_bit_for_bit_the_full_sort(dtype, monkeypatch):
    """On a CPU, where top-k leaves each sampled top-p row at most 4,096 tokens of nonzero
    probability, top-p sorts only those (`sampling_support.support`): the same probabilities to the bit as
    sorting the vocabulary, with rows mixed (greedy, temperature, top-k, top-p, both), bf16 logits
    (ties), masked tokens, ties at the k-th value past k, and a top-k wider than the row's finite
    tokens. A sampled top-p row without top-k, or ties past 4,096 tokens, sort the vocabulary."""
    g = torch.Generator().manual_seed(21)
    logits = (torch.randn(8, 3, 5000, generator=g) * 4).to(dtype).float()
    logits[2, :, 100:140] = 30.0  # 40 tokens tied above the rest: top-k 20 keeps all 40
    logits[3, :, :4990] = float("-inf")  # 10 tokens left (a grammar's mask) under top-k 20
    temperature = torch.tensor([0.0, 0.7, 1.0, 0.9, 0.6, 1.3, 0.8, 0.0])
    top_k = torch.tensor([0, 50, 20, 20, 20, 64, 1, 20])
    top_p = torch.tensor([0.9, 0.9, 0.95, 0.8, 0.95, 1.0, 0.5, 0.9])

    def run(logits, top_k):
        calls = []
        spy_on_shortlists(monkeypatch, calls)
        got = reference.process_logits(logits, temperature, top_k, top_p)
        monkeypatch.undo()
        return got, calls

    got, calls = run(logits, top_k)
    assert calls == [True] and torch.equal(got, _top_p_by_sorting_the_vocabulary(logits, temperature, top_k, top_p))
    assert int((got[2, 0] > 0).sum()) == 40 and int((got[3, 0] > 0).sum()) <= 10

    tied = logits.clone()
    tied[1, :, 200:300] = 40.0  # 100 tokens tied at the top under top-k 50: all kept, all in the support
    got, calls = run(tied, top_k)
    assert calls == [True] and torch.equal(got, _top_p_by_sorting_the_vocabulary(tied, temperature, top_k, top_p))
    assert int((got[1, 0] > 0).sum()) == 100

    tied[1, :, :4500] = 40.0  # 4,500 tied: past the support's limit
    got, calls = run(tied, top_k)
    assert calls == [False] and torch.equal(got, _top_p_by_sorting_the_vocabulary(tied, temperature, top_k, top_p))

    top_k_off = top_k.clone()
    top_k_off[4] = 0  # a sampled top-p row without top-k (row 0 is greedy: its top-p result is replaced and does not count)
    assert run(logits, top_k_off)[1] == [False]


def test_sampling_over_the_support_draws_the_full_races_tokens():
    """The race over the support (`sample_from_probs(..., largest_top_k=64)`) draws the tokens of the race
    over the vocabulary; a dense row (no top-k) races the vocabulary."""
    g = torch.Generator().manual_seed(22)
    logits = (torch.randn(6, 4, 6000, generator=g) * 3).to(torch.bfloat16).float()
    logits[0, :, [7, 4000]] = 50.0  # two tokens of equal probability far above the rest
    temperature, top_k, top_p = torch.tensor([1.0, 0.7, 0.6, 1.0, 0.9, 1.2]), torch.tensor([5, 50, 20, 1, 64, 30]), torch.full((6,), 0.95)
    probs = reference.process_logits(logits, temperature, top_k, top_p)
    draws = probs[:, :1].expand(-1, 400, -1)  # 400 draws of each row's first position: the less likely tokens win some
    keys = rng.counter_key(torch.arange(6).view(-1, 1) * 7, torch.arange(400) + 100, rng.STREAM_BONUS)
    within = sampling_support.support(draws)
    assert within is not None and within.shape[-1] <= 64
    sparse = reference.sample_from_probs(draws, keys, largest_top_k=64)
    assert torch.equal(sparse, reference.sample_from_probs(draws, keys))
    assert len(set(sparse[4].tolist())) > 10  # top-k 64, top-p 0.95: many tokens drawn
    dense = reference.process_logits(logits, temperature, torch.zeros(6, dtype=torch.long), torch.ones(6))
    assert sampling_support.support(dense) is None  # every token has probability > 0: the vocabulary races


@pytest.mark.parametrize("dense_row", [False, True])
def test_sample_tokens_draws_the_full_races_tokens_when_top_p_found_the_support(dense_row):
    """`sample_tokens` races over the support top-p found where every sampled row used top-p, and
    finds it again otherwise: its tokens are those of the race over the vocabulary either way, with a
    greedy row and, in one case, a sampled row without top-k or top-p (a dense distribution)."""
    g = torch.Generator().manual_seed(24)
    batch, positions = 4, 6
    logits = (torch.randn(batch, positions, 6000, generator=g) * 3).to(torch.bfloat16).float()
    temperature = torch.tensor([0.0, 0.7, 1.0, 0.9])
    top_k, top_p = torch.tensor([0, 20, 50, 5]), torch.tensor([1.0, 0.95, 0.9, 0.8])
    if dense_row:  # nearly uniform: its race's winners lie outside the other rows' few hundred tokens
        top_k[3], top_p[3], logits[3] = 0, 1.0, logits[3] * 0.01
    seed, at = torch.arange(batch) * 5 + 1, torch.arange(positions).expand(batch, -1) + 30
    tokens, probs = reference.sample_tokens(logits, temperature, top_k, top_p, seed, at, rng.STREAM_DRAFT)
    full_race = reference.sample_from_probs(probs, rng.counter_key(seed.view(-1, 1), at, rng.STREAM_DRAFT))
    assert torch.equal(tokens[1:], full_race[1:])
    assert torch.equal(tokens[0], logits[0].argmax(-1))


def test_the_support_from_the_largest_top_k_holds_every_nonzero_token():
    """`support(..., largest_top_k=k)` takes the 2k + TIES_MARGIN largest where each needed row's
    smallest of them is 0, and counts over the vocabulary otherwise: every nonzero token is in it
    either way, ascending."""
    g = torch.Generator().manual_seed(23)
    logits = (torch.randn(4, 2, 6000, generator=g) * 3).float()
    probs = reference.process_logits(logits, torch.ones(4), torch.tensor([20, 5, 20, 1]), torch.ones(4))
    taken = 2 * 20 + sampling_support.TIES_MARGIN

    def holds_every_nonzero(probs, within):
        inside = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, within, True)
        return bool(((probs > 0) & ~inside).sum() == 0) and bool((within.diff(dim=-1) > 0).all())

    bounded = sampling_support.support(probs, largest_top_k=20)
    assert bounded.shape[-1] == taken and holds_every_nonzero(probs, bounded)
    assert sampling_support.support(probs).shape[-1] == 20  # counted: the most any row has
    wide = probs.clone()
    wide[1, 0, 100 : 100 + taken] = 1e-3  # more nonzero tokens in one row than taken: counted instead
    counted = sampling_support.support(wide, largest_top_k=20)
    assert counted.shape[-1] == int((wide > 0).sum(-1).max()) > taken and holds_every_nonzero(wide, counted)
    rows = torch.tensor([True, False, True, True]).view(4, 1, 1)  # that row not needed: the largest again
    assert sampling_support.support(wide, rows, largest_top_k=20).shape[-1] == taken


def _drop_top_p_by_binary_search(probs, p):
    """Top-p's mask as `_drop_top_p_` first computed it: each token's count of values at or below it
    by torch.searchsorted over the ascending values, the mass above it from the ascending sums."""
    ascending, _ = probs.sort(dim=-1)
    cumulative = ascending.cumsum(dim=-1)
    n_less_equal = torch.searchsorted(ascending.contiguous(), probs.contiguous(), right=True)
    mass_greater = cumulative[..., -1:] - cumulative.gather(-1, (n_less_equal - 1).clamp_min(0))
    return probs.masked_fill(~((p >= 1) | (mass_greater < p)), 0.0)


@pytest.mark.parametrize("seed", range(4))
def test_top_p_finds_the_mass_above_each_token_as_a_binary_search_does(seed):
    """`_drop_top_p_` finds where each run of tied values ends by a running minimum instead of a
    binary search per token: the same indices, so the same probabilities to the bit, with ties
    (bf16 logits, a tied plateau), zeros (masked tokens, a three-token row), p of 1 and near 0,
    and a NaN position (dropped whole)."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(6, 5, 3000, generator=g) * 3).to(torch.bfloat16).float()
    logits[0, :, :100] = 20.0
    logits[1, :, 50:] = float("-inf")
    probs = torch.softmax(logits / 0.8, dim=-1)
    probs[2] = 0.0
    probs[2, :, :3] = 1 / 3
    probs[5, 0] = float("nan")  # softmax of a row without a finite logit
    p = torch.rand(6, 1, 1, generator=g)
    p[3], p[4] = 1.0, 1e-9
    got = probs.clone()
    reference._drop_top_p_(got, p, None)
    assert torch.equal(got, _drop_top_p_by_binary_search(probs, p)) and bool((got[5, 0] == 0).all())
    assert bool((got[0, :, :100] > 0).all()) and bool(((got[4] > 0).sum(-1) >= 1).all())  # a tied top kept whole; p ~ 0 keeps the top


def test_ties_are_kept_together_and_greedy_is_one_hot():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 5.0, 1.0, 5.0]])
    probs = reference.process_logits(logits, torch.tensor([1.0, 0.0]), torch.tensor([1, 0]), torch.tensor([1.0, 1.0]))
    assert probs[0, 1] == probs[0, 2] == 0.5 and probs[0, 0] == 0  # top-1 with a tie keeps both
    assert probs[1].tolist() == [0.0, 1.0, 0.0, 0.0]  # greedy: the first index of the max


@pytest.mark.parametrize(
    ("drafts", "expected_accepted"),
    [([2, 3, 1], 3), ([2, 0, 1], 1), ([0, 3, 1], 0), ([2, 3, 0], 2)],
    ids=["all", "short", "none", "long"],
)
def test_greedy_verification_counts_the_matching_prefix(drafts, expected_accepted):
    posterior = [2, 3, 1, 4]  # the target's argmax at block positions 0..3
    logits = torch.nn.functional.one_hot(torch.tensor([posterior]), 5).float() * 10
    block = torch.tensor([[7] + drafts])
    zero, one = torch.zeros(1), torch.ones(1)
    accepted, bonus = reference.verify_block(
        logits,
        block,
        None,
        zero,
        torch.zeros(1, dtype=torch.long),
        one,
        torch.zeros(1, dtype=torch.long),
        torch.tensor([10]),
    )
    assert int(accepted) == expected_accepted
    assert int(bonus) == posterior[expected_accepted]


def test_counter_rng_is_uniform_and_stream_separated():
    seeds = torch.arange(20000)
    u = rng.uniform(seeds, torch.full_like(seeds, 5), rng.STREAM_ACCEPT)
    assert 0 < float(u.min()) and float(u.max()) < 1
    histogram = torch.histc(u, bins=10, min=0, max=1)
    assert chisquare(histogram.numpy()).pvalue > 1e-3
    other = rng.uniform(seeds, torch.full_like(seeds, 5), rng.STREAM_BONUS)
    assert abs(float(torch.corrcoef(torch.stack([u, other]))[0, 1])) < 0.03
    assert torch.equal(u, rng.uniform(seeds, torch.full_like(seeds, 5), rng.STREAM_ACCEPT))


def test_vocabulary_uniforms_are_the_int64_lowbias32_bit_for_bit():
    """uniform_from_key hashes on int32 in place; the bits must be the plain 64-bit formula's
    (what the Triton kernels compute on uint32): odd sizes, keys above 2**31, huge indexes."""
    g = torch.Generator().manual_seed(3)

    def plain(key, index):
        bits = rng.hash32(key ^ ((torch.as_tensor(index, dtype=torch.int64) * rng.GOLDEN32 + 1) & rng.MASK32))
        return ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / 16777216.0)

    for shape, index in (
        ((3, 5, 1), torch.arange(1001)),
        ((64, 1), torch.arange(65536)),
        ((999,), torch.randint(0, 2**40, (999,), generator=g)),
    ):
        key = torch.randint(0, 2**32, shape, generator=g)
        assert torch.equal(rng.uniform_from_key(key, index), plain(key, index))
    key = torch.tensor([0, 2**31 - 1, 2**31, 2**32 - 1])
    assert torch.equal(rng.uniform_from_key(key, 7), plain(key, 7))


def test_race_sampling_follows_the_distribution():
    probs = torch.tensor([0.5, 0.25, 0.125, 0.125, 0.0])
    keys = rng.counter_key(torch.arange(20000), torch.zeros(20000, dtype=torch.long), rng.STREAM_BONUS)
    tokens = reference.sample_from_probs(probs.expand(20000, -1), keys)
    counts = torch.bincount(tokens, minlength=5)
    assert counts[4] == 0
    assert chisquare(counts[:4].numpy(), (probs[:4] * 20000).numpy()).pvalue > 1e-3
    assert list(itertools.islice(tokens.tolist(), 5)) == reference.sample_from_probs(probs.expand(5, -1), keys[:5]).tolist()

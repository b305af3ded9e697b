"""The block-verification Triton kernels (CPU interpreter) against the torch reference, and the
statistical losslessness of the sampling verifier.

Kernel and reference must agree exactly (same accepted counts, same tokens): they share the
counter RNG bit for bit and the same tie rules.
"""

from __future__ import annotations

import pytest
import torch
from scipy import stats

pytest.importorskip("triton")

from trtllm_dflash.ops import (
    kernels,
    reference,
    rng,  # noqa: E402
)
from trtllm_dflash.ops.kernels import launch  # noqa: E402
from trtllm_dflash.ops.kernels.verify_shortlist_launch import sample_drafts_shortlist, verify_positions_shortlist  # noqa: E402
from trtllm_dflash.ops.kernels.verify_spread_launch import verify_positions_spread  # noqa: E402


def params(temps, top_ks=None, top_ps=None):
    n = len(temps)
    return (
        torch.tensor(temps, dtype=torch.float32),
        torch.tensor(top_ks or [0] * n, dtype=torch.int64),
        torch.tensor(top_ps or [1.0] * n, dtype=torch.float32),
    )


def make_block(seed, logits, runs, draft_probs=None):
    """Block tokens whose drafts follow the target's argmax for `runs[r]` positions, then differ."""
    g = torch.Generator().manual_seed(seed)
    batch, block, vocab = logits.shape
    posterior = logits.float().argmax(-1)
    tokens = torch.randint(0, vocab, (batch, block), generator=g)
    for r, run in enumerate(runs):
        tokens[r, 1 : 1 + run] = posterior[r, :run]
        if run + 1 < block:
            tokens[r, run + 1] = (posterior[r, run] + 1) % vocab
    return tokens


def compare(logits, tokens, draft_probs, temperature, top_k, top_p, seed=None, start=None, stop_ids=None, block_v=256, chunk_v=None):
    """The three kernel forms (one program per position; every pass spread over the vocabulary
    chunks; the shortlist of the largest logits) against the reference, token for token."""
    batch = logits.shape[0]
    seed = torch.arange(batch) * 7919 - 3 if seed is None else seed
    start = torch.arange(batch) * 13 + 5 if start is None else start
    args = (logits, tokens, draft_probs, temperature, top_k, top_p, seed, start, stop_ids)
    expected = reference.verify_block_packed(*args)
    ref_decisions = reference.verify_positions(*args[:-1])
    forms = {
        "positions": lambda: launch.verify_positions(*args[:-1], block_v=block_v, chunk_v=chunk_v),
        "spread": lambda: verify_positions_spread(*args[:-1], block_v=block_v, chunk_v=chunk_v),
        # chunks of 256 unless given: several per row at the tests' vocabularies (the default 4,096 above them)
        "shortlist": lambda: verify_positions_shortlist(*args[:-1], chunk_v=chunk_v or (256 if logits.shape[-1] <= 4096 else 4096)),
    }
    for form, positions in forms.items():
        decisions = positions()
        got = launch.verify_commit(decisions, tokens, start, stop_ids)
        assert torch.equal(got, expected), f"kernel ({form})\n{got}\nreference\n{expected}"
        # the per-position form agrees where it is used: accept flags up to the end of the accepted
        # run, the emitted token at its end (elsewhere a residual of q == p is 0/0, decided by rounding)
        position = torch.arange(tokens.shape[1])
        flags_used = position <= expected[:, :1]
        assert torch.equal(decisions[..., 0][flags_used], ref_decisions[..., 0][flags_used])
        emit_used = position == expected[:, :1]
        assert torch.equal(decisions[..., 1][emit_used], ref_decisions[..., 1][emit_used])
        assert torch.equal(reference.verify_commit(decisions, tokens, start, stop_ids), expected)
    return got


def test_counter_rng_is_bit_exact():
    module = kernels.load("verify", interpret=True)
    g = torch.Generator().manual_seed(0)
    n = 1000
    seed = torch.randint(-(2**62), 2**62, (n,), generator=g)
    position = torch.randint(0, 2**40, (n,), generator=g)
    index = torch.randint(0, 262144, (n,), generator=g)
    for stream in (rng.STREAM_ACCEPT, rng.STREAM_BONUS):
        bits, uniform = torch.empty(n, dtype=torch.int64), torch.empty(n)
        module.rng_kernel[(4,)](seed, position, index, n, bits, uniform, STREAM_MIX=(stream * rng.GOLDEN32) & rng.MASK32, BLOCK=256)
        key = rng.counter_key(seed, position, stream)
        assert torch.equal(bits, key)
        assert torch.equal(uniform, rng.uniform_from_key(key, index))


def test_greedy_runs_of_every_length():
    g = torch.Generator().manual_seed(1)
    block = 6
    runs = [0, 1, 3, 5, 2]  # none accepted, short, middle, all accepted, stop in the middle
    logits = torch.randn(len(runs), block, 700, generator=g) * 3
    logits[4, 2, 10] = logits[4, 2, 20] = logits[4, 2].max() + 1  # a tie: the first index wins
    tokens = make_block(1, logits, runs)
    got = compare(logits, tokens, None, *params([0.0] * len(runs)))
    assert got[:, 0].tolist() == runs
    assert got[4, 1] == 10


def test_sampled_rows_mixed_with_greedy_rows():
    g = torch.Generator().manual_seed(2)
    batch, block, vocab = 7, 5, 500
    logits = torch.randn(batch, block, vocab, generator=g) * 4
    temperature, top_k, top_p = params([0.0, 1.0, 0.7, 1.3, 0.9, 1.0, 0.0], [0, 0, 20, 0, 8, 3, 0], [1.0, 1.0, 1.0, 0.8, 0.9, 1.0, 1.0])
    # q: the target's own processed distribution (all accepted), a noisy copy (runs of any
    # length), or mass on tokens that top-k removes from p (none accepted: residual sampling)
    p = reference.process_logits(logits[:, :-1], temperature, top_k, top_p)
    noisy = reference.process_logits(logits[:, :-1] + torch.randn(batch, block - 1, vocab, generator=g) * 2, temperature, top_k, top_p)
    q = torch.where(torch.tensor([1, 1, 0, 0, 0, 1, 1]).view(-1, 1, 1).bool(), p, noisy)
    tokens = reference.sample_tokens(
        logits[:, :-1], temperature, top_k, top_p, torch.arange(batch), torch.arange(1, block).expand(batch, -1), rng.STREAM_DRAFT
    )[0]
    tokens = torch.cat([torch.zeros(batch, 1, dtype=torch.long), tokens], dim=1)
    outside = logits[5, :-1].argsort(-1)[:, 0]  # the least likely token: never in the top 3
    tokens[5, 1:] = outside
    q[5] = 0
    q[5, torch.arange(block - 1), outside] = 1.0
    got = compare(logits, tokens, q, temperature, top_k, top_p)
    assert got[1, 0] == block - 1  # q == p: everything accepted
    assert got[5, 0] == 0  # p(draft) == 0: rejected at once
    assert len(set(got[:, 0].tolist())) >= 3


def test_top_k_and_top_p_keep_ties_together():
    batch, block, vocab = 4, 3, 64
    logits = torch.zeros(batch, block, vocab)
    logits[..., :8] = 2.0  # eight tied tokens around every threshold
    logits[..., 8:12] = torch.tensor([3.0, 1.0, 1.0, -1.0])
    temperature, top_k, top_p = params([1.0, 1.0, 0.5, 1.0], [3, 9, 0, 5], [1.0, 1.0, 0.3, 0.6])
    probs = reference.process_logits(logits, temperature, top_k, top_p)
    assert (probs[0, 0] > 0).sum() == 9  # k=3 cuts inside the tie at 2.0: all eight stay
    q = reference.process_logits(logits[:, 1:] + 0.5 * torch.randn(batch, block - 1, vocab), temperature, top_k, top_p)
    tokens = torch.randint(0, 12, (batch, block))
    compare(logits, tokens, q, temperature, top_k, top_p, block_v=32)


def test_stop_tokens_cut_the_committed_tokens():
    g = torch.Generator().manual_seed(3)
    block = 6
    runs = [5, 5, 2, 3]
    logits = torch.randn(4, block, 300, generator=g) * 3
    tokens = make_block(3, logits, runs)
    posterior = logits.argmax(-1)
    stop_ids = torch.full((4, 3), -1)
    stop_ids[0, 1] = tokens[0, 3]  # a stop token in the middle of an accepted run
    stop_ids[1, 0] = posterior[1, 5]  # the bonus token is a stop token
    stop_ids[2, 2] = tokens[2, 5]  # listed, but only after the rejection: not committed
    got = compare(logits, tokens, None, *params([0.0] * 4), stop_ids=stop_ids)
    assert got[:, 3].tolist() == [3, 6, 3, 4]  # committed
    assert got[:, 4].tolist() == [1, 1, 0, 0]  # stopped
    assert torch.equal(got[:, 2], torch.arange(4) * 13 + 5 + got[:, 0] + 1)  # next start


def test_first_token_is_a_block_of_one():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(4, 1, 900, generator=g) * 2
    compare(logits, torch.zeros(4, 1, dtype=torch.long), None, *params([0.0, 1.0, 0.6, 1.1], [0, 0, 40, 0], [1.0, 0.95, 1.0, 0.7]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_logits(dtype):
    g = torch.Generator().manual_seed(5)
    logits = (torch.randn(3, 4, 400, generator=g) * 3).to(dtype)
    temperature, top_k, top_p = params([0.0, 0.8, 1.0], [0, 10, 0], [1.0, 1.0, 0.9])
    q = reference.process_logits(logits[:, 1:].float() + torch.randn(3, 3, 400, generator=g), temperature, top_k, top_p)
    compare(logits, make_block(5, logits, [1, 2, 0]), q, temperature, top_k, top_p)


def test_vocabulary_of_262k_is_processed_in_chunks():
    g = torch.Generator().manual_seed(6)
    vocab = 262144
    logits = torch.randn(2, 2, vocab, generator=g) * 3
    logits[0, 0, vocab - 3] = 50.0  # the maximum sits in the last chunk
    tokens = torch.tensor([[0, vocab - 3], [0, 5]])
    q = torch.softmax(torch.randn(2, 1, vocab, generator=g), -1)
    got = compare(logits, tokens, q, *params([0.0, 1.0]), block_v=4096)
    assert got[0, 0] == 1


# ----------------------------------------------------------------------------- the vocabulary split


@pytest.mark.parametrize("vocab,dtype", [(1000, torch.float32), (1024, torch.bfloat16), (777, torch.float16)])
def test_chunk_maxima_are_the_reference_partials(vocab, dtype):
    """Stage 1 alone: every chunk's maximum and first index, ties inside a chunk and across chunks."""
    g = torch.Generator().manual_seed(8)
    logits = (torch.randn(2, 3, vocab, generator=g) * 3).to(dtype)
    logits[0, 0, [70, 90, 300]] = 20.0  # a tie inside the chunk [64, 128), and one in a later chunk
    logits[1, 2, -1] = 20.0  # the maximum is the last logit, in a partial chunk
    chunk_max, chunk_index = launch.verify_partials(logits, chunk_v=64, block_v=32)
    expected_max, expected_index = reference.verify_partials(logits, 64)
    assert chunk_max.shape == (2, 3, -(-vocab // 64))
    assert torch.equal(chunk_max, expected_max) and torch.equal(chunk_index, expected_index)
    assert chunk_index[0, 0, 1] == 70
    first = chunk_max.argmax(-1, keepdim=True)  # the first maximal chunk holds the row's argmax
    assert torch.equal(chunk_index.gather(-1, first).squeeze(-1).long(), logits.float().argmax(-1))


@pytest.mark.parametrize("vocab", [1000, 1024])  # not a multiple of 16 / a multiple of 16 (aligned rows)
def test_split_vocabulary_greedy_and_sampled_rows(vocab):
    """Chunks of 256 logits (3 of them and a partial one at vocabulary 1000): greedy ties across
    chunks, top-k, top-p and both, rows mixed, against the reference."""
    g = torch.Generator().manual_seed(9)
    batch, block = 6, 4
    logits = torch.randn(batch, block, vocab, generator=g) * 3
    logits[0, 1, [100, 700]] = 30.0  # a greedy tie across chunks: the first index wins
    temperature, top_k, top_p = params([0.0, 1.0, 0.8, 1.2, 0.7, 1.0], [0, 40, 0, 25, 0, 1], [1.0, 1.0, 0.85, 0.9, 1.0, 0.5])
    q = reference.process_logits(logits[:, 1:] + torch.randn(batch, block - 1, vocab, generator=g), temperature, top_k, top_p)
    tokens = make_block(9, logits, [2, 1, 0, 3, 1, 2])
    got = compare(logits, tokens, q, temperature, top_k, top_p, block_v=256, chunk_v=256)
    assert got[0, 0] == 2 and tokens[0, 2] == 100
    compare(logits[:3], tokens[:3], None, temperature[:3], top_k[:3], top_p[:3], block_v=256, chunk_v=256)  # no draft distributions


def test_split_vocabulary_keeps_ties_together_at_the_thresholds():
    """Eight tied logits around every threshold, spread over several chunks of 16."""
    batch, block, vocab = 4, 3, 100
    logits = torch.zeros(batch, block, vocab)
    logits[..., ::12] = 2.0  # tied tokens 0, 12, ..., 96: one per chunk of 16 or so
    logits[..., [5, 17, 29, 41]] = torch.tensor([3.0, 1.0, 1.0, -1.0])
    temperature, top_k, top_p = params([1.0, 1.0, 0.5, 1.0], [3, 10, 0, 5], [1.0, 1.0, 0.3, 0.6])
    q = reference.process_logits(logits[:, 1:] + 0.5 * torch.randn(batch, block - 1, vocab), temperature, top_k, top_p)
    tokens = torch.randint(0, vocab, (batch, block))
    compare(logits, tokens, q, temperature, top_k, top_p, block_v=16, chunk_v=16)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_split_vocabulary_half_precision(dtype):
    g = torch.Generator().manual_seed(10)
    vocab = 1000
    logits = (torch.randn(3, 4, vocab, generator=g) * 3).to(dtype)
    temperature, top_k, top_p = params([0.0, 0.8, 1.0], [0, 10, 30], [1.0, 1.0, 0.9])
    q = reference.process_logits(logits[:, 1:].float() + torch.randn(3, 3, vocab, generator=g), temperature, top_k, top_p)
    compare(logits, make_block(10, logits, [1, 2, 0]), q, temperature, top_k, top_p, block_v=128, chunk_v=256)


# ----------------------------------------------------------------------------- the shortlist


def shortlist_walks(logits, tokens, q, temperature, top_k, top_p, chunk_v):
    """The shortlist form against the reference (through `compare`, with the other forms), and which
    positions it sent on the full walk."""
    compare(logits, tokens, q, temperature, top_k, top_p, chunk_v=chunk_v)
    batch = logits.shape[0]
    sampling = (temperature, top_k, top_p, torch.arange(batch) * 7919 - 3, torch.arange(batch) * 13 + 5)
    return verify_positions_shortlist(logits, tokens, q, *sampling, chunk_v=chunk_v, with_walked=True)[1]


def test_shortlist_serves_top_k_rows_and_walks_the_others():
    """Rows with top-k 1..64 (with and without top-p, drafts following the target for a while) come
    from the shortlist; temperature-only, top-p-only and top-k above 64 rows walk the row; greedy
    rows need neither. Chunks of 256 logits, the last one partial."""
    g = torch.Generator().manual_seed(11)
    batch, block, vocab = 8, 5, 1000
    logits = (torch.randn(batch, block, vocab, generator=g) * 3).to(torch.bfloat16)  # bf16: ties are common
    temperature, top_k, top_p = params(
        [1.0, 0.6, 0.8, 1.0, 0.9, 0.7, 0.0, 1.1], [1, 20, 50, 64, 0, 0, 0, 65], [1.0, 0.95, 0.9, 1.0, 1.0, 0.8, 1.0, 1.0]
    )
    q = reference.process_logits(logits[:, 1:].float() + torch.randn(batch, block - 1, vocab, generator=g), temperature, top_k, top_p)
    walked = shortlist_walks(logits, make_block(11, logits, [1, 3, 2, 4, 0, 1, 2, 1]), q, temperature, top_k, top_p, 256)
    assert walked.tolist() == [[r in (4, 5, 7)] * block for r in range(batch)]


@pytest.mark.parametrize("k", [10, 3])
def test_shortlist_walks_where_ties_at_the_threshold_were_left_out(k):
    """100 tokens tied at the top-k threshold in one chunk of 256: the chunk's shortlist holds 64 of
    them, so the position walks its row; 40 ties in each of three chunks (each shortlist holds all
    of them): 120 kept tokens fit the 128 slots; 50 in each: 150 do not, and those walk. Top-k 10
    is above the 8 keys of the 4 chunks' two largest each (no bound: every chunk radix-selects);
    under top-k 3 the bound is the ties' key, so the chunk of 100 radix-selects and the others do not."""
    batch, block, vocab = 3, 2, 1024
    logits = torch.randn(batch, block, vocab, generator=torch.Generator().manual_seed(12))
    logits[0, :, 0:100] = 4.0
    for row, ties in ((1, 40), (2, 50)):
        for chunk in range(3):
            logits[row, :, chunk * 256 : chunk * 256 + ties] = 4.0
    logits[:, :, 900] = 6.0  # one token above the ties
    temperature, top_k, top_p = params([1.0, 1.0, 0.9], [k, k, k], [1.0, 0.5, 1.0])
    q = reference.process_logits(logits[:, 1:] + 0.3 * torch.randn(batch, block - 1, vocab), temperature, top_k, top_p)
    tokens = torch.tensor([[0, 99], [0, 700], [0, 5]])  # drafts among the ties; token 99 is one the shortlist left out
    walked = shortlist_walks(logits, tokens, q, temperature, top_k, top_p, 256)
    assert walked.tolist() == [[True, True], [False, False], [True, True]]


def test_shortlist_of_a_masked_row_keeps_only_the_allowed_tokens():
    """A grammar leaves 5 tokens (the rest -inf) under a top-k of 20: the kept tokens are those 5,
    served from the shortlist (the tokens at -inf that no chunk shortlisted have probability 0)."""
    g = torch.Generator().manual_seed(13)
    batch, block, vocab = 2, 4, 800
    logits = torch.full((batch, block, vocab), float("-inf"))
    allowed = torch.tensor([3, 250, 251, 600, 799])
    logits[..., allowed] = torch.randn(batch, block, 5, generator=g) * 2
    temperature, top_k, top_p = params([1.0, 0.8], [20, 20], [1.0, 0.9])
    q = torch.zeros(batch, block - 1, vocab)
    q[..., allowed] = torch.softmax(torch.randn(batch, block - 1, 5, generator=g), -1)
    tokens = allowed[torch.randint(0, 5, (batch, block), generator=g)]
    assert not shortlist_walks(logits, tokens, q, temperature, top_k, top_p, 256).any()


def test_shortlist_at_qwen3_vocabulary_in_default_chunks():
    """Qwen3's vocabulary (151,936: 37 chunks of 4,096 and a partial one) in bf16, top-k 50 and top-p
    0.9 as the GPU benchmark samples, drafts from a noisy copy of the target."""
    g = torch.Generator().manual_seed(14)
    batch, block, vocab = 2, 3, 151936
    logits = (torch.randn(batch, block, vocab, generator=g) * 4).to(torch.bfloat16)
    temperature, top_k, top_p = params([0.8, 0.6], [50, 20], [0.9, 0.95])
    q = reference.process_logits(logits[:, 1:].float() + 0.5 * torch.randn(batch, block - 1, vocab, generator=g), temperature, top_k, top_p)
    tokens = make_block(14, logits, [2, 1])
    args = (logits, tokens, q, temperature, top_k, top_p, torch.tensor([5, 9]), torch.tensor([100, 7]))
    decisions, walked = verify_positions_shortlist(*args, with_walked=True)
    assert not walked.any()
    assert torch.equal(launch.verify_commit(decisions, tokens, args[-1], None), reference.verify_block_packed(*args))


def test_shortlist_draft_samples_are_the_references():
    """The drafter's samples by the shortlist kernels: the tokens `reference.sample_tokens` draws
    (stream STREAM_DRAFT) and its q to float rounding, with the same support; greedy rows (argmax,
    one-hot q), top-k rows with and without top-p and with ties past k, a masked row, and rows the
    shortlist does not serve (no top-k; top-k 65), which walk their row. The last row's top-8 are
    its 4 chunks' two largest each: the bound from those 8 keys is its 8th largest exactly."""
    g = torch.Generator().manual_seed(15)
    batch, block, vocab = 9, 3, 1000
    logits = (torch.randn(batch, block, vocab, generator=g) * 3).to(torch.bfloat16).float()
    logits[3, :, 400:430] = 20.0  # 30 tied tokens on top under top-k 5: all kept
    logits[4, :, :990] = float("-inf")  # 10 tokens left under top-k 20
    for chunk in range(4):
        logits[8, :, chunk * 256 + 10], logits[8, :, chunk * 256 + 20] = 12.0 + chunk, 14.0 + chunk
    temperature = torch.tensor([0.0, 0.7, 1.0, 0.8, 0.6, 1.2, 0.9, 1.1, 3.0])
    top_k = torch.tensor([0, 20, 50, 5, 20, 64, 0, 65, 8])
    top_p = torch.tensor([1.0, 0.95, 0.9, 1.0, 0.8, 1.0, 0.9, 1.0, 1.0])
    seed, positions = torch.arange(batch) * 13 + 1, torch.arange(batch).view(-1, 1) * 10 + torch.arange(1, block + 1)
    want_tokens, want_q = reference.sample_tokens(logits, temperature, top_k, top_p, seed, positions, rng.STREAM_DRAFT)
    tokens, q = sample_drafts_shortlist(logits, temperature, top_k, top_p, seed, positions, chunk_v=256)
    assert torch.equal(tokens, want_tokens)
    assert torch.equal(q > 0, want_q > 0)
    torch.testing.assert_close(q, want_q, rtol=1e-5, atol=1e-7)
    assert int((q[3, 0] > 0).sum()) == 30
    assert int((q[8, 0] > 0).sum()) == 8


# ----------------------------------------------------------------------------- losslessness

VOCAB, BLOCK, TRIALS = 6, 3, 8000


def speculative_trials(temperature, top_k, top_p, residual=True):
    """First and second committed tokens of TRIALS independent verification steps.

    Target logits are fixed per position; the drafter's q differs from p. The first committed token
    must follow p at position 0; given that it was an accepted draft, the second follows p at 1.
    """
    g = torch.Generator().manual_seed(7)
    target = (torch.randn(1, BLOCK, VOCAB, generator=g) * 1.5).expand(TRIALS, -1, -1)
    draft = (torch.randn(1, BLOCK - 1, VOCAB, generator=g) * 1.5).expand(TRIALS, -1, -1)
    temperature, top_k, top_p = (torch.full((TRIALS,), x) for x in (temperature, top_k, top_p))
    seed, start = torch.arange(TRIALS) * 1000003 + 17, torch.full((TRIALS,), 40)
    positions = start.view(-1, 1) + torch.arange(1, BLOCK)
    drafts, q = reference.sample_tokens(draft, temperature, top_k, top_p, seed, positions, rng.STREAM_DRAFT)
    tokens = torch.cat([torch.zeros(TRIALS, 1, dtype=torch.long), drafts], dim=1)
    accepted, bonus = reference.verify_block(target, tokens, q, temperature, top_k, top_p, seed, start)
    if not residual:  # the classic bug: after a rejection, sample from p instead of max(0, p - q)
        p = reference.process_logits(target, temperature, top_k, top_p)
        wrong = reference.sample_from_probs(
            p[torch.arange(TRIALS), accepted], rng.counter_key(seed, start + accepted + 1, rng.STREAM_BONUS)
        )
        bonus = torch.where(accepted < BLOCK - 1, wrong, bonus)
    committed = torch.cat([drafts, bonus.view(-1, 1)], dim=1)
    committed = torch.where(torch.arange(BLOCK) < accepted.view(-1, 1), committed, bonus.view(-1, 1))
    p = reference.process_logits(target[:1], temperature[:1], top_k[:1], top_p[:1])[0]
    return committed, accepted, p, (target, tokens, q, temperature, top_k, top_p, seed, start)


def fits(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square goodness-of-fit p-value of token samples against a distribution."""
    support = probs > 0
    assert bool(support[samples].all()), "a token outside the target's support was emitted"
    observed = torch.bincount(samples, minlength=VOCAB)[support].double()
    expected = probs[support].double() * samples.numel()
    return float(stats.chisquare(observed.numpy(), expected.numpy() * observed.sum().item() / expected.sum().item()).pvalue)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.8, 4, 0.9)])
def test_sampling_verifier_reproduces_the_target_distribution(temperature, top_k, top_p):
    committed, accepted, p, _ = speculative_trials(temperature, top_k, top_p)
    assert 0.2 < float((accepted > 0).float().mean()) < 0.95  # both branches are exercised
    assert fits(committed[:, 0], p[0]) > 1e-3
    assert fits(committed[accepted > 0, 1], p[1]) > 1e-3


def test_a_wrong_residual_fails_the_statistical_test():
    committed, _, p, _ = speculative_trials(1.0, 0, 1.0, residual=False)
    assert fits(committed[:, 0], p[0]) < 1e-6


def test_kernel_draws_the_same_samples_as_the_reference():
    # rows of the statistical test above (top-k/top-p rows are compared in the tests further up)
    *_, args = speculative_trials(1.0, 0, 1.0)
    rows = slice(0, 16)
    compare(*(a[rows] for a in args), block_v=8)

"""Sampled block verification from a shortlist of each position's largest logits (issue 39, item 5).

The same decisions as `verify_positions_kernel` (verify.py; semantics
`trtllm_dflash.ops.reference.verify_positions`) for rows with top-k of at most SHORTLIST tokens, the
setting chat models ship with (Qwen3: top-k 20, top-p 0.95). Such a row's distribution lives on
its top-k tokens (ties kept), so after two reads of the logits (the chunks' maxima, then the
candidates) everything else works on a few dozen values: no program walks a vocabulary row. The
per-position kernel makes ~14 serial passes over the row (4.6 ms a step at vocabulary 151,936 on an
H200); the spread form (verify_spread.py) makes ~15 passes, each one launch over the whole batch's
logits.

Five launches (`verify_shortlist_launch.py`):
- `shortlist_maxima_kernel`, grid (chunks of CHUNK_V logits, block position, sequence): the chunk's
  maximum and first index of it (the argmax, as `verify_partials_kernel` stores them) and, for a
  shortlisted row, the chunk's two largest order keys of the scaled logits.
- `shortlist_bound_kernel`, grid (block position, sequence): a lower bound on the row's k-th largest
  key, the k-th largest of those 2 x chunks keys (76 at Qwen3's vocabulary, so any k <= 64).
- `shortlist_select_kernel`, grid as the maxima's, shortlisted rows only: the chunk's candidates
  for the row's top-k, written in vocabulary order with their token indices. Those at or above the
  bound are usually a handful per chunk, found with one count and one scan; where more than
  SHORTLIST pass (ties), the chunk's SHORTLIST largest by radix selection on the tile in registers
  (8 bits a step), ties at the chunk's cut kept in index order and the cut's key stored when some
  were left out.
- `shortlist_threshold_kernel`, grid (block position, sequence): the k-th largest key over the
  chunks' shortlists, which is the row's: each of the row's k largest keys is in its chunk's
  shortlist (a bound keeps every key at or above it, a radix cut the chunk's SHORTLIST >= k largest)
  unless it ties at a cut that left some out, which the cut records; the kept tokens (key at or
  above it, finite) gathered into KEPT slots in vocabulary order. A position is flagged for the
  full walk when the shortlist cannot be trusted: a chunk left out ties at the threshold, or more
  than KEPT tokens are kept (ties again), or its row samples without a top-k the shortlist serves
  (top-k 0 or above SHORTLIST).
- `shortlist_decide_kernel`, grid (block position, sequence): greedy rows from the chunk maxima;
  shortlisted positions from the KEPT slots: the top-k mass z_k, top-p by each kept token's mass of
  strictly larger keys (a KEPT x 32 comparison per step), the accept test and the two exponential
  races over the kept tokens only (every other token has probability 0, so its race is 0 and
  cannot win: the reference's argmax over the vocabulary picks the same token, the first index on
  a tie since the slots are in vocabulary order); flagged positions walk the row as the
  per-position kernel does (`verify._sampled_decision`).
Then `verify_commit_kernel` (verify.py) as in the other forms. Every launch covers every row, so
the launches do not depend on the requests (a CUDA graph can hold them).

The arithmetic is verify.py's (`_prob`, `_accepts`, the precise exp/log, the counter RNG); the sums
run over the kept tokens in another order than the full walk's, so they round differently, as the
two other forms do from each other and from torch: the tests check all three against the
reference token for token.
"""

import triton
import triton.language as tl

from trtllm_dflash.ops import kernels, rng

_verify = kernels.load("verify", interpret=triton.knobs.runtime.interpret)
wait_for_inputs = _verify.wait_for_inputs  # each kernel waits first under dependent launches
row_offset, in_vocab, order_key, _prob = _verify.row_offset, _verify.in_vocab, _verify.order_key, _verify._prob
counter_key, uniform_from_key, precise_exp, precise_log = (
    _verify.counter_key,
    _verify.uniform_from_key,
    _verify.precise_exp,
    _verify.precise_log,
)
_topk_step, _chunk_argmax, _greedy_decision, _accepts, _sampled_decision = (
    _verify._topk_step,
    _verify._chunk_argmax,
    _verify._greedy_decision,
    _verify._accepts,
    _verify._sampled_decision,
)
_walked_distribution, _races, _scaled = _verify._walked_distribution, _verify._races, _verify._scaled
SUM, MAX, MIN, ARGMAX, BONUS_MIX = _verify.SUM, _verify.MAX, _verify.MIN, _verify.ARGMAX, _verify.BONUS_MIX

DRAFT_MIX = tl.constexpr((rng.STREAM_DRAFT * rng.GOLDEN32) & rng.MASK32)
NO_KEY = tl.constexpr(-1)  # below every order key: an empty slot, or a chunk that left nothing out
NEG_INF_KEY = tl.constexpr(0x7FFFFF)  # order_key(-inf)
TOP_KEY = tl.constexpr(1 << 32)  # above every order key
PAIRS = tl.constexpr(32)  # kept tokens compared at a time for top-p


@triton.jit
def _shortlisted(temperature, top_k, SHORTLIST: tl.constexpr):
    """Whether a row is served from the shortlist: it samples, with a top-k of 1..SHORTLIST."""
    return (temperature > 0) & (top_k >= 1) & (top_k <= SHORTLIST)


@triton.jit
def _kth_key(key, count, want):
    """The `want`-th largest of the int64 keys in registers (`count` of them are not NO_KEY; `want`
    is clamped to 1..count): four 8-bit steps of radix selection, as `_kth_largest_key` takes them
    over a vocabulary row."""
    prefix = tl.full((), 0, tl.int64)
    remaining = tl.maximum(tl.minimum(want, count), 1).to(tl.int64)
    present = key >= 0
    for rnd in tl.static_range(4):
        shift = 24 - 8 * rnd
        match = present & ((key >> (shift + 8)) == (prefix >> (shift + 8)))
        counts = tl.histogram(((key >> shift) & 255).to(tl.int32), 256, mask=match)
        prefix, remaining = _topk_step(counts, prefix, remaining, shift)
    return prefix


@triton.jit
def _scaled_keys(x, valid, temperature):
    """(scaled logits, their order keys, NO_KEY where not `valid`) of raw logits `x`."""
    s = tl.div_rn(x, temperature)
    return s, tl.where(valid, order_key(s), NO_KEY)


# ----------------------------------------------------------------------------- kernels


@triton.jit
def shortlist_maxima_kernel(
    # inputs
    logits_ptr,
    temperature_ptr,
    top_k_ptr,
    # scalars
    block,
    vocab,
    # outputs
    chunk_max_ptr,
    chunk_index_ptr,
    top_keys_ptr,
    # compile-time configuration
    CHUNK_V: tl.constexpr,
    SHORTLIST: tl.constexpr,
    VOCAB_DIVISIBLE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One chunk's maximum logit and first index of it (the argmax, as `verify_partials_kernel`
    stores them) and, for a shortlisted row, its two largest order keys of the scaled logits (of
    two different tokens; NO_KEY for a chunk of one token)."""
    wait_for_inputs(PDL)
    chunk = tl.program_id(0)
    row = tl.program_id(2).to(tl.int64)
    position = row * block + tl.program_id(1)
    num_chunks = (vocab + CHUNK_V - 1) // CHUNK_V
    offs = chunk * CHUNK_V + tl.arange(0, CHUNK_V)
    ok = in_vocab(offs, vocab, VOCAB_DIVISIBLE)
    x = tl.load(logits_ptr + row_offset(position, vocab, VOCAB_DIVISIBLE) + offs, mask=ok, other=float("-inf")).to(tl.float32)
    best, best_at = tl.reduce((x, tl.arange(0, CHUNK_V)), 0, ARGMAX)
    tl.store(chunk_max_ptr + position * num_chunks + chunk, best)
    tl.store(chunk_index_ptr + position * num_chunks + chunk, chunk * CHUNK_V + best_at)
    temperature = tl.load(temperature_ptr + row).to(tl.float32)
    if _shortlisted(temperature, tl.load(top_k_ptr + row).to(tl.int64), SHORTLIST):
        _, key = _scaled_keys(x, ok, temperature)
        first, first_at = tl.reduce((key, tl.arange(0, CHUNK_V)), 0, ARGMAX)
        second = tl.reduce(tl.where(tl.arange(0, CHUNK_V) == first_at, NO_KEY, key), 0, MAX)
        out = top_keys_ptr + (position * num_chunks + chunk) * 2
        tl.store(out, first)
        tl.store(out + 1, second)


@triton.jit
def shortlist_bound_kernel(
    # inputs
    temperature_ptr,
    top_k_ptr,
    top_keys_ptr,
    # scalars
    block,
    num_chunks,
    # outputs
    bound_ptr,
    # compile-time configuration
    TOP_KEYS: tl.constexpr,
    SHORTLIST: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """For a shortlisted row, a key at or below its top-k-th largest: the k-th largest of its
    chunks' two largest keys (those are keys of 2 x chunks different tokens of the row, so at least
    k of the row's keys are at or above it), or NO_KEY (no bound) where the chunks hold fewer than k."""
    wait_for_inputs(PDL)
    row = tl.program_id(1).to(tl.int64)
    position = row * block + tl.program_id(0)
    top_k = tl.load(top_k_ptr + row).to(tl.int64)
    if _shortlisted(tl.load(temperature_ptr + row).to(tl.float32), top_k, SHORTLIST):
        offs = tl.arange(0, TOP_KEYS)
        in_row = (offs // 2) < num_chunks  # whole pairs of int64: 16-byte loads
        key = tl.load(top_keys_ptr + position * num_chunks * 2 + offs, mask=in_row, other=NO_KEY)
        count = tl.reduce((key >= 0).to(tl.int32), 0, SUM)
        tl.store(bound_ptr + position, tl.where(count >= top_k, _kth_key(key, count, top_k), NO_KEY))


@triton.jit
def shortlist_select_kernel(
    # inputs
    logits_ptr,
    temperature_ptr,
    top_k_ptr,
    bound_ptr,
    # scalars
    block,
    vocab,
    # outputs
    shortlist_logit_ptr,
    shortlist_index_ptr,
    cut_ptr,
    # compile-time configuration
    CHUNK_V: tl.constexpr,
    SHORTLIST: tl.constexpr,
    VOCAB_DIVISIBLE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """For a shortlisted row, the chunk's logits that may be among the row's top-k, at most SHORTLIST.

    Usually those at or above the row's bound (`shortlist_bound_kernel`): one count and one scan.
    Where more than SHORTLIST pass it (ties, or no bound), the chunk's SHORTLIST largest by radix
    selection. Either way, every logit left out is below the row's top-k threshold or ties at the
    key stored as the chunk's cut."""
    wait_for_inputs(PDL)
    chunk = tl.program_id(0)
    row = tl.program_id(2).to(tl.int64)
    position = row * block + tl.program_id(1)
    temperature = tl.load(temperature_ptr + row).to(tl.float32)
    if _shortlisted(temperature, tl.load(top_k_ptr + row).to(tl.int64), SHORTLIST):
        num_chunks = (vocab + CHUNK_V - 1) // CHUNK_V
        offs = chunk * CHUNK_V + tl.arange(0, CHUNK_V)
        ok = in_vocab(offs, vocab, VOCAB_DIVISIBLE)
        x = tl.load(logits_ptr + row_offset(position, vocab, VOCAB_DIVISIBLE) + offs, mask=ok, other=float("-inf")).to(tl.float32)
        _, key = _scaled_keys(x, ok, temperature)
        chosen = ok & (key >= tl.load(bound_ptr + position))
        want = tl.reduce(chosen.to(tl.int32), 0, SUM)
        cut = tl.full((), NO_KEY, tl.int64)  # what the bound leaves out is below the threshold
        if want > SHORTLIST:
            count = tl.reduce(ok.to(tl.int32), 0, SUM)
            want = tl.minimum(count, SHORTLIST)
            at = _kth_key(key, count, want)
            above, at_cut = key > at, key == at
            room = want - tl.reduce(above.to(tl.int32), 0, SUM)  # ties at the cut that fit, in index order
            chosen = above | (at_cut & (tl.associative_scan(at_cut.to(tl.int32), 0, SUM) <= room))
            cut = tl.where(tl.reduce(at_cut.to(tl.int32), 0, SUM) > room, at, NO_KEY)
        slot = tl.associative_scan(chosen.to(tl.int32), 0, SUM) - 1
        out = (position * num_chunks + chunk) * SHORTLIST
        tl.store(shortlist_logit_ptr + out + slot, x, mask=chosen)
        tl.store(shortlist_index_ptr + out + slot, offs, mask=chosen)
        empty = tl.arange(0, SHORTLIST)
        tl.store(shortlist_index_ptr + out + empty, tl.full([SHORTLIST], -1, tl.int32), mask=empty >= want)
        tl.store(cut_ptr + position * num_chunks + chunk, cut)


@triton.jit
def shortlist_threshold_kernel(
    # inputs
    temperature_ptr,
    top_k_ptr,
    shortlist_logit_ptr,
    shortlist_index_ptr,
    cut_ptr,
    # scalars
    block,
    num_chunks,
    # outputs
    kept_logit_ptr,
    kept_index_ptr,
    threshold_ptr,
    flag_ptr,
    # compile-time configuration
    CANDIDATES: tl.constexpr,
    SHORTLIST: tl.constexpr,
    KEPT: tl.constexpr,
    BLOCK_C: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """A position's top-k threshold and kept tokens from the chunks' shortlists, or its flag for the full walk."""
    wait_for_inputs(PDL)
    row = tl.program_id(1).to(tl.int64)
    position = row * block + tl.program_id(0)
    temperature = tl.load(temperature_ptr + row).to(tl.float32)
    top_k = tl.load(top_k_ptr + row).to(tl.int64)
    shortlisted = _shortlisted(temperature, top_k, SHORTLIST)
    flag = tl.where(shortlisted, 0, (temperature > 0).to(tl.int32))
    if shortlisted:
        n = num_chunks * SHORTLIST
        offs = tl.arange(0, CANDIDATES)
        index = tl.load(shortlist_index_ptr + position * n + offs, mask=offs < n, other=-1)
        valid = index >= 0
        x = tl.load(shortlist_logit_ptr + position * n + offs, mask=valid, other=float("-inf"))
        s, key = _scaled_keys(x, valid, temperature)
        threshold = _kth_key(key, tl.reduce(valid.to(tl.int32), 0, SUM), top_k)
        # a chunk that left out ties at the threshold may hold kept tokens the shortlist lacks; at
        # the key of -inf they have probability 0 and do not matter
        missing = tl.full((), 0, tl.int32)
        for c0 in range(0, num_chunks, BLOCK_C):
            cs = c0 + tl.arange(0, BLOCK_C)
            cuts = tl.load(cut_ptr + position * num_chunks + cs, mask=cs < num_chunks, other=NO_KEY)
            missing = tl.maximum(missing, tl.reduce((cuts >= threshold).to(tl.int32), 0, MAX))
        kept = valid & (key >= threshold) & (s > float("-inf"))
        count = tl.reduce(kept.to(tl.int32), 0, SUM)
        flag = ((count > KEPT) | ((missing > 0) & (threshold > NEG_INF_KEY))).to(tl.int32)
        slot = tl.associative_scan(kept.to(tl.int32), 0, SUM) - 1
        fits = kept & (slot < KEPT)
        tl.store(kept_logit_ptr + position * KEPT + slot, x, mask=fits)
        tl.store(kept_index_ptr + position * KEPT + slot, index, mask=fits)
        empty = tl.arange(0, KEPT)
        tl.store(kept_index_ptr + position * KEPT + empty, tl.full([KEPT], -1, tl.int32), mask=empty >= count)
        tl.store(threshold_ptr + position, threshold)
    tl.store(flag_ptr + position, flag)


@triton.jit
def _kept_distribution(kept_logit_ptr, kept_index_ptr, threshold_ptr, position_index, temperature, row_max, top_p, KEPT: tl.constexpr):
    """A shortlisted position's distribution over its kept tokens: (their token indices, -1 in empty
    slots; their probabilities, 0 there; the threshold key, z_k, z_p and use_top_p, as `_prob` takes them)."""
    slots = tl.arange(0, KEPT)
    index = tl.load(kept_index_ptr + position_index * KEPT + slots)
    valid = index >= 0
    s, key = _scaled_keys(tl.load(kept_logit_ptr + position_index * KEPT + slots, mask=valid, other=float("-inf")), valid, temperature)
    weight = tl.where(valid, precise_exp(s - row_max), 0.0)
    z_k = tl.reduce(weight, 0, SUM)
    threshold = tl.load(threshold_ptr + position_index)
    use_top_p = top_p < 1.0
    z_p = tl.full((), 1.0, tl.float32)
    if use_top_p:
        # keep a token while the mass of strictly larger keys is below top_p of z_k (ties together)
        larger = tl.full([KEPT], 0.0, tl.float32)
        for j0 in tl.static_range(0, KEPT, PAIRS):
            others = j0 + tl.arange(0, PAIRS)
            other_index = tl.load(kept_index_ptr + position_index * KEPT + others)
            other_valid = other_index >= 0
            x_other = tl.load(kept_logit_ptr + position_index * KEPT + others, mask=other_valid, other=float("-inf"))
            s_other, key_other = _scaled_keys(x_other, other_valid, temperature)
            w_other = tl.where(other_valid, precise_exp(s_other - row_max), 0.0)
            larger += tl.reduce(tl.where(key_other[None, :] > key[:, None], w_other[None, :], 0.0), 1, SUM)
        keep = valid & (larger < top_p * z_k)
        threshold = tl.maximum(threshold, tl.reduce(tl.where(keep, key, TOP_KEY), 0, MIN))
        z_p = tl.div_rn(tl.reduce(tl.where(keep, weight, 0.0), 0, SUM), z_k)
    prob = tl.where(valid, _prob(s, row_max, threshold, z_k, z_p, use_top_p), 0.0)
    return index, prob, threshold, z_k, z_p, use_top_p


@triton.jit
def _race_winner(index, weight, key):
    """The token of `index` (-1: an empty slot) whose exponential race weight / -log(u) is largest,
    the first slot on a tie (the slots are in vocabulary order: the first index)."""
    slots = tl.arange(0, index.shape[0])
    exponential = -precise_log(uniform_from_key(key, tl.where(index >= 0, index, 0)))
    race = tl.where(index >= 0, tl.div_rn(weight, exponential), -1.0)
    _, at = tl.reduce((race, slots), 0, ARGMAX)
    return tl.reduce(tl.where(slots == at, index, 0), 0, SUM)


@triton.jit
def _kept_decision(
    row_ptr, kept_logit_ptr, kept_index_ptr, threshold_ptr, draft_q_ptr, position_index, draft, has_draft, use_q, seed,
    position, temperature, row_max, top_p, KEPT: tl.constexpr,
):  # fmt: skip
    """(accept, emit) of a shortlisted position from its kept tokens."""
    index, prob, threshold, z_k, z_p, use_top_p = _kept_distribution(
        kept_logit_ptr, kept_index_ptr, threshold_ptr, position_index, temperature, row_max, top_p, KEPT
    )
    accept = _accepts(row_ptr, draft_q_ptr, draft, has_draft, use_q, seed, position, temperature, row_max, threshold, z_k, z_p, use_top_p)
    # the two exponential races (p; the residual max(0, p - q)) over the kept tokens
    key = counter_key(seed, position, BONUS_MIX)
    q_index = tl.where(use_q, index, -1)  # one comparison as the mask: the interpreter turns bool & bool into int32
    residual = tl.maximum(prob - tl.load(draft_q_ptr + q_index, mask=q_index >= 0, other=0.0).to(tl.float32), 0.0)
    emit = tl.where(use_q & (tl.reduce(residual, 0, SUM) > 0), _race_winner(index, residual, key), _race_winner(index, prob, key))
    return accept, emit


@triton.jit
def shortlist_decide_kernel(
    # inputs
    logits_ptr,
    tokens_ptr,
    draft_probs_ptr,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    seed_ptr,
    start_ptr,
    chunk_max_ptr,
    chunk_index_ptr,
    kept_logit_ptr,
    kept_index_ptr,
    threshold_ptr,
    flag_ptr,
    # scalars
    block,
    vocab,
    has_draft_probs,
    num_chunks,
    # outputs
    decisions_ptr,
    # compile-time configuration
    BLOCK_V: tl.constexpr,
    BLOCK_C: tl.constexpr,
    KEPT: tl.constexpr,
    VOCAB_DIVISIBLE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """The decisions at one block position, `[b, B, 2]` int32 as verify_positions_kernel writes them."""
    wait_for_inputs(PDL)
    t = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    position_index = row * block + t
    row_ptr = logits_ptr + row_offset(position_index, vocab, VOCAB_DIVISIBLE)
    temperature = tl.load(temperature_ptr + row).to(tl.float32)
    draft, has_draft, best, accept, emit = _greedy_decision(tokens_ptr, chunk_max_ptr, chunk_index_ptr, row, t, block, num_chunks, BLOCK_C)
    if temperature > 0:
        if tl.load(flag_ptr + position_index) != 0:
            accept, emit = _sampled_decision(
                row_ptr, draft_probs_ptr, top_k_ptr, top_p_ptr, seed_ptr, start_ptr, row, t, block, vocab, has_draft_probs,
                draft, has_draft, temperature, best, BLOCK_V, VOCAB_DIVISIBLE,
            )  # fmt: skip
        else:
            use_q = (has_draft.to(tl.int32) * has_draft_probs) != 0
            accept, emit = _kept_decision(
                row_ptr, kept_logit_ptr, kept_index_ptr, threshold_ptr,
                draft_probs_ptr + row_offset(row * (block - 1) + t, vocab, VOCAB_DIVISIBLE), position_index, draft, has_draft,
                use_q, tl.load(seed_ptr + row), tl.load(start_ptr + row) + t + 1, temperature, tl.div_rn(best, temperature),
                tl.load(top_p_ptr + row).to(tl.float32), KEPT,
            )  # fmt: skip
    out = decisions_ptr + position_index * 2
    tl.store(out, accept)
    tl.store(out + 1, emit)


@triton.jit
def shortlist_sample_kernel(
    # inputs
    logits_ptr,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    seed_ptr,
    positions_ptr,
    chunk_max_ptr,
    chunk_index_ptr,
    kept_logit_ptr,
    kept_index_ptr,
    threshold_ptr,
    flag_ptr,
    # scalars
    block,
    vocab,
    num_chunks,
    # outputs
    tokens_ptr,
    probs_ptr,
    # compile-time configuration
    BLOCK_V: tl.constexpr,
    BLOCK_C: tl.constexpr,
    KEPT: tl.constexpr,
    VOCAB_DIVISIBLE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """The drafter's sample at one of its `block` positions (`reference.sample_tokens`, stream
    STREAM_DRAFT): the argmax for a greedy row (its distribution one-hot), else the exponential race
    over the kept tokens of a shortlisted position or over the row for a flagged one. Writes the
    token and the position's distribution q into `probs_ptr`, zero where it is not written."""
    wait_for_inputs(PDL)
    t = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    position_index = row * block + t
    row_ptr = logits_ptr + row_offset(position_index, vocab, VOCAB_DIVISIBLE)
    q_ptr = probs_ptr + row_offset(position_index, vocab, VOCAB_DIVISIBLE)
    temperature = tl.load(temperature_ptr + row).to(tl.float32)
    best, token = _chunk_argmax(chunk_max_ptr, chunk_index_ptr, position_index, num_chunks, BLOCK_C)
    if temperature > 0:
        row_max = tl.div_rn(best, temperature)
        top_p = tl.load(top_p_ptr + row).to(tl.float32)
        key = counter_key(tl.load(seed_ptr + row), tl.load(positions_ptr + position_index), DRAFT_MIX)
        if tl.load(flag_ptr + position_index) != 0:
            top_k = tl.load(top_k_ptr + row).to(tl.int64)
            threshold, z_k, z_p, use_top_p = _walked_distribution(
                row_ptr, vocab, temperature, row_max, top_k, top_p, BLOCK_V, VOCAB_DIVISIBLE
            )
            race_best, token, residual_best, residual_token, residual_mass = _races(  # only the race on p is used here
                row_ptr, q_ptr, 0, key, 0, vocab, vocab, temperature, row_max, threshold, z_k, z_p, use_top_p, BLOCK_V, VOCAB_DIVISIBLE
            )
            for v0 in range(0, vocab, BLOCK_V):
                offs = v0 + tl.arange(0, BLOCK_V)
                ok = in_vocab(offs, vocab, VOCAB_DIVISIBLE)
                tl.store(q_ptr + offs, _prob(_scaled(row_ptr, offs, ok, temperature), row_max, threshold, z_k, z_p, use_top_p), mask=ok)
        else:
            index, prob, threshold, z_k, z_p, use_top_p = _kept_distribution(
                kept_logit_ptr, kept_index_ptr, threshold_ptr, position_index, temperature, row_max, top_p, KEPT
            )
            token = _race_winner(index, prob, key)
            tl.store(q_ptr + index, prob, mask=index >= 0)
    else:
        tl.store(q_ptr + token, 1.0)
    tl.store(tokens_ptr + position_index, token.to(tl.int64))

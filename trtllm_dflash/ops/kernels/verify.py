"""Triton kernels of the tree-free block verification plugin.

Semantics: `trtllm_dflash.ops.reference.verify_block_packed`. Three kernels:
- `verify_partials_kernel`, one program per (vocabulary chunk, block position t, sequence): the
  chunk's maximum logit and the first index of it, so the argmax over the vocabulary is spread
  over many programs (16 block positions at batch 1 would fill a tenth of an H100);
- `verify_positions_kernel`, one program per (block position t, sequence): combines the chunks
  into the argmax, then the target's decision at t, i.e. whether draft token t+1 is accepted, and
  the token to emit if the accepted run ends at t (argmax for greedy rows; for sampled rows a
  sample of the residual max(0, p - q), or of p at the last position). Positions are independent,
  so all B of them run in parallel.
- `verify_commit_kernel`, one program per sequence: the accepted count (leading accepted
  positions), the bonus token, the next start and the committed length cut at a stop token.

Sampling follows the reference exactly: temperature, then top-k and top-p thresholds with ties
kept together (found by radix selection on an order-preserving integer key of the scaled logit, so
any vocabulary size works with a fixed tile: top-k counts 8 bits per pass, top-p masses 4 bits per
pass, the first top-p pass also giving the top-k mass), then the exponential race with uniforms
from the counter RNG (`trtllm_dflash/ops/rng.py`, on uint32 in `counter_rng.py`). Divisions and exponentials that
decide sampled tokens are IEEE-rounded (`tl.div_rn`, libdevice `expf`/`logf` when compiled), not
the approximate instructions `/` and `tl.exp` compile to, so a GPU decides near-ties as the CPU does.

`VOCAB_DIVISIBLE` (the vocabulary is a multiple of 16, as Qwen3's, Llama 3's and gpt-oss's are)
tells the compiler that every row starts 16-element aligned, so logits stream in 16-byte vectors.

Parameter order is inputs, then scalars, then outputs (TensorRT's ahead-of-time plugin convention).
Reductions use the builtin `tl.reduce` with Triton's combine functions (see `attention.py`).
"""

import triton
import triton.language as tl

from trtllm_dflash.ops import kernels, rng

# the counter RNG and the precise exp/log (counter_rng.py), in this file's own form
_counter_rng = kernels.load("counter_rng", interpret=triton.knobs.runtime.interpret)
precise_exp, precise_log = _counter_rng.precise_exp, _counter_rng.precise_log
counter_key, uniform_from_key = _counter_rng.counter_key, _counter_rng.uniform_from_key
# every kernel here may run as a programmatic dependent launch (grid_dependency.py): it waits first
wait_for_inputs = kernels.load("grid_dependency", interpret=triton.knobs.runtime.interpret).wait_for_inputs

ACCEPT_MIX = tl.constexpr((rng.STREAM_ACCEPT * rng.GOLDEN32) & rng.MASK32)
BONUS_MIX = tl.constexpr((rng.STREAM_BONUS * rng.GOLDEN32) & rng.MASK32)
SUM = tl.standard._sum_combine
MAX = tl.standard._elementwise_max
MIN = tl.standard._elementwise_min
ARGMAX = tl.standard._argmax_combine_tie_break_left  # first index of the maximum


@triton.jit
def row_offset(position, vocab, VOCAB_DIVISIBLE: tl.constexpr):
    """Element offset of row `position` of a `[..., vocab]` tensor, 16-aligned when the vocabulary is."""
    offset = position * vocab
    if VOCAB_DIVISIBLE:
        offset = tl.multiple_of(offset, 16)
    return offset


@triton.jit
def in_vocab(offs, vocab, VOCAB_DIVISIBLE: tl.constexpr):
    """`offs < vocab`, written so that the compiler sees the mask constant over 16 elements when the
    vocabulary is a multiple of 16 (a plain comparison with a runtime scalar splits vector loads)."""
    if VOCAB_DIVISIBLE:
        return (offs // 16) < (vocab // 16)
    return offs < vocab


# ----------------------------------------------------------------------------- sampling pieces


@triton.jit
def order_key(s):
    """An int64 in [0, 2**32) ordered like the float32 `s` (equal floats, equal keys)."""
    s = tl.where(s == 0.0, 0.0, s)  # -0.0 == +0.0
    bits = s.to(tl.uint32, bitcast=True).to(tl.int64)
    return tl.where(bits >= 0x80000000, 0xFFFFFFFF - bits, bits + 0x80000000)


@triton.jit
def _scaled(row_ptr, offs, ok, temperature):
    return tl.div_rn(tl.load(row_ptr + offs, mask=ok, other=float("-inf")).to(tl.float32), temperature)


@triton.jit
def _key_counts(row_ptr, start, stop, vocab, temperature, prefix, shift, BLOCK_V: tl.constexpr, VOCAB_DIVISIBLE: tl.constexpr):
    """256-bin counts of the 8-bit digit at `shift` of the keys in [start, stop) that match `prefix` above it."""
    hist = tl.full([256], 0, tl.int32)
    for v0 in range(start, stop, BLOCK_V):
        offs = v0 + tl.arange(0, BLOCK_V)
        ok = in_vocab(offs, vocab, VOCAB_DIVISIBLE)
        key = order_key(_scaled(row_ptr, offs, ok, temperature))
        match = ok & ((key >> (shift + 8)) == (prefix >> (shift + 8)))
        hist += tl.histogram(((key >> shift) & 255).to(tl.int32), 256, mask=match)
    return hist


@triton.jit
def _topk_step(counts, prefix, remaining, shift):
    """One 8-bit digit of the k-th largest key from a pass's counts: (prefix, keys still to pass)."""
    bins = tl.arange(0, 256)
    at_least = tl.associative_scan(counts, 0, SUM, reverse=True)  # keys in bins >= d
    digit = tl.reduce((at_least >= remaining).to(tl.int32), 0, SUM) - 1
    remaining -= tl.reduce(tl.where(bins > digit, counts, 0), 0, SUM).to(tl.int64)
    return prefix | (digit.to(tl.int64) << shift), remaining


@triton.jit
def _kth_largest_key(row_ptr, vocab, temperature, k, BLOCK_V: tl.constexpr, VOCAB_DIVISIBLE: tl.constexpr):
    """Key of the k-th largest scaled logit: top-k keeps exactly the keys >= it (4 passes of 8-bit digits)."""
    prefix = tl.full((), 0, tl.int64)
    remaining = k.to(tl.int64)
    for rnd in range(4):  # not unrolled: keeps the kernel small
        shift = 24 - 8 * rnd
        counts = _key_counts(row_ptr, 0, vocab, vocab, temperature, prefix, shift, BLOCK_V, VOCAB_DIVISIBLE)
        prefix, remaining = _topk_step(counts, prefix, remaining, shift)
    return prefix


@triton.jit
def _kept_mass(row_ptr, start, stop, vocab, temperature, row_max, threshold, BLOCK_V: tl.constexpr, VOCAB_DIVISIBLE: tl.constexpr):
    """Sum over the keys in [start, stop) at or above threshold of exp(s - max) (the softmax normaliser's share)."""
    total = tl.full([BLOCK_V], 0.0, tl.float32)
    for v0 in range(start, stop, BLOCK_V):
        offs = v0 + tl.arange(0, BLOCK_V)
        ok = in_vocab(offs, vocab, VOCAB_DIVISIBLE)
        s = _scaled(row_ptr, offs, ok, temperature)
        total += tl.where(ok & (order_key(s) >= threshold), precise_exp(s - row_max), 0.0)
    return tl.reduce(total, 0, SUM)


@triton.jit
def _mass_histogram(
    row_ptr, start, stop, vocab, temperature, row_max, top_k_key, prefix, shift, BLOCK_V: tl.constexpr, VOCAB_DIVISIBLE: tl.constexpr
):
    """exp(s - max) summed per 4-bit digit at `shift`, over the keys in [start, stop) at or above
    top_k_key that match `prefix` above it."""
    bins = tl.arange(0, 16)
    weight = tl.full([16], 0.0, tl.float32)
    for v0 in range(start, stop, BLOCK_V):
        offs = v0 + tl.arange(0, BLOCK_V)
        ok = in_vocab(offs, vocab, VOCAB_DIVISIBLE)
        s = _scaled(row_ptr, offs, ok, temperature)
        key = order_key(s)
        match = ok & (key >= top_k_key) & ((key >> (shift + 4)) == (prefix >> (shift + 4)))
        mass = tl.where(match, precise_exp(s - row_max), 0.0)
        digit = ((key >> shift) & 15).to(tl.int32)
        for b in tl.static_range(16):
            weight += tl.where(bins == b, tl.reduce(tl.where(digit == b, mass, 0.0), 0, SUM), 0.0)
    return weight


@triton.jit
def _topp_step(weight, rnd, remaining, above, found, prefix):
    """One 4-bit digit (pass `rnd` of 8) of the top-p key from a pass's masses: (remaining, above, found, prefix)."""
    bins = tl.arange(0, 16)
    at_least = tl.associative_scan(weight, 0, SUM, reverse=True)
    count = tl.reduce((at_least >= remaining).to(tl.int32), 0, SUM)
    found = found & (count > 0).to(tl.int32)
    digit = tl.maximum(count - 1, 0)
    greater = tl.reduce(tl.where(bins > digit, weight, 0.0), 0, SUM)
    remaining -= greater
    above += greater
    if rnd == 7:
        above += tl.reduce(tl.where(bins == digit, weight, 0.0), 0, SUM)
    return remaining, above, found, prefix | (digit.to(tl.int64) << (28 - 4 * rnd))


@triton.jit
def _top_p_key(row_ptr, vocab, temperature, row_max, top_k_key, top_p, BLOCK_V: tl.constexpr, VOCAB_DIVISIBLE: tl.constexpr):
    """(smallest kept key of top-p, z_k, z_p): the key where the mass from the top first reaches
    top_p of the top-k mass z_k, and the kept mass as a fraction of z_k (the top-p normaliser).

    Radix selection on 4-bit digits over unnormalised masses exp(s - max): the first pass sees every
    key >= top_k_key, so its total is z_k and no separate normaliser pass is needed; the kept mass is
    what the passes found above the key plus the key's own bin."""
    weight = _mass_histogram(
        row_ptr, 0, vocab, vocab, temperature, row_max, top_k_key, tl.full((), 0, tl.int64), 28, BLOCK_V, VOCAB_DIVISIBLE
    )
    z_k = tl.reduce(weight, 0, SUM)
    remaining = top_p * z_k
    above = tl.full((), 0.0, tl.float32)
    prefix = tl.full((), 0, tl.int64)
    found = tl.full((), 1, tl.int32)
    for rnd in range(8):  # not unrolled: keeps the kernel small
        if rnd > 0:
            weight = _mass_histogram(
                row_ptr, 0, vocab, vocab, temperature, row_max, top_k_key, prefix, 28 - 4 * rnd, BLOCK_V, VOCAB_DIVISIBLE
            )
        remaining, above, found, prefix = _topp_step(weight, rnd, remaining, above, found, prefix)
    kept = tl.where(found != 0, above, z_k)
    return tl.where(found != 0, prefix, 0), z_k, tl.div_rn(kept, z_k)


@triton.jit
def _prob(s, row_max, threshold, z_k, z_p, use_top_p):
    """Processed probability of scaled logits `s` (reference: softmax, mask, renormalise)."""
    p = tl.div_rn(precise_exp(s - row_max), z_k)
    p = tl.where(use_top_p, tl.div_rn(p, z_p), p)
    return tl.where(order_key(s) >= threshold, p, 0.0)


@triton.jit
def _chunk_argmax(chunk_max_ptr, chunk_index_ptr, position, num_chunks, BLOCK_C: tl.constexpr):
    """(maximum, first index of it) of a row, from its chunks' maxima (the first chunk wins ties)."""
    best = tl.full((), float("-inf"), tl.float32)
    best_index = tl.full((), 0, tl.int32)
    for c0 in range(0, num_chunks, BLOCK_C):
        cs = c0 + tl.arange(0, BLOCK_C)
        ok = cs < num_chunks
        chunk_max = tl.load(chunk_max_ptr + position * num_chunks + cs, mask=ok, other=float("-inf"))
        chunk_index = tl.load(chunk_index_ptr + position * num_chunks + cs, mask=ok, other=0)
        tile_max, tile_position = tl.reduce((chunk_max, tl.arange(0, BLOCK_C)), 0, ARGMAX)
        tile_index = tl.reduce(tl.where(tl.arange(0, BLOCK_C) == tile_position, chunk_index, 0), 0, SUM)
        better = tile_max > best
        best_index = tl.where(better, tile_index, best_index)
        best = tl.where(better, tile_max, best)
    return best, best_index


@triton.jit
def _greedy_decision(tokens_ptr, chunk_max_ptr, chunk_index_ptr, row, t, block, num_chunks, BLOCK_C: tl.constexpr):
    """Block position t of `row` decided greedily, the start of every decide kernel: (draft token t+1,
    whether t has one, the row's maximum logit, accept as int32, the token to emit: the first index
    of the maximum, from the chunks' maxima)."""
    has_draft = t < block - 1
    draft = tl.load(tokens_ptr + row * block + t + 1, mask=has_draft, other=0)
    best, best_index = _chunk_argmax(chunk_max_ptr, chunk_index_ptr, row * block + t, num_chunks, BLOCK_C)
    accept = (has_draft & (draft == best_index)).to(tl.int32)
    return draft, has_draft, best, accept, best_index


@triton.jit
def _accepts(row_ptr, draft_q_ptr, draft, has_draft, use_q, seed, position, temperature, row_max, threshold, z_k, z_p, use_top_p):
    """Whether draft token `draft` (at absolute `position`) is accepted: with probability
    min(1, p/q), that is u * q < p."""
    p_draft = _prob(tl.div_rn(tl.load(row_ptr + draft).to(tl.float32), temperature), row_max, threshold, z_k, z_p, use_top_p)
    q_draft = tl.load(draft_q_ptr + draft, mask=use_q, other=0.0).to(tl.float32)
    u = uniform_from_key(counter_key(seed, position, ACCEPT_MIX), tl.full((), 0, tl.int32))
    return (has_draft & (u * q_draft < p_draft)).to(tl.int32)


@triton.jit
def _races(
    row_ptr, draft_q_ptr, q_len, bonus_key, start, stop, vocab, temperature, row_max, threshold, z_k, z_p, use_top_p,
    BLOCK_V: tl.constexpr, VOCAB_DIVISIBLE: tl.constexpr,
):  # fmt: skip
    """The exponential races over the tokens in [start, stop): (best race on p, its token, best race
    on the residual max(0, p - q), its token, the residual's mass). An earlier tile keeps a tie."""
    best_p = tl.full((), -1.0, tl.float32)
    index_p = tl.full((), 0, tl.int32)
    best_r = tl.full((), -1.0, tl.float32)
    index_r = tl.full((), 0, tl.int32)
    mass = tl.full([BLOCK_V], 0.0, tl.float32)
    for v0 in range(start, stop, BLOCK_V):
        offs = v0 + tl.arange(0, BLOCK_V)
        ok = in_vocab(offs, vocab, VOCAB_DIVISIBLE)
        prob = tl.where(ok, _prob(_scaled(row_ptr, offs, ok, temperature), row_max, threshold, z_k, z_p, use_top_p), 0.0)
        exponential = -precise_log(uniform_from_key(bonus_key, offs))
        race = tl.where(ok, tl.div_rn(prob, exponential), -1.0)
        tile_best, tile_index = tl.reduce((race, tl.arange(0, BLOCK_V)), 0, ARGMAX)
        better = tile_best > best_p
        index_p = tl.where(better, v0 + tile_index, index_p)
        best_p = tl.where(better, tile_best, best_p)
        q = tl.load(draft_q_ptr + offs, mask=in_vocab(offs, q_len, VOCAB_DIVISIBLE), other=0.0).to(tl.float32)
        residual = tl.maximum(prob - q, 0.0)
        mass += residual
        race = tl.where(ok, tl.div_rn(residual, exponential), -1.0)
        tile_best, tile_index = tl.reduce((race, tl.arange(0, BLOCK_V)), 0, ARGMAX)
        better = tile_best > best_r
        index_r = tl.where(better, v0 + tile_index, index_r)
        best_r = tl.where(better, tile_best, best_r)
    return best_p, index_p, best_r, index_r, tl.reduce(mass, 0, SUM)


@triton.jit
def _walked_distribution(row_ptr, vocab, temperature, row_max, top_k, top_p, BLOCK_V: tl.constexpr, VOCAB_DIVISIBLE: tl.constexpr):
    """(threshold key, z_k, z_p, use_top_p) of a sampled row's distribution (`_prob`'s arguments),
    each selection walking the whole vocabulary row (`row_max`: its largest scaled logit)."""
    threshold = tl.full((), 0, tl.int64)
    if (top_k > 0) & (top_k < vocab):
        threshold = _kth_largest_key(row_ptr, vocab, temperature, top_k, BLOCK_V, VOCAB_DIVISIBLE)
    use_top_p = top_p < 1.0
    z_p = tl.full((), 1.0, tl.float32)
    if use_top_p:
        top_p_key, z_k, z_p = _top_p_key(row_ptr, vocab, temperature, row_max, threshold, top_p, BLOCK_V, VOCAB_DIVISIBLE)
        threshold = tl.maximum(threshold, top_p_key)
    else:
        z_k = _kept_mass(row_ptr, 0, vocab, vocab, temperature, row_max, threshold, BLOCK_V, VOCAB_DIVISIBLE)
    return threshold, z_k, z_p, use_top_p


@triton.jit
def _sampled_decision(
    row_ptr, draft_probs_ptr, top_k_ptr, top_p_ptr, seed_ptr, start_ptr, row, t, block, vocab, has_draft_probs,
    draft, has_draft, temperature, best, BLOCK_V: tl.constexpr, VOCAB_DIVISIBLE: tl.constexpr,
):  # fmt: skip
    """(accept, emit) of a sampled row at block position t, each pass walking the whole vocabulary row
    (`best`: the row's maximum logit). The per-position kernel's sampled branch, and the fallback of
    the shortlist kernels (verify_shortlist.py) for a position outside what they serve."""
    row_max = tl.div_rn(best, temperature)
    top_k = tl.load(top_k_ptr + row).to(tl.int64)
    top_p = tl.load(top_p_ptr + row).to(tl.float32)
    threshold, z_k, z_p, use_top_p = _walked_distribution(row_ptr, vocab, temperature, row_max, top_k, top_p, BLOCK_V, VOCAB_DIVISIBLE)

    use_q = (has_draft.to(tl.int32) * has_draft_probs) != 0
    q_len = tl.where(use_q, vocab, 0)  # masks as `offs < q_len`: the interpreter turns bool & bool into int32
    draft_q_ptr = draft_probs_ptr + row_offset(row * (block - 1) + t, vocab, VOCAB_DIVISIBLE)
    seed = tl.load(seed_ptr + row)
    position = tl.load(start_ptr + row) + t + 1
    accept = _accepts(row_ptr, draft_q_ptr, draft, has_draft, use_q, seed, position, temperature, row_max, threshold, z_k, z_p, use_top_p)

    # The token emitted if the run ends here: race on max(0, p - q), or on p (last position,
    # or a residual with no mass).
    best_p, index_p, best_r, index_r, mass = _races(
        row_ptr, draft_q_ptr, q_len, counter_key(seed, position, BONUS_MIX), 0, vocab, vocab, temperature, row_max, threshold,
        z_k, z_p, use_top_p, BLOCK_V, VOCAB_DIVISIBLE,
    )  # fmt: skip
    return accept, tl.where(use_q & (mass > 0), index_r, index_p)


# ----------------------------------------------------------------------------- kernels


@triton.jit
def verify_partials_kernel(
    # inputs
    logits_ptr,
    # scalars
    block,
    vocab,
    # outputs
    chunk_max_ptr,
    chunk_index_ptr,
    # compile-time configuration
    BLOCK_V: tl.constexpr,
    CHUNK_V: tl.constexpr,
    VOCAB_DIVISIBLE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """The maximum logit of one chunk of CHUNK_V logits and the first index of it (stage 1 of the argmax)."""
    wait_for_inputs(PDL)
    chunk = tl.program_id(0)
    position = tl.program_id(2).to(tl.int64) * block + tl.program_id(1)
    row_ptr = logits_ptr + row_offset(position, vocab, VOCAB_DIVISIBLE)
    best = tl.full((), float("-inf"), tl.float32)
    best_index = tl.full((), 0, tl.int32) + chunk * CHUNK_V
    for v0 in tl.static_range(0, CHUNK_V, BLOCK_V):  # unrolled: the tiles' loads are in flight together
        offs = chunk * CHUNK_V + v0 + tl.arange(0, BLOCK_V)
        x = tl.load(row_ptr + offs, mask=in_vocab(offs, vocab, VOCAB_DIVISIBLE), other=float("-inf")).to(tl.float32)
        tile_max, tile_index = tl.reduce((x, tl.arange(0, BLOCK_V)), 0, ARGMAX)
        better = tile_max > best
        best_index = tl.where(better, chunk * CHUNK_V + v0 + tile_index, best_index)
        best = tl.where(better, tile_max, best)
    chunks = (vocab + CHUNK_V - 1) // CHUNK_V
    tl.store(chunk_max_ptr + position * chunks + chunk, best)
    tl.store(chunk_index_ptr + position * chunks + chunk, best_index)


@triton.jit
def verify_positions_kernel(
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
    VOCAB_DIVISIBLE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    wait_for_inputs(PDL)
    t = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    position_index = row * block + t
    row_ptr = logits_ptr + row_offset(position_index, vocab, VOCAB_DIVISIBLE)
    temperature = tl.load(temperature_ptr + row).to(tl.float32)
    draft, has_draft, best, accept, emit = _greedy_decision(tokens_ptr, chunk_max_ptr, chunk_index_ptr, row, t, block, num_chunks, BLOCK_C)

    if temperature > 0:
        accept, emit = _sampled_decision(
            row_ptr, draft_probs_ptr, top_k_ptr, top_p_ptr, seed_ptr, start_ptr, row, t, block, vocab, has_draft_probs,
            draft, has_draft, temperature, best, BLOCK_V, VOCAB_DIVISIBLE,
        )  # fmt: skip

    out = decisions_ptr + (row * block + t) * 2
    tl.store(out, accept)
    tl.store(out + 1, emit)


@triton.jit
def verify_commit_kernel(
    # inputs
    decisions_ptr,
    tokens_ptr,
    start_ptr,
    stop_ids_ptr,
    # scalars
    block,
    num_stop,
    # outputs
    result_ptr,
    # compile-time configuration
    BLOCK_T: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PDL: tl.constexpr = False,
):
    wait_for_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    pos = tl.arange(0, BLOCK_T)
    is_draft = pos < block - 1
    flags = tl.load(decisions_ptr + (row * block + pos) * 2, mask=is_draft, other=0)
    accepted = tl.reduce(tl.where(is_draft & (flags == 0), pos, block - 1), 0, MIN)
    bonus = tl.load(decisions_ptr + (row * block + accepted) * 2 + 1).to(tl.int64)
    start = tl.load(start_ptr + row).to(tl.int64)

    # Committed tokens: drafts 1..accepted, then the bonus; cut after the first stop token.
    tokens = tl.load(tokens_ptr + row * block + pos + 1, mask=pos < accepted, other=0).to(tl.int64)
    tokens = tl.where(pos == accepted, bonus, tokens)
    first_stop = tl.full((), BLOCK_T, tl.int32)
    for s0 in range(0, num_stop, BLOCK_S):
        sj = s0 + tl.arange(0, BLOCK_S)
        stops = tl.load(stop_ids_ptr + row * num_stop + sj, mask=sj < num_stop, other=-1).to(tl.int64)
        hit = (tokens[:, None] == stops[None, :]) & (stops[None, :] >= 0) & (pos[:, None] <= accepted)
        is_stop = tl.reduce(hit.to(tl.int32), 1, MAX) > 0
        first_stop = tl.minimum(first_stop, tl.reduce(tl.where(is_stop, pos, BLOCK_T), 0, MIN))
    stopped = first_stop <= accepted
    committed = tl.where(stopped, first_stop + 1, accepted + 1)

    col = tl.arange(0, 8)
    values = tl.where(col == 0, accepted.to(tl.int64), bonus)
    values = tl.where(col == 2, start + accepted + 1, values)
    values = tl.where(col == 3, committed.to(tl.int64), values)
    values = tl.where(col == 4, stopped.to(tl.int64), values)
    tl.store(result_ptr + row * 5 + col, values, mask=col < 5)


@triton.jit
def rng_kernel(seed_ptr, position_ptr, index_ptr, n, bits_ptr, uniform_ptr, STREAM_MIX: tl.constexpr, BLOCK: tl.constexpr):
    """The counter RNG over arrays (keys and uniforms), to check it bit for bit against `rng.py`."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    key = counter_key(tl.load(seed_ptr + offs, mask=ok, other=0), tl.load(position_ptr + offs, mask=ok, other=0), STREAM_MIX)
    tl.store(bits_ptr + offs, key.to(tl.int64), mask=ok)
    tl.store(uniform_ptr + offs, uniform_from_key(key, tl.load(index_ptr + offs, mask=ok, other=0)), mask=ok)

"""Sampled block verification spread over the vocabulary (issue 39, item 5).

The same decisions as `verify_positions_kernel` (verify.py; semantics
`trtllm_dflash.ops.reference.verify_positions`), but no program walks a whole vocabulary row.
There, one program per (block position, sequence) makes ~14 serial passes over the row (4 top-k
selection passes, 8 top-p passes, the race): 16 programs at batch 1 on a GPU of 132 SMs, 4.6 ms a
step at vocabulary 151,936. Here every pass is one launch of one program per (vocabulary chunk,
block position, sequence), each over CHUNK_V logits.

A selection pass needs the digits every pass before it chose, over the whole row. So pass r first
sums pass r-1's per-chunk histograms, in chunk order, and takes pass r-1's step of the radix
selection from them; then it counts its own chunk. Every program of a row computes that same step
from the same numbers in the same order, so all get the same bits (on a GPU as in the
interpreter); the program of chunk 0 also stores the state it reached, which pass r+1 starts from.
No atomics: nothing depends on timing, and a seed reproduces its tokens.

Launch order (`launch.verify_positions_spread`), grid (chunks, block, batch) except the last:
  verify_partials_kernel (verify.py): chunk maxima, for the argmax and the row maximum
  topk_pass_kernel, rnd 0..3: 256-bin counts of the 8-bit digit of the k-th largest key
  topp_pass_kernel, rnd 0..7: 16-bin masses of the 4-bit digit of the top-p key (pass 0's total is z_k)
  mass_kernel: rows without top-p: the chunk's kept mass (their z_k)
  race_kernel: the chunk's winners of the two exponential races (p, and the residual) and its residual mass
  decide_kernel, grid (block, batch, 1): the decisions, `[b, B, 2]` int32 as verify_positions_kernel writes them
Every launch covers every row, so a step's launches do not depend on its requests (a CUDA graph can
hold them); a program whose row does not need its pass returns at once.

The arithmetic is verify.py's (its helpers are used here), with the sums taken per chunk and then
over chunks: the float sums round differently from the one-program kernel's, as that one's do from
torch's; the tests check both against the reference token for token.
"""

import triton
import triton.language as tl

from trtllm_dflash.ops import kernels

_verify = kernels.load("verify", interpret=triton.knobs.runtime.interpret)
wait_for_inputs = _verify.wait_for_inputs  # each kernel waits first under dependent launches
row_offset, _prob, counter_key, BONUS_MIX = _verify.row_offset, _verify._prob, _verify.counter_key, _verify.BONUS_MIX
SUM, MAX = _verify.SUM, _verify.MAX
# the passes over a span of the vocabulary and the selection steps, shared with the one-program kernel
_key_counts, _kept_mass, _mass_histogram, _races = _verify._key_counts, _verify._kept_mass, _verify._mass_histogram, _verify._races
_topk_step, _topp_step, _greedy_decision, _accepts = _verify._topk_step, _verify._topp_step, _verify._greedy_decision, _verify._accepts

TOPK_PASSES = tl.constexpr(4)  # 8-bit digits of a 32-bit key
TOPP_PASSES = tl.constexpr(8)  # 4-bit digits
TOPK_BINS = tl.constexpr(256)
TOPP_BINS = tl.constexpr(16)


# ----------------------------------------------------------------------------- row-wide values


@triton.jit
def _chunk_program(block):
    """(chunk, block position t, sequence, its row of logits `row * block + t`, rows in all) of a
    program of the grid (chunks, block, batch)."""
    t = tl.program_id(1)
    row = tl.program_id(2).to(tl.int64)
    return tl.program_id(0), t, row, row * block + t, tl.num_programs(2).to(tl.int64) * block


@triton.jit
def _row_max(chunk_max_ptr, position, num_chunks, temperature, BLOCK_C: tl.constexpr):
    """The row's largest scaled logit, from the chunk maxima."""
    best = tl.full((), float("-inf"), tl.float32)
    for c0 in range(0, num_chunks, BLOCK_C):
        cs = c0 + tl.arange(0, BLOCK_C)
        chunk_max = tl.load(chunk_max_ptr + position * num_chunks + cs, mask=cs < num_chunks, other=float("-inf"))
        best = tl.maximum(best, tl.reduce(chunk_max, 0, MAX))
    return tl.div_rn(best, temperature)


@triton.jit
def _summed(hist_ptr, position, num_chunks, BINS: tl.constexpr, DTYPE: tl.constexpr):
    """A pass's per-chunk histograms of a row, summed over the chunks in chunk order."""
    bins = tl.arange(0, BINS)
    total = tl.full([BINS], 0, DTYPE)
    for c in range(num_chunks):
        total += tl.load(hist_ptr + (position * num_chunks + c) * BINS + bins)
    return total


@triton.jit
def _uses_top_k(temperature, top_k, vocab):
    return (temperature > 0) & (top_k > 0) & (top_k < vocab)


@triton.jit
def _top_k_key(hist_ptr, state_ptr, position, positions, num_chunks, vocab, temperature, top_k):
    """The top-k threshold (0: no top-k) from the last top-k pass."""
    threshold = tl.full((), 0, tl.int64)
    if _uses_top_k(temperature, top_k, vocab):
        last = (TOPK_PASSES - 1) * positions + position
        prefix, remaining = tl.load(state_ptr + last * 2), tl.load(state_ptr + last * 2 + 1)
        counts = _summed(hist_ptr + (TOPK_PASSES - 1) * positions * num_chunks * TOPK_BINS, position, num_chunks, TOPK_BINS, tl.int32)
        threshold, remaining = _topk_step(counts, prefix, remaining, 0)
    return threshold


@triton.jit
def _topp_state(hist_ptr, state_ptr, prefix_ptr, rnd, position, positions, num_chunks, top_p):
    """(remaining, above, found, prefix, z_k) after top-p pass `rnd`: the state before it, stepped
    with its masses summed over the chunks."""
    before = rnd * positions + position
    remaining = tl.load(state_ptr + before * 4)
    above = tl.load(state_ptr + before * 4 + 1)
    z_k = tl.load(state_ptr + before * 4 + 2)
    found = tl.load(state_ptr + before * 4 + 3).to(tl.int32)
    prefix = tl.load(prefix_ptr + before * 2)
    weight = _summed(hist_ptr + rnd * positions * num_chunks * TOPP_BINS, position, num_chunks, TOPP_BINS, tl.float32)
    if rnd == 0:  # the first pass sees every key above the top-k threshold: its total is z_k
        z_k = tl.reduce(weight, 0, SUM)
        remaining = top_p * z_k
    remaining, above, found, prefix = _topp_step(weight, rnd, remaining, above, found, prefix)
    return remaining, above, found, prefix, z_k


@triton.jit
def _distribution(
    chunk_max_ptr, topk_hist_ptr, topk_state_ptr, topp_hist_ptr, topp_state_ptr, topp_prefix_ptr, mass_ptr,
    position, positions, num_chunks, vocab, temperature, top_k, top_p, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """(row max, kept-key threshold, z_k, z_p, uses top-p) of a sampled row: what `_prob` needs."""
    row_max = _row_max(chunk_max_ptr, position, num_chunks, temperature, BLOCK_C)
    threshold = _top_k_key(topk_hist_ptr, topk_state_ptr, position, positions, num_chunks, vocab, temperature, top_k)
    use_top_p = top_p < 1.0
    z_p = tl.full((), 1.0, tl.float32)
    z_k = tl.full((), 0.0, tl.float32)
    if use_top_p:
        remaining, above, found, prefix, z_k = _topp_state(
            topp_hist_ptr, topp_state_ptr, topp_prefix_ptr, TOPP_PASSES - 1, position, positions, num_chunks, top_p
        )
        kept = tl.where(found != 0, above, z_k)
        threshold = tl.maximum(threshold, tl.where(found != 0, prefix, 0))
        z_p = tl.div_rn(kept, z_k)
    else:
        for c in range(num_chunks):
            z_k += tl.load(mass_ptr + position * num_chunks + c)
    return row_max, threshold, z_k, z_p, use_top_p


# ----------------------------------------------------------------------------- pass kernels


@triton.jit
def topk_pass_kernel(
    # inputs
    logits_ptr,
    temperature_ptr,
    top_k_ptr,
    # scalars
    rnd,
    block,
    vocab,
    num_chunks,
    # outputs (read back by the next pass)
    hist_ptr,
    state_ptr,
    # compile-time configuration
    CHUNK_V: tl.constexpr,
    BLOCK_V: tl.constexpr,
    VOCAB_DIVISIBLE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Top-k pass `rnd`: the state after the passes before it, then this chunk's 256-bin counts.

    hist `[4, positions, chunks, 256]` int32; state `[4, positions, 2]` int64 (prefix, remaining
    before the pass)."""
    wait_for_inputs(PDL)
    chunk, t, row, position, positions = _chunk_program(block)
    temperature = tl.load(temperature_ptr + row).to(tl.float32)
    top_k = tl.load(top_k_ptr + row).to(tl.int64)
    if _uses_top_k(temperature, top_k, vocab):
        layer = positions * num_chunks * TOPK_BINS
        prefix = tl.full((), 0, tl.int64)
        remaining = top_k
        if rnd > 0:
            last = (rnd - 1) * positions + position
            prefix, remaining = tl.load(state_ptr + last * 2), tl.load(state_ptr + last * 2 + 1)
            counts = _summed(hist_ptr + (rnd - 1) * layer, position, num_chunks, TOPK_BINS, tl.int32)
            prefix, remaining = _topk_step(counts, prefix, remaining, 24 - 8 * (rnd - 1))
        if chunk == 0:
            tl.store(state_ptr + (rnd * positions + position) * 2, prefix)
            tl.store(state_ptr + (rnd * positions + position) * 2 + 1, remaining)
        row_ptr = logits_ptr + row_offset(position, vocab, VOCAB_DIVISIBLE)
        start = chunk * CHUNK_V
        hist = _key_counts(row_ptr, start, start + CHUNK_V, vocab, temperature, prefix, 24 - 8 * rnd, BLOCK_V, VOCAB_DIVISIBLE)
        tl.store(hist_ptr + rnd * layer + (position * num_chunks + chunk) * TOPK_BINS + tl.arange(0, TOPK_BINS), hist)


@triton.jit
def topp_pass_kernel(
    # inputs
    logits_ptr,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    chunk_max_ptr,
    topk_hist_ptr,
    topk_state_ptr,
    # scalars
    rnd,
    block,
    vocab,
    num_chunks,
    # outputs (read back by the next pass)
    hist_ptr,
    state_ptr,
    prefix_ptr,
    # compile-time configuration
    CHUNK_V: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_C: tl.constexpr,
    VOCAB_DIVISIBLE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Top-p pass `rnd`: the state after the passes before it, then this chunk's masses exp(s - max)
    per 4-bit digit, over keys at or above the top-k threshold that match the digits so far.

    hist `[8, positions, chunks, 16]` float32; state `[8, positions, 4]` float32 (remaining, above,
    z_k, found before the pass); prefix `[8, positions, 2]` int64 (prefix, top-k threshold)."""
    wait_for_inputs(PDL)
    chunk, t, row, position, positions = _chunk_program(block)
    temperature = tl.load(temperature_ptr + row).to(tl.float32)
    top_p = tl.load(top_p_ptr + row).to(tl.float32)
    if (temperature > 0) & (top_p < 1.0):
        top_k = tl.load(top_k_ptr + row).to(tl.int64)
        row_max = _row_max(chunk_max_ptr, position, num_chunks, temperature, BLOCK_C)
        remaining = tl.full((), 0.0, tl.float32)
        above = tl.full((), 0.0, tl.float32)
        z_k = tl.full((), 0.0, tl.float32)
        found = tl.full((), 1, tl.int32)
        prefix = tl.full((), 0, tl.int64)
        if rnd == 0:
            top_k_key = _top_k_key(topk_hist_ptr, topk_state_ptr, position, positions, num_chunks, vocab, temperature, top_k)
        else:
            top_k_key = tl.load(prefix_ptr + ((rnd - 1) * positions + position) * 2 + 1)
            remaining, above, found, prefix, z_k = _topp_state(
                hist_ptr, state_ptr, prefix_ptr, rnd - 1, position, positions, num_chunks, top_p
            )
        if chunk == 0:
            here = rnd * positions + position
            tl.store(state_ptr + here * 4, remaining)
            tl.store(state_ptr + here * 4 + 1, above)
            tl.store(state_ptr + here * 4 + 2, z_k)
            tl.store(state_ptr + here * 4 + 3, found.to(tl.float32))
            tl.store(prefix_ptr + here * 2, prefix)
            tl.store(prefix_ptr + here * 2 + 1, top_k_key)
        row_ptr = logits_ptr + row_offset(position, vocab, VOCAB_DIVISIBLE)
        start = chunk * CHUNK_V
        weight = _mass_histogram(
            row_ptr, start, start + CHUNK_V, vocab, temperature, row_max, top_k_key, prefix, 28 - 4 * rnd, BLOCK_V, VOCAB_DIVISIBLE
        )
        here = rnd * positions * num_chunks + position * num_chunks + chunk
        tl.store(hist_ptr + here * TOPP_BINS + tl.arange(0, TOPP_BINS), weight)


@triton.jit
def mass_kernel(
    # inputs
    logits_ptr,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    chunk_max_ptr,
    topk_hist_ptr,
    topk_state_ptr,
    # scalars
    block,
    vocab,
    num_chunks,
    # outputs
    mass_ptr,
    # compile-time configuration
    CHUNK_V: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_C: tl.constexpr,
    VOCAB_DIVISIBLE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """A sampled row without top-p: this chunk's sum of exp(s - max) over keys at or above the
    top-k threshold (`[positions, chunks]` float32; summed over chunks it is z_k)."""
    wait_for_inputs(PDL)
    chunk, t, row, position, positions = _chunk_program(block)
    temperature = tl.load(temperature_ptr + row).to(tl.float32)
    top_p = tl.load(top_p_ptr + row).to(tl.float32)
    if (temperature > 0) & (top_p >= 1.0):
        top_k = tl.load(top_k_ptr + row).to(tl.int64)
        row_max = _row_max(chunk_max_ptr, position, num_chunks, temperature, BLOCK_C)
        threshold = _top_k_key(topk_hist_ptr, topk_state_ptr, position, positions, num_chunks, vocab, temperature, top_k)
        row_ptr = logits_ptr + row_offset(position, vocab, VOCAB_DIVISIBLE)
        start = chunk * CHUNK_V
        mass = _kept_mass(row_ptr, start, start + CHUNK_V, vocab, temperature, row_max, threshold, BLOCK_V, VOCAB_DIVISIBLE)
        tl.store(mass_ptr + position * num_chunks + chunk, mass)


@triton.jit
def race_kernel(
    # inputs
    logits_ptr,
    draft_probs_ptr,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    seed_ptr,
    start_ptr,
    chunk_max_ptr,
    topk_hist_ptr,
    topk_state_ptr,
    topp_hist_ptr,
    topp_state_ptr,
    topp_prefix_ptr,
    mass_ptr,
    # scalars
    block,
    vocab,
    has_draft_probs,
    num_chunks,
    # outputs
    race_ptr,
    race_index_ptr,
    # compile-time configuration
    CHUNK_V: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_C: tl.constexpr,
    VOCAB_DIVISIBLE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """This chunk's exponential races of a sampled row: the winner on p and on max(0, p - q), and
    the residual's mass. race `[positions, chunks, 3]` float32 (best p race, best residual race,
    residual mass); race_index `[positions, chunks, 2]` int32."""
    wait_for_inputs(PDL)
    chunk, t, row, position, positions = _chunk_program(block)
    temperature = tl.load(temperature_ptr + row).to(tl.float32)
    if temperature > 0:
        top_k = tl.load(top_k_ptr + row).to(tl.int64)
        top_p = tl.load(top_p_ptr + row).to(tl.float32)
        row_max, threshold, z_k, z_p, use_top_p = _distribution(
            chunk_max_ptr, topk_hist_ptr, topk_state_ptr, topp_hist_ptr, topp_state_ptr, topp_prefix_ptr, mass_ptr,
            position, positions, num_chunks, vocab, temperature, top_k, top_p, BLOCK_C,
        )  # fmt: skip
        use_q = ((t < block - 1).to(tl.int32) * has_draft_probs) != 0
        q_len = tl.where(use_q, vocab, 0)
        draft_q_ptr = draft_probs_ptr + row_offset(row * (block - 1) + t, vocab, VOCAB_DIVISIBLE)
        bonus_key = counter_key(tl.load(seed_ptr + row), tl.load(start_ptr + row) + t + 1, BONUS_MIX)
        row_ptr = logits_ptr + row_offset(position, vocab, VOCAB_DIVISIBLE)
        start = chunk * CHUNK_V
        best_p, index_p, best_r, index_r, mass = _races(
            row_ptr, draft_q_ptr, q_len, bonus_key, start, start + CHUNK_V, vocab, temperature, row_max, threshold, z_k, z_p,
            use_top_p, BLOCK_V, VOCAB_DIVISIBLE,
        )  # fmt: skip
        here = position * num_chunks + chunk
        tl.store(race_ptr + here * 3, best_p)
        tl.store(race_ptr + here * 3 + 1, best_r)
        tl.store(race_ptr + here * 3 + 2, mass)
        tl.store(race_index_ptr + here * 2, index_p)
        tl.store(race_index_ptr + here * 2 + 1, index_r)


@triton.jit
def decide_kernel(
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
    topk_hist_ptr,
    topk_state_ptr,
    topp_hist_ptr,
    topp_state_ptr,
    topp_prefix_ptr,
    mass_ptr,
    race_ptr,
    race_index_ptr,
    # scalars
    block,
    vocab,
    has_draft_probs,
    num_chunks,
    # outputs
    decisions_ptr,
    # compile-time configuration
    BLOCK_C: tl.constexpr,
    VOCAB_DIVISIBLE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One program per (block position, sequence): accept draft t+1 or not, and the token to emit
    if the run ends at t (verify_positions_kernel's output), from the chunks' results."""
    wait_for_inputs(PDL)
    t = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    position = row * block + t
    positions = tl.num_programs(1).to(tl.int64) * block
    temperature = tl.load(temperature_ptr + row).to(tl.float32)
    draft, has_draft, best, accept, emit = _greedy_decision(tokens_ptr, chunk_max_ptr, chunk_index_ptr, row, t, block, num_chunks, BLOCK_C)

    if temperature > 0:
        top_k = tl.load(top_k_ptr + row).to(tl.int64)
        top_p = tl.load(top_p_ptr + row).to(tl.float32)
        row_max, threshold, z_k, z_p, use_top_p = _distribution(
            chunk_max_ptr, topk_hist_ptr, topk_state_ptr, topp_hist_ptr, topp_state_ptr, topp_prefix_ptr, mass_ptr,
            position, positions, num_chunks, vocab, temperature, top_k, top_p, BLOCK_C,
        )  # fmt: skip
        use_q = (has_draft.to(tl.int32) * has_draft_probs) != 0
        row_ptr = logits_ptr + row_offset(position, vocab, VOCAB_DIVISIBLE)
        draft_q_ptr = draft_probs_ptr + row_offset(row * (block - 1) + t, vocab, VOCAB_DIVISIBLE)
        seed, anchor = tl.load(seed_ptr + row), tl.load(start_ptr + row) + t + 1
        accept = _accepts(row_ptr, draft_q_ptr, draft, has_draft, use_q, seed, anchor, temperature, row_max, threshold, z_k, z_p, use_top_p)

        # The chunks' race winners, in chunk order (an earlier chunk keeps a tie, as one program's tiles do).
        best_p = tl.full((), -1.0, tl.float32)
        index_p = tl.full((), 0, tl.int32)
        best_r = tl.full((), -1.0, tl.float32)
        index_r = tl.full((), 0, tl.int32)
        mass = tl.full((), 0.0, tl.float32)
        for c in range(num_chunks):
            here = position * num_chunks + c
            chunk_best_p, chunk_best_r = tl.load(race_ptr + here * 3), tl.load(race_ptr + here * 3 + 1)
            better = chunk_best_p > best_p
            index_p = tl.where(better, tl.load(race_index_ptr + here * 2), index_p)
            best_p = tl.where(better, chunk_best_p, best_p)
            better = chunk_best_r > best_r
            index_r = tl.where(better, tl.load(race_index_ptr + here * 2 + 1), index_r)
            best_r = tl.where(better, chunk_best_r, best_r)
            mass += tl.load(race_ptr + here * 3 + 2)
        emit = tl.where(use_q & (mass > 0), index_r, index_p)

    out = decisions_ptr + position * 2
    tl.store(out, accept)
    tl.store(out + 1, emit)

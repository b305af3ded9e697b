"""Triton kernels of the two DFlash V2 ops.

Semantics: `trtllm_dflash.ops.reference_dflash2`. Four kernels, one per plugin node:
- `grouped_conv_kernel`, one program per (channel tile, block): the grouped dynamic causal
  convolution of one block's T <= 16 rows over BLOCK_C channels, in float32, plus the float32
  residual when there is one. The per-group coefficients are read once per group (BLOCK_C / GROUP
  contiguous values per row) and broadcast over the group's channels in registers, so every read
  streams whole rows;
- `topk_partials_kernel`, one program per (vocabulary chunk, draft position): the TOP_K largest
  unary logits of one chunk (stage 1 of the candidates, spread over the vocabulary like
  verification's argmax);
- `topk_merge_kernel`, one program per draft position: the TOP_K largest of the chunks' (stage 2);
- `candidate_select_kernel`, one program per sequence: the left-to-right walk over the block
  (each step gathers the predecessor row of the previous pick and the successor rows of the
  candidates), greedy or sampled with the counter RNG exactly as the reference.

Top-k is exact and ties go to the smaller id: each logit becomes one int64 key, ordered by the
value (the order-preserving integer of the float) and then by the smaller id, so a selection
round is one max-reduction. The walk's sampling is the exponential race of `reference.py` with
IEEE-rounded divisions and libdevice exp/log on the GPU (as `verify.py`), keyed by (seed, position,
STREAM_DRAFT) and indexed by the candidate's token id.

Parameter order is inputs, then scalars, then outputs (TensorRT's ahead-of-time plugin convention).
"""

import triton
import triton.language as tl

from trtllm_dflash.ops import kernels, rng

# the counter RNG and the precise exp/log (counter_rng.py, as verify.py's), in this file's own form
_counter_rng = kernels.load("counter_rng", interpret=triton.knobs.runtime.interpret)
precise_exp, precise_log = _counter_rng.precise_exp, _counter_rng.precise_log
counter_key, uniform_from_key = _counter_rng.counter_key, _counter_rng.uniform_from_key

DRAFT_MIX = tl.constexpr((rng.STREAM_DRAFT * rng.GOLDEN32) & rng.MASK32)
NO_KEY = tl.constexpr(-(2**63))  # below every candidate key
SUM = tl.standard._sum_combine
MAX = tl.standard._elementwise_max
MIN = tl.standard._elementwise_min
ARGMAX = tl.standard._argmax_combine_tie_break_left  # first index of the maximum


# ----------------------------------------------------------------------------- shared pieces

if triton.knobs.runtime.interpret:

    @triton.jit
    def round_to(x, dtype: tl.constexpr):
        """float32 -> dtype, rounded to nearest even (the interpreter truncates float32 -> bfloat16)."""
        if dtype == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            x = bits.to(tl.float32, bitcast=True)
        return x.to(dtype)

else:

    @triton.jit
    def round_to(x, dtype: tl.constexpr):
        return x.to(dtype)


@triton.jit
def below(offs, limit, UNIT: tl.constexpr, ALIGNED: tl.constexpr):
    """`offs < limit`, written so the compiler sees the mask constant over UNIT elements when `limit`
    is a multiple of UNIT (a plain comparison with a runtime scalar splits vector loads)."""
    if ALIGNED:
        return (offs // UNIT) < (limit // UNIT)
    return offs < limit


# ----------------------------------------------------------------------------- grouped conv


@triton.jit
def grouped_conv_kernel(
    # inputs
    x_ptr,
    delta_ptr,
    base_ptr,
    residual_ptr,
    # scalars
    steps,
    hidden,
    # outputs
    out_ptr,
    # compile-time configuration
    KERNEL_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    ALIGNED: tl.constexpr,
):
    """`out[t, c] = sum_k [t >= k] (base[k, c] + delta[t, k, c // GROUP]) x[t - k, c]` (+ residual)
    for one block and BLOCK_C channels. ALIGNED: the hidden size is a multiple of BLOCK_C."""
    BLOCK_G: tl.constexpr = BLOCK_C // GROUP
    # what the compiler may assume of row offsets (an `if` around tl.multiple_of would drop the hint)
    C_UNIT: tl.constexpr = BLOCK_C if ALIGNED else 1
    G_UNIT: tl.constexpr = BLOCK_G if ALIGNED else 1
    tile = tl.program_id(0)
    block = tl.program_id(1).to(tl.int64)
    groups = hidden // GROUP
    t = tl.arange(0, BLOCK_T)
    c = tile * BLOCK_C + tl.arange(0, BLOCK_C)
    g = tile * BLOCK_G + tl.arange(0, BLOCK_G)
    c_ok = below(c, hidden, BLOCK_C, ALIGNED)
    g_ok = below(g, groups, BLOCK_G, ALIGNED)
    rows = block * steps + t
    row_ok = t < steps
    acc = tl.full([BLOCK_T, BLOCK_C], 0.0, tl.float32)
    for k in tl.static_range(KERNEL_SIZE):
        tap_ok = row_ok & (t >= k)
        x = tl.load(
            x_ptr + tl.multiple_of((rows - k) * hidden, C_UNIT)[:, None] + c[None, :], mask=tap_ok[:, None] & c_ok[None, :], other=0.0
        )
        d = tl.load(
            delta_ptr + tl.multiple_of((rows * KERNEL_SIZE + k) * groups, G_UNIT)[:, None] + g[None, :],
            mask=row_ok[:, None] & g_ok[None, :],
            other=0.0,
        ).to(tl.float32)
        d = tl.reshape(tl.broadcast_to(d[:, :, None], (BLOCK_T, BLOCK_G, GROUP)), (BLOCK_T, BLOCK_C))  # per channel
        base = tl.load(base_ptr + tl.multiple_of(k * hidden, C_UNIT) + c, mask=c_ok, other=0.0).to(tl.float32)
        acc += (base[None, :] + d) * x.to(tl.float32)
    out_offs = tl.multiple_of(rows * hidden, C_UNIT)[:, None] + c[None, :]
    ok = row_ok[:, None] & c_ok[None, :]
    if HAS_RESIDUAL:
        acc = tl.load(residual_ptr + out_offs, mask=ok, other=0.0) + acc
    tl.store(out_ptr + out_offs, round_to(acc, out_ptr.dtype.element_ty), mask=ok)


# ----------------------------------------------------------------------------- top-k


@triton.jit
def candidate_key(values, ids):
    """An int64 ordered by the float32 value, then by the smaller id (ids in [0, 2**31 - 1))."""
    values = tl.where(values == 0.0, 0.0, values)  # -0.0 == +0.0
    bits = values.to(tl.uint32, bitcast=True).to(tl.int64)
    ordered = tl.where(bits >= 0x80000000, 0xFFFFFFFF - bits, bits + 0x80000000)  # [0, 2**32), like the floats
    return (ordered - 0x80000000) * 4294967296 + (0x7FFFFFFF - ids.to(tl.int64))


@triton.jit
def key_value(key):
    """The float32 value of a `candidate_key` (-inf for NO_KEY)."""
    ordered = (key >> 32) + 0x80000000
    bits = tl.where(ordered >= 0x80000000, ordered - 0x80000000, 0xFFFFFFFF - ordered)
    value = bits.to(tl.uint32).to(tl.float32, bitcast=True)
    return tl.where(key == NO_KEY, float("-inf"), value)


@triton.jit
def key_id(key):
    """The token id of a `candidate_key` (-1 for NO_KEY)."""
    return tl.where(key == NO_KEY, -1, 0x7FFFFFFF - (key & 0xFFFFFFFF))


@triton.jit
def top_keys(best, keys, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr):
    """The TOP_K largest of `best` (a previous result) and `keys`, largest first; NO_KEY after them."""
    slots = tl.arange(0, BLOCK_K)
    result = tl.full([BLOCK_K], NO_KEY, tl.int64)
    for r in range(TOP_K):  # keys are unique (one per token id), so each round removes one
        top = tl.maximum(tl.reduce(keys, 0, MAX), tl.reduce(best, 0, MAX))
        result = tl.where(slots == r, top, result)
        keys = tl.where(keys == top, NO_KEY, keys)
        best = tl.where(best == top, NO_KEY, best)
    return result


@triton.jit
def topk_partials_kernel(
    # inputs
    unary_ptr,
    # scalars
    vocab,
    # outputs
    values_ptr,
    ids_ptr,
    # compile-time configuration
    TOP_K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    CHUNK_V: tl.constexpr,
    VOCAB_DIVISIBLE: tl.constexpr,
):
    """The TOP_K largest logits of one chunk of CHUNK_V (stage 1), as (value, id); empty slots (-inf, -1)."""
    chunk = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    row_offset = row * vocab
    if VOCAB_DIVISIBLE:
        row_offset = tl.multiple_of(row_offset, 16)
    best = tl.full([BLOCK_K], NO_KEY, tl.int64)
    for v0 in tl.static_range(0, CHUNK_V, BLOCK_V):
        offs = chunk * CHUNK_V + v0 + tl.arange(0, BLOCK_V)
        ok = below(offs, vocab, 16, VOCAB_DIVISIBLE)
        x = tl.load(unary_ptr + row_offset + offs, mask=ok, other=float("-inf")).to(tl.float32)
        best = top_keys(best, tl.where(ok, candidate_key(x, offs), NO_KEY), TOP_K, BLOCK_K)
    chunks = (vocab + CHUNK_V - 1) // CHUNK_V
    slots = tl.arange(0, BLOCK_K)
    out = (row * chunks + chunk) * TOP_K + slots
    tl.store(values_ptr + out, key_value(best), mask=slots < TOP_K)
    tl.store(ids_ptr + out, key_id(best).to(tl.int32), mask=slots < TOP_K)


@triton.jit
def topk_merge_kernel(
    # inputs
    values_ptr,
    ids_ptr,
    # scalars
    num_chunks,
    # outputs
    cand_ptr,
    cand_unary_ptr,
    # compile-time configuration
    TOP_K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """The TOP_K largest of one position's chunk partials (stage 2): the candidates, best first."""
    row = tl.program_id(0).to(tl.int64)
    entries = num_chunks * TOP_K
    best = tl.full([BLOCK_K], NO_KEY, tl.int64)
    for m0 in range(0, entries, BLOCK_M):
        offs = m0 + tl.arange(0, BLOCK_M)
        ok = offs < entries
        values = tl.load(values_ptr + row * entries + offs, mask=ok, other=float("-inf"))
        ids = tl.load(ids_ptr + row * entries + offs, mask=ok, other=-1)
        best = top_keys(best, tl.where(ok & (ids >= 0), candidate_key(values, ids), NO_KEY), TOP_K, BLOCK_K)
    slots = tl.arange(0, BLOCK_K)
    tl.store(cand_ptr + row * TOP_K + slots, key_id(best), mask=slots < TOP_K)
    tl.store(cand_unary_ptr + row * TOP_K + slots, key_value(best), mask=slots < TOP_K)


# ----------------------------------------------------------------------------- the walk


@triton.jit
def candidate_select_kernel(
    # inputs
    cand_ptr,
    cand_unary_ptr,
    z_ptr,
    anchor_ptr,
    predecessor_ptr,
    successor_ptr,
    temperature_ptr,
    seed_ptr,
    positions_ptr,
    # scalars
    steps,
    # outputs
    tokens_ptr,
    probs_ptr,
    # compile-time configuration
    TOP_K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    RANK: tl.constexpr,
):
    """One sequence's walk: score_k = unary_k + <successor[c_k], predecessor[prev] * z_t>, pick
    (greedy: best, ties to the smaller id; sampled: the race on softmax(score / T)), prev = pick."""
    row = tl.program_id(0).to(tl.int64)
    slots = tl.arange(0, BLOCK_K)
    k_ok = slots < TOP_K
    r = tl.arange(0, RANK)
    temperature = tl.load(temperature_ptr + row).to(tl.float32)
    greedy = temperature <= 0
    safe_t = tl.where(greedy, 1.0, temperature)
    seed = tl.load(seed_ptr + row)
    prev = tl.load(anchor_ptr + row).to(tl.int64)
    for t in range(steps):
        position = row * steps + t
        cand = tl.load(cand_ptr + position * TOP_K + slots, mask=k_ok, other=0)
        cand_unary = tl.load(cand_unary_ptr + position * TOP_K + slots, mask=k_ok, other=float("-inf"))
        u = tl.load(predecessor_ptr + prev * RANK + r).to(tl.float32) * tl.load(z_ptr + position * RANK + r).to(tl.float32)
        successor = tl.load(successor_ptr + cand[:, None] * RANK + r[None, :], mask=k_ok[:, None], other=0.0).to(tl.float32)
        score = tl.where(k_ok, cand_unary + tl.reduce(successor * u[None, :], 1, SUM), float("-inf"))
        top = tl.reduce(score, 0, MAX)
        greedy_pick = tl.reduce(tl.where(k_ok & (score == top), cand, 0x7FFFFFFFFFFFFFFF), 0, MIN)
        scaled = tl.div_rn(score, safe_t)
        e = tl.where(k_ok, precise_exp(scaled - tl.reduce(scaled, 0, MAX)), 0.0)
        q = tl.div_rn(e, tl.reduce(e, 0, SUM))
        key = counter_key(seed, tl.load(positions_ptr + position), DRAFT_MIX)
        race = tl.where(k_ok, tl.div_rn(q, -precise_log(uniform_from_key(key, cand))), -1.0)
        _, winner = tl.reduce((race, slots), 0, ARGMAX)
        sampled_pick = tl.reduce(tl.where(slots == winner, cand, 0), 0, SUM)
        pick = tl.where(greedy, greedy_pick, sampled_pick)
        probs = tl.where(greedy, (cand == pick).to(tl.float32), q)
        tl.store(tokens_ptr + position, pick)
        tl.store(probs_ptr + position * TOP_K + slots, probs, mask=k_ok)
        prev = pick

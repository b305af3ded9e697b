"""Plain-torch reference implementations of sampling and block verification (the verification
plugin); the attention plugins' are in `reference_attention.py`.

These define the semantics. The Triton kernels, the TensorRT plugins and the ONNX node
evaluators are all checked against them, and the torch runtime runs them wherever a kernel
is not available (CPU).

Sampling semantics (shared with the verification kernel):
- temperature 0 is greedy (argmax; the first index wins ties);
- otherwise probs = softmax(logits / T), then top-k keeps tokens with fewer than k logits
  strictly greater than their own (k = 0: off), then top-p keeps tokens whose strictly-more-probable
  mass is below p (p = 1: off), then renormalise. Ties are kept together, so the result does not
  depend on a sort order;
- a categorical sample is the exponential race argmax_v(prob_v / -log u_v) with u_v from the
  counter RNG keyed by (seed, absolute position, stream).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from trtllm_dflash.ops import rng, sampling_support

# ----------------------------------------------------------------------------- sampling


@dataclasses.dataclass(frozen=True)
class SamplingBranches:
    """Which parts of sampling some row of a batch needs, as the host knows them: given, sampling reads
    nothing back from the device to decide (each such read waits for the device). Every part is exact
    for the rows that do not use it, so these only skip work."""

    any_greedy: bool
    max_top_k: int  # <= 0: no row uses top-k
    any_top_p: bool


def process_logits(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    branches: SamplingBranches | None = None,
) -> torch.Tensor:
    """Sampling distribution for logits `[b, ..., V]` with per-row parameters `[b]` (float32).

    Rows with temperature 0 get the one-hot distribution of their argmax, which makes greedy
    decoding a special case of the rejection-sampling formulas. `branches`: what the host knows
    of the rows (else read from the tensors).
    """
    return _processed(logits, temperature, top_k, top_p, branches)[0]


def _processed(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    branches: SamplingBranches | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`process_logits`, and the support its top-p found (`sampling_support.support`) where that
    holds every sampled row's distribution (every such row used top-p), else None: a race over
    the result can run on it (top-p only zeroes tokens) without finding it again."""
    batch = logits.shape[0]
    extra = logits.dim() - 2
    shape = (batch,) + (1,) * (extra + 1)
    logits = logits.float()
    temperature = temperature.float().view(shape)
    greedy = temperature <= 0
    scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature)

    k = top_k.to(torch.int64).view(shape)
    widest = (int(k.max()) if k.numel() else 0) if branches is None else branches.max_top_k
    # `scaled` and `probs` are this call's own tensors: the steps below work on them in place (a
    # full-vocabulary copy each saved; on a CPU such copies were a third of a sampled step)
    if widest > 0:
        scaled.masked_fill_(_top_k_dropped(scaled, k, widest), float("-inf"))
    probs = torch.softmax(scaled, dim=-1)

    p = top_p.float().view(shape)
    within = None
    if bool((p < 1).any()) if branches is None else branches.any_top_p:
        # a greedy row's result is replaced by its argmax, a row without top-p's is its softmax
        within = sampling_support.support(probs, (p < 1) & ~greedy, widest) if widest > 0 else None
        _drop_top_p_(probs, p, within)
        # renormalise only the rows that use top-p (the others divide by 1, exactly), so a row's
        # distribution (and its samples) does not depend on the other rows of the batch
        probs.div_(torch.where(p < 1, probs.sum(dim=-1, keepdim=True), 1.0))

    if bool(greedy.any()) if branches is None else branches.any_greedy:  # one-hot at the argmax
        top = argmax(logits).unsqueeze(-1)
        probs.masked_fill_(greedy, 0.0)
        probs.scatter_(-1, top, torch.where(greedy, 1.0, probs.gather(-1, top)))
    return probs, within if within is not None and bool(((p < 1) | greedy).all()) else None


def argmax(x: torch.Tensor) -> torch.Tensor:
    """`x.argmax(dim=-1)`: the first index of the maximum (a NaN counts as the maximum), int64.

    On CPU float32 through numpy, whose argmax is vectorised: a batch-8 block of 8 x 4,096 logits
    took 11 us against torch's 145 us on one thread, twice in every decoding step (drafts and the
    target's posterior). Elsewhere torch's own."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() > 0 and x.shape[-1] > 0:
        return torch.from_numpy(x.detach().numpy().argmax(axis=-1))
    return x.argmax(dim=-1)


def _top_k_dropped(scaled: torch.Tensor, k: torch.Tensor, largest_k: int) -> torch.Tensor:
    """The tokens top-k drops: all but those with fewer than k values strictly greater than their
    own (k <= 0: none), ties kept: exactly those not at or above the k-th largest value, found with
    topk rather than a sort of the vocabulary when k is small. `largest_k`: the largest k of any row."""
    widest = min(largest_k, scaled.shape[-1])
    kth = scaled.topk(widest, dim=-1).values.gather(-1, (k.clamp(1, widest) - 1).expand(*scaled.shape[:-1], 1))
    return torch.ge(scaled, kth).logical_not_().logical_and_(k > 0)


def _drop_top_p_(probs: torch.Tensor, p: torch.Tensor, within: torch.Tensor | None) -> None:
    """Set to 0, in place, the tokens top-p drops: those whose strictly-more-probable mass is not
    below p (p >= 1: none).

    The masses come from the cumulative sum of the probabilities in ascending order: a value's is
    the total less the ascending sum up to the last value equal to it. Those masses fall as the
    values rise, so the kept tokens are those at or above one value per row: the first ascending
    value whose mass above, total less the ascending sum up to itself, is below p (inside a run of
    ties that mass is at least the run's own, so the first such index lies in the first kept run).
    No token's own mass is looked up (a binary search per token cost most of a CPU's top-p) and no
    sort order is kept: numpy sorts the values alone, a third of torch's time on a CPU. Over a
    row's support (`within`, from `sampling_support.support`) the zeros left out add nothing to the
    ascending sums, so every sum is the same float, bit for bit, and so is the decision on the
    tokens that can be kept."""
    values = probs if within is None else probs.gather(-1, within)
    if values.device.type == "cpu" and values.dtype == torch.float32:
        ascending = torch.from_numpy(np.sort(values.detach().numpy(), axis=-1))
    else:
        ascending = values.sort(dim=-1).values
    cumulative = ascending.cumsum(dim=-1)
    kept_count = ((cumulative[..., -1:] - cumulative) < p).sum(dim=-1, keepdim=True)  # a suffix of the ascending values
    first_kept = ascending.gather(-1, (ascending.shape[-1] - kept_count).clamp_max(ascending.shape[-1] - 1))
    threshold = torch.where(kept_count > 0, first_kept, float("inf"))
    dropped = torch.where(p >= 1, False, ~(values >= threshold))  # a NaN row (no finite logit) is dropped, as the sums said
    if within is None:
        probs.masked_fill_(dropped, 0.0)
    else:
        probs.scatter_(-1, within, values.masked_fill_(dropped, 0.0))  # outside the support: 0 already


def sample_from_probs(probs: torch.Tensor, key: torch.Tensor, largest_top_k: int = 0, within: torch.Tensor | None = None) -> torch.Tensor:
    """Exponential-race sample per row of `probs [..., V]` with counter keys `key [...]`.

    `largest_top_k` (> 0: some row used top-k, this the largest k): race over the rows' support
    (`sampling_support.support`) where it applies: a token of probability 0 races 0 and never wins,
    and the support's ascending order keeps the first index on a tie, so the winner is the same.
    `within`: such a support, already found (rows whose sample is not used may lack theirs)."""
    if within is None and largest_top_k > 0:
        within = sampling_support.support(probs, largest_top_k=largest_top_k)
    if within is None:
        index = torch.arange(probs.shape[-1], dtype=torch.int64, device=probs.device)
        exponential = rng.uniform_from_key(key.unsqueeze(-1), index).log_().neg_()  # -log(u), in place
        return argmax(probs / exponential)
    exponential = rng.uniform_from_key(key.unsqueeze(-1), within).log_().neg_()
    return within.gather(-1, argmax(probs.gather(-1, within) / exponential).unsqueeze(-1)).squeeze(-1)


def sample_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seed: torch.Tensor,
    positions: torch.Tensor,
    stream: int,
    branches: SamplingBranches | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per position of `logits [b, T, V]`; returns (tokens [b, T], probs).

    `positions [b, T]` are the absolute positions of the tokens being sampled; `branches` as
    `process_logits` takes them.
    """
    probs, within = _processed(logits, temperature, top_k, top_p, branches)
    key = rng.counter_key(seed.view(-1, 1), positions, stream)
    tokens = sample_from_probs(probs, key, sampling_support.largest_top_k(top_k, getattr(branches, "max_top_k", None)), within)
    greedy = (temperature <= 0).view(-1, 1)
    if bool(greedy.any()) if branches is None else branches.any_greedy:
        tokens = torch.where(greedy, argmax(logits), tokens)
    return tokens, probs


# ----------------------------------------------------------------------------- verification


def verify_block(
    target_logits: torch.Tensor,
    block_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seed: torch.Tensor,
    start: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tree-free block verification for one decoding step.

    target_logits: `[b, B, V]`, the target's logits at block positions start .. start+B-1;
    block_tokens: `[b, B]`, the anchor followed by B-1 draft tokens;
    draft_probs: `[b, B-1, V]`, the drafter's processed distribution at positions 1..B-1
    (needed only for rows with temperature > 0; None reads as q = 0: accept any draft the target
    can emit, sample the bonus from p).
    Returns (accepted drafts `[b]` in 0..B-1, bonus token `[b]`). The tokens committed this step
    are `block_tokens[1 : 1+accepted]` followed by the bonus token.
    """
    batch, block, vocab = target_logits.shape
    drafts = block_tokens[:, 1:]
    greedy = temperature <= 0
    posterior = argmax(target_logits)  # [b, B]

    if block > 1:
        accepted = drafts == posterior[:, :-1]
        if not bool(greedy.all()):
            target_probs = process_logits(target_logits, temperature, top_k, top_p)
            p = target_probs[:, :-1].gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
            q = draft_probs.gather(-1, drafts.unsqueeze(-1)).squeeze(-1) if draft_probs is not None else torch.zeros_like(p)
            positions = start.view(-1, 1) + torch.arange(1, block, device=start.device)
            u = rng.uniform(seed.view(-1, 1), positions, rng.STREAM_ACCEPT)
            sampled_accept = u * q < p  # u < min(1, p/q) without dividing
            accepted = torch.where(greedy.view(-1, 1), accepted, sampled_accept)
        num_accepted = accepted.to(torch.int64).cumprod(dim=-1).sum(dim=-1)
    else:
        num_accepted = torch.zeros(batch, dtype=torch.int64, device=target_logits.device)

    bonus = posterior.gather(-1, num_accepted.view(-1, 1)).squeeze(-1)
    if not bool(greedy.all()):
        rows = torch.arange(batch, device=target_logits.device)
        # the bonus is drawn where the accepted prefix ends: that row of the distribution the drafts
        # were checked against (computed once), or the target's own there when nothing was drafted
        p = target_probs[rows, num_accepted] if block > 1 else process_logits(target_logits[rows, num_accepted], temperature, top_k, top_p)
        if block > 1 and draft_probs is not None:  # without q there is no residual: sample p
            rejected = num_accepted < block - 1
            q = draft_probs[rows, num_accepted.clamp_max(block - 2)]
            p = torch.where(rejected.view(-1, 1), _residual(p, q), p)
        key = rng.counter_key(seed, start + num_accepted + 1, rng.STREAM_BONUS)
        sampled_bonus = sample_from_probs(p, key, sampling_support.largest_top_k(top_k))
        bonus = torch.where(greedy, bonus, sampled_bonus)
    return num_accepted, bonus


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The distribution a rejection samples from: normalize(max(0, p - q)), or p where that has no mass."""
    residual = (p - q).clamp_min(0)
    mass = residual.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, residual / mass.clamp_min(1e-30), p)


VERIFY_RESULT_COLUMNS = ("accepted", "bonus", "next_start", "committed", "stopped")


def verify_block_packed(
    target_logits: torch.Tensor,
    block_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seed: torch.Tensor,
    start: torch.Tensor,
    stop_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """`verify_block` plus the bookkeeping a device-resident loop needs, in one int64 `[b, 5]`.

    Columns (`VERIFY_RESULT_COLUMNS`): accepted drafts; bonus token (the next anchor); next start
    (`start + accepted + 1`, the position of the next anchor); committed tokens this step (the
    accepted drafts and the bonus, cut after the first stop token); stopped (1 if a stop token
    was committed). `stop_ids [b, S]` lists each row's stop tokens, -1 for unused entries.
    """
    accepted, bonus = verify_block(target_logits, block_tokens, draft_probs, temperature, top_k, top_p, seed, start)
    return _commit(block_tokens, accepted, bonus, start, stop_ids)


def _commit(block_tokens, accepted, bonus, start, stop_ids) -> torch.Tensor:
    batch, block = block_tokens.shape
    committed, stopped = accepted + 1, torch.zeros_like(accepted)
    if stop_ids is not None and stop_ids.numel():
        index = torch.arange(block, device=block_tokens.device)
        tokens = torch.cat([block_tokens[:, 1:], bonus.view(-1, 1)], dim=1)  # token i is committed i-th
        tokens = torch.where(index < accepted.view(-1, 1), tokens, bonus.view(-1, 1))
        is_stop = ((tokens.unsqueeze(-1) == stop_ids.unsqueeze(1)) & (stop_ids.unsqueeze(1) >= 0)).any(-1)
        is_stop &= index <= accepted.view(-1, 1)
        first = torch.where(is_stop, index, block).min(dim=1).values
        stopped = (first <= accepted).to(torch.int64)
        committed = torch.where(stopped.bool(), first + 1, committed)
    next_start = start.to(torch.int64) + accepted + 1
    return torch.stack([accepted, bonus, next_start, committed, stopped], dim=1).to(torch.int64)


def verify_positions(
    target_logits: torch.Tensor,
    block_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seed: torch.Tensor,
    start: torch.Tensor,
) -> torch.Tensor:
    """The per-position form of `verify_block` (what the parallel kernel computes first).

    Returns int32 `[b, B, 2]`: at block position t, [..., 0] says whether draft token t+1 is
    accepted (0 at t = B-1), and [..., 1] is the token to emit if the accepted run ends at t: the
    argmax for greedy rows; for sampled rows a sample of normalize(max(0, p_t - q_t)) (of p_t when
    the residual has no mass, at t = B-1, or without draft probabilities). `verify_commit` turns
    it into `verify_block_packed`'s result.
    """
    batch, block, vocab = target_logits.shape
    greedy = (temperature <= 0).view(-1, 1)
    drafts = block_tokens[:, 1:]
    posterior = argmax(target_logits)
    accept = torch.zeros(batch, block, dtype=torch.bool, device=target_logits.device)
    accept[:, :-1] = drafts == posterior[:, :-1]
    emit = posterior
    if not bool(greedy.all()):
        p = process_logits(target_logits, temperature, top_k, top_p)
        positions = start.view(-1, 1) + torch.arange(1, block + 1, device=start.device)  # position t + 1
        dist = p
        if block > 1:
            q = draft_probs if draft_probs is not None else torch.zeros_like(p[:, :-1])
            p_draft = p[:, :-1].gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
            q_draft = q.gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
            u = rng.uniform(seed.view(-1, 1), positions[:, :-1], rng.STREAM_ACCEPT)
            accept[:, :-1] = torch.where(greedy, accept[:, :-1], u * q_draft < p_draft)
            if draft_probs is not None:
                dist = torch.cat([_residual(p[:, :-1], q), p[:, -1:]], dim=1)
        sampled = sample_from_probs(
            dist, rng.counter_key(seed.view(-1, 1), positions, rng.STREAM_BONUS), sampling_support.largest_top_k(top_k)
        )
        emit = torch.where(greedy, posterior, sampled)
    return torch.stack([accept.to(torch.int32), emit.to(torch.int32)], dim=-1)


def verify_partials(target_logits: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1 of the split argmax: per chunk of `chunk` logits of `[b, B, V]`, the float32 maximum
    and the int32 first index of it, `[b, B, ceil(V / chunk)]` each. `verify_positions` does not
    need them (they only spread the argmax over more programs); the first maximal chunk holds the
    row's argmax."""
    batch, block, vocab = target_logits.shape
    chunks = -(-vocab // chunk)
    padded = torch.full((batch, block, chunks * chunk), float("-inf"), dtype=torch.float32, device=target_logits.device)
    padded[..., :vocab] = target_logits.float()
    values, index = padded.view(batch, block, chunks, chunk).max(dim=-1)  # torch: the first index of the maximum
    index = index + torch.arange(chunks, device=target_logits.device) * chunk
    return values, index.to(torch.int32)


def verify_commit(
    decisions: torch.Tensor, block_tokens: torch.Tensor, start: torch.Tensor, stop_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """From `verify_positions`' decisions to `verify_block_packed`'s `[b, 5]` result."""
    accept = decisions[..., 0].to(torch.int64)
    accepted = accept[:, :-1].cumprod(dim=-1).sum(dim=-1)
    bonus = decisions[..., 1].to(torch.int64).gather(1, accepted.view(-1, 1)).squeeze(1)
    return _commit(block_tokens, accepted, bonus, start, stop_ids)

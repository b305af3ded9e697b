"""Plain-torch reference implementations of the two DFlash V2 ops.

They define the semantics; the Triton kernels, the ONNX node evaluators and the TensorRT
plugins are checked against them.

- Grouped dynamic causal convolution along a draft block (t = 0 is the anchor; taps never cross
  the block): `out[t, c] = sum_{k<K} [t-k >= 0] (base[k, c] + delta[t, k, c // group]) * x[t-k, c]`,
  computed in float32 (float64 for float64 inputs). With `residual`, the output is `residual + conv`
  in that precision (the V2 drafter keeps its residual stream in float32); otherwise it is cast to `x`'s dtype.
- Candidate selector: at each draft position the `top_k` largest unary logits are the
  candidates (ties to the smaller id); the walk starts at the anchor and scores each candidate
  c as `unary[c] + <successor[c], predecessor[prev] * z_t>`, where prev is the previous pick.
  Greedy rows (temperature 0) pick the best score, ties to the smaller id; sampled rows draw
  from softmax(score / T) over the candidates with the exponential race of `reference.py`,
  keyed by (seed, absolute position, STREAM_DRAFT) and indexed by the candidate's token id, so
  the draft distribution q is exact: the candidates' softmax, 0 for every other token.
"""

from __future__ import annotations

import torch

from trtllm_dflash.ops import rng


def grouped_dynamic_conv(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """Conv of `x [..., T, H]` with per-position coefficients `delta [..., T, K, G]` and a shared
    `base [K, H]` (G = H / group); each leading index is one block."""
    kernel_size, hidden = base.shape
    groups = delta.shape[-1]
    group = hidden // groups
    accumulate = torch.promote_types(x.dtype, torch.float32)  # float32 (float64 models stay float64)
    x32 = x.to(accumulate)
    # [.., T, K, H]: the dynamic part repeated over each group's channels, plus the base
    coefficients = base.to(accumulate) + delta.to(accumulate).repeat_interleave(group, dim=-1)
    out = torch.zeros_like(x32)
    steps = x.shape[-2]
    for k in range(min(kernel_size, steps)):
        out[..., k:, :] += coefficients[..., k:, k, :] * x32[..., : steps - k, :]
    if residual is not None:
        return residual.to(accumulate) + out
    return out.to(x.dtype)


def candidates(unary: torch.Tensor, top_k: int) -> torch.Tensor:
    """Token ids of the `top_k` largest logits of `unary [..., V]`, best first, ties to the smaller id."""
    k = min(top_k, unary.shape[-1])
    values = unary.to(torch.promote_types(unary.dtype, torch.float32))
    # the k-th largest value; every larger token is a candidate, and of the tokens equal to it the
    # smallest ids fill the remaining places (exact ties without sorting the vocabulary)
    threshold = values.topk(k, dim=-1).values[..., -1:]
    greater = values > threshold
    equal = values == threshold
    room = k - greater.sum(dim=-1, keepdim=True)
    chosen = greater | (equal & (equal.cumsum(dim=-1) <= room))
    ids = chosen.nonzero()[:, -1].view(*values.shape[:-1], k)  # ascending ids, k per position
    order = torch.sort(values.gather(-1, ids), dim=-1, descending=True, stable=True).indices
    return ids.gather(-1, order)


def candidate_select(
    unary: torch.Tensor,
    z: torch.Tensor,
    anchor: torch.Tensor,
    predecessor: torch.Tensor,
    successor: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    positions: torch.Tensor,
    top_k: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The selector's walk over draft positions 1..T of a batch.

    unary `[b, T, V]` (the drafter's logits), z `[b, T, R]` (hidden_projection of the drafter's
    hidden states), anchor `[b]`, codebooks `[V, R]`, temperature / seed `[b]`, positions `[b, T]`
    (absolute positions of the drafted tokens). Returns (tokens `[b, T]`, candidate ids
    `[b, T, k]`, candidate probabilities `[b, T, k]` float32: the draft distribution q, one-hot
    at the pick for greedy rows).
    """
    cand = candidates(unary, top_k)  # [b, T, k]
    accumulate = torch.promote_types(unary.dtype, torch.float32)  # float32 (float64 models stay float64)
    cand_unary = unary.to(accumulate).gather(-1, cand)
    tokens, probs = candidate_walk(cand, cand_unary, z, anchor, predecessor, successor, temperature, seed, positions)
    return tokens, cand, probs


def candidate_walk(
    cand: torch.Tensor,
    cand_unary: torch.Tensor,
    z: torch.Tensor,
    anchor: torch.Tensor,
    predecessor: torch.Tensor,
    successor: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The walk of `candidate_select` given the candidates (ids `[b, T, k]`, float32 unary logits
    `[b, T, k]`): (tokens `[b, T]`, candidate probabilities `[b, T, k]`). Split out so the walk's
    node (DFlash2CandidateSelect) has a reference of its own."""
    steps = cand.shape[1]
    accumulate = torch.promote_types(cand_unary.dtype, torch.float32)  # float32 (float64 models stay float64)
    cand_unary = cand_unary.to(accumulate)
    cand_successor = successor.to(accumulate)[cand]  # [b, T, k, R]
    no_token = torch.iinfo(torch.int64).max  # greater than every id: loses every greedy tie
    prev = anchor.long()
    tokens, probs = [], []
    for t in range(steps):
        u = predecessor.to(accumulate)[prev] * z[:, t].to(accumulate)  # [b, R]
        score = cand_unary[:, t] + (cand_successor[:, t] * u.unsqueeze(1)).sum(-1)  # [b, k]
        pick, q = select_step(score, cand[:, t], temperature, seed, positions[:, t], no_token)
        probs.append(q)
        tokens.append(pick)
        prev = pick
    return torch.stack(tokens, dim=1), torch.stack(probs, dim=1)


# ----------------------------------------------------------------------------- split top-k
# The kernels find the candidates in two stages, like verification's argmax: the top-k of each
# chunk of the vocabulary, then the top-k of those. These are the stages' references (the ONNX
# nodes DFlash2TopKPartials and DFlash2TopKMerge evaluate them); merged, they equal `candidates`.

EMPTY_ID = -1  # a partial slot with no token (a chunk shorter than k); its value is -inf


def topk_partials(unary: torch.Tensor, top_k: int, chunk_v: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per chunk of `chunk_v` logits of `unary [b, T, V]`, the `top_k` largest (ties to the smaller
    id): float32 values and int32 ids `[b, T, chunks, top_k]`, empty slots (-inf, EMPTY_ID) last."""
    *lead, vocab = unary.shape
    chunks = -(-vocab // chunk_v)
    values = torch.full((*lead, chunks, top_k), float("-inf"), dtype=torch.float32, device=unary.device)
    ids = torch.full((*lead, chunks, top_k), EMPTY_ID, dtype=torch.int32, device=unary.device)
    for c in range(chunks):
        part = unary[..., c * chunk_v : (c + 1) * chunk_v].float()
        best = candidates(part, top_k)
        values[..., c, : best.shape[-1]] = part.gather(-1, best)
        ids[..., c, : best.shape[-1]] = (best + c * chunk_v).to(torch.int32)
    return values, ids


def topk_merge(values: torch.Tensor, ids: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `top_k` largest of the partials `[b, T, chunks, k]` (ties to the smaller id, empty slots
    after every token): int64 ids and float32 values `[b, T, top_k]`."""
    values, ids = values.flatten(-2).float(), ids.flatten(-2).long()
    ids = torch.where(ids < 0, torch.iinfo(torch.int64).max, ids)
    by_id = torch.sort(ids, dim=-1, stable=True).indices
    values, ids = values.gather(-1, by_id), ids.gather(-1, by_id)
    order = torch.sort(values, dim=-1, descending=True, stable=True).indices[..., :top_k]
    return ids.gather(-1, order), values.gather(-1, order)


def select_step(
    score: torch.Tensor, cand: torch.Tensor, temperature: torch.Tensor, seed: torch.Tensor, positions: torch.Tensor, vocab: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One position of the walk, from the candidates' scores `[b, k]` (ids `cand [b, k]`, absolute
    `positions [b]`; `vocab`: any id above every candidate): (pick `[b]`, q over the candidates
    `[b, k]` float32). Shared by the walk above and by runtimes that walk precomputed scores (the V2
    drafter graphs without plugin nodes)."""
    greedy = temperature <= 0
    best = score.max(dim=-1, keepdim=True).values
    pick = torch.where(score == best, cand, vocab).min(dim=-1).values
    if bool(greedy.all()):  # no row samples: skip the softmax and the race
        return pick, (cand == pick.view(-1, 1)).float()
    safe_t = torch.where(greedy, torch.ones_like(temperature), temperature).to(score.dtype).view(-1, 1)
    q = torch.softmax(score / safe_t, dim=-1).float()
    key = rng.counter_key(seed, positions, rng.STREAM_DRAFT)
    race = q / -torch.log(rng.uniform_from_key(key.view(-1, 1), cand))
    sampled_pick = cand.gather(-1, race.argmax(dim=-1, keepdim=True)).squeeze(-1)
    pick = torch.where(greedy, pick, sampled_pick)
    one_hot = (cand == pick.view(-1, 1)).float()
    return pick, torch.where(greedy.view(-1, 1), one_hot, q)


def scatter_draft_probs(cand: torch.Tensor, cand_probs: torch.Tensor, vocab: int) -> torch.Tensor:
    """The selector's q over the whole vocabulary `[b, T, V]` (0 outside the candidates), as
    verification takes it."""
    full = torch.zeros((*cand.shape[:-1], vocab), dtype=torch.float32, device=cand.device)
    return full.scatter_(-1, cand, cand_probs.float())

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

from trtllm_dflash.plugins import rng


def grouped_dynamic_conv(
    x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, residual: torch.Tensor | None = None
) -> torch.Tensor:
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
    order = torch.sort(unary.to(torch.promote_types(unary.dtype, torch.float32)), dim=-1, descending=True, stable=True).indices
    return order[..., : min(top_k, unary.shape[-1])]


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
    steps = unary.shape[1]
    cand = candidates(unary, top_k)  # [b, T, k]
    accumulate = torch.promote_types(unary.dtype, torch.float32)  # float32 (float64 models stay float64)
    cand_unary = unary.to(accumulate).gather(-1, cand)
    cand_successor = successor.to(accumulate)[cand]  # [b, T, k, R]
    prev = anchor.long()
    tokens, probs = [], []
    for t in range(steps):
        u = predecessor.to(accumulate)[prev] * z[:, t].to(accumulate)  # [b, R]
        score = cand_unary[:, t] + (cand_successor[:, t] * u.unsqueeze(1)).sum(-1)  # [b, k]
        pick, q = select_step(score, cand[:, t], temperature, seed, positions[:, t], unary.shape[-1])
        probs.append(q)
        tokens.append(pick)
        prev = pick
    return torch.stack(tokens, dim=1), cand, torch.stack(probs, dim=1)


def select_step(
    score: torch.Tensor, cand: torch.Tensor, temperature: torch.Tensor, seed: torch.Tensor, positions: torch.Tensor, vocab: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One position of the walk, from the candidates' scores `[b, k]` (ids `cand [b, k]`, absolute
    `positions [b]`): (pick `[b]`, q over the candidates `[b, k]` float32). Shared by the walk above
    and by runtimes that walk precomputed scores (the V2 drafter graphs without plugin nodes)."""
    greedy = temperature <= 0
    safe_t = torch.where(greedy, torch.ones_like(temperature), temperature).to(score.dtype).view(-1, 1)
    best = score.max(dim=-1, keepdim=True).values
    greedy_pick = torch.where(score == best, cand, vocab).min(dim=-1).values
    q = torch.softmax(score / safe_t, dim=-1).float()
    key = rng.counter_key(seed, positions, rng.STREAM_DRAFT)
    race = q / -torch.log(rng.uniform_from_key(key.view(-1, 1), cand))
    sampled_pick = cand.gather(-1, race.argmax(dim=-1, keepdim=True)).squeeze(-1)
    pick = torch.where(greedy, greedy_pick, sampled_pick)
    one_hot = (cand == pick.view(-1, 1)).float()
    return pick, torch.where(greedy.view(-1, 1), one_hot, q)


def scatter_draft_probs(cand: torch.Tensor, cand_probs: torch.Tensor, vocab: int) -> torch.Tensor:
    """The selector's q over the whole vocabulary `[b, T, V]` (0 outside the candidates), as
    verification takes it."""
    full = torch.zeros((*cand.shape[:-1], vocab), dtype=torch.float32, device=cand.device)
    return full.scatter_(-1, cand, cand_probs.float())

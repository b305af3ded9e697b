"""Where a row's sampling distribution lives: the tokens of nonzero probability, for the CPU's
sampling shortcut in `reference.py`.

Why: with top-k (chat models sample with one: Qwen3's is 20), a row's distribution lives on a few
dozen tokens, and top-p and the exponential race give the same floats, bit for bit, over those as
over the vocabulary (the others add exact zeros to the ascending sums and race 0, never winning),
at a fraction of the work on a CPU: sorting 151,936 probabilities per position was most of a
sampled step there (benchmarks/RESULTS.md, "Sampled decoding on CPU"). On a GPU nothing changes:
finding a row's support reads the device, and the verification kernels do their own shortlist.
"""

from __future__ import annotations

import torch

SUPPORT_LIMIT = 4096  # the most tokens of nonzero probability a row may have for the support's shortcut
# room past a row's top-k for the ties at its k-th value (bf16 logits tie often), so one topk finds
# the support: 2k + 64 largest cost a CPU little more than k + 1 (23 vs 27 ms, 128 rows of 151,936)
TIES_MARGIN = 64


def largest_top_k(top_k: torch.Tensor, max_top_k: int | None = None) -> int:
    """The largest top-k of any row, 0 where no row samples with top-k (its distribution may be
    sparse): `max_top_k` where the host knows it (`reference.SamplingBranches`), else read from
    `top_k` on a CPU only (a GPU would wait for the read: 0 there)."""
    if max_top_k is not None:
        return max(max_top_k, 0)
    if top_k.device.type != "cpu" or not top_k.numel():
        return 0
    return max(int(top_k.max()), 0)


def support(probs: torch.Tensor, rows: torch.Tensor | None = None, largest_top_k: int = 0) -> torch.Tensor | None:
    """Indices `[..., m]`, ascending, holding every token of nonzero probability of each row of
    `probs [..., V]` (and possibly some of probability 0), or None where the shortcut does not apply:
    off a CPU (finding m reads the device), or where some row has none or more than SUPPORT_LIMIT.

    `rows` (a mask broadcast to `[..., 1]`): only these rows need their support (the others' results
    are not used). `largest_top_k` (the rows' largest top-k k, 0 if unknown): where the smallest of
    every needed row's 2k + TIES_MARGIN largest probabilities is 0, those hold its support, and one
    topk finds them without counting the nonzero tokens over the vocabulary (a count cost 3-4 such
    topk calls on a CPU); a row with more ties than that is counted."""
    if probs.device.type != "cpu" or probs.shape[-1] <= SUPPORT_LIMIT:
        return None
    if 0 < largest_top_k < SUPPORT_LIMIT:
        top = probs.topk(min(2 * largest_top_k + TIES_MARGIN, SUPPORT_LIMIT), dim=-1)
        held = (top.values[..., -1:] == 0) & (top.values[..., :1] > 0)  # none outside, one inside
        if bool((held if rows is None else held | ~rows).all()):
            return top.indices.sort(dim=-1).values
    nonzero = torch.count_nonzero(probs, dim=-1).unsqueeze(-1)  # probabilities are >= 0: nonzero is > 0
    if rows is not None:
        nonzero = torch.where(rows, nonzero, 1)
    if not nonzero.numel() or int(nonzero.min()) < 1 or int(nonzero.max()) > SUPPORT_LIMIT:
        return None
    return probs.topk(int(nonzero.max()), dim=-1).indices.sort(dim=-1).values

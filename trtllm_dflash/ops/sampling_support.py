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


def uses_top_k(top_k: torch.Tensor, max_top_k: int | None = None) -> bool:
    """Whether some row samples with top-k (its distribution may be sparse): from `max_top_k` where
    the host knows it (`reference.SamplingBranches`), else read from `top_k` on a CPU only (a GPU
    would wait for the read)."""
    if max_top_k is not None:
        return max_top_k > 0
    return top_k.device.type == "cpu" and bool((top_k > 0).any())


def support(probs: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor | None:
    """Indices `[..., m]`, ascending, holding every token of nonzero probability of each row of
    `probs [..., V]` (m: the most any row has), or None where the shortcut does not apply: off a
    CPU (finding m reads the device), or where some row has none or more than SUPPORT_LIMIT.

    `rows` (a mask broadcast to `[..., 1]`): only these rows need their support (the others' results
    are not used)."""
    if probs.device.type != "cpu" or probs.shape[-1] <= SUPPORT_LIMIT:
        return None
    nonzero = torch.count_nonzero(probs, dim=-1).unsqueeze(-1)  # probabilities are >= 0: nonzero is > 0
    if rows is not None:
        nonzero = torch.where(rows, nonzero, 1)
    if not nonzero.numel() or int(nonzero.min()) < 1 or int(nonzero.max()) > SUPPORT_LIMIT:
        return None
    return probs.topk(int(nonzero.max()), dim=-1).indices.sort(dim=-1).values

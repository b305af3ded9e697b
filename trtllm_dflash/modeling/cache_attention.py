"""Attention of a pass's new query rows over a slot == position cache, reading only the live span.

Why: in decode a pass has a few query rows per sequence and the cache holds thousands of keys.
Building a `[b, 1, T, span]` boolean mask and having every layer apply it cost about as much as
the attention itself on a CPU (SDPA turns a boolean mask into an additive one on every call), and
one long row made every row read the longest row's span. An `AttentionPlan` is made once per
target pass: rows are grouped by start position (one group where all rows are level, the decode
case at batch 1), each group reads only its own keys `[lo, start + T)` per attention window
(`lo` > 0 only where a sliding window bites), and a mask is built, once and additive, only where
one is needed: where a group has more than one query row (the block is causal within itself and
a biting window's lower bound moves with the query). One query row sees every key it reads; a
group that starts at position 0 (a prefill) with a window that does not bite is SDPA's own
`is_causal` (its queries and keys are the same positions), which skips the masked half instead
of building and adding a `T x T` mask.

Keys are the cache's own rows, `[b, capacity, Hkv, D]` viewed as `[b, Hkv, span, D]`; nothing is
copied or concatenated. The Triton kernels (ops/kernels) split the same live span on a GPU.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F


@dataclasses.dataclass
class RowGroup:
    """Consecutive rows that start at the same position: one attention call per window."""

    rows: slice
    start: int  # position of the group's first query
    count: int  # queries per row (T)
    reads: dict[int, tuple[int, int]]  # window -> key slots [lo, hi) the group reads
    masks: dict[int, torch.Tensor | None]  # window -> additive `[1, 1, T, hi - lo]`, or None (see `causal`)
    causal: dict[int, bool]  # window -> no mask but SDPA's is_causal (else None: every key visible)


@dataclasses.dataclass
class AttentionPlan:
    """How one target pass attends over the cache (see the module docstring); made once per pass."""

    groups: list[RowGroup]

    @classmethod
    def make(
        cls, starts: list[int], count: int, windows: set[int], dtype: torch.dtype, device: torch.device, sdpa: bool = True
    ) -> "AttentionPlan":
        """`starts`: each row's first query position (host ints); `count`: queries per row;
        `windows`: the sliding windows the layers use (0: full attention); `sdpa`: whether the
        caller attends with `attend` (False: an explicit mask wherever is_causal would do)."""
        groups, first = [], 0
        for r in range(1, len(starts) + 1):
            if r == len(starts) or starts[r] != starts[first]:
                groups.append(_group(slice(first, r), starts[first], count, windows, dtype, device, sdpa))
                first = r
        return cls(groups)

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, window: int, scale: float) -> torch.Tensor:
        """`q [b, Hq, T, D]` over cache rows `keys`/`values [b, capacity, Hkv, D]`: `[b, T, Hq, Dv]`."""
        outs = []
        for group in self.groups:
            lo, hi = group.reads[window]
            k = keys[group.rows, lo:hi].transpose(1, 2)
            v = values[group.rows, lo:hi].transpose(1, 2)
            out = F.scaled_dot_product_attention(
                q[group.rows], k, v, attn_mask=group.masks[window], is_causal=group.causal[window], scale=scale,
                enable_gqa=q.shape[1] != k.shape[1],
            )
            outs.append(out)
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        return out.transpose(1, 2)


def window_bites(window: int, count: int) -> bool:
    """Whether a sliding window (0: none) hides keys from some of `count` queries that start together."""
    return 0 < window < count


def window_reads(start: int, count: int, window: int) -> tuple[int, int]:
    """Key slots `[lo, hi)` that queries at positions start .. start+count-1 can see."""
    lo = max(start - window + 1, 0) if window > 0 else 0
    return lo, start + count


def _group(rows: slice, start: int, count: int, windows: set[int], dtype: torch.dtype, device: torch.device, sdpa: bool) -> RowGroup:
    reads, masks, causal = {}, {}, {}
    for window in windows:
        lo, hi = reads[window] = window_reads(start, count, window)
        # from position 0, with no biting window, queries and keys are the same positions: is_causal
        causal[window] = sdpa and count > 1 and start == 0 and not window_bites(window, count)
        if count == 1 or causal[window]:  # one query sees every key in [lo, hi)
            masks[window] = None
            continue
        queries = torch.arange(start, hi, device=device).view(-1, 1)
        keys = torch.arange(lo, hi, device=device).view(1, -1)
        visible = keys <= queries
        if window > 0:
            visible &= keys > queries - window
        masks[window] = torch.zeros(1, 1, count, hi - lo, dtype=dtype, device=device).masked_fill(~visible, torch.finfo(dtype).min)
    return RowGroup(rows, start, count, reads, masks, causal)

"""Attention of a pass's new query rows over a slot == position cache, reading only the live span.

Why: in decode a pass has a few query rows per sequence and the cache holds thousands of keys.
Building a `[b, 1, T, span]` boolean mask and having every layer apply it cost about as much as
the attention itself on a CPU (SDPA turns a boolean mask into an additive one on every call), and
one long row made every row read the longest row's span. An `AttentionPlan` is made once per
target pass: rows are grouped by start position (one group where all rows are level, the decode
case at batch 1), each group reads only its own keys `[lo, start + T)` per attention window
(`lo` > 0 only where a sliding window bites), and a mask is built, once and additive, only where
one is needed: where a group has more than one query row (the block is causal within itself and
a biting window's lower bound moves with the query). Rows that start at different positions (every
decode step past the first, at batch > 1) are one group with a per-row mask when that reads at
most twice the keys the rows need (`MERGE_WASTE`): SDPA's cost on a CPU is mostly per call, and a
call per row cost more than the masked keys (8 rows of a block of 8: one call 100 us, eight 180 us).
One query row sees every key it reads; a group that starts at position 0 (a prefill) with a window
that does not bite is SDPA's own `is_causal` (its queries and keys are the same positions), which
skips the masked half instead of building and adding a `T x T` mask.

Keys are the cache's own slots, `[max_batch, capacity, Hkv, D]`, a group's consecutive slots viewed
as `[rows, Hkv, span, D]`; nothing is copied or concatenated. A group never spans a gap between
slots (runtime/base.py `Slots`: a request keeps its slot, so a batch's slots may have gaps). The
Triton kernels (ops/kernels) split the same live span on a GPU.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

# rows that start at different positions share one masked attention call while the keys it reads
# (rows x the longest row's span) are at most this many times the keys the rows need
MERGE_WASTE = 2.0


@dataclasses.dataclass
class RowGroup:
    """Consecutive rows that start at the same position, or rows merged under a per-row mask: one
    attention call per window."""

    rows: slice  # batch rows
    slots: slice  # their cache slots (consecutive)
    start: int  # position of the group's first query (the earliest row's, when merged)
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
        cls,
        starts: list[int],
        count: int,
        windows: set[int],
        dtype: torch.dtype,
        device: torch.device,
        sdpa: bool = True,
        slots: tuple[int, ...] | None = None,
    ) -> "AttentionPlan":
        """`starts`: each row's first query position (host ints); `count`: queries per row;
        `windows`: the sliding windows the layers use (0: full attention); `sdpa`: whether the
        caller attends with `attend` (False: an explicit mask wherever is_causal would do);
        `slots`: each row's cache slot (default: row r in slot r)."""
        slots = tuple(range(len(starts))) if slots is None else tuple(slots)
        groups, first = [], 0
        for r in range(1, len(starts) + 1):  # runs of consecutive slots, then the groups within each
            if r == len(starts) or slots[r] != slots[r - 1] + 1:
                groups += _run_groups(starts[first:r], first, slots[first], count, windows, dtype, device, sdpa)
                first = r
        return cls(groups)

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, window: int, scale: float) -> torch.Tensor:
        """`q [b, Hq, T, D]` over cache slots `keys`/`values [max_batch, capacity, Hkv, D]`: `[b, T, Hq, Dv]`."""
        outs = []
        for group in self.groups:
            lo, hi = group.reads[window]
            k = keys[group.slots, lo:hi].transpose(1, 2)
            v = values[group.slots, lo:hi].transpose(1, 2)
            out = F.scaled_dot_product_attention(
                q[group.rows],
                k,
                v,
                attn_mask=group.masks[window],
                is_causal=group.causal[window],
                scale=scale,
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


def _run_groups(
    starts: list[int], row: int, slot: int, count: int, windows: set[int], dtype: torch.dtype, device: torch.device, sdpa: bool
) -> list[RowGroup]:
    """The groups of rows row.. (slots slot..., consecutive): one masked group where merging pays,
    else one per start."""
    if len(set(starts)) > 1 and _merge_pays(starts, count, windows):
        return [_merged_group(starts, row, slot, count, windows, dtype, device)]
    groups, first = [], 0
    for r in range(1, len(starts) + 1):
        if r == len(starts) or starts[r] != starts[first]:
            rows, slots = slice(row + first, row + r), slice(slot + first, slot + r)
            groups.append(_group(rows, slots, starts[first], count, windows, dtype, device, sdpa))
            first = r
    return groups


def _merge_pays(starts: list[int], count: int, windows: set[int]) -> bool:
    """Whether one masked call over every row reads at most MERGE_WASTE times the keys they need."""
    for window in windows:
        needed = [hi - lo for lo, hi in (window_reads(s, count, window) for s in starts)]
        lo = min(window_reads(s, count, window)[0] for s in starts)
        if len(starts) * (max(starts) + count - lo) > MERGE_WASTE * sum(needed):
            return False
    return True


def _merged_group(
    starts: list[int], row: int, slot: int, count: int, windows: set[int], dtype: torch.dtype, device: torch.device
) -> RowGroup:
    """Rows row.. (slots slot...) in one group: each window reads [lowest lo, highest hi) under a `[b, 1, T, hi - lo]`
    additive mask that shows each query its own keys (a causal block at the row's start)."""
    reads, masks, causal = {}, {}, {}
    queries = torch.tensor(starts, device=device).view(-1, 1, 1, 1) + torch.arange(count, device=device).view(1, 1, -1, 1)
    for window in windows:
        lo = min(window_reads(s, count, window)[0] for s in starts)
        hi = max(starts) + count
        reads[window] = (lo, hi)
        keys = torch.arange(lo, hi, device=device).view(1, 1, 1, -1)
        visible = keys <= queries
        if window > 0:
            visible &= keys > queries - window
        masks[window] = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill(~visible, torch.finfo(dtype).min)
        causal[window] = False
    return RowGroup(slice(row, row + len(starts)), slice(slot, slot + len(starts)), min(starts), count, reads, masks, causal)


def _group(
    rows: slice, slots: slice, start: int, count: int, windows: set[int], dtype: torch.dtype, device: torch.device, sdpa: bool
) -> RowGroup:
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
    return RowGroup(rows, slots, start, count, reads, masks, causal)

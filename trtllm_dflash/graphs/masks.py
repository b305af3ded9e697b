"""Visibility masks of the exported target graphs: which keys each (causal) query may attend to.

The graphs mask by position over `[past cache; new keys]` instead of scattering into the cache, so
one boolean mask per attention kind (full or a sliding window) says everything; the torch runtime
builds the same masks over its slot == position caches. The drafter's masks (never causal, a
symmetric window) come from `trtllm_dflash/contracts/draft_window.py`.
"""

from __future__ import annotations

import torch


def visibility(
    key_positions: torch.Tensor, key_valid: torch.Tensor, query_positions: torch.Tensor, window: int, causal: bool
) -> torch.Tensor:
    """`[b, 1, Q, K]` mask: a valid key is visible (causally, and within `window` if > 0)."""
    keys = key_positions.unsqueeze(1)  # [b, 1, K]
    queries = query_positions.unsqueeze(2)  # [b, Q, 1]
    visible = key_valid.unsqueeze(1).expand(-1, queries.shape[1], -1)
    if causal or window > 0:
        visible = visible & (keys <= queries)
    if window > 0:
        visible = visible & (keys > queries - window)
    return visible.unsqueeze(1)

"""Which keys a draft query sees: the one definition every drafter runtime and export uses.

DFlash drafters attend non-causally on every layer: z-lab's `DFlashDraftModel` sets
`is_causal = False` and hands a sliding layer's `sliding_window` W to the attention function, which
under flash attention is the window (W - 1, W - 1). So a block query at position q sees a key at
position k (context row or block token alike) iff

    window == 0 or |q - k| <= window - 1        and, for `causal` drafters only, k <= q.

`window` is 0 on full layers. ModelOpt / DeepSpec drafters say the same with
`dflash_config.use_swa: true, swa_window_size: W` (`DrafterConfig.attention_of` resolves which
layers). `causal` is ModelOpt's `causal: true` export option (causal inside the block); no
published drafter sets it together with a window, and Laguna's causal sliding layers are refused
at load time.

Users: `reference_attention.block_attention` and its split form (the CPU evaluators of the plugin nodes),
the drafter graphs' masks (`graphs/drafter.py`), the training masks (`training/objective.py`);
the Triton kernel (`kernels/attention.py`) implements the same rule and is tested against the
reference.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class DraftWindow:
    """The attention window of one draft layer: 0 = every key; W > 0 = keys within W - 1 positions."""

    window: int = 0
    causal: bool = False

    def __post_init__(self) -> None:
        if self.window < 0:
            raise ValueError(f"a draft attention window is >= 0, got {self.window}")

    def visible(self, query_pos: torch.Tensor, key_pos: torch.Tensor) -> torch.Tensor:
        """Boolean visibility, broadcast over `query_pos` and `key_pos` (absolute positions)."""
        return draft_visible(query_pos, key_pos, self.window, self.causal)


def draft_visible(query_pos: torch.Tensor, key_pos: torch.Tensor, window: int, causal: bool | int = False) -> torch.Tensor:
    """The rule above on tensors: `window == 0 or |q - k| < window`, and `k <= q` when causal."""
    visible = torch.ones(torch.broadcast_shapes(query_pos.shape, key_pos.shape), dtype=torch.bool, device=query_pos.device)
    if window > 0:
        visible = visible & ((query_pos - key_pos).abs() < window)
    if causal:
        visible = visible & (key_pos <= query_pos)
    return visible

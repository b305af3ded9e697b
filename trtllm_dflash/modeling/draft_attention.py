"""The drafter's block attention on a CPU at batch > 1, planned once per draft step.

Why: `ops.block_attention` (the op the Triton kernels and the exported graphs implement)
concatenates each row's cached context with the block and builds its mask in every layer; on a
CPU at batch 8 that cost more than its attention. Here a step's plan is made once for all layers:
each layer writes the new context rows and the block's keys/values into the row's own cache slot
(the block at positions L_r .. L_r + B - 1, right after the row's context of L_r positions: slots
past a row's length are scratch that the next step's context overwrites before anything reads
it, as in the target's cache), and each run of consecutive slots attends over its slots' first
`hi` positions, a view of the cache, under one additive mask that shows row r the positions
before L_r + B: its context and its whole block, bidirectionally.

The same keys in the same order as the op, so the same attention up to rounding. Full-attention,
bidirectional layers in float32/float64 only; otherwise (and for one row, whose slice fast path
in `DFlashAttention.step` already writes the cache in place) the drafter uses the op.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from trtllm_dflash.modeling.kv_cache import LayerCache
from trtllm_dflash.modeling.slots import Slots


@dataclasses.dataclass
class DraftAttentionPlan:
    """Where one draft step writes and what each run of slots reads, shared by every layer."""

    valid: torch.Tensor  # [b, n] bool: the new context rows that are real (the first new_counts[r])
    ctx_slots: torch.Tensor  # [valid rows] the slot each real context row is written to
    ctx_positions: torch.Tensor  # [valid rows] and its position (cache_lens[r] + i)
    block_slots: torch.Tensor  # [b, 1]
    block_positions: torch.Tensor  # [b, B]: L_r + t
    runs: list[tuple[slice, slice, int, torch.Tensor]]  # batch rows, slots, positions read [0, hi), mask [rows, 1, 1, hi]

    @classmethod
    def make(
        cls, cache_lens: torch.Tensor, new_counts: torch.Tensor, n: int, block: int, slots: Slots, dtype: torch.dtype
    ) -> "DraftAttentionPlan":
        """`slots`: the slot of each batch row."""
        device = cache_lens.device
        slot_column = slots.index.view(-1, 1)
        offsets = torch.arange(n, device=device).view(1, -1)
        valid = offsets < new_counts.view(-1, 1)
        lengths = cache_lens + new_counts
        visible_to = lengths + block  # row r sees positions < L_r + B
        planned = []
        for rows, held in slots.runs():
            hi = int(visible_to[rows].max())
            hidden = torch.arange(hi, device=device).view(1, -1) >= visible_to[rows].view(-1, 1)
            mask = torch.zeros(hidden.shape, dtype=dtype, device=device).masked_fill(hidden, torch.finfo(dtype).min)
            planned.append((rows, held, hi, mask.view(-1, 1, 1, hi)))
        return cls(
            valid,
            slot_column.expand(-1, n)[valid],
            (cache_lens.view(-1, 1) + offsets)[valid],
            slot_column,
            lengths.view(-1, 1) + torch.arange(block, device=device),
            planned,
        )

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor, cache: LayerCache, scale: float
    ) -> torch.Tensor:
        """`ops.block_attention`'s result `[b, B, Hq, D]` for q/k/v `[b, B, H, D]` and the new context
        rows k/v_ctx `[b, n, Hkv, D]`, which it appends to `cache` (every slot) as the op does."""
        keys, values = cache.keys, cache.values
        keys[self.ctx_slots, self.ctx_positions] = k_ctx[self.valid].to(keys.dtype)
        values[self.ctx_slots, self.ctx_positions] = v_ctx[self.valid].to(values.dtype)
        keys[self.block_slots, self.block_positions] = k.to(keys.dtype)
        values[self.block_slots, self.block_positions] = v.to(values.dtype)
        outs = []
        for rows, held, hi, mask in self.runs:
            out = F.scaled_dot_product_attention(
                q[rows].transpose(1, 2),
                keys[held, :hi].transpose(1, 2),
                values[held, :hi].transpose(1, 2),
                attn_mask=mask,
                scale=scale,
                enable_gqa=q.shape[2] != keys.shape[2],
            )
            outs.append(out.transpose(1, 2))
        return (outs[0] if len(outs) == 1 else torch.cat(outs)).to(q.dtype)

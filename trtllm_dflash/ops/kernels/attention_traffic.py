"""Attention benchmark shapes and the bytes an attention layer must move (its roofline floor).

For `benchmarks/bench_kernels.py`, the kernel cost model (`bench/kernel_model.py`) and the GPU
selftest: the Qwen3-8B verify step (32 query heads, 8 KV heads, head dim 128, a 16-token block) at
batch 1/8/64 over 1k and 8k tokens of context, and the 1-token autoregressive pass.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class TargetAttentionShape:
    """One target-attention benchmark case: every row has `context` committed tokens."""

    name: str
    batch: int
    tokens: int
    heads: int
    kv_heads: int
    head_dim_k: int
    head_dim_v: int
    context: int
    window: int = 0

    def bytes_moved(self, kv_bytes: int = 2, act_bytes: int = 2) -> int:
        return target_attention_bytes(
            self.batch,
            self.tokens,
            self.heads,
            self.kv_heads,
            self.head_dim_k,
            self.head_dim_v,
            self.context,
            self.window,
            kv_bytes,
            act_bytes,
        )


TARGET_ATTENTION_BENCH_SHAPES = tuple(
    TargetAttentionShape(f"qwen3-8b-verify-b{batch}-ctx{context // 1024}k", batch, 16, 32, 8, 128, 128, context)
    for batch in (1, 8, 64)
    for context in (1024, 8192)
) + tuple(  # the 1-token autoregressive pass (issue 39 item 4 chooses attention per pass)
    TargetAttentionShape(f"qwen3-8b-ar-b{batch}-ctx1k", batch, 1, 32, 8, 128, 128, 1024) for batch in (1, 8, 32)
)


def block_attention_bytes(
    batch: int, block: int, heads: int, kv_heads: int, head_dim: int, context: int, new_rows: int, act_bytes: int = 2
) -> int:
    """Minimum HBM bytes of one drafter block-attention layer per step: the context K/V read, the
    block's K/V and queries read, the outputs and the appended context rows written."""
    return (
        act_bytes
        * batch
        * (
            2 * context * kv_heads * head_dim
            + 2 * block * kv_heads * head_dim
            + 2 * block * heads * head_dim
            + 2 * new_rows * kv_heads * head_dim
        )
    )


def target_attention_bytes(
    batch: int,
    tokens: int,
    heads: int,
    kv_heads: int,
    head_dim_k: int,
    head_dim_v: int,
    context: int,
    window: int = 0,
    kv_bytes: int = 2,
    act_bytes: int = 2,
) -> int:
    """Minimum HBM bytes of one target-attention layer per step (the roofline of the kernel).

    Per row: read the visible prefix (all `context` slots, or the `window - 1` below the block on a
    sliding layer) and the block's T keys/values, write the T block slots, read q and write out:
    `(L + T) * Hkv * (Dk + Dv) * kv_bytes + T * Hkv * (Dk + Dv) * kv_bytes + T * Hq * (Dk + Dv) * act_bytes`.
    Nothing proportional to the cache capacity: the cache is written in place and read to the row's length.
    """
    prefix = min(context, window - 1) if window > 0 else context
    per_slot = kv_heads * (head_dim_k + head_dim_v) * kv_bytes
    per_row = (prefix + tokens) * per_slot + tokens * per_slot + tokens * heads * (head_dim_k + head_dim_v) * act_bytes
    return batch * per_row


def target_attention_bench_inputs(
    shape: TargetAttentionShape, device: torch.device, dtype: torch.dtype = torch.bfloat16, seed: int = 0
) -> dict:
    """Random inputs for `target_attention(**inputs, sinks=None, scale=..., window=shape.window)`:
    caches sized to the context plus one block, every row starting its block at `context`."""
    g = torch.Generator(device=device).manual_seed(seed)
    b, t, capacity = shape.batch, shape.tokens, shape.context + shape.tokens

    def rand(*size):
        return torch.randn(*size, generator=g, device=device, dtype=torch.float32).to(dtype)

    return dict(
        q=rand(b, t, shape.heads, shape.head_dim_k),
        k_new=rand(b, t, shape.kv_heads, shape.head_dim_k),
        v_new=rand(b, t, shape.kv_heads, shape.head_dim_v),
        k_cache=rand(b, capacity, shape.kv_heads, shape.head_dim_k),
        v_cache=rand(b, capacity, shape.kv_heads, shape.head_dim_v),
        starts=torch.full((b,), shape.context, dtype=torch.int64, device=device),
    )

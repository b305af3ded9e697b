"""The drafter's planned CPU block attention (modeling/draft_attention.py) against the op it stands
in for (`ops.block_attention`): the same outputs, the same context appended to each row's own slot,
over batches whose slots have gaps and rows with padded context."""

from __future__ import annotations

import torch

from trtllm_dflash import ops
from trtllm_dflash.modeling.draft_attention import DraftAttentionPlan
from trtllm_dflash.modeling.kv_cache import LayerCache
from trtllm_dflash.modeling.slots import Slots


def test_the_plan_equals_the_op_per_run_and_appends_the_same_context():
    generator = torch.Generator().manual_seed(3)
    batch, block, n, heads, kv_heads, dim, capacity = 4, 6, 5, 4, 2, 8, 64
    slots = Slots.of([0, 1, 4, 2])  # a gap (3) and a slot out of order: three runs
    cache_lens = torch.tensor([10, 3, 17, 0])
    new_counts = torch.tensor([5, 1, 3, 5])  # rows 1 and 2 have padded context rows
    randn = lambda *shape: torch.randn(*shape, generator=generator, dtype=torch.float64)  # noqa: E731
    q, k, v = randn(batch, block, heads, dim), randn(batch, block, kv_heads, dim), randn(batch, block, kv_heads, dim)
    k_ctx, v_ctx = randn(batch, n, kv_heads, dim), randn(batch, n, kv_heads, dim)
    filled = LayerCache(randn(6, capacity, kv_heads, dim), randn(6, capacity, kv_heads, dim))
    planned = LayerCache(filled.keys.clone(), filled.values.clone())
    reference = LayerCache(filled.keys.clone(), filled.values.clone())

    plan = DraftAttentionPlan.make(cache_lens, new_counts, n, block, slots, torch.float64)
    assert [(rows, held, hi) for rows, held, hi, _ in plan.runs] == [
        (slice(0, 2), slice(0, 2), 15 + block),
        (slice(2, 3), slice(4, 5), 20 + block),
        (slice(3, 4), slice(2, 3), 5 + block),
    ]
    got = plan.attend(q, k, v, k_ctx, v_ctx, planned, 0.3)
    want = torch.cat(
        [
            ops.block_attention(
                q[rows],
                k[rows],
                v[rows],
                k_ctx[rows],
                v_ctx[rows],
                new_counts[rows],
                reference.keys[held],
                reference.values[held],
                cache_lens[rows],
                0.3,
                0,
                0,
            )
            for rows, held in slots.runs()
        ]
    )
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for r, slot in enumerate(slots.ids):  # the context as the op appends it; nothing before it, nor other slots, touched
        context = int(cache_lens[r] + new_counts[r])
        assert torch.equal(planned.keys[slot, :context], reference.keys[slot, :context])
        assert torch.equal(planned.values[slot, :context], reference.values[slot, :context])
    for untouched in (3, 5):
        assert torch.equal(planned.keys[untouched], filled.keys[untouched])

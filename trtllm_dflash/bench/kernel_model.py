"""A paper model of one Qwen3-8B DFlash step's plugin kernels on an H100, for docs/plugins.md.

For each kernel at batch 1, 8 and 64 (8k tokens of context, 16-token blocks): its grid and program
count from the same functions the launches use (`trtllm_dflash/ops/kernels/launch.py`), the bytes it must
move, and a modelled time. The model is deliberately simple: a kernel streams its bytes at the
H100's bandwidth, and a launch with fewer programs than SMs gets only their share of it (one
program streams at most what one SM can). No GPU ran this; `dflash-trt selftest --gpu` measures
the bandwidth and the kernels (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import dataclasses

from trtllm_dflash.ops.kernels import attention_traffic, launch

H100_SMS = 132
# About 90% of the H100 SXM's 3.35 TB/s HBM3 peak: what device-to-device copies typically reach.
# An assumption, not a measurement of ours (no GPU has been lent to this project yet).
H100_BANDWIDTH = 3.0e12
BATCHES = (1, 8, 64)
CONTEXT = 8192
BLOCK = 16
# Qwen3-8B: 32 query heads, 8 KV heads, head dim 128, bf16, vocabulary 151,936; its DFlash drafter
# (z-lab/Qwen3-8B-DFlash-b16) has the same attention shape.
HEADS, KV_HEADS, HEAD_DIM, VOCAB = 32, 8, 128, 151_936
GROUP = HEADS // KV_HEADS
ACCEPTED = 4  # context rows the drafter appends per step (accepted drafts + bonus), for its bytes


@dataclasses.dataclass(frozen=True)
class KernelRow:
    kernel: str
    batch: int
    grid: tuple[int, int, int]
    bytes_moved: int

    @property
    def programs(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    def modelled_us(self, bandwidth: float = H100_BANDWIDTH, sms: int = H100_SMS) -> float:
        return self.bytes_moved / (bandwidth * min(1.0, self.programs / sms)) * 1e6


def qwen3_8b_rows(batch: int, sms: int = H100_SMS) -> list[KernelRow]:
    """The plugin launches of one verify + draft step, per layer, at this batch."""
    rows_per_head = BLOCK * GROUP
    partial_bytes = 4 * (HEAD_DIM + 1)  # one fp32 partial output row and its log-sum-exp
    target = launch.target_attention_config(HEAD_DIM, HEAD_DIM, BLOCK, GROUP)
    target_tiles = target.m_tiles(BLOCK, GROUP)
    target_bytes = attention_traffic.target_attention_bytes(batch, BLOCK, HEADS, KV_HEADS, HEAD_DIM, HEAD_DIM, CONTEXT)
    splits = launch.target_kv_splits(batch, KV_HEADS, target_tiles, CONTEXT, sms)
    partials = batch * KV_HEADS * splits * rows_per_head * partial_bytes if splits > 1 else 0
    merge_m = launch.merge_block_m(HEAD_DIM, BLOCK, GROUP)
    out_bytes = 2 * batch * BLOCK * HEADS * HEAD_DIM
    drafter = launch.attention_config(HEAD_DIM, BLOCK, GROUP)
    drafter_tiles = drafter.m_tiles(BLOCK, GROUP)
    drafter_splits = launch.drafter_kv_splits(batch, KV_HEADS, drafter_tiles, CONTEXT + BLOCK, sms)
    drafter_bytes = attention_traffic.block_attention_bytes(batch, BLOCK, HEADS, KV_HEADS, HEAD_DIM, CONTEXT, ACCEPTED)
    drafter_partials = batch * KV_HEADS * drafter_splits * rows_per_head * partial_bytes if drafter_splits > 1 else 0
    chunks = launch.verify_num_chunks(VOCAB)
    logits = 2 * batch * BLOCK * VOCAB
    chunk_stats = batch * BLOCK * chunks * 8
    rows = [
        KernelRow(
            "target attention, one program per tile",
            batch,
            launch.target_attention_grid(batch, BLOCK, KV_HEADS, GROUP, target.block_m),
            target_bytes,
        )
    ]
    if splits > 1:  # the split the launch picks for this shape (1: the unsplit kernel above)
        rows += [
            KernelRow(
                f"target attention, KV split ({splits})",
                batch,
                launch.target_attention_grid(batch, BLOCK, KV_HEADS, GROUP, target.block_m, splits),
                target_bytes + partials,
            ),
            KernelRow(
                "merge of the target's splits", batch, launch.merge_grid(batch, BLOCK, KV_HEADS, GROUP, merge_m), partials + out_bytes
            ),
        ]
    rows.append(
        KernelRow(
            f"drafter block attention ({drafter_splits} split{'s' if drafter_splits > 1 else ''})",
            batch,
            launch.attention_grid(batch, BLOCK, KV_HEADS, GROUP, drafter.block_m, drafter_splits),
            drafter_bytes + drafter_partials,
        )
    )
    if drafter_splits > 1:
        rows.append(
            KernelRow(
                "merge of the drafter's splits",
                batch,
                launch.merge_grid(batch, BLOCK, KV_HEADS, GROUP, drafter.block_m),
                drafter_partials + out_bytes,
            )
        )
    rows += [
        KernelRow(
            "verify partials (argmax per 4096-logit chunk)", batch, launch.verify_partials_grid(batch, BLOCK, VOCAB), logits + chunk_stats
        ),
        KernelRow("verify positions (greedy)", batch, launch.verify_positions_grid(batch, BLOCK), chunk_stats + 8 * batch * BLOCK * 3),
        KernelRow("verify commit", batch, launch.verify_commit_grid(batch), 8 * batch * (3 * BLOCK + 6)),
    ]
    return rows


def markdown_table(batches: tuple[int, ...] = BATCHES) -> str:
    """The docs/plugins.md table (tests/test_kernel_model.py keeps the two equal)."""
    lines = [
        "| kernel | batch | grid | programs | MB moved | modelled µs |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for batch in batches:
        for row in qwen3_8b_rows(batch):
            lines.append(
                f"| {row.kernel} | {batch} | {row.grid} | {row.programs} | {row.bytes_moved / 1e6:.3f} | {row.modelled_us():.1f} |"
            )
    return "\n".join(lines) + "\n"

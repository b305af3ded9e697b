"""Host side of the vocabulary-spread verification kernels (`verify_spread.py`): buffers and launches.

`verify_positions_spread` takes what `launch.verify_positions` takes and returns the same `[b, B, 2]`
decisions: the split argmax (`launch.verify_partials`), 4 top-k passes, 8 top-p passes, the mass,
race and decision kernels. The buffers between the passes are a few hundred kilobytes at batch 1
(38 chunks of Qwen3's vocabulary: 16 positions x 38 x 256 int32 per top-k pass); every launch
covers every row, so the same launches serve any mix of greedy and sampled rows.
"""

from __future__ import annotations

import torch

from trtllm_dflash.ops import kernels
from trtllm_dflash.ops.kernels.launch import (
    VERIFY_BLOCK_C,
    VERIFY_BLOCK_V,
    VERIFY_CHUNK_V,
    _launch_options,
    check_verify_inputs,
    verify_commit,
    verify_first_stage,
    verify_vocab_divisible,
)

TOPK_PASSES, TOPP_PASSES = 4, 8
TOPK_BINS, TOPP_BINS = 256, 16


def verify_spread_grid(batch, block, num_chunks):
    return (num_chunks, block, batch)


def verify_positions_spread(
    target_logits: torch.Tensor,
    block_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seed: torch.Tensor,
    start: torch.Tensor,
    *,
    block_v: int = VERIFY_BLOCK_V,
    chunk_v: int | None = None,
) -> torch.Tensor:
    """int32 `[b, B, 2]` decisions (`reference.verify_positions`), every pass spread over chunks of
    `chunk_v` logits (default VERIFY_CHUNK_V, scaled with `block_v` as `launch.verify_positions` does)."""
    check_verify_inputs(target_logits, block_tokens, draft_probs)
    batch, block, vocab = target_logits.shape
    device = target_logits.device
    decisions = torch.empty(batch, block, 2, dtype=torch.int32, device=device)
    if batch == 0:
        return decisions
    chunk_v = chunk_v or VERIFY_CHUNK_V // VERIFY_BLOCK_V * block_v
    target_logits, chunk_max, chunk_index, has_draft, draft_probs = verify_first_stage(target_logits, draft_probs, block_v, chunk_v)
    chunks, positions = chunk_max.shape[2], batch * block
    rows = dict(
        temperature=temperature.to(torch.float32).contiguous(),
        top_k=top_k.to(torch.int64).contiguous(),
        top_p=top_p.to(torch.float32).contiguous(),
        seed=seed.to(torch.int64).contiguous(),
        start=start.to(torch.int64).contiguous(),
    )
    topk_hist = torch.zeros(TOPK_PASSES, positions, chunks, TOPK_BINS, dtype=torch.int32, device=device)
    topk_state = torch.zeros(TOPK_PASSES, positions, 2, dtype=torch.int64, device=device)
    topp_hist = torch.zeros(TOPP_PASSES, positions, chunks, TOPP_BINS, dtype=torch.float32, device=device)
    topp_state = torch.zeros(TOPP_PASSES, positions, 4, dtype=torch.float32, device=device)
    topp_prefix = torch.zeros(TOPP_PASSES, positions, 2, dtype=torch.int64, device=device)
    mass = torch.zeros(positions, chunks, dtype=torch.float32, device=device)
    race = torch.zeros(positions, chunks, 3, dtype=torch.float32, device=device)
    race_index = torch.zeros(positions, chunks, 2, dtype=torch.int32, device=device)

    module = kernels.for_tensor_device("verify_spread", device)
    grid = verify_spread_grid(batch, block, chunks)
    tiles = dict(
        CHUNK_V=chunk_v, BLOCK_V=block_v, VOCAB_DIVISIBLE=verify_vocab_divisible(vocab), **_launch_options(device, 4, 1, fp_fusion=False)
    )
    for rnd in range(TOPK_PASSES):
        module.topk_pass_kernel[grid](
            target_logits, rows["temperature"], rows["top_k"], rnd, block, vocab, chunks, topk_hist, topk_state, **tiles
        )
    selection = (chunk_max, topk_hist, topk_state)
    for rnd in range(TOPP_PASSES):
        module.topp_pass_kernel[grid](
            target_logits, rows["temperature"], rows["top_k"], rows["top_p"], *selection, rnd, block, vocab, chunks,
            topp_hist, topp_state, topp_prefix, BLOCK_C=VERIFY_BLOCK_C, **tiles,
        )  # fmt: skip
    module.mass_kernel[grid](
        target_logits, rows["temperature"], rows["top_k"], rows["top_p"], *selection, block, vocab, chunks, mass,
        BLOCK_C=VERIFY_BLOCK_C, **tiles,
    )  # fmt: skip
    sampling = (rows["temperature"], rows["top_k"], rows["top_p"], rows["seed"], rows["start"])
    kept = (topk_hist, topk_state, topp_hist, topp_state, topp_prefix, mass)
    tokens = block_tokens.to(torch.int64).contiguous()
    module.race_kernel[grid](
        target_logits, draft_probs, *sampling, chunk_max, *kept, block, vocab, int(has_draft), chunks, race, race_index,
        BLOCK_C=VERIFY_BLOCK_C, **tiles,
    )  # fmt: skip
    module.decide_kernel[(block, batch, 1)](
        target_logits, tokens, draft_probs, *sampling, chunk_max, chunk_index, *kept, race, race_index,
        block, vocab, int(has_draft), chunks, decisions,
        BLOCK_C=VERIFY_BLOCK_C, VOCAB_DIVISIBLE=verify_vocab_divisible(vocab), **_launch_options(device, 4, 1, fp_fusion=False),
    )  # fmt: skip
    return decisions


def verify_block_spread(
    target_logits: torch.Tensor,
    block_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seed: torch.Tensor,
    start: torch.Tensor,
    stop_ids: torch.Tensor | None = None,
    *,
    block_v: int = VERIFY_BLOCK_V,
    chunk_v: int | None = None,
) -> torch.Tensor:
    """`launch.verify_block` with the spread decisions: the packed `[b, 5]` int64 result."""
    sampling = (temperature, top_k, top_p, seed, start)
    decisions = verify_positions_spread(target_logits, block_tokens, draft_probs, *sampling, block_v=block_v, chunk_v=chunk_v)
    return verify_commit(decisions, block_tokens, start, stop_ids)

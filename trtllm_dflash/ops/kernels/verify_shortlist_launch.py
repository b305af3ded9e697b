"""Host side of the shortlist verification kernels (`verify_shortlist.py`): buffers and launches.

`verify_positions_shortlist` takes what `launch.verify_positions` takes and returns the same
`[b, B, 2]` decisions in three launches: select (one read of the logits), threshold, decide. The
buffers between them are small: at batch 1 and Qwen3's vocabulary, 16 positions x 38 chunks x 64
shortlisted logits and indices (0.3 MB), and 128 kept slots per position.
"""

from __future__ import annotations

import torch

from trtllm_dflash.ops import kernels
from trtllm_dflash.ops.kernels.launch import (
    VERIFY_BLOCK_C,
    VERIFY_BLOCK_V,
    _launch_options,
    check_verify_inputs,
    verify_commit,
    verify_vocab_divisible,
)
from trtllm_dflash.ops.kernels.tiles import SHORTLIST, SHORTLIST_CHUNK_V, SHORTLIST_KEPT, cdiv, next_power_of_2


def verify_positions_shortlist(
    target_logits: torch.Tensor,
    block_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seed: torch.Tensor,
    start: torch.Tensor,
    *,
    chunk_v: int = SHORTLIST_CHUNK_V,
    with_walked: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """int32 `[b, B, 2]` decisions (`reference.verify_positions`): rows with top-k 1..SHORTLIST from
    the shortlist, other sampled positions by the full walk of `verify_positions_kernel`.
    `with_walked`: also the bool `[b, B]` of the positions that walked their row (for tests)."""
    check_verify_inputs(target_logits, block_tokens, draft_probs)
    batch, block, vocab = target_logits.shape
    device = target_logits.device
    decisions = torch.empty(batch, block, 2, dtype=torch.int32, device=device)
    if batch == 0:
        return (decisions, torch.zeros(0, block, dtype=torch.bool, device=device)) if with_walked else decisions
    target_logits = target_logits.contiguous()
    has_draft = draft_probs is not None and block > 1
    draft_probs = draft_probs.to(torch.float32).contiguous() if has_draft else torch.empty(1, dtype=torch.float32, device=device)
    temperature = temperature.to(torch.float32).contiguous()
    top_k = top_k.to(torch.int64).contiguous()
    positions, chunks = batch * block, cdiv(vocab, chunk_v)
    chunk_max = torch.empty(positions, chunks, dtype=torch.float32, device=device)
    chunk_index = torch.empty(positions, chunks, dtype=torch.int32, device=device)
    shortlist_logit = torch.empty(positions, chunks * SHORTLIST, dtype=torch.float32, device=device)
    shortlist_index = torch.empty(positions, chunks * SHORTLIST, dtype=torch.int32, device=device)
    cut = torch.empty(positions, chunks, dtype=torch.int64, device=device)
    kept_logit = torch.empty(positions, SHORTLIST_KEPT, dtype=torch.float32, device=device)
    kept_index = torch.empty(positions, SHORTLIST_KEPT, dtype=torch.int32, device=device)
    threshold = torch.empty(positions, dtype=torch.int64, device=device)
    flag = torch.empty(positions, dtype=torch.int32, device=device)

    module = kernels.for_tensor_device("verify_shortlist", device)
    divisible = verify_vocab_divisible(vocab)
    module.shortlist_select_kernel[(chunks, block, batch)](
        target_logits, temperature, top_k, block, vocab, chunk_max, chunk_index, shortlist_logit, shortlist_index, cut,
        CHUNK_V=chunk_v, SHORTLIST=SHORTLIST, VOCAB_DIVISIBLE=divisible, **_launch_options(device, 8, 1, fp_fusion=False),
    )  # fmt: skip
    module.shortlist_threshold_kernel[(block, batch, 1)](
        temperature, top_k, shortlist_logit, shortlist_index, cut, block, chunks, kept_logit, kept_index, threshold, flag,
        CANDIDATES=next_power_of_2(chunks * SHORTLIST), SHORTLIST=SHORTLIST, KEPT=SHORTLIST_KEPT, BLOCK_C=VERIFY_BLOCK_C,
        **_launch_options(device, 8, 1, fp_fusion=False),
    )  # fmt: skip
    module.shortlist_decide_kernel[(block, batch, 1)](
        target_logits, block_tokens.to(torch.int64).contiguous(), draft_probs, temperature, top_k,
        top_p.to(torch.float32).contiguous(), seed.to(torch.int64).contiguous(), start.to(torch.int64).contiguous(),
        chunk_max, chunk_index, kept_logit, kept_index, threshold, flag, block, vocab, int(has_draft), chunks, decisions,
        BLOCK_V=VERIFY_BLOCK_V, BLOCK_C=VERIFY_BLOCK_C, KEPT=SHORTLIST_KEPT, VOCAB_DIVISIBLE=divisible,
        **_launch_options(device, 4, 1, fp_fusion=False),
    )  # fmt: skip
    return (decisions, flag.view(batch, block).bool()) if with_walked else decisions


def verify_block_shortlist(
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
    chunk_v: int = SHORTLIST_CHUNK_V,
) -> torch.Tensor:
    """`launch.verify_block` with the shortlist decisions: the packed `[b, 5]` int64 result."""
    sampling = (temperature, top_k, top_p, seed, start)
    decisions = verify_positions_shortlist(target_logits, block_tokens, draft_probs, *sampling, chunk_v=chunk_v)
    return verify_commit(decisions, block_tokens, start, stop_ids)

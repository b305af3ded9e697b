"""Host side of the shortlist verification kernels (`verify_shortlist.py`): buffers and launches.

`verify_positions_shortlist` takes what `launch.verify_positions` takes and returns the same
`[b, B, 2]` decisions in five launches: maxima (one read of the logits), bound, select (one more
read of the shortlisted rows'), threshold, decide. The buffers between them are small: at batch 1
and Qwen3's vocabulary, 16 positions x 38 chunks x 64 shortlisted logits and indices (0.3 MB), and
128 kept slots per position.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType

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


@dataclasses.dataclass
class _Shortlisted:
    """The select and threshold launches' results: the chunk maxima and, per position, the kept
    tokens, threshold and walk flag (`kept`, in the decide and sample kernels' argument order)."""

    module: ModuleType
    chunks: int
    kept: tuple[torch.Tensor, ...]  # chunk_max, chunk_index, kept_logit, kept_index, threshold, flag


def _shortlist(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, chunk_v: int) -> _Shortlisted:
    """The maxima, bound, select and threshold launches over contiguous `logits [b, T, V]` (float32
    temperature, int64 top_k)."""
    batch, block, vocab = logits.shape
    device = logits.device
    positions, chunks = batch * block, cdiv(vocab, chunk_v)
    chunk_max = torch.empty(positions, chunks, dtype=torch.float32, device=device)
    chunk_index = torch.empty(positions, chunks, dtype=torch.int32, device=device)
    shortlist_logit = torch.empty(positions, chunks * SHORTLIST, dtype=torch.float32, device=device)
    shortlist_index = torch.empty(positions, chunks * SHORTLIST, dtype=torch.int32, device=device)
    top_keys = torch.empty(positions, chunks * 2, dtype=torch.int64, device=device)
    bound = torch.empty(positions, dtype=torch.int64, device=device)
    cut = torch.empty(positions, chunks, dtype=torch.int64, device=device)
    kept_logit = torch.empty(positions, SHORTLIST_KEPT, dtype=torch.float32, device=device)
    kept_index = torch.empty(positions, SHORTLIST_KEPT, dtype=torch.int32, device=device)
    threshold = torch.empty(positions, dtype=torch.int64, device=device)
    flag = torch.empty(positions, dtype=torch.int32, device=device)
    module = kernels.for_tensor_device("verify_shortlist", device)
    divisible = verify_vocab_divisible(vocab)
    module.shortlist_maxima_kernel[(chunks, block, batch)](
        logits, temperature, top_k, block, vocab, chunk_max, chunk_index, top_keys,
        CHUNK_V=chunk_v, SHORTLIST=SHORTLIST, VOCAB_DIVISIBLE=divisible, **_launch_options(device, 8, 1, fp_fusion=False),
    )  # fmt: skip
    module.shortlist_bound_kernel[(block, batch, 1)](
        temperature, top_k, top_keys, block, chunks, bound,
        TOP_KEYS=next_power_of_2(chunks * 2), SHORTLIST=SHORTLIST, **_launch_options(device, 1, 1, fp_fusion=False),
    )  # fmt: skip
    module.shortlist_select_kernel[(chunks, block, batch)](
        logits, temperature, top_k, bound, block, vocab, shortlist_logit, shortlist_index, cut,
        CHUNK_V=chunk_v, SHORTLIST=SHORTLIST, VOCAB_DIVISIBLE=divisible, **_launch_options(device, 8, 1, fp_fusion=False),
    )  # fmt: skip
    module.shortlist_threshold_kernel[(block, batch, 1)](
        temperature, top_k, shortlist_logit, shortlist_index, cut, block, chunks, kept_logit, kept_index, threshold, flag,
        CANDIDATES=next_power_of_2(chunks * SHORTLIST), SHORTLIST=SHORTLIST, KEPT=SHORTLIST_KEPT, BLOCK_C=VERIFY_BLOCK_C,
        **_launch_options(device, 8, 1, fp_fusion=False),
    )  # fmt: skip
    return _Shortlisted(module, chunks, (chunk_max, chunk_index, kept_logit, kept_index, threshold, flag))


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
    temperature, top_k = temperature.to(torch.float32).contiguous(), top_k.to(torch.int64).contiguous()
    stage = _shortlist(target_logits, temperature, top_k, chunk_v)
    module, divisible = stage.module, verify_vocab_divisible(vocab)
    module.shortlist_decide_kernel[(block, batch, 1)](
        target_logits, block_tokens.to(torch.int64).contiguous(), draft_probs, temperature, top_k,
        top_p.to(torch.float32).contiguous(), seed.to(torch.int64).contiguous(), start.to(torch.int64).contiguous(),
        *stage.kept, block, vocab, int(has_draft), stage.chunks, decisions,
        BLOCK_V=VERIFY_BLOCK_V, BLOCK_C=VERIFY_BLOCK_C, KEPT=SHORTLIST_KEPT, VOCAB_DIVISIBLE=divisible,
        **_launch_options(device, 4, 1, fp_fusion=False),
    )  # fmt: skip
    return (decisions, stage.kept[-1].view(batch, block).bool()) if with_walked else decisions


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


def sample_drafts_shortlist(
    draft_logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seed: torch.Tensor,
    positions: torch.Tensor,
    *,
    chunk_v: int = SHORTLIST_CHUNK_V,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The drafter's samples and their distribution q, as `reference.sample_tokens(...,
    rng.STREAM_DRAFT)` draws them: int64 tokens `[b, T]` and float32 q `[b, T, V]` from draft logits
    `[b, T, V]` at absolute `positions [b, T]`. Rows with top-k 1..SHORTLIST race over their kept
    tokens; other sampled positions walk the row (slower than torch's ops: for rows with top-k)."""
    batch, block, vocab = draft_logits.shape
    device = draft_logits.device
    tokens = torch.empty(batch, block, dtype=torch.int64, device=device)
    probs = torch.zeros(batch, block, vocab, dtype=torch.float32, device=device)
    if batch == 0 or block == 0:
        return tokens, probs
    draft_logits = draft_logits.contiguous()
    temperature, top_k = temperature.to(torch.float32).contiguous(), top_k.to(torch.int64).contiguous()
    stage = _shortlist(draft_logits, temperature, top_k, chunk_v)
    stage.module.shortlist_sample_kernel[(block, batch, 1)](
        draft_logits, temperature, top_k, top_p.to(torch.float32).contiguous(), seed.to(torch.int64).contiguous(),
        positions.to(torch.int64).contiguous(), *stage.kept, block, vocab, stage.chunks, tokens, probs,
        BLOCK_V=VERIFY_BLOCK_V, BLOCK_C=VERIFY_BLOCK_C, KEPT=SHORTLIST_KEPT, VOCAB_DIVISIBLE=verify_vocab_divisible(vocab),
        **_launch_options(device, 4, 1, fp_fusion=False),
    )  # fmt: skip
    return tokens, probs

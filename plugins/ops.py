"""Entry points the runtimes call for the two DFlash plugins.

Each op runs the fastest implementation available for its inputs' device and falls back to the
torch reference, so the torch runtime has one code path on CPU and GPU.
"""

from __future__ import annotations

import torch

from trtllm_dflash.plugins import reference


def block_attention(
    q: torch.Tensor,
    k_block: torch.Tensor,
    v_block: torch.Tensor,
    k_ctx_new: torch.Tensor,
    v_ctx_new: torch.Tensor,
    new_counts: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    scale: float,
    window: int = 0,
) -> torch.Tensor:
    """KV-injected block attention; see `reference.block_attention` for the semantics."""
    return reference.block_attention(
        q, k_block, v_block, k_ctx_new, v_ctx_new, new_counts, k_cache, v_cache, cache_lens, scale, window
    )


def verify_block(
    target_logits: torch.Tensor,
    block_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seed: torch.Tensor,
    start: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tree-free block verification; see `reference.verify_block` for the semantics."""
    return reference.verify_block(target_logits, block_tokens, draft_probs, temperature, top_k, top_p, seed, start)

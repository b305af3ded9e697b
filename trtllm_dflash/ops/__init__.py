"""The DFlash ops: KV-injected block attention, the target's in-place attention, block verification.

`reference` (with `rng`, and `reference_dflash2` for V2 drafters) defines their semantics in plain
torch; `kernels` holds the Triton kernels and their launchers; `custom_ops` exposes them as
`dflash::` torch ops; `attention_options` declares the attention ops' options (scale, window,
sinks) once. The functions below are the entry points the runtimes call: each runs the Triton
kernels (through the `dflash::` ops) where they can run, that is on CUDA tensors, or on CPU when
`TRITON_INTERPRET=1` asks for Triton's interpreter, and the torch reference otherwise, so the
torch runtime has one code path on CPU and GPU. TensorRT packaging lives in `trtllm_dflash.plugins`.
"""

from __future__ import annotations

import torch

from trtllm_dflash.ops import custom_ops, reference, reference_dflash2
from trtllm_dflash.ops.attention_options import BLOCK_ATTENTION, TARGET_ATTENTION


@BLOCK_ATTENTION.takes_options(torch.Tensor)
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
    **options,
) -> torch.Tensor:
    """KV-injected block attention; see `reference.block_attention` for the semantics.

    Options (scale, window): `attention_options.BLOCK_ATTENTION`.
    """
    args = (q, k_block, v_block, k_ctx_new, v_ctx_new, new_counts, k_cache, v_cache, cache_lens)
    if custom_ops.kernels_enabled(q.device):
        return torch.ops.dflash.block_attention(*args, *options.values())
    return reference.block_attention(*args, **options)


@TARGET_ATTENTION.takes_options(torch.Tensor)
def target_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    starts: torch.Tensor,
    **options,
) -> torch.Tensor:
    """Causal target attention over an in-place cache; see `reference.target_attention`.

    Options (sinks, scale, window): `attention_options.TARGET_ATTENTION`.
    """
    args = (q, k_new, v_new, k_cache, v_cache, starts)
    if custom_ops.kernels_enabled(q.device):
        return torch.ops.dflash.target_attention(*args, *options.values())
    return reference.target_attention(*args, **options)


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
    args = (target_logits, block_tokens, draft_probs, temperature, top_k, top_p, seed, start)
    if custom_ops.kernels_enabled(target_logits.device):
        packed = torch.ops.dflash.verify_block(*args)
        return packed[:, 0].contiguous(), packed[:, 1].contiguous()
    return reference.verify_block(*args)


def verify_block_packed(
    target_logits: torch.Tensor,
    block_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seed: torch.Tensor,
    start: torch.Tensor,
    stop_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Verification plus next start, committed length and stop flag in one int64 `[b, 5]` tensor
    (one small host read per step); see `reference.verify_block_packed`."""
    args = (target_logits, block_tokens, draft_probs, temperature, top_k, top_p, seed, start, stop_ids)
    if custom_ops.kernels_enabled(target_logits.device):
        return torch.ops.dflash.verify_block(*args)
    return reference.verify_block_packed(*args)


def grouped_dynamic_conv(
    x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, residual: torch.Tensor | None = None
) -> torch.Tensor:
    """DFlash V2's grouped dynamic causal convolution along a block; see `reference_dflash2`."""
    if custom_ops.kernels_enabled(x.device):  # the op itself falls back where its kernel does not fit
        return torch.ops.dflash.grouped_dynamic_conv(x, delta, base, residual)
    return reference_dflash2.grouped_dynamic_conv(x, delta, base, residual)


def candidate_select(
    unary: torch.Tensor,
    z: torch.Tensor,
    anchor: torch.Tensor,
    predecessor: torch.Tensor,
    successor: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    positions: torch.Tensor,
    top_k: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DFlash V2's candidate selector walk: (tokens, candidate ids, candidate q); see `reference_dflash2`."""
    args = (unary, z, anchor, predecessor, successor, temperature, seed, positions, top_k)
    if custom_ops.kernels_enabled(unary.device):  # the op itself falls back where its kernels do not fit
        return torch.ops.dflash.candidate_select(*args)
    return reference_dflash2.candidate_select(*args)

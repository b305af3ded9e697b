"""The plugins as torch custom ops: `dflash::block_attention`, `dflash::target_attention`,
`dflash::verify_block`, and DFlash V2's `dflash::grouped_dynamic_conv` and `dflash::candidate_select`.

Custom ops are opaque to torch.compile and torch.export, so graphs keep one node per plugin (the
ONNX exporter maps it to the plugin's ONNX node, see `onnx_nodes.custom_translation_table`), and
each op has a fake implementation for shape propagation. At run time an op runs:
- the compiled Triton kernels on CUDA tensors;
- the same kernels through Triton's CPU interpreter when `TRITON_INTERPRET=1`;
- otherwise, or for inputs the kernels do not cover (float64 models, head dims that are not a
  power of two in 16..256, blocks over 16), the torch reference (`reference.py`,
  `reference_dflash2.py`), which defines the semantics.

`dflash::block_attention` appends the new context rows to the caches in place (what a runtime
wants). Mutating ops cannot be exported, so `dflash::block_attention_functional` returns the
updated caches instead; its ONNX/TensorRT node aliases them to the input caches, which makes
the append in place inside an engine too. `dflash::target_attention` (causal attention of a
target layer over its in-place cache) and `dflash::target_attention_functional` follow the same
pattern. The attention ops' options (scale, window, sinks) come from `attention_options`: their
schemas are the ops' own tensors followed by the options, none with a default.
"""

from __future__ import annotations

import torch

from trtllm_dflash.ops import kernels, reference, reference_dflash2
from trtllm_dflash.ops.attention_options import BLOCK_ATTENTION, TARGET_ATTENTION
from trtllm_dflash.ops.kernels import dflash2_launch, launch


def kernels_enabled(device: torch.device) -> bool:
    """Whether the Triton kernels (compiled, or interpreted on request) run on this device."""
    if not kernels.triton_available():
        return False
    return device.type == "cuda" or kernels.interpreter_requested()


def _attention(q, k_block, v_block, k_ctx_new, v_ctx_new, new_counts, k_cache, v_cache, cache_lens, **options):
    args = (q, k_block, v_block, k_ctx_new, v_ctx_new, new_counts, k_cache, v_cache, cache_lens)
    if kernels_enabled(q.device) and launch.attention_supported(q, k_cache):
        return launch.block_attention(*args, *options.values())  # positionally: the cheap call
    return reference.block_attention(*args, **options)


@torch.library.custom_op("dflash::block_attention", mutates_args=("k_cache", "v_cache"))
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
    """KV-injected block attention; appends the new context to `k_cache`/`v_cache` in place."""
    return _attention(q, k_block, v_block, k_ctx_new, v_ctx_new, new_counts, k_cache, v_cache, cache_lens, **options)


@block_attention.register_fake
def _block_attention_fake(q, *args):
    return torch.empty_like(q)


@torch.library.custom_op("dflash::block_attention_functional", mutates_args=())
@BLOCK_ATTENTION.takes_options(torch.Tensor)
def block_attention_functional(
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The exportable form: returns (output, updated k_cache, updated v_cache)."""
    k_out, v_out = k_cache.clone(), v_cache.clone()
    out = _attention(q, k_block, v_block, k_ctx_new, v_ctx_new, new_counts, k_out, v_out, cache_lens, **options)
    return out, k_out, v_out


@block_attention_functional.register_fake
def _block_attention_functional_fake(q, k_block, v_block, k_ctx_new, v_ctx_new, new_counts, k_cache, v_cache, *args):
    return torch.empty_like(q), torch.empty_like(k_cache), torch.empty_like(v_cache)


@torch.library.custom_op("dflash::verify_block", mutates_args=())
def verify_block(
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
    """Tree-free block verification; returns int64 `[b, 5]` (`reference.VERIFY_RESULT_COLUMNS`)."""
    if kernels_enabled(target_logits.device) and launch.verify_supported(target_logits):
        return launch.verify_block(target_logits, block_tokens, draft_probs, temperature, top_k, top_p, seed, start, stop_ids)
    return reference.verify_block_packed(target_logits, block_tokens, draft_probs, temperature, top_k, top_p, seed, start, stop_ids)


@verify_block.register_fake
def _verify_block_fake(target_logits, block_tokens, draft_probs, temperature, top_k, top_p, seed, start, stop_ids=None):
    return target_logits.new_empty((target_logits.shape[0], len(reference.VERIFY_RESULT_COLUMNS)), dtype=torch.int64)


def _target_attention(q, k_new, v_new, k_cache, v_cache, starts, **options):
    args = (q, k_new, v_new, k_cache, v_cache, starts)
    if kernels_enabled(q.device) and launch.target_attention_supported(q, k_cache, v_cache):
        return launch.target_attention(*args, *options.values())
    return reference.target_attention(*args, **options)


@torch.library.custom_op("dflash::target_attention", mutates_args=("k_cache", "v_cache"))
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
    """Causal block attention of a target layer; writes the block's K/V into the caches in place."""
    return _target_attention(q, k_new, v_new, k_cache, v_cache, starts, **options)


@target_attention.register_fake
def _target_attention_fake(q, k_new, v_new, k_cache, v_cache, *args):
    return q.new_empty((*q.shape[:-1], v_cache.shape[-1]))


@torch.library.custom_op("dflash::target_attention_functional", mutates_args=())
@TARGET_ATTENTION.takes_options(torch.Tensor)
def target_attention_functional(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    starts: torch.Tensor,
    **options,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The exportable form: returns (output, updated k_cache, updated v_cache)."""
    k_out, v_out = k_cache.clone(), v_cache.clone()
    out = _target_attention(q, k_new, v_new, k_out, v_out, starts, **options)
    return out, k_out, v_out


@target_attention_functional.register_fake
def _target_attention_functional_fake(q, k_new, v_new, k_cache, v_cache, *args):
    return q.new_empty((*q.shape[:-1], v_cache.shape[-1])), torch.empty_like(k_cache), torch.empty_like(v_cache)


@torch.library.custom_op("dflash::grouped_dynamic_conv", mutates_args=())
def grouped_dynamic_conv(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """DFlash V2's grouped dynamic causal conv along a block (`reference_dflash2.grouped_dynamic_conv`)."""
    if kernels_enabled(x.device) and dflash2_launch.conv_supported(x, delta, base, residual):
        return dflash2_launch.grouped_dynamic_conv(x, delta, base, residual)
    return reference_dflash2.grouped_dynamic_conv(x, delta, base, residual)


@grouped_dynamic_conv.register_fake
def _grouped_dynamic_conv_fake(x, delta, base, residual=None):
    return x.new_empty(x.shape, dtype=torch.float32 if residual is not None else x.dtype)


@torch.library.custom_op("dflash::candidate_select", mutates_args=())
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
    """DFlash V2's candidate selector: (tokens, candidate ids, candidate q) (`reference_dflash2.candidate_select`)."""
    args = (unary, z, anchor, predecessor, successor, temperature, seed, positions, top_k)
    if kernels_enabled(unary.device) and dflash2_launch.select_supported(unary, z, predecessor, successor, top_k):
        return dflash2_launch.candidate_select(*args)
    return reference_dflash2.candidate_select(*args)


@candidate_select.register_fake
def _candidate_select_fake(unary, z, anchor, predecessor, successor, temperature, seed, positions, top_k):
    batch, steps, vocab = unary.shape
    k = min(top_k, vocab)
    return (unary.new_empty((batch, steps), dtype=torch.int64), unary.new_empty((batch, steps, k), dtype=torch.int64),
            unary.new_empty((batch, steps, k), dtype=torch.float32))

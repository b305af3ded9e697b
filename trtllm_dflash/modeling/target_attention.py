"""The target's attention as the DFlash target-attention op, inside the target's own modeling code.

transformers looks each layer's attention function up by the config's attention implementation
in its `AttentionInterface` (see hf_compat); registering `dflash_attention` there (name `ATTENTION_NAME`) lets any
family whose attention goes through that interface (Llama, Qwen3, Qwen3-MoE, Gemma 3, gpt-oss
with its sinks) run `dflash::target_attention` unchanged: the layer computes q/k/v, norms and
RoPE as always, and the op writes the new K/V into the layer's cache at each row's positions and
attends over the row's own slots. The model is called without a transformers cache
(`use_cache=False`), so nothing else concatenates or copies K/V.

Which cache, which rows, which positions: the caller makes a `TargetAttentionStep` active for
one forward pass. In place (`functional=False`, the torch runtime) the op mutates the cache
tensors; functional (`functional=True`, the ONNX export of the plugin target graph) it returns
the updated caches, which the graph outputs and the ONNX/TensorRT node aliases to its inputs.

Refused (`unsupported_reason`): layers without their own K/V (Gemma 4's KV sharing), attention
logit soft-capping, latent attention (MLA) and linear-attention layers: the op does not express
them, and the HF attention path keeps running those models.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Callable

import torch
from torch import nn

from trtllm_dflash import hf_compat, ops
from trtllm_dflash.errors import DFlashError

ATTENTION_NAME = "dflash_target"
_ACTIVE: list["TargetAttentionStep"] = []


@dataclasses.dataclass
class TargetAttentionStep:
    """What one forward pass's attention calls need: per-layer caches, row starts, windows."""

    caches: dict[int, tuple[torch.Tensor, torch.Tensor]]  # layer -> (keys, values) [slots, S, Hkv, D]
    starts: torch.Tensor  # [b] int64: position of each row's first token
    windows: list[int]  # per layer: sliding window (0: full attention)
    functional: bool = False
    # (batch rows, cache slots) per run of consecutive slots (Slots.runs); None: row r in slot r
    runs: list[tuple[slice, slice]] | None = None
    # the kernel that runs `ops.target_attention`'s call (runtime/attention_choice.py; not exported)
    attend: Callable[..., torch.Tensor] = ops.target_attention
    updated: dict[int, tuple[torch.Tensor, torch.Tensor]] = dataclasses.field(default_factory=dict)

    @contextlib.contextmanager
    def active(self):
        _ACTIVE.append(self)
        try:
            yield self
        finally:
            _ACTIVE.pop()


def dflash_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """An `AttentionInterface` function: q/k/v `[b, H, T, D]` in, `[b, T, Hq, Dv]` out (the mask is ignored)."""
    if not _ACTIVE:
        raise DFlashError("dflash target attention was called outside a TargetAttentionStep", "this is a bug; report it")
    if kwargs.get("softcap") is not None:
        raise DFlashError("dflash target attention has no attention-logit soft-capping", "run this model with attention='hf'")
    step = _ACTIVE[-1]
    layer = int(module.layer_idx)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # token-major [b, T, H, D]
    k_cache, v_cache = step.caches[layer]
    scale = float(scaling if scaling is not None else q.shape[-1] ** -0.5)
    window = step.windows[layer]
    if step.functional:  # graph export: one batch, row r in slot r
        out, k_out, v_out = torch.ops.dflash.target_attention_functional(q, k, v, k_cache, v_cache, step.starts, s_aux, scale, window)
        step.updated[layer] = (k_out, v_out)
        return out, None
    runs = step.runs if step.runs is not None else [(slice(0, q.shape[0]), slice(0, q.shape[0]))]
    outs = [
        step.attend(q[rows], k[rows], v[rows], k_cache[slots], v_cache[slots], step.starts[rows], s_aux, scale, window)
        for rows, slots in runs
    ]
    return (outs[0] if len(outs) == 1 else torch.cat(outs)), None


@functools.cache
def register() -> None:
    """Make `ATTENTION_NAME` a valid attention implementation (once per process)."""
    hf_compat.register_attention(ATTENTION_NAME, dflash_attention)


@contextlib.contextmanager
def use_dflash_attention(model: nn.Module):
    """Switch every attention layer of `model` to `dflash_attention` for the duration."""
    register()
    configs = {id(c): c for c in (model.config, model.config.get_text_config())}.values()
    previous = [hf_compat.attention_implementation(c) for c in configs]
    for config in configs:
        hf_compat.set_attention_implementation(config, ATTENTION_NAME)
    try:
        yield
    finally:
        for config, implementation in zip(configs, previous):
            hf_compat.set_attention_implementation(config, implementation)


def unsupported_reason(config) -> str | None:
    """Why the target-attention op cannot run this target's attention (None: it can)."""
    config = config.get_text_config()
    model_type = getattr(config, "model_type", "this target")
    if "linear_attention" in (getattr(config, "layer_types", None) or []):
        return f"{model_type} has linear-attention layers (recurrent state, no KV cache)"
    if getattr(config, "kv_lora_rank", None):
        return f"{model_type} has multi-head latent attention (a compressed latent cache)"
    if int(getattr(config, "num_kv_shared_layers", 0) or 0):
        return f"{model_type} has layers that reuse another layer's K/V (KV sharing)"
    if getattr(config, "attn_logit_softcapping", None):
        return f"{model_type} soft-caps its attention logits"
    return None


def layer_windows(config) -> list[int]:
    """Sliding window of each decoder layer (0: full attention), as the torch runtime masks them."""
    config = config.get_text_config()
    layers = int(config.num_hidden_layers)
    types = list(getattr(config, "layer_types", None) or ["full_attention"] * layers)
    window = int(getattr(config, "sliding_window", None) or 0)
    return [window if kind == "sliding_attention" else 0 for kind in types]


def placeholder_masks(config, input_ids: torch.Tensor):
    """Masks the model accepts without building its own (the op masks by position itself).

    A 4D mask passes through transformers' mask preparation untouched; models that mix layer
    types look theirs up by type.
    """
    config = config.get_text_config()
    mask = torch.ones(input_ids.shape[0], 1, input_ids.shape[1], 1, dtype=torch.bool, device=input_ids.device)
    types = set(getattr(config, "layer_types", None) or ["full_attention"])
    return {kind: mask for kind in types} if len(types) > 1 else mask

"""The target as one prefill/verify step with explicit caches and hidden-state taps.

`TargetGraph` (the `native` variant) takes the past K/V as inputs and returns the new K/V and the
logits at `logit_index`; `VerifyingTargetGraph` (the `plugin` variant) updates its caches in place
through the DFlash target-attention op and verifies inside, returning verification results. The
torch runtime uses `TargetGraph` to probe the K/V shape each layer writes. builder/export.py
documents their inputs and outputs and exports them to ONNX.
"""

from __future__ import annotations

import torch
from torch import nn

from trtllm_dflash import hf_compat
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.graphs.concat_cache import ConcatCache, LayerCache
from trtllm_dflash.graphs.masks import visibility
from trtllm_dflash.modeling import target_attention


class UnsupportedTargetError(DFlashError):
    """A target whose layers our engines cannot run (recurrent state, latent attention)."""


def check_exportable(config) -> None:
    """Refuse targets whose layers our graphs cannot express: they keep K/V caches only.

    Gated DeltaNet hybrids (Qwen3.5 / Qwen3.6 / Qwen3-Next) carry a recurrent state per row that
    must be rolled back per accepted draft; DeepSeek-style MLA would need its compressed latent
    cache. TensorRT-LLM (and the torch runtime) run both.
    """
    config = config.get_text_config()
    model_type = getattr(config, "model_type", "this target")
    if "linear_attention" in (getattr(config, "layer_types", None) or []):
        raise UnsupportedTargetError(
            f"{model_type} has Gated DeltaNet linear-attention layers; our engines keep no recurrent state",
            "use backend: trtllm or torch",
        )
    if getattr(config, "kv_lora_rank", None):
        raise UnsupportedTargetError(
            f"{model_type} has multi-head latent attention (MLA) layers; our engines keep no latent KV cache",
            "use backend: trtllm or torch",
        )


class TargetGraph(nn.Module):
    """A Hugging Face causal LM as one prefill/verify step with explicit caches and hidden taps.

    `past_keys` / `past_values` hold one tensor per layer in `cache_layers` (the layers whose
    attention writes K/V, in order), found by running the model once (`probe_cache_layers`), so
    per-layer shapes and KV-sharing layers come from the model's own code, not from its config.
    Eager-attention models (gpt-oss: attention sinks) add the mask to the scores, so they get
    additive float masks (0 / dtype min) as in the torch runtime.
    """

    def __init__(self, model: nn.Module, layer_ids: list[int]) -> None:
        super().__init__()
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        config = model.config.get_text_config()
        self.num_layers = int(config.num_hidden_layers)
        self.layer_types = list(getattr(config, "layer_types", None) or ["full_attention"] * self.num_layers)
        self.sliding_window = int(getattr(config, "sliding_window", None) or 0)
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self.additive_masks = hf_compat.attention_implementation(config) == "eager"
        self.dtype = model.get_input_embeddings().weight.dtype  # the compute dtype (FP8 layers keep E4M3 weights)
        self.layer_ids = list(layer_ids)
        self.cache_shapes = self.probe_cache_layers()
        self.cache_layers = [i for i, shape in enumerate(self.cache_shapes) if shape is not None]

    def _masks(self, key_positions: torch.Tensor, key_valid: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype):
        """One mask per attention kind (a single 4D mask where there is one kind), as the torch runtime builds them."""
        masks = {}
        for kind in set(self.layer_types):
            visible = visibility(key_positions, key_valid, positions, self.sliding_window if kind == "sliding_attention" else 0, True)
            if self.additive_masks:  # eager attention adds the mask to the scores
                visible = torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill(~visible, torch.finfo(dtype).min)
            masks[kind] = visible
        return masks if len(masks) > 1 else next(iter(masks.values()))

    def _decode(self, input_ids, positions, masks, cache: ConcatCache | None) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        taps: dict[int, torch.Tensor] = {}
        hooks = [
            self.decoder.layers[i].register_forward_hook(
                lambda module, args, output, i=i: taps.__setitem__(i, output[0] if isinstance(output, tuple) else output)
            )
            for i in self.layer_ids
        ]
        try:
            hidden = hf_compat.forward_with_cache(
                self.decoder, cache, input_ids=input_ids, position_ids=positions, attention_mask=masks, use_cache=cache is not None
            ).last_hidden_state
        finally:
            for hook in hooks:
                hook.remove()
        return hidden, taps

    @torch.no_grad()
    def probe_cache_layers(self) -> list[LayerCache | None]:
        """Run two tokens through the model and record the K/V shape each layer writes (None: no cache)."""
        device = self.lm_head.weight.device  # the torch runtime probes a model on its GPU
        input_ids = torch.zeros(2, 2, dtype=torch.long, device=device)
        positions = torch.arange(2, device=device).expand(2, -1)
        masks = self._masks(positions, torch.ones(2, 2, dtype=torch.bool, device=device), positions, self.dtype)
        cache = ConcatCache({}, 2, self.num_layers)
        self._decode(input_ids, positions, masks, cache)
        shapes: list[LayerCache | None] = []
        for written in cache.new:  # token-major [b, T, kv_heads, D]
            shapes.append(
                None if written is None else LayerCache(int(written[0].shape[2]), int(written[0].shape[3]), int(written[1].shape[3]))
            )
        return shapes

    def forward(self, input_ids, starts, logit_index, past_keys: tuple, past_values: tuple):
        batch, tokens = input_ids.shape
        past_len = past_keys[0].shape[1]
        steps = torch.arange(tokens, device=input_ids.device)
        positions = starts.view(-1, 1) + steps
        slots = torch.arange(past_len, device=input_ids.device).view(1, -1)
        key_positions = torch.cat([slots.expand(batch, -1), positions], dim=1)
        key_valid = torch.cat([slots < starts.view(-1, 1), torch.ones_like(positions, dtype=torch.bool)], dim=1)
        masks = self._masks(key_positions, key_valid, positions, self.dtype)
        past = {layer: (k, v) for layer, k, v in zip(self.cache_layers, past_keys, past_values)}
        cache = ConcatCache(past, past_len + tokens, self.num_layers)
        hidden, taps = self._decode(input_ids, positions, masks, cache)
        features = torch.cat([taps[i] for i in self.layer_ids], dim=-1)
        picked = hidden.gather(1, logit_index.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        logits = self.lm_head(picked)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        new_keys = tuple(cache.new[i][0] for i in self.cache_layers)
        new_values = tuple(cache.new[i][1] for i in self.cache_layers)
        return logits, features, new_keys, new_values


def _pick(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`values [b, T, ...]` at `index [b, n]` per row, as one flat Gather (onnx.reference's
    GatherElements cannot index more than 32 positions)."""
    batch, tokens = values.shape[:2]
    flat = (torch.arange(batch, device=index.device).view(-1, 1) * tokens + index).reshape(-1)
    picked = values.reshape(batch * tokens, *values.shape[2:]).index_select(0, flat)
    return picked.reshape(batch, index.shape[1], *values.shape[2:])


class VerifyingTargetGraph(TargetGraph):
    """The plugin variant of the target: in-place cache attention, verification inside the graph.

    Every attention layer runs `dflash::target_attention_functional` (the `DFlashTargetAttention`
    node): the block's K/V are written into `cache_key_i` / `cache_value_i` `[b, capacity, ...]` at
    each row's positions and attention reads only the row's own slots, so nothing is concatenated
    or copied and the cost follows each row's length, not the capacity. The caches come back as
    `present_key_i` / `present_value_i`, which the node aliases to its inputs (one buffer per layer
    in an engine). The logits at `logit_index` go straight into `dflash::verify_block` (the
    `DFlashVerifyPositions` + `DFlashVerifyCommit` nodes): the graph returns per row the packed
    verification result `[b, 5]` (accepted drafts, bonus token, next start, committed, stopped)
    and the tapped features of every position, never the logits.

    The verified block is `input_ids` at `logit_index`; its first token sits at position
    `starts + logit_index[:, 0]`. At prefill `logit_index` is each row's last prompt token (a block
    of one: no drafts, the first token is sampled); at verify it is every block position.
    `draft_probs [b, >= n-1, V]` (float32) is the drafter's processed distribution for sampled rows
    (zeros read as q = 0, what greedy and autoregressive rows pass).
    """

    def __init__(self, model: nn.Module, layer_ids: list[int]) -> None:
        super().__init__(model, layer_ids)
        self.model = model
        self.windows = target_attention.layer_windows(model.config)

    def forward(self, input_ids, starts, logit_index, draft_probs, temperature, top_k, top_p, seed, cache_keys: tuple, cache_values: tuple):
        positions = starts.view(-1, 1) + torch.arange(input_ids.shape[1], device=input_ids.device)
        caches = {layer: (k, v) for layer, k, v in zip(self.cache_layers, cache_keys, cache_values)}
        step = target_attention.TargetAttentionStep(caches, starts, self.windows, functional=True)
        masks = target_attention.placeholder_masks(self.model.config, input_ids)
        with target_attention.use_dflash_attention(self.model), step.active():
            hidden, taps = self._decode(input_ids, positions, masks, None)
        features = torch.cat([taps[i] for i in self.layer_ids], dim=-1)
        logits = self.lm_head(_pick(hidden, logit_index))
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        block = _pick(input_ids, logit_index)
        drafts = draft_probs[:, : logit_index.shape[1] - 1]
        result = torch.ops.dflash.verify_block(logits, block, drafts, temperature, top_k, top_p, seed, starts + logit_index[:, 0])
        present_keys = tuple(step.updated[i][0] for i in self.cache_layers)
        present_values = tuple(step.updated[i][1] for i in self.cache_layers)
        return result, features, present_keys, present_values


def verifying_target_refusal(model: nn.Module) -> str | None:
    """Why this target gets no verifying (plugin) target graph (None: it does)."""
    return target_attention.unsupported_reason(model.config)

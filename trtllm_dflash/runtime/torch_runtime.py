"""The torch runtime: a Hugging Face target and the PyTorch DFlash drafter.

This is the reference for losslessness and the default on CPU. The target runs unmodified
`transformers` modeling code; only its KV cache (one slot per absolute position, per-row write
positions) and its attention masks are ours, so any causal LM whose attention goes through
`Cache.update` works. Tapped hidden states are taken with forward hooks on the decoder layers,
which is exactly "the output of decoder layer i".
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from trtllm_dflash.modeling.drafter import DFlashDrafter
from trtllm_dflash.modeling.kv_cache import RaggedHFCache, StaticKVCache
from trtllm_dflash.modeling.taps import HiddenTaps
from trtllm_dflash.runtime.base import Runtime, TargetOutput


def causal_mask(positions: torch.Tensor, span: int, window: int = 0) -> torch.Tensor:
    """`[b, 1, T, span]` visibility of key slot j (== position j) from each query position."""
    keys = torch.arange(span, device=positions.device).view(1, 1, 1, -1)
    queries = positions.unsqueeze(1).unsqueeze(-1)
    visible = keys <= queries
    if window > 0:
        visible = visible & (keys > queries - window)
    return visible


class TorchRuntime(Runtime):
    """Runs a transformers causal LM and a DFlashDrafter with PyTorch."""

    def __init__(self, target: PreTrainedModel, drafter: DFlashDrafter | None = None) -> None:
        self.model = target.eval()
        self.drafter = drafter.eval() if drafter is not None else None
        self.drafter_config = drafter.config if drafter is not None else None
        self.device = next(target.parameters()).device
        self.dtype = next(target.parameters()).dtype
        self.decoder = target.get_decoder()
        self.embedding = target.get_input_embeddings()
        self.lm_head = target.get_output_embeddings()
        config = target.config.get_text_config()
        self.target_config = config
        self.vocab_size = int(config.vocab_size)
        self.num_layers = int(config.num_hidden_layers)
        self.layer_types = list(getattr(config, "layer_types", None) or ["full_attention"] * self.num_layers)
        self.sliding_window = int(getattr(config, "sliding_window", None) or 0)
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self.taps = HiddenTaps(self.decoder.layers, self.drafter_config.target_layer_ids) if drafter else None
        self.target_cache: StaticKVCache | None = None
        self.draft_cache: StaticKVCache | None = None

    # ------------------------------------------------------------------ caches

    def allocate(self, max_batch: int, capacity: int) -> None:
        config = self.target_config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.target_cache = StaticKVCache(
            self.num_layers, max_batch, capacity, config.num_key_value_heads, head_dim, self.dtype, self.device
        )
        self._hf_cache = RaggedHFCache(self.target_cache)
        if self.drafter is not None:
            dc = self.drafter_config
            self.draft_cache = StaticKVCache(
                dc.num_hidden_layers, max_batch, capacity, dc.num_key_value_heads, dc.head_dim, self.dtype, self.device
            )
        self.max_batch, self.capacity = max_batch, capacity

    def keep_rows(self, index: torch.Tensor) -> None:
        self.target_cache.keep_rows(index)
        if self.draft_cache is not None:
            self.draft_cache.keep_rows(index)

    # ------------------------------------------------------------------ forward passes

    @torch.inference_mode()
    def target_forward(self, rows, tokens, starts, span, logits_at=None) -> TargetOutput:
        positions = starts.view(-1, 1) + torch.arange(tokens.shape[1], device=self.device)
        self._hf_cache.bind(rows, positions, span)
        masks = {
            kind: causal_mask(positions, span, self.sliding_window if kind == "sliding_attention" else 0)
            for kind in set(self.layer_types)
        }
        # a 4D mask passes through every HF model untouched; a per-type dict only where types mix
        masks = masks if len(masks) > 1 else next(iter(masks.values()))
        hidden = self.decoder(
            input_ids=tokens, position_ids=positions, attention_mask=masks, past_key_values=self._hf_cache, use_cache=True
        ).last_hidden_state
        if logits_at is not None:
            hidden = hidden[torch.arange(hidden.shape[0], device=self.device), logits_at].unsqueeze(1)
        logits = self.lm_head(hidden)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return TargetOutput(logits=logits, features=self.taps.features() if self.taps else None)

    @torch.inference_mode()
    def draft_forward(self, rows, block, ctx_features, new_counts, cache_lens) -> torch.Tensor:
        embeds = self.drafter.embed(block, self.embedding)
        hidden = self.drafter.step(embeds, ctx_features, new_counts, cache_lens, self.draft_cache.rows(rows))
        return self.drafter.logits(hidden[:, 1:], self.lm_head)

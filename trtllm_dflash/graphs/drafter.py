"""The drafter as one block-diffusion step with the draft cache as inputs and outputs."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from trtllm_dflash.contracts.draft_window import DraftWindow
from trtllm_dflash.modeling.drafter import DFlashDrafter

HEAD_LOGITS = "logits"  # graphs.json `head` of a graph that ends in the draft logits (V1)


def native_block_attention(q, keys, values, mask, scale: float) -> torch.Tensor:
    """Masked attention of `q [b, B, Hq, D]` over `keys/values [b, K, Hkv, D]` with plain ops."""
    heads, kv_heads = q.shape[2], keys.shape[2]
    if heads != kv_heads:
        keys = keys.repeat_interleave(heads // kv_heads, dim=2)
        values = values.repeat_interleave(heads // kv_heads, dim=2)
    out = nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), attn_mask=mask, scale=scale
    )
    return out.transpose(1, 2)


def draft_mask(window: DraftWindow, key_positions, key_valid, query_positions) -> torch.Tensor:
    """`[b, 1, Q, K]`: a valid key that `window` lets the query see (`draft_window`, the definition
    the plugin op and every runtime share)."""
    visible = window.visible(query_positions.unsqueeze(2), key_positions.unsqueeze(1))
    return (key_valid.unsqueeze(1) & visible).unsqueeze(1)


class DrafterGraph(nn.Module):
    """One DFlash drafting step with the draft cache as inputs/outputs (KV injection, non-causal).

    `plugin=False`: attention over [past cache; new context; block] with plain ops and a mask.
    `plugin=True`: the DFlash block-attention plugin op (`dflash::block_attention_functional`),
    which appends the new context to the cache itself (in place inside an engine); the new
    context K/V are graph outputs in both variants, so a runtime treats them the same.
    """

    def __init__(self, drafter: DFlashDrafter, embedding: nn.Module, lm_head: nn.Module, plugin: bool = False) -> None:
        super().__init__()
        self.drafter = drafter
        self.embedding = embedding
        self.lm_head = lm_head
        self.plugin = plugin

    def forward(self, block_ids, ctx_features, new_counts, cache_lens, past_keys: tuple, past_values: tuple):
        step = self.prepare(block_ids, ctx_features, new_counts, cache_lens, past_keys)
        x = step.embeds
        new_keys, new_values = [], []
        for layer, past_k, past_v in zip(self.drafter.layers, past_keys, past_values):
            out, k_ctx, v_ctx = self.attend(layer.self_attn, layer.input_layernorm(x), step, past_k, past_v)
            x = layer._finish(x, out)
            new_keys.append(k_ctx)
            new_values.append(v_ctx)
        hidden = self.drafter.norm(x)
        logits = self.drafter.logits(hidden[:, 1:], self.lm_head)
        return logits, tuple(new_keys), tuple(new_values)

    def prepare(self, block_ids, ctx_features, new_counts, cache_lens, past_keys: tuple) -> "StepInputs":
        """What every layer of a step shares: embeddings, context hidden states, RoPE, masks."""
        drafter = self.drafter
        batch, block = block_ids.shape
        rows, past_len = ctx_features.shape[1], past_keys[0].shape[1]
        device = block_ids.device
        ctx_steps = torch.arange(rows, device=device).view(1, -1)
        ctx_positions = cache_lens.view(-1, 1) + ctx_steps
        context_len = cache_lens + new_counts
        block_positions = context_len.view(-1, 1) + torch.arange(block, device=device)
        slots = torch.arange(past_len, device=device).view(1, -1)
        key_positions = torch.cat([slots.expand(batch, -1), ctx_positions, block_positions], dim=1)
        key_valid = torch.cat(
            [slots < cache_lens.view(-1, 1), ctx_steps < new_counts.view(-1, 1), torch.ones_like(block_positions, dtype=torch.bool)],
            dim=1,
        )
        windows = [] if self.plugin else drafter.config.attentions  # the plugin op masks by itself
        masks = {window: draft_mask(window, key_positions, key_valid, block_positions) for window in windows}
        embeds = drafter.embed(block_ids, self.embedding)
        ctx_hidden = drafter.context_hidden(ctx_features)
        return StepInputs(
            embeds,
            ctx_hidden,
            drafter.rope(ctx_hidden, ctx_positions),
            drafter.rope(embeds, block_positions),
            masks,
            new_counts,
            cache_lens,
        )

    def attend(self, attn, h, step: "StepInputs", past_k, past_v):
        """One layer's attention of the block `h` over [past cache; new context; block]:
        (o_proj output, new context keys, new context values)."""
        q = attn.project_queries(h, step.block_rope)
        k_block, v_block = attn.project_keys_values(h, step.block_rope)
        k_ctx, v_ctx = attn.project_keys_values(step.ctx_hidden, step.ctx_rope)
        if self.plugin:
            out, _, _ = torch.ops.dflash.block_attention_functional(
                q,
                k_block,
                v_block,
                k_ctx,
                v_ctx,
                step.new_counts,
                past_k,
                past_v,
                step.cache_lens,
                float(attn.scale),
                attn.attention.window,
                int(attn.attention.causal),
            )
        else:
            keys = torch.cat([past_k.to(k_block.dtype), k_ctx, k_block], dim=1)
            values = torch.cat([past_v.to(v_block.dtype), v_ctx, v_block], dim=1)
            out = native_block_attention(q, keys, values, step.masks[attn.attention], attn.scale)
        return attn.o_proj(out.flatten(-2)), k_ctx, v_ctx


@dataclasses.dataclass
class StepInputs:
    """The per-step tensors every drafter layer reads (`DrafterGraph.prepare`)."""

    embeds: torch.Tensor
    ctx_hidden: torch.Tensor
    ctx_rope: tuple
    block_rope: tuple
    masks: dict
    new_counts: torch.Tensor
    cache_lens: torch.Tensor

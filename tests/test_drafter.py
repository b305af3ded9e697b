"""The drafter against a from-the-spec re-implementation, and the tap index convention.

Computed in float64; the remaining ~1e-7 differences are Hugging Face's float32 RoPE tables.
"""

from __future__ import annotations

import math

import pytest
import torch
from support import rms, rope

from trtllm_dflash.checkpoints import load_drafter, load_target
from trtllm_dflash.config import DrafterConfig
from trtllm_dflash.contracts.draft_window import DraftWindow
from trtllm_dflash.modeling.drafter import DFlashDrafter
from trtllm_dflash.modeling.kv_cache import StaticKVCache
from trtllm_dflash.runtime.torch_runtime import TorchRuntime
from trtllm_dflash.training.objective import make_block_batch


def naive_block(drafter: DFlashDrafter, ctx_features: torch.Tensor, block_embeds: torch.Tensor) -> torch.Tensor:
    """DFLASH.md, literally: recompute everything for one sequence whose block starts at len(ctx).

    Masks, written out from z-lab's DFlashDraftModel (is_causal = False, `sliding_window` W handed
    to flash attention: window (W - 1, W - 1)): a sliding layer's query at p sees keys j with
    |p - j| <= W - 1, context and block alike, never causally; ModelOpt's `use_swa` windows the
    sliding layers by `swa_window_size`, or every layer without layer_types; `causal` (ModelOpt)
    adds j <= p; `sliding_window_size` W hides context positions j < S - W.
    """
    c = drafter.config
    S, B = ctx_features.shape[0], block_embeds.shape[0]
    ctx = rms(ctx_features @ drafter.fc.weight.T, drafter.hidden_norm.weight)
    q_pos = torch.arange(S, S + B)
    k_pos = torch.arange(S + B)
    x = block_embeds
    for i, layer in enumerate(drafter.layers):
        a = layer.self_attn
        h = rms(x, layer.input_layernorm.weight)
        q = rms((h @ a.q_proj.weight.T).view(B, c.num_attention_heads, c.head_dim), a.q_norm.weight)
        k = torch.cat([ctx @ a.k_proj.weight.T, h @ a.k_proj.weight.T]).view(S + B, c.num_key_value_heads, c.head_dim)
        v = torch.cat([ctx @ a.v_proj.weight.T, h @ a.v_proj.weight.T]).view(S + B, c.num_key_value_heads, c.head_dim)
        k = rms(k, a.k_norm.weight)
        q, k = rope(q, q_pos, c.rope_theta), rope(k, k_pos, c.rope_theta)
        group = c.num_attention_heads // c.num_key_value_heads
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(c.head_dim)
        sliding = bool(c.layer_types) and c.layer_types[i] == "sliding_attention"
        window = c.sliding_window if sliding else None
        if c.swa_window_size is not None:
            window = c.swa_window_size if (sliding or not c.layer_types) else None
        visible = torch.ones(B, S + B, dtype=torch.bool)
        if window is not None:
            visible &= (k_pos.view(1, -1) - q_pos.view(-1, 1)).abs() <= window - 1
        if c.causal:
            visible &= k_pos.view(1, -1) <= q_pos.view(-1, 1)
        if c.sliding_window_size:
            visible &= (k_pos.view(1, -1) >= S - c.sliding_window_size) | (k_pos.view(1, -1) >= S)
        scores = scores.masked_fill(~visible, float("-inf"))
        attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(B, -1)
        x = x + attn @ a.o_proj.weight.T
        h2 = rms(x, layer.post_attention_layernorm.weight)
        m = layer.mlp
        x = x + (torch.nn.functional.silu(h2 @ m.gate_proj.weight.T) * (h2 @ m.up_proj.weight.T)) @ m.down_proj.weight.T
    return rms(x, drafter.norm.weight)


def _random_drafter(layer_types=(), window=None, seed=0, **options) -> DFlashDrafter:
    torch.manual_seed(seed)
    config = DrafterConfig(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_target_layers=6,
        target_layer_ids=(1, 3),
        mask_token_id=0,
        block_size=4,
        rope_theta=10000.0,
        layer_types=tuple(layer_types),
        sliding_window=window,
        **options,
    )
    drafter = DFlashDrafter(config).double()
    with torch.no_grad():  # non-trivial norm weights so a skipped norm is visible
        for name, param in drafter.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return drafter


SLIDING = ("sliding_attention", "full_attention", "sliding_attention")
VARIANTS = {
    "full": ((), None, {}),
    "sliding": (SLIDING, 5, {}),
    "sliding-inside-block": (SLIDING, 2, {}),  # window 2 < block 4: the block's own keys are cut both ways
    "use_swa+layer_types": (SLIDING, None, {"swa_window_size": 3}),  # ModelOpt / DeepSpec: sliding layers only
    "use_swa": ((), None, {"swa_window_size": 3}),  # no layer_types: every layer
    # bounded draft history (z-lab sliding_window_size), alone and with sliding layers
    "history": ((), None, {"sliding_window_size": 4}),
    "history+sliding": (SLIDING, 3, {"sliding_window_size": 6}),
    "causal": ((), None, {"causal": True}),  # ModelOpt `causal: true`
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cached_steps_equal_full_recompute(variant):
    """Three ragged decoding steps for two sequences: cache reuse == recomputing from scratch."""
    layer_types, window, options = VARIANTS[variant]
    drafter = _random_drafter(layer_types, window, **options)
    F = 2 * 32
    total = [torch.randn(11, F, dtype=torch.float64), torch.randn(9, F, dtype=torch.float64)]
    cache = StaticKVCache(3, 2, 32, 2, 8, torch.float64, torch.device("cpu"))
    cache_lens = torch.tensor([0, 0])
    schedule = [[5, 2], [1, 4], [3, 1]]  # new context rows per sequence per step (ragged)
    for new in schedule:
        counts = torch.tensor(new)
        n = max(new)
        ctx = torch.zeros(2, n, F, dtype=torch.float64)
        for r in range(2):
            ctx[r, : new[r]] = total[r][cache_lens[r] : cache_lens[r] + new[r]]
        block = torch.randn(2, 4, 32, dtype=torch.float64)
        out = drafter.step(block, ctx, counts, cache_lens, cache.rows(slice(0, 2)))
        cache_lens = cache_lens + counts
        for r in range(2):
            expected = naive_block(drafter, total[r][: cache_lens[r]], block[r])
            torch.testing.assert_close(out[r], expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_training_forward_equals_decoding_step(variant):
    """forward_train with the sparse block mask == the explicit-mask recompute, block by block."""
    layer_types, window, options = VARIANTS[variant]
    drafter = _random_drafter(layer_types, window, **options)
    S, F = 12, 64
    features = torch.randn(1, S, F, dtype=torch.float64)
    input_ids = torch.randint(1, 50, (1, S))
    embedding = torch.nn.Embedding(50, 32).double()
    anchors = torch.tensor([[3, 7, 9]])
    windows = drafter.config.attentions
    batch = make_block_batch(
        input_ids,
        anchors,
        torch.ones_like(input_ids),
        4,
        mask_token_id=0,
        windows=windows,
        history=drafter.config.history,
    )
    embeds = embedding(batch.block_tokens)
    hidden = drafter.forward_train(embeds, batch.block_positions, features, torch.arange(S).view(1, -1), batch.masks).view(3, 4, -1)
    for j, anchor in enumerate(anchors[0].tolist()):
        expected = naive_block(drafter, features[0, :anchor], embeds.view(3, 4, -1)[j])
        torch.testing.assert_close(hidden[j], expected, rtol=1e-6, atol=1e-6)


def test_block_masks_block_other_blocks_and_later_context():
    input_ids = torch.arange(10).view(1, -1)
    batch = make_block_batch(input_ids, torch.tensor([[2, 6]]), torch.ones_like(input_ids), 3, mask_token_id=99)
    mask = batch.masks[DraftWindow()][0, 0]  # [6 queries, 10 ctx + 6 block]
    assert mask[:3, :10].sum(-1).tolist() == [2, 2, 2]  # block at anchor 2 sees ctx 0, 1
    assert mask[3:, :10].sum(-1).tolist() == [6, 6, 6]
    assert mask[:3, 10:13].all() and not mask[:3, 13:].any()
    assert batch.block_tokens.tolist() == [[2, 99, 99, 6, 99, 99]]
    assert batch.labels.tolist() == [[3, 4, 7, 8]]
    assert batch.block_positions.tolist() == [[2, 3, 4, 6, 7, 8]]


def test_taps_are_outputs_of_decoder_layers(tiny_qwen3, tiny_qwen3_drafter):
    """id i == Hugging Face output_hidden_states[i + 1] (index 0 is the embedding output)."""
    target = load_target(tiny_qwen3, dtype=torch.float64)
    drafter = load_drafter(tiny_qwen3_drafter, target=target)
    runtime = TorchRuntime(target.model, drafter)
    runtime.allocate(1, 32)
    tokens = torch.tensor([[5, 9, 11, 3, 7]])
    out = runtime.target_forward(slice(0, 1), tokens, torch.tensor([0]), 5)
    with torch.no_grad():
        hf = target.model(tokens, output_hidden_states=True)
    expected = torch.cat([hf.hidden_states[i + 1] for i in drafter.config.target_layer_ids], dim=-1)
    torch.testing.assert_close(out.features, expected)
    torch.testing.assert_close(out.logits, hf.logits)


def test_optional_scalings_are_applied():
    drafter = _random_drafter()
    embedding = torch.nn.Embedding(10, 32).double()
    head = torch.nn.Linear(32, 10, bias=False).double()
    hidden = torch.randn(2, 32, dtype=torch.float64)
    tokens = torch.tensor([1, 2])
    base_embeds, base_logits = drafter.embed(tokens, embedding), drafter.logits(hidden, head)
    object.__setattr__(drafter.config, "input_embedding_scale", 3.0)
    object.__setattr__(drafter.config, "output_multiplier", 0.5)
    object.__setattr__(drafter.config, "final_logit_softcapping", 0.1)
    torch.testing.assert_close(drafter.embed(tokens, embedding), 3.0 * base_embeds)
    torch.testing.assert_close(drafter.logits(hidden, head), torch.tanh(0.5 * base_logits / 0.1) * 0.1)

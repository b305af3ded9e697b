"""The fused passes of the torch runtime: the target's (used only where it is bit-identical to
transformers' forward, or within float32 rounding on packed linears: tests/test_packed_linear.py)
and the drafter's decoding step (the same arithmetic as its unfused form)."""

from __future__ import annotations

import pytest
import torch

from trtllm_dflash import DFlashPipeline
from trtllm_dflash.checkpoints import load_drafter, load_target
from trtllm_dflash.modeling import fused_target
from trtllm_dflash.modeling.kv_cache import StaticKVCache
from trtllm_dflash.runtime.torch_runtime import TorchRuntime
from trtllm_dflash.testing.tiny import make_tiny_drafter, make_tiny_target


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fused")
    made = {}
    for family in ("qwen3", "llama", "gemma3"):
        target = make_tiny_target(root / family, family, seed=1)
        made[family] = (target, make_tiny_drafter(root / f"{family}-drafter", target, seed=2))
    return made


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_fused_target_is_used_and_decodes_the_same_tokens(pairs, family):
    target_dir, drafter_dir = pairs[family]
    prompts = [[5, 9, 14, 3], [7, 8, 9, 10, 11, 12, 13], [4]]
    tokens = {}
    for fused in (True, False):
        target = load_target(target_dir)
        runtime = TorchRuntime(target.model, load_drafter(drafter_dir, target=target), fused=fused)
        pipe = DFlashPipeline(runtime)
        outputs = pipe.generate(prompts, max_new_tokens=24, stop_token_ids=())
        assert (runtime.fused is not None) == fused
        tokens[fused] = [out.token_ids for out in outputs]
    assert tokens[True] == tokens[False]


def test_fused_target_refuses_other_layers(pairs):
    target = load_target(pairs["gemma3"][0])
    assert fused_target.unsupported_reason(target.model.get_decoder()) is not None
    runtime = TorchRuntime(target.model, load_drafter(pairs["gemma3"][1], target=target))
    runtime.allocate(2, 64)
    assert runtime.fused is None


def test_fused_target_survives_reallocation(pairs):
    target_dir, drafter_dir = pairs["qwen3"]
    pipe = DFlashPipeline.load(target_dir, drafter_dir)
    first = pipe.generate([[5, 6, 7]], max_new_tokens=12, stop_token_ids=(), max_batch=1)[0].token_ids
    again = pipe.generate([[5, 6, 7]], max_new_tokens=12, stop_token_ids=(), max_batch=3)[0].token_ids  # new caches
    assert pipe.runtime.fused is not None and first == again


def test_drafter_fused_step_matches_the_unfused_projections(pairs):
    target_dir, drafter_dir = pairs["qwen3"]
    drafter = load_drafter(drafter_dir, target=load_target(target_dir), dtype=torch.float64)
    config = drafter.config
    generator = torch.Generator().manual_seed(0)
    batch, n, block = 2, 3, config.block_size
    h = torch.randn(batch, block, config.hidden_size, generator=generator, dtype=torch.float64)
    ctx = torch.randn(batch, n, config.hidden_size, generator=generator, dtype=torch.float64)
    positions = torch.arange(n + block).expand(batch, -1) + torch.tensor([[4], [9]])
    rope = drafter.rope(h, positions)
    ctx_rope, block_rope = tuple(r[:, :n] for r in rope), tuple(r[:, n:] for r in rope)
    attn = drafter.layers[0].self_attn
    with torch.inference_mode():
        q, k, v, k_ctx, v_ctx = attn.project_step(h, ctx, rope)
        expected = (attn.project_queries(h, block_rope), *attn.project_keys_values(h, block_rope), *attn.project_keys_values(ctx, ctx_rope))
    for got, want in zip((q, k, v, k_ctx, v_ctx), expected):
        torch.testing.assert_close(got, want)


def test_drafter_stacked_weights_follow_in_place_updates(pairs):
    target_dir, drafter_dir = pairs["qwen3"]
    drafter = load_drafter(drafter_dir, target=load_target(target_dir))
    layer = drafter.layers[0]
    x = torch.randn(1, 4, drafter.config.hidden_size)
    with torch.inference_mode():
        before = layer.finish_step(x, torch.zeros_like(x))
    with torch.no_grad():
        layer.mlp.up_proj.weight.mul_(2.0)  # what an optimizer step does
    with torch.inference_mode():
        after = layer.finish_step(x, torch.zeros_like(x))
        expected = layer._finish(x, torch.zeros_like(x))
    assert not torch.equal(before, after)
    torch.testing.assert_close(after, expected)


def test_static_cache_layers_stay_allocated_for_the_fused_pass(pairs):
    target = load_target(pairs["qwen3"][0])
    runtime = TorchRuntime(target.model, None)
    runtime.allocate(1, 16)
    assert runtime.fused is not None
    assert all(layer.keys is not None for layer in runtime.target_cache.layers)
    assert isinstance(runtime.target_cache, StaticKVCache)

"""The fused target pass's GPU kernels (ops/kernels/fused_layer.py, here through Triton's
interpreter) against the op-by-op torch arithmetic they replace, and the in-place fused pass
(`FusedDecoder.forward_in_place`, the torch runtime's GPU path) decoding exactly like the unfused
pass on the same attention op: the same tokens and acceptance lengths, greedy and seeded."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from trtllm_dflash.decoding import Decoder, Request, SamplingParams  # noqa: E402
from trtllm_dflash.modeling import fused_ops  # noqa: E402
from trtllm_dflash.runtime.torch_runtime import TorchRuntime, relative_error  # noqa: E402


def both(monkeypatch, fn):
    """fn() with the torch arithmetic, then with the interpreted kernels."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    reference = fn()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    return reference, fn()


# float32: the same arithmetic up to reduction order; bf16: one rounding step where torch rounds per op
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_delta", [False, True])
def test_add_rms_norm_matches_the_torch_ops(monkeypatch, dtype, with_delta):
    g = torch.Generator().manual_seed(3 + with_delta)
    x = torch.randn(2, 3, 96, generator=g).to(dtype)  # 96: not a power of two, the tile is masked
    delta = torch.randn(2, 3, 96, generator=g).to(dtype) if with_delta else None
    weight = (1 + 0.1 * torch.randn(96, generator=g)).to(dtype)
    (ref_total, ref_norm), (total, normed) = both(monkeypatch, lambda: fused_ops.add_rms_norm(x, delta, weight, 1e-6))
    # one rounding of the sum in both (the interpreter's float32 -> bf16 conversion may round differently)
    assert relative_error(total, ref_total) < TOLERANCE[dtype]
    assert relative_error(normed, ref_norm) < TOLERANCE[dtype]
    assert torch.isfinite(normed).all() and normed.abs().sum() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_norm", [False, True])
@pytest.mark.parametrize("rope_part", [False, True])
def test_qk_norm_rope_matches_the_torch_ops(monkeypatch, dtype, with_norm, rope_part):
    """`rope_part`: cos/sin are the last 3 tokens of a 5-token pass's (the drafter's block after its
    context rows), which the kernel reads in place, batch rows 5 tokens apart."""
    q_heads, kv_heads, head_dim = 4, 2, 16
    g = torch.Generator().manual_seed(5 + with_norm)
    qkv = torch.randn(2, 3, (q_heads + 2 * kv_heads) * head_dim, generator=g).to(dtype)
    angles = torch.rand(2, 5 if rope_part else 3, head_dim // 2, generator=g) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype)
    if rope_part:
        cos, sin = cos[:, 2:], sin[:, 2:]
        assert not cos.is_contiguous() and fused_ops._rope_rows(cos) is cos
    norm = ((1 + 0.1 * torch.randn(q_heads + kv_heads, head_dim, generator=g)).to(dtype), 1e-6) if with_norm else None
    reference, kernel = both(monkeypatch, lambda: fused_ops.qk_norm_rope(qkv, cos, sin, norm, q_heads, kv_heads, head_dim))
    for ours, expected, heads in zip(kernel, reference, (q_heads, kv_heads, kv_heads)):
        assert ours.shape == (2, 3, heads, head_dim) and ours.is_contiguous()
        assert relative_error(ours, expected) < TOLERANCE[dtype]
    assert torch.equal(kernel[2], reference[2])  # v is copied out untouched


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_matches_the_torch_ops(monkeypatch, dtype):
    g = torch.Generator().manual_seed(7)
    gate_up = (3 * torch.randn(4, 2 * 1100, generator=g)).to(dtype)  # 1100: two programs, the second masked
    reference, kernel = both(monkeypatch, lambda: fused_ops.silu_mul(gate_up))
    assert kernel.shape == (4, 1100)
    assert relative_error(kernel, reference) < TOLERANCE[dtype]


def _decode(runtime, prompts, params):
    decoder = Decoder(runtime, max_batch=2, max_context=48)
    return [(r.token_ids, r.acceptance_lengths) for r in decoder.generate([Request(p, s) for p, s in zip(prompts, params)])]


def test_the_rope_table_holds_the_rotary_embeddings_values_for_every_position():
    """RopeTable: the rows of a pass's positions are what the model's rotary embedding computes for
    them, bit for bit, far positions included; one past the table reads its last row (never out of
    bounds); an embedding whose values depend on more than the position gets no table."""
    import types

    from trtllm_dflash.bench import gpu_step

    target, _ = gpu_step.make_models(gpu_step.TINY, torch.device("cpu"), torch.float32)
    rotary = target.model.rotary_emb  # Qwen3's, default type
    positions = torch.tensor([[4000, 4001, 4002, 17], [0, 1, 2, 4999]])
    for dtype in (torch.float32, torch.bfloat16):
        table = fused_ops.RopeTable.of(rotary, 5000, dtype, torch.device("cpu"))
        cos, sin = table.rows(positions)
        want_cos, want_sin = rotary(torch.empty(0, dtype=dtype), positions)
        assert cos.dtype == dtype and torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
        past = table.rows(torch.tensor([[5000, 7000]]))
        assert torch.equal(past[0], want_cos[1, 3].expand(1, 2, -1)) and torch.equal(past[1], want_sin[1, 3].expand(1, 2, -1))
    assert fused_ops.RopeTable.of(types.SimpleNamespace(rope_type="dynamic"), 10, torch.float32, torch.device("cpu")) is None


def test_the_in_place_fused_pass_decodes_like_the_unfused_one(monkeypatch):
    """Kernels interpreted on both sides (the attention op too): only the fused pass differs. The
    probe must accept it (it is the path a GPU takes), and a pass that computes something else
    must be refused by the same probe."""
    from trtllm_dflash.bench import gpu_step

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    target, drafter = gpu_step.make_models(gpu_step.TINY, torch.device("cpu"), torch.float32)
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 500, (n,), generator=g).tolist() for n in (5, 8)]
    params = [SamplingParams(max_new_tokens=4), SamplingParams(max_new_tokens=4, temperature=0.8, top_k=20, seed=3)]
    runs = {}
    for fused in (False, True):
        runtime = TorchRuntime(target, drafter, attention="dflash", fused=fused)
        runs[fused] = _decode(runtime, prompts, params)
        assert (runtime.fused is not None) == fused
        if fused:  # its cos/sin, and the drafter's, gathered from tables of every position a pass reaches
            assert runtime.fused.rope_table.length == drafter.rope_table.length == runtime.capacity + drafter.config.block_size
        runtime.taps.remove()
    assert runs[True] == runs[False] and all(len(tokens) == 4 for tokens, _ in runs[True])

    monkeypatch.setattr(fused_ops, "_kernels", lambda device: None)  # the torch arithmetic ...
    monkeypatch.setattr("trtllm_dflash.modeling.fused_target.silu_mul_linear", lambda *a: fused_ops.silu_mul_linear(*a) * 1.1)
    wrong = TorchRuntime(target, drafter, attention="dflash")  # ... with a wrong MLP: the probe refuses it
    wrong.allocate(2, 48)
    assert wrong.fused is None
    wrong.taps.remove()


def test_the_drafter_step_with_the_kernels_matches_its_torch_arithmetic(monkeypatch):
    """The drafter's decoding step takes the same kernels on a GPU (norms, each with the residual add
    of the layer before, q/k norm + RoPE of the block and of the injected context rows read in place,
    SiLU * up), with cos/sin computed or gathered from a RopeTable: float32 logits within 1e-5 of
    its torch code, over two layers and two rows."""
    import dataclasses

    from trtllm_dflash.bench import gpu_step
    from trtllm_dflash.modeling.kv_cache import StaticKVCache

    shape = dataclasses.replace(gpu_step.TINY, draft_layers=2)
    target, drafter = gpu_step.make_models(shape, torch.device("cpu"), torch.float32)
    config = drafter.config
    g = torch.Generator().manual_seed(13)
    block = torch.randint(0, 500, (2, shape.block), generator=g)
    features = torch.randn(2, 3, len(shape.target_layer_ids) * shape.hidden, generator=g)
    new_counts, cache_lens = torch.tensor([3, 2]), torch.tensor([5, 9])

    def draft():
        cache = StaticKVCache(
            config.num_hidden_layers, 2, 40, config.num_key_value_heads, config.head_dim, torch.float32, torch.device("cpu")
        )
        for layer in cache.layers:
            layer.keys.copy_(torch.randn(layer.keys.shape, generator=torch.Generator().manual_seed(1)))
            layer.values.copy_(torch.randn(layer.values.shape, generator=torch.Generator().manual_seed(2)))
        embeds = drafter.embed(block, target.get_input_embeddings())
        hidden = drafter.step(embeds, features, new_counts, cache_lens, cache.rows(slice(0, 2)))
        # each row's context after the step (past it the CPU path keeps the block's keys as scratch:
        # modeling/draft_attention.py)
        context = [cache.layers[0].keys[r, : int(cache_lens[r] + new_counts[r])] for r in range(2)]
        return drafter.logits(hidden[:, 1:], target.get_output_embeddings()), torch.cat(context).clone()

    (ref_logits, ref_keys), (logits, keys) = both(monkeypatch, draft)
    assert relative_error(logits, ref_logits) < 1e-5
    assert relative_error(keys, ref_keys) < 1e-5  # the context rows' keys were written through the kernel
    # with cos/sin gathered from a table, as the runtime sets one where the kernels run (the torch
    # arithmetic's step ignores it and computes them)
    drafter.rope_table = fused_ops.RopeTable.of(drafter.rotary_emb, 40 + shape.block, torch.float32, torch.device("cpu"))
    (ref_logits, ref_keys), (logits, keys) = both(monkeypatch, draft)
    assert relative_error(logits, ref_logits) < 1e-5 and relative_error(keys, ref_keys) < 1e-5

"""The fused target pass on a GPU (issue 39): its compiled kernels against the torch arithmetic, and
the torch runtime's GPU path (the in-place fused pass, CUDA graphs on) decoding like the unfused
pass. Skipped where no GPU is visible (every CI machine); `make gpu-check` runs it."""

from __future__ import annotations

import pytest
import torch

from trtllm_dflash.bench import gpu_step
from trtllm_dflash.decoding import Decoder, Request, SamplingParams
from trtllm_dflash.modeling import fused_ops
from trtllm_dflash.runtime.torch_runtime import FUSED_TOLERANCE, TorchRuntime, relative_error

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)"),
]


def _reference(monkeypatch, fn):
    with monkeypatch.context() as patch:
        patch.setattr(fused_ops, "_kernels", lambda device: None)
        return fn()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_kernels_match_the_torch_ops(monkeypatch, dtype):
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    g = torch.Generator(device="cuda").manual_seed(1)
    x, delta = (torch.randn(3, 16, 4096, device="cuda", generator=g).to(dtype) for _ in range(2))
    weight = (1 + 0.1 * torch.randn(4096, device="cuda", generator=g)).to(dtype)
    for ours, ref in zip(
        fused_ops.add_rms_norm(x, delta, weight, 1e-6), _reference(monkeypatch, lambda: fused_ops.add_rms_norm(x, delta, weight, 1e-6))
    ):
        assert relative_error(ours, ref) < tolerance
    qkv = torch.randn(3, 16, 48 * 128, device="cuda", generator=g).to(dtype)
    angles = torch.rand(3, 16, 64, device="cuda", generator=g) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype)
    norm = ((1 + 0.1 * torch.randn(40, 128, device="cuda", generator=g)).to(dtype), 1e-6)
    args = (qkv, cos, sin, norm, 32, 8, 128)
    for ours, ref in zip(fused_ops.qk_norm_rope(*args), _reference(monkeypatch, lambda: fused_ops.qk_norm_rope(*args))):
        assert relative_error(ours, ref) < tolerance
    gate_up = 3 * torch.randn(48, 2 * 12288, device="cuda", generator=g).to(dtype)
    assert relative_error(fused_ops.silu_mul(gate_up), _reference(monkeypatch, lambda: fused_ops.silu_mul(gate_up))) < tolerance


def _decode(runtime, prompts, params):
    decoder = Decoder(runtime, max_batch=2, max_context=160)
    results = decoder.generate([Request(p, s) for p, s in zip(prompts, params)])
    runtime.taps.remove()
    return [(r.token_ids, r.acceptance_lengths) for r in results]


@pytest.mark.parametrize("graphs", [False, True])
def test_the_fused_gpu_pass_decodes_like_the_unfused_one(graphs):
    """float32, so the only difference is the fusion: same tokens and acceptance, greedy and seeded."""
    target, drafter = gpu_step.make_models(gpu_step.TINY, torch.device("cuda"), torch.float32)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 500, (n,), generator=g).tolist() for n in (9, 40, 23)]
    params = [
        SamplingParams(max_new_tokens=48),
        SamplingParams(max_new_tokens=48, temperature=0.8, top_k=20, seed=5),
        SamplingParams(max_new_tokens=30, temperature=1.0, top_p=0.9, seed=6),
    ]
    fused = TorchRuntime(target, drafter, attention="dflash", cuda_graphs=graphs)
    ours = _decode(fused, prompts, params)
    assert fused.fused is not None
    assert ours == _decode(TorchRuntime(target, drafter, attention="dflash", fused=False), prompts, params)


def test_the_fused_pass_at_qwen3_8b_width_is_within_tolerance_of_transformers():
    """bf16, Qwen3-8B's layer shape (2 layers): the probe accepts the fused pass, and a prefill's
    logits and tapped features are within FUSED_TOLERANCE of transformers' own attention and forward."""
    shape = gpu_step.StepShape("qwen3-8b-2-layers", 2, 4096, 32, 8, 128, 12288, 151936, 1, 16, (0, 1))
    target, drafter = gpu_step.make_models(shape, torch.device("cuda"), torch.bfloat16)
    tokens = torch.randint(0, 151936, (2, 33), device="cuda")
    starts = torch.zeros(2, dtype=torch.long, device="cuda")
    outs = []
    for attention in ("dflash", "hf"):
        runtime = TorchRuntime(target, drafter, attention=attention)
        runtime.allocate(2, 64)
        assert (runtime.fused is not None) == (attention == "dflash")
        outs.append(runtime.target_forward(slice(0, 2), tokens, starts, 33))
        runtime.taps.remove()
    assert relative_error(outs[0].logits, outs[1].logits) < FUSED_TOLERANCE[torch.bfloat16]
    assert relative_error(outs[0].features, outs[1].features) < FUSED_TOLERANCE[torch.bfloat16]

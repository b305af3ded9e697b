"""Programmatic dependent launches on a GPU (ops/kernels/dependent_launch.py): the same bits.

A dependent launch changes when a kernel's programs start, never what they compute; a kernel that
touched memory before its wait would read what the kernel ahead had not yet written, and give
other bits, or other bits on some replays. These compare the passes replayed from CUDA graphs,
ordinary against dependent, bit for bit, at Qwen3-8B's width (kernels long enough to overlap),
and decode the demo pair both ways.

Skipped where no GPU is visible (every CI machine), and on GPUs before Hopper, which have no grid
dependency control. On a GPU machine: `pytest tests/test_dependent_launch_gpu.py`
(`benchmarks/gpu_window.sh tests` runs it).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trtllm_dflash.decoding import Decoder, Request, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)"),
    pytest.mark.skipif(
        torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0),
        reason="programmatic dependent launch needs compute capability 9.0 (Hopper) or later",
    ),
]


@pytest.mark.parametrize("kv_splits", [None, 4], ids=["default splits", "4 KV splits"])
def test_replayed_passes_give_the_ordinary_launches_bits_at_qwen3_8b_width(monkeypatch, kv_splits):
    """The verify, AR and draft passes (skinny projections, the attention op, the fused-layer
    kernels: every kernel a dependent launch) replayed 20 times from graphs captured with dependent
    launches: every replay gives the ordinary graphs' logits bit for bit."""
    from trtllm_dflash.bench import gpu_step
    from trtllm_dflash.ops.kernels import launch
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    if kv_splits is not None:
        monkeypatch.setattr(launch, "default_target_kv_splits", lambda *shape: kv_splits)
        monkeypatch.setattr(launch, "default_kv_splits", lambda *shape: kv_splits)
    shape = dataclasses.replace(gpu_step.QWEN3_8B, layers=2, draft_layers=2, target_layer_ids=(0, 1))
    device = torch.device("cuda")
    target, drafter = gpu_step.make_models(shape, device, torch.bfloat16)
    runtime = TorchRuntime(target, drafter, attention="dflash", linear_choice="skinny")
    batch, context = 2, 700
    runtime.allocate(batch, 1024)
    assert runtime.fused is not None
    g = torch.Generator().manual_seed(0)
    for cache in (runtime.target_cache, runtime.draft_cache):
        for layer in cache.layers:
            if layer.keys is not None:
                layer.keys.copy_(torch.randn(layer.keys.shape, generator=g))
                layer.values.copy_(torch.randn(layer.values.shape, generator=g))
    rows = slice(0, batch)
    tokens = torch.randint(0, shape.vocab, (batch, shape.block), generator=g).to(device)
    starts = torch.tensor([context, context - 300], device=device)
    features = torch.randn(batch, shape.block, 2 * shape.hidden, generator=g).to(device, torch.bfloat16)
    block = torch.full((batch, shape.block), runtime.drafter_config.mask_token_id, dtype=torch.long, device=device)
    new_counts = torch.tensor([shape.block, 5], device=device)
    passes = {
        # the passes write the block's keys/values where they read them: the same slots every replay
        "verify": lambda: runtime.target_forward(rows, tokens, starts, context + shape.block).logits,
        "AR": lambda: runtime.target_forward(rows, tokens[:, :1], starts, context + 1).logits,
        "draft": lambda: runtime.draft_forward(rows, block, features, new_counts, starts - new_counts),
    }
    for name, run in passes.items():
        _assert_replays_agree(runtime, lambda run=run: (run(),), name)
    runtime.taps.remove()


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_demo_pair_decodes_the_same_tokens_with_dependent_launches(temperature):
    from trtllm_dflash import demo
    from trtllm_dflash.checkpoints import load_drafter, load_target
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    target = load_target(demo.target_dir(), device="cuda", dtype=torch.bfloat16)
    drafter = load_drafter(demo.drafter_dir(), target=target, device="cuda")
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(max_new_tokens=48, temperature=temperature, seed=11)
    prompts = [torch.randint(3, target.model.config.vocab_size, (7 + 5 * i,), generator=g).tolist() for i in range(4)]
    decoded = {}
    for dependent in (False, True):
        runtime = TorchRuntime(target.model, drafter, cuda_graphs=True, linear_choice="skinny", dependent_launch=dependent)
        results = Decoder(runtime, max_batch=3, max_context=1024).generate([Request(list(p), params) for p in prompts])
        decoded[dependent] = [(r.token_ids, r.acceptance_lengths) for r in results]
        runtime.taps.remove()
    assert decoded[True] == decoded[False]


@pytest.mark.parametrize("form", ["positions", "spread", "shortlist"])
def test_replayed_verification_gives_the_ordinary_launches_decisions(form):
    """A step's verification by each kernel form, after the drafter's samples (by the shortlist
    kernels, in the graph, where that form verifies), at Qwen3's vocabulary: replayed 20 times from
    graphs captured with dependent launches, every replay gives the ordinary graphs' drafts, q and
    decisions."""
    from trtllm_dflash.bench import gpu_step
    from trtllm_dflash.runtime import verify_choice
    from trtllm_dflash.runtime.base import SamplingTensors, draft_positions
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    device, vocab, block = torch.device("cuda"), gpu_step.QWEN3_8B.vocab, gpu_step.QWEN3_8B.block
    target, drafter = gpu_step.make_models(dataclasses.replace(gpu_step.TINY, vocab=vocab), device, torch.bfloat16)
    runtime = TorchRuntime(target, drafter)
    runtime.verify_choices = verify_choice.VerifyChoices(form)
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, block, vocab, generator=g) * 3).to(device, torch.bfloat16)
    draft_logits = (torch.randn(2, block - 1, vocab, generator=g) * 3).to(device, torch.bfloat16)
    anchors, starts = torch.randint(0, vocab, (2, 1), generator=g).to(device), torch.tensor([700, 400], device=device)
    sampling = SamplingTensors(
        torch.tensor([0.0, 0.8], device=device), torch.tensor([0, 50], device=device), torch.tensor([1.0, 0.9], device=device),
        torch.tensor([3, 4], device=device), (True, False), (0, 50), (1.0, 0.9),
    )  # fmt: skip

    positions = draft_positions(starts, block - 1)
    # the other forms' drafts come from torch's ops, which launch no kernel of ours: drawn once, outside the graphs
    drafted = runtime.draft_head(draft_logits, sampling, positions)

    def step() -> tuple[torch.Tensor, ...]:
        proposal = runtime.draft_head(draft_logits, sampling, positions) if form == "shortlist" else drafted
        accepted, bonus = runtime.verify(logits, torch.cat([anchors, proposal.tokens], dim=1), proposal.probs, sampling, starts)
        return proposal.tokens, proposal.probs, accepted, bonus

    _assert_replays_agree(runtime, step, form)


def _assert_replays_agree(runtime, run, name: str) -> None:
    """`run` (returning a tuple of tensors) captured in a CUDA graph with ordinary launches and with
    dependent ones, each replayed 20 times: every replay gives the first ordinary replay's bits."""
    from trtllm_dflash.runtime import cuda_graphs

    outputs = {}
    for dependent in (False, True):
        runtime.dependent_launch = dependent
        replay, out = cuda_graphs.capture(run, torch.cuda.graph_pool_handle())
        replays = []
        for _ in range(20):
            replay()
            replays.append([o.clone() for o in out])
        outputs[dependent] = replays
    want = outputs[False][0]
    for dependent, replays in outputs.items():
        for replay in replays:
            same = all(torch.equal(got, expected) for got, expected in zip(replay, want, strict=True))
            assert same, (
                f"{name}: {'a dependent replay differs from the ordinary launches' if dependent else 'the ordinary replays differ'}"
            )

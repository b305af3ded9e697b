"""`plugins.ops` dispatch and the `dflash::` custom ops: the torch runtime runs the Triton kernels
(compiled on CUDA; here through Triton's interpreter with TRITON_INTERPRET=1) and decodes exactly
as with the torch reference."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from trtllm_dflash import ops
from trtllm_dflash.api import DFlashPipeline  # noqa: E402
from trtllm_dflash.ops import (
    custom_ops,
    reference,  # noqa: E402
    reference_attention,  # noqa: E402
)
from trtllm_dflash.ops.kernels import launch  # noqa: E402


def attention_args(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(2, 4, 4, 16, generator=g),
        torch.randn(2, 4, 2, 16, generator=g),
        torch.randn(2, 4, 2, 16, generator=g),
        torch.randn(2, 3, 2, 16, generator=g),
        torch.randn(2, 3, 2, 16, generator=g),
        torch.tensor([3, 2]),
        torch.zeros(2, 20, 2, 16),
        torch.zeros(2, 20, 2, 16),
        torch.tensor([4, 0]),
        0.25,
        0,
    )


def test_ops_use_the_reference_on_cpu_and_the_kernels_when_asked(monkeypatch):
    calls = []
    monkeypatch.setattr(launch, "block_attention", lambda *a, **k: calls.append("kernel") or reference_attention.block_attention(*a, **k))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not custom_ops.kernels_enabled(torch.device("cpu"))
    ops.block_attention(*attention_args())
    assert calls == []
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert custom_ops.kernels_enabled(torch.device("cpu"))
    ops.block_attention(*attention_args())
    assert calls == ["kernel"]


def test_custom_ops_match_the_reference_and_append_in_place(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    args, ref_args = attention_args(1), attention_args(1)
    out = ops.block_attention(*args)
    expected = reference_attention.block_attention(*ref_args)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(args[6], ref_args[6]) and args[6].abs().sum() > 0  # the caches were written

    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 5, 40, generator=g)
    tokens = torch.randint(0, 40, (3, 5), generator=g)
    draft = torch.softmax(torch.randn(3, 4, 40, generator=g), -1)
    sampling = (
        torch.tensor([0.0, 1.0, 0.5]),
        torch.tensor([0, 5, 0]),
        torch.tensor([1.0, 1.0, 0.8]),
        torch.tensor([1, 2, 3]),
        torch.tensor([7, 8, 9]),
    )
    accepted, bonus = ops.verify_block(logits, tokens, draft, *sampling)
    ref_accepted, ref_bonus = reference.verify_block(logits, tokens, draft, *sampling)
    assert torch.equal(accepted, ref_accepted) and torch.equal(bonus, ref_bonus)
    assert torch.equal(
        ops.verify_block_packed(logits, tokens, draft, *sampling), reference.verify_block_packed(logits, tokens, draft, *sampling)
    )


def test_fake_implementations_let_torch_export_trace_the_ops():
    class Layer(torch.nn.Module):
        def forward(self, *args):
            out, k_cache, v_cache = torch.ops.dflash.block_attention_functional(*args, 0.25, 0)
            logits = out.flatten(2)[..., :40]
            result = torch.ops.dflash.verify_block(
                logits,
                logits.argmax(-1),
                None,
                logits[:, 0, 0] * 0,
                logits[:, 0, 0].long() * 0,
                logits[:, 0, 0] * 0 + 1,
                logits[:, 0, 0].long(),
                logits[:, 0, 0].long(),
            )
            return out, k_cache, v_cache, result

    program = torch.export.export(Layer(), attention_args()[:9])
    targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert {"dflash.block_attention_functional.default", "dflash.verify_block.default"} <= targets
    shapes = [tuple(s.meta["val"].shape) for s in program.graph.output_node().args[0]]
    assert shapes == [(2, 4, 4, 16), (2, 20, 2, 16), (2, 20, 2, 16), (2, 5)]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_decoding_with_the_kernels_is_identical_to_the_reference(monkeypatch, tiny_qwen3, tiny_qwen3_drafter, temperature):
    prompts = [[5, 9, 14, 3, 22, 7], [30, 4, 4, 17]]  # ragged batch
    # sampled rows cost the interpreter far more per program: fewer tokens (top-k/top-p rows are
    # compared kernel-to-reference in test_plugin_verify.py)
    kwargs = dict(max_new_tokens=6 if temperature else 10, temperature=temperature, seed=11, stop_token_ids=())
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    expected = DFlashPipeline.load(tiny_qwen3, tiny_qwen3_drafter).generate(prompts, **kwargs)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    calls = {"attention": 0, "verify": 0}
    for name in calls:
        original = getattr(launch, {"attention": "block_attention", "verify": "verify_block"}[name])
        monkeypatch.setattr(
            launch, original.__name__, lambda *a, _f=original, _n=name, **k: calls.__setitem__(_n, calls[_n] + 1) or _f(*a, **k)
        )
    got = DFlashPipeline.load(tiny_qwen3, tiny_qwen3_drafter).generate(prompts, **kwargs)
    assert calls["attention"] > 0 and calls["verify"] > 0  # the kernels really ran
    for mine, theirs in zip(got, expected):
        assert mine.token_ids == theirs.token_ids
        assert mine.acceptance_lengths == theirs.acceptance_lengths

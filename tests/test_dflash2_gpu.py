"""DFlash V2's compiled kernels on an NVIDIA GPU against `reference_dflash2`, at a real drafter's
sizes (hidden 5120, a 151,936 vocabulary, rank 256, k 16).

Skipped where no GPU is visible (every CI machine). On a GPU machine: `pytest tests/test_dflash2_gpu.py`.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from trtllm_dflash.ops import reference_dflash2  # noqa: E402
from trtllm_dflash.ops.kernels import dflash2_launch  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)"),
]


@pytest.mark.parametrize("residual", [False, True])
def test_conv_on_the_gpu(residual):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 16, 5120, generator=g).bfloat16().cuda()
    delta = torch.randn(4, 16, 2, 320, generator=g).bfloat16().cuda()
    base = torch.randn(2, 5120, generator=g).bfloat16().cuda()
    res = torch.randn(4, 16, 5120, generator=g).cuda() if residual else None
    got = dflash2_launch.grouped_dynamic_conv(x, delta, base, res)
    want = reference_dflash2.grouped_dynamic_conv(x, delta, base, res)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=1e-2)


def test_selector_on_the_gpu():
    g = torch.Generator().manual_seed(1)
    batch, steps, vocab, rank = 4, 15, 151936, 256
    unary = (torch.randn(batch, steps, vocab, generator=g) * 3).bfloat16().cuda()
    z = torch.randn(batch, steps, rank, generator=g).bfloat16().cuda()
    predecessor = (torch.randn(vocab, rank, generator=g) * 0.2).bfloat16().cuda()
    successor = (torch.randn(vocab, rank, generator=g) * 0.2).bfloat16().cuda()
    args = (
        unary,
        z,
        torch.tensor([1, 2, 3, 4]).cuda(),
        predecessor,
        successor,
        torch.tensor([0.0, 1.0, 0.7, 0.0]).cuda(),
        torch.tensor([5, 6, 7, 8]).cuda(),
        (torch.arange(batch * steps).view(batch, steps) + 100).cuda(),
    )
    tokens, cand, probs = dflash2_launch.candidate_select(*args, 16)
    want_tokens, want_cand, want_probs = reference_dflash2.candidate_select(*args, 16)
    assert torch.equal(cand, want_cand)
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(probs, want_probs, atol=1e-5, rtol=1e-4)

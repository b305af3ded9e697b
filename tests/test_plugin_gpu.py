"""The compiled Triton kernels on an NVIDIA GPU against the torch reference.

Skipped where no GPU is visible (every CI machine). On a GPU machine: `pytest tests/test_plugin_gpu.py`.
"""

from __future__ import annotations

import pytest
import torch
from support import GPU_TOLERANCE, target_case_past_capacity

pytest.importorskip("triton")

from trtllm_dflash import ops
from trtllm_dflash.ops import reference, reference_attention, rng  # noqa: E402
from trtllm_dflash.ops.kernels import launch  # noqa: E402
from trtllm_dflash.ops.kernels.verify_shortlist_launch import (  # noqa: E402
    sample_drafts_shortlist,
    verify_block_shortlist,
    verify_positions_shortlist,
)
from trtllm_dflash.ops.kernels.verify_spread_launch import verify_block_spread  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)"),
]


def attention_case(batch, block, heads, kv_heads, head_dim, capacity, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    new = 8
    return dict(
        q=torch.randn(batch, block, heads, head_dim, generator=g).to(dtype),
        k_block=torch.randn(batch, block, kv_heads, head_dim, generator=g).to(dtype),
        v_block=torch.randn(batch, block, kv_heads, head_dim, generator=g).to(dtype),
        k_ctx_new=torch.randn(batch, new, kv_heads, head_dim, generator=g).to(dtype),
        v_ctx_new=torch.randn(batch, new, kv_heads, head_dim, generator=g).to(dtype),
        new_counts=torch.randint(0, new + 1, (batch,), generator=g),
        k_cache=torch.randn(batch, capacity, kv_heads, head_dim, generator=g).to(dtype),
        v_cache=torch.randn(batch, capacity, kv_heads, head_dim, generator=g).to(dtype),
        cache_lens=torch.randint(0, capacity - new, (batch,), generator=g),
        scale=head_dim**-0.5,
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(32, 8, 128), (16, 16, 64), (8, 1, 256)])
@pytest.mark.parametrize("kv_splits,window", [(1, 0), (None, 0), (7, 0), (1, 40)])
def test_block_attention_on_gpu(dtype, heads, kv_heads, head_dim, kv_splits, window):
    case = attention_case(3, 16, heads, kv_heads, head_dim, 3000, dtype)
    gpu = {k: v.cuda() if torch.is_tensor(v) else v for k, v in case.items()}
    out = launch.block_attention(**gpu, window=window, kv_splits=kv_splits)
    expected = reference_attention.block_attention(**case, window=window)
    torch.testing.assert_close(out.cpu().float(), expected.float(), atol=GPU_TOLERANCE[dtype], rtol=GPU_TOLERANCE[dtype])
    assert torch.equal(gpu["k_cache"].cpu(), case["k_cache"]) and torch.equal(gpu["v_cache"].cpu(), case["v_cache"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(
    "heads,kv_heads,key_dim,value_dim,tokens",
    [(32, 8, 128, 128, 16), (64, 8, 64, 64, 16), (16, 16, 128, 64, 1), (32, 16, 256, 256, 7), (32, 8, 128, 128, 300)],
)
@pytest.mark.parametrize("window,with_sinks", [(0, False), (0, True), (128, True), (1000, False)])
def test_target_attention_on_gpu(dtype, heads, kv_heads, key_dim, value_dim, tokens, window, with_sinks):
    case = target_case_past_capacity(4, tokens, heads, kv_heads, key_dim, value_dim, 3000, dtype)
    sinks = torch.randn(heads, generator=torch.Generator().manual_seed(1)) if with_sinks else None
    gpu = {k: v.cuda() for k, v in case.items()}
    out = launch.target_attention(**gpu, sinks=None if sinks is None else sinks.cuda(), scale=key_dim**-0.5, window=window)
    expected = reference_attention.target_attention(**case, sinks=sinks, scale=key_dim**-0.5, window=window)
    torch.testing.assert_close(out.cpu().float(), expected.float(), atol=GPU_TOLERANCE[dtype], rtol=GPU_TOLERANCE[dtype])
    assert torch.equal(gpu["k_cache"].cpu(), case["k_cache"]) and torch.equal(gpu["v_cache"].cpu(), case["v_cache"])


def test_target_attention_never_reads_past_a_rows_positions_on_gpu():
    case = target_case_past_capacity(3, 16, 32, 8, 128, 128, 2048, torch.bfloat16)
    clean = launch.target_attention(**{k: v.clone().cuda() for k, v in case.items()}, sinks=None, scale=0.1, window=0)
    for r, start in enumerate(case["starts"].tolist()):
        case["k_cache"][r, start:] = float("nan")
        case["v_cache"][r, start:] = float("nan")
    dirty = launch.target_attention(**{k: v.cuda() for k, v in case.items()}, sinks=None, scale=0.1, window=0)
    assert torch.equal(dirty, clean)


@pytest.mark.parametrize("vocab", [151936, 32001])  # aligned rows (16-byte loads), and not
def test_verification_on_gpu_is_identical_to_the_reference(vocab):
    g = torch.Generator().manual_seed(1)
    batch, block = 8, 16
    logits = torch.randn(batch, block, vocab, generator=g) * 4
    temperature = torch.tensor([0.0, 1.0, 0.7, 1.0, 0.0, 0.9, 1.2, 0.6])
    top_k = torch.tensor([0, 0, 50, 0, 0, 20, 0, 1000])
    top_p = torch.tensor([1.0, 1.0, 1.0, 0.9, 1.0, 0.8, 0.95, 1.0])
    draft = reference.process_logits(logits[:, :-1] + torch.randn(batch, block - 1, vocab, generator=g), temperature, top_k, top_p)
    tokens = torch.cat([torch.zeros(batch, 1, dtype=torch.long), logits[:, :-1].argmax(-1)], dim=1)
    seed, start = torch.arange(batch) * 31 + 7, torch.arange(batch) * 100
    args = (logits, tokens, draft, temperature, top_k, top_p, seed, start)
    got = ops.verify_block_packed(*(a.cuda() for a in args))
    assert torch.equal(got.cpu(), reference.verify_block_packed(*args))
    spread = verify_block_spread(*(a.cuda() for a in args))  # every pass spread over the vocabulary
    assert torch.equal(spread.cpu(), reference.verify_block_packed(*args))
    shortlist = verify_block_shortlist(*(a.cuda() for a in args))  # two reads of the logits for the top-k rows
    assert torch.equal(shortlist.cpu(), reference.verify_block_packed(*args))
    _, walked = verify_positions_shortlist(*(a.cuda() for a in args), with_walked=True)
    assert walked.cpu().tolist() == [[r in (1, 3, 6, 7)] * block for r in range(batch)]  # top-k 0 or above 64 walk
    # the drafter's samples by the same kernels: the reference's tokens, its q to float rounding
    positions = start.view(-1, 1) + torch.arange(1, block)
    sampling = (logits[:, :-1], temperature, top_k, top_p, seed, positions)
    want_tokens, want_q = reference.sample_tokens(*sampling, rng.STREAM_DRAFT)
    tokens, q = sample_drafts_shortlist(*(a.cuda() for a in sampling))
    assert torch.equal(tokens.cpu(), want_tokens)
    torch.testing.assert_close(q.cpu(), want_q, rtol=1e-5, atol=1e-7)

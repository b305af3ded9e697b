"""The compiled target-attention KV split on an NVIDIA GPU against the torch reference and the unsplit
kernel. Skipped where no GPU is visible (every CI machine); `make gpu-check` runs it."""

from __future__ import annotations

import pytest
import torch
from support import GPU_TOLERANCE, target_case_past_capacity

pytest.importorskip("triton")


from trtllm_dflash.ops import reference_attention  # noqa: E402
from trtllm_dflash.ops.kernels import launch  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)"),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("kv_splits", [None, 3, 16])  # None: what the shape picks
@pytest.mark.parametrize("window,with_sinks", [(0, False), (128, True)])
def test_target_attention_kv_split_on_gpu(dtype, kv_splits, window, with_sinks):
    # a Qwen3-8B verify step over up to 8k of context, rows ragged (one at 0, one past the capacity)
    case = target_case_past_capacity(2, 16, 32, 8, 128, 128, 8208, dtype)
    sinks = torch.randn(32, generator=torch.Generator().manual_seed(1)) if with_sinks else None
    options = dict(sinks=None if sinks is None else sinks.cuda(), scale=128**-0.5, window=window)
    split, unsplit = {k: v.cuda() for k, v in case.items()}, {k: v.cuda() for k, v in case.items()}
    out = launch.target_attention(**split, **options, kv_splits=kv_splits)
    one = launch.target_attention(**unsplit, **options, kv_splits=1)
    expected = reference_attention.target_attention(**case, sinks=sinks, scale=128**-0.5, window=window)
    tol = GPU_TOLERANCE[dtype]
    torch.testing.assert_close(out.cpu().float(), expected.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(out.float(), one.float(), atol=tol, rtol=tol)
    assert torch.equal(split["k_cache"].cpu(), case["k_cache"]) and torch.equal(split["v_cache"].cpu(), case["v_cache"])


def test_the_shape_picks_splits_on_this_gpu():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert launch.default_target_kv_splits(1, 8, 1, 16, 8208, torch.device("cuda")) == launch.target_kv_splits(1, 8, 1, 8192, sms) > 1
    assert launch.default_target_kv_splits(64, 8, 1, 16, 8208, torch.device("cuda")) == 1


@pytest.mark.parametrize("tokens", [1, 16])
def test_the_merge_in_the_split_launch_gives_the_two_launch_bits_on_gpu(tokens):
    """On a GPU any split of a tile can be its last: the one-launch form (attention_merge.py) gives
    the bits of the split and merge launches on every one of 20 launches (a merge that read a
    partial not yet stored would differ), and leaves the tile counters zero."""
    from trtllm_dflash.ops.kernels import tile_counters

    case = {k: v.cuda() for k, v in target_case_past_capacity(2, tokens, 32, 8, 128, 128, 8208, torch.bfloat16).items()}
    options = dict(sinks=None, scale=128**-0.5, window=0, kv_splits=16)
    separate = launch.target_attention(**{k: v.clone() for k, v in case.items()}, **options, merge_in_launch=False)
    for _ in range(20):
        merged = launch.target_attention(**{k: v.clone() for k, v in case.items()}, **options)
        assert torch.equal(merged, separate)
    assert not tile_counters._COUNTERS[torch.device("cuda", torch.cuda.current_device())].any()

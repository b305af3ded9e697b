"""Split attention merged in the split launch (ops/kernels/attention_merge.py), in Triton's interpreter.

Each query tile's last KV split merges every split's partials; the result must be the bits of the
plugins' two launches (the split kernel, then `merge_kernel`), which the other attention tests
compare with the reference. A GPU runs the programs in any order, so any split can be the last: the
merged launches here run their programs in a seeded random order (`shuffled_programs`; Triton's
interpreter would run them in grid order, in which a miscounted tile still merges last). The memory
order a GPU needs is checked in the compiled code (tests/test_kernel_audit.py).
"""

from __future__ import annotations

import pytest
import torch
from support import block_attention_case, clone, shuffled_programs, target_attention_case

pytest.importorskip("triton")

from trtllm_dflash.ops.kernels import launch, tile_counters  # noqa: E402


def both_forms(run, case, seed=0):
    """(merged in the launch with its programs in a random order, two launches): outputs and the
    caches each left."""
    merged, separate = ({k: v.clone() if torch.is_tensor(v) else v for k, v in case.items()} for _ in range(2))
    with shuffled_programs(seed):
        merged_out = run(merged, True)
    return (merged_out, merged), (run(separate, False), separate)


def assert_same_bits(forms):
    (merged_out, merged), (separate_out, separate) = forms
    assert torch.equal(merged_out.view(torch.uint8), separate_out.view(torch.uint8))
    for name in ("k_cache", "v_cache"):
        assert torch.equal(merged[name].view(torch.uint8), separate[name].view(torch.uint8)), name


def counters() -> torch.Tensor:
    return tile_counters._COUNTERS[torch.device("cpu")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("splits", [2, 5])
def test_target_attention_merged_in_the_launch_is_the_two_launch_form_bit_for_bit(dtype, splits):
    """GQA 16 over several query tiles per KV head (12 tokens x group 16 = 192 rows: 3 tiles of 64
    in float32, 2 of 128 in bf16), sinks, ragged rows; the counters are zero after each launch, so
    a second launch of another shape is exact too."""
    case = target_attention_case(31, batch=2, tokens=12, heads=32, kv_heads=2, key_dim=32, value_dim=32, capacity=64, dtype=dtype)
    assert launch.target_attention_config(32, 32, 12, 16, launch.dtype_name(dtype)).m_tiles(12, 16) > 1
    sinks = torch.randn(32, generator=torch.Generator().manual_seed(3))

    def run(inputs, merge_in_launch):
        return launch.target_attention(**inputs, sinks=sinks, scale=0.2, window=0, kv_splits=splits, merge_in_launch=merge_in_launch)

    assert_same_bits(both_forms(run, case))
    assert not counters().any()
    smaller = target_attention_case(32, batch=2, tokens=3, heads=4, kv_heads=2, key_dim=16, value_dim=16, capacity=40, dtype=dtype)
    assert_same_bits(
        both_forms(lambda c, m: launch.target_attention(**c, sinks=None, scale=0.3, window=5, kv_splits=3, merge_in_launch=m), smaller)
    )
    assert not counters().any()


@pytest.mark.parametrize("splits", [2, 4])
def test_block_attention_merged_in_the_launch_is_the_two_launch_form_bit_for_bit(splits):
    """The drafter's block attention (new context rows appended, an empty cache, a row without new
    rows), merged in the launch against its two launches."""
    case = block_attention_case(33, 3, 4, 8, 2, 32, torch.bfloat16)

    def run(inputs, merge_in_launch):
        return launch.block_attention(**inputs, window=0, causal=0, kv_splits=splits, merge_in_launch=merge_in_launch)

    assert_same_bits(both_forms(run, case))
    assert not counters().any()


def test_past_the_counters_the_launch_merges_separately(monkeypatch):
    """More query tiles than the device has counters: the split and merge launches run instead."""
    case = target_attention_case(34, batch=2, tokens=4, heads=4, kv_heads=2, key_dim=16, value_dim=16)
    launched = []
    real = launch.kernels.for_tensor_device

    def recording(name, device):
        launched.append(name)
        return real(name, device)

    monkeypatch.setattr(launch.kernels, "for_tensor_device", recording)
    monkeypatch.setattr(tile_counters, "MAX_TILES", 3)  # 2 rows x 2 KV heads x 1 tile = 4 tiles
    merged = launch.target_attention(**clone(case), sinks=None, scale=0.25, window=0, kv_splits=3)
    assert launched.count("attention") == 2  # the split kernel's module: the merge was not in the launch
    separate = launch.target_attention(**clone(case), sinks=None, scale=0.25, window=0, kv_splits=3, merge_in_launch=False)
    assert torch.equal(merged, separate)

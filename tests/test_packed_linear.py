"""Packed oneDNN linears (modeling/packed_linear.py): what the torch runtime runs its CPU projections on.

They must compute F.linear within float32 rounding, give a row the same bits whatever the other
rows of the call (the property that keeps a token's logits independent of the batch), and decode
the target's greedy tokens through the runtime."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from support import hf_greedy

from trtllm_dflash import DFlashPipeline, demo
from trtllm_dflash.checkpoints import load_drafter, load_target
from trtllm_dflash.modeling import packed_linear
from trtllm_dflash.runtime.torch_runtime import TorchRuntime

REASON = packed_linear.unavailable_reason(torch.device("cpu"), torch.float32)
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"{REASON}")


@pytest.mark.parametrize("in_features,out_features", [(128, 768), (384, 128), (64, 4096), (96, 40)])
def test_packed_linear_is_f_linear_within_rounding_and_a_row_does_not_depend_on_the_batch(in_features, out_features):
    torch.manual_seed(0)
    weight, bias = torch.randn(out_features, in_features) * 0.05, torch.randn(out_features)
    x = torch.randn(300, in_features)
    linear = packed_linear.PackedLinears()
    with torch.inference_mode():
        full = linear(x, weight, bias)
        reference = F.linear(x.double(), weight.double(), bias.double())
        assert ((full.double() - reference).norm() / reference.norm()).item() < 1e-6
        packed_rows = [rows for rows in (1, 2, 3, 5, 8, 64, 299) if rows * in_features * out_features >= packed_linear.MIN_MACS]
        assert packed_rows and packed_rows[-1] == 299
        for rows in packed_rows:  # F.linear gives 1-3 rows other bits than 4 or more; packed calls must not
            assert torch.equal(linear(x[:rows], weight, bias), full[:rows]), rows
        assert torch.equal(linear(x.view(30, 10, in_features), weight, bias), full.view(30, 10, -1))  # [b, T, H] input
        if in_features * out_features < packed_linear.MIN_MACS:  # a call too small to pay for oneDNN's overhead is F.linear's
            assert torch.equal(linear(x[:1], weight, bias), F.linear(x[:1], weight, bias))
    assert len(linear) == 1


def test_row_counts_are_padded_to_a_few_buckets_with_at_most_a_quarter_more_rows():
    """A prefill's row count is padded so oneDNN builds few primitives; the padding is bounded and
    changes no bits (the batch-independence test above runs 299 rows, padded to 320)."""
    buckets = {packed_linear.bucket_rows(rows) for rows in range(1, 4097)}
    assert all(packed_linear.bucket_rows(rows) == rows for rows in range(1, packed_linear.EXACT_ROWS + 1))
    assert all(rows <= packed_linear.bucket_rows(rows) <= 1.25 * rows for rows in range(1, 4097))
    assert len(buckets - set(range(1, packed_linear.EXACT_ROWS + 1))) == 24  # 4 per doubling from 64 to 4,096


def test_a_fresh_view_of_the_same_rows_is_packed_once_and_another_view_is_not_confused_with_it():
    weight = torch.randn(192, 128)
    x = torch.randn(200, 128)  # enough rows to take the packed path (MIN_MACS)
    linear = packed_linear.PackedLinears()
    with torch.inference_mode():
        for _ in range(3):
            tail = linear(x, weight[64:])  # a new view object each time, as the drafter's context K/V projection makes
        head = linear(x, weight[:64])
    assert len(linear) == 2
    torch.testing.assert_close(tail, F.linear(x, weight[64:]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(head, F.linear(x, weight[:64]), rtol=1e-5, atol=1e-5)


def test_packed_linears_are_refused_off_float32_with_the_reason():
    assert "float32" in packed_linear.unavailable_reason(torch.device("cpu"), torch.bfloat16)
    assert "CPU" in packed_linear.unavailable_reason(torch.device("meta"), torch.float32)


def test_the_runtime_decodes_the_targets_greedy_tokens_on_packed_linears():
    """The demo pair (its 4,096-wide LM heads and 8-row blocks take the packed path): the fused pass
    and both LM heads on packed linears (the CPU default), at batch 1 and 4, give transformers' own
    greedy tokens; with packed_linears=False the fused pass runs on F.linear."""
    prompts = [list(range(5, 45)), [7, 8, 9, 10, 11, 12, 13] * 3, [4, 40, 41], list(range(300, 360, 2))]
    expected = [hf_greedy(load_target(demo.target_dir()).model, prompt, 24) for prompt in prompts]
    for packed in (True, False):
        target = load_target(demo.target_dir())
        runtime = TorchRuntime(target.model, load_drafter(demo.drafter_dir(), target=target), packed_linears=packed)
        pipe = DFlashPipeline(runtime)
        for max_batch in (1, 4):
            outputs = pipe.generate(prompts, max_new_tokens=24, stop_token_ids=(), max_batch=max_batch)
            assert [out.token_ids for out in outputs] == expected, (packed, max_batch)
        assert runtime.fused is not None
        assert (runtime.fused.linear is runtime._packed) == packed and (runtime._draft_linear is not None) == packed
        if packed:
            assert len(runtime._packed) > 0  # the passes really went through it

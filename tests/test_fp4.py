"""The FP4 codec: MXFP4 as gpt-oss publishes it, checked against transformers' own dequantization."""

from __future__ import annotations

import pytest
import torch

from trtllm_dflash.hf_compat import transformers_mxfp4_dequantize
from trtllm_dflash.modeling.fp4 import (
    E2M1_VALUES,
    decode_e2m1,
    dequantize_mxfp4,
    encode_e2m1,
    expert_weight_layout,
    pack_codes,
    quantize_mxfp4,
    unpack_codes,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_equals_transformers_gpt_oss_conversion(dtype):
    torch.manual_seed(0)
    weight = torch.randn(3, 40, 96) * torch.logspace(-4, 1, 96)  # blocks of very different magnitudes
    blocks, scales = quantize_mxfp4(weight)
    assert blocks.shape == (3, 40, 3, 16) and scales.shape == (3, 40, 3) and blocks.dtype == scales.dtype == torch.uint8
    ours = expert_weight_layout(dequantize_mxfp4(blocks, scales, dtype))
    assert torch.equal(ours, transformers_mxfp4_dequantize(blocks, scales, dtype))


def test_quantize_is_the_ocp_rule_and_round_trips():
    block = torch.tensor([[6.0 * 2.0**-3] + [0.0] * 31, [-5.0] + [0.25] * 31])  # amax 0.75 and 5
    blocks, scales = quantize_mxfp4(block)
    assert scales.tolist() == [[127 - 3], [127 + 0]]  # 2^(floor(log2 amax) - 2)
    values = dequantize_mxfp4(blocks, scales)
    assert values[0, 0] == 0.75 and values[1, 0] == -4.0 and values[1, 1] == 0.0  # 5 and 0.25 are ties: to the even code
    again = quantize_mxfp4(values)
    assert torch.equal(again[0], blocks) and torch.equal(again[1], scales)


def test_codes_pack_low_nibble_first_and_encode_every_value():
    codes = torch.arange(16, dtype=torch.uint8)
    packed = pack_codes(codes)
    assert packed[0] == 0x10 and torch.equal(unpack_codes(packed), codes)
    values = torch.tensor(E2M1_VALUES)
    assert torch.equal(decode_e2m1(encode_e2m1(values)), values)
    assert torch.equal(encode_e2m1(torch.tensor([0.25, 0.75, 2.5, 5.0, 7.0])), torch.tensor([0, 2, 4, 6, 7], dtype=torch.uint8))


def test_mismatched_blocks_and_scales_are_refused():
    with pytest.raises(ValueError, match="do not match"):
        dequantize_mxfp4(torch.zeros(2, 3, 16, dtype=torch.uint8), torch.zeros(2, 4, dtype=torch.uint8))

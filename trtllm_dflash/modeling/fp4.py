"""The 4-bit float formats of the checkpoints we load and write: MXFP4 (gpt-oss) and NVFP4's element codes.

Both store E2M1 elements, two per byte, the element with the even index in the low nibble.
They differ in the scales:

    MXFP4  one E8M0 scale (a power of two, 2^(s - 127)) per 32 elements, no tensor scale
    NVFP4  one E4M3 scale per 16 elements, times one float32 scale per tensor
           (ModelOpt writes them as `weight` uint8 [out, in/2], `weight_scale` F8_E4M3
           [out, in/16] and `weight_scale_2` F32 []; value = e2m1 * weight_scale * weight_scale_2)

gpt-oss stores each expert projection as `<proj>_blocks` [E, out, in/32, 16] uint8 and
`<proj>_scales` [E, out, in/32] uint8 (the OCP MX layout), with `quantization_config.quant_method:
mxfp4`. Dequantized, a projection is [E, out, in]; transformers' GptOssExperts keeps the transpose
[E, in, out] (`expert_weight_layout`).
"""

from __future__ import annotations

import torch

from trtllm_dflash.modeling.fp8_linear import FP8_MAX

# E2M1: code -> value (sign bit 3, exponent bits 2..1, mantissa bit 0); the OCP MX table
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
E2M1_MAX = 6.0
E4M3_MAX = FP8_MAX  # largest finite E4M3 (NVFP4 block scales)
E8M0_BIAS = 127
MXFP4_BLOCK = 32
NVFP4_BLOCK = 16


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., n] -> E2M1 codes [..., 2n] (low nibble first)."""
    packed = packed.to(torch.uint8)
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2)


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes [..., 2n] -> uint8 [..., n] (the inverse of unpack_codes)."""
    codes = codes.to(torch.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def decode_e2m1(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor(E2M1_VALUES, dtype=dtype, device=codes.device)[codes.long()]


def encode_e2m1(values: torch.Tensor) -> torch.Tensor:
    """Round each value to the nearest E2M1 code (ties to the even mantissa), saturating at +-6."""
    grid = torch.tensor(E2M1_VALUES[:8], dtype=torch.float32, device=values.device)
    magnitude = values.float().abs().clamp(max=E2M1_MAX)
    distance = (magnitude.unsqueeze(-1) - grid).abs()
    # ties between two grid points go to the even code (mantissa 0), as round-to-nearest-even does
    distance = distance + (torch.arange(8, device=values.device) % 2) * 1e-6
    code = distance.argmin(-1).to(torch.uint8)
    return code | ((values < 0) | ((values == 0) & torch.signbit(values))).to(torch.uint8) << 3


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`<proj>_blocks` [..., G, 16] and `<proj>_scales` [..., G] -> weights [..., G * 32], exactly.

    E2M1 values times a power of two are exact in float32 and bfloat16 (both have 8 exponent
    bits); an exponent outside the dtype's range is not, and is refused.
    """
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != MXFP4_BLOCK // 2:
        raise ValueError(
            f"MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not match ([..., G, {MXFP4_BLOCK // 2}] and [..., G])"
        )
    values = decode_e2m1(unpack_codes(blocks), torch.float32)  # [..., G, 32]
    exponent = scales.to(torch.int32) - E8M0_BIAS
    out = torch.ldexp(values, exponent.unsqueeze(-1).float())
    return out.flatten(-2).to(dtype)


def dequantize_nvfp4(
    packed: torch.Tensor, block_scales: torch.Tensor, global_scale: torch.Tensor | float, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """NVFP4 `weight` [..., K/2] uint8, `weight_scale` [..., K/16] (E4M3) and `weight_scale_2` -> [..., K].

    Correctly rounded: an E2M1 value (2 significant bits) times an E4M3 scale (4 bits) is exact in
    float32, so multiplying that by the float32 tensor scale rounds once, giving the float32
    nearest to the exact product (exact when the tensor scale is a power of two, as in a
    converted MXFP4 tensor). ModelOpt's own dequantize multiplies the two scales first and rounds
    twice, so it can differ from this in the last bit. float64 output is exact for any scale.
    """
    work = torch.float64 if dtype == torch.float64 else torch.float32
    values = decode_e2m1(unpack_codes(packed), work)
    if values.shape[:-1] != block_scales.shape[:-1] or values.shape[-1] != block_scales.shape[-1] * NVFP4_BLOCK:
        raise ValueError(
            f"NVFP4 weight {tuple(packed.shape)} and block scales {tuple(block_scales.shape)} do not match "
            f"([..., K/2] and [..., K/{NVFP4_BLOCK}])"
        )
    blocks = values.unflatten(-1, (-1, NVFP4_BLOCK)) * block_scales.to(work).unsqueeze(-1)  # exact
    return (blocks * torch.as_tensor(global_scale, dtype=torch.float32).to(work)).flatten(-2).to(dtype)


def quantize_nvfp4(weight: torch.Tensor, global_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weights [..., K] (K a multiple of 16) -> (`weight` uint8 [..., K/2], `weight_scale` E4M3 [..., K/16],
    `weight_scale_2` float32 []), ModelOpt's dynamic NVFP4 rule (NVFP4QTensor.quantize):

        weight_scale_2 = amax(|w|) / (6 * 448)
        weight_scale   = E4M3(clamp(block_amax / (6 * weight_scale_2), 2^-9, 448)), 1.0 for an all-zero block
        codes          = E2M1(w / (weight_scale * weight_scale_2)), ties to even, two per byte, low nibble first

    Used to write NVFP4 checkpoints in ModelOpt's layout where ModelOpt cannot calibrate (CPU tests).
    """
    if weight.shape[-1] % NVFP4_BLOCK:
        raise ValueError(f"the last dimension ({weight.shape[-1]}) must be a multiple of {NVFP4_BLOCK}")
    w = weight.float()
    if global_scale is None:
        global_scale = w.abs().amax() / (E2M1_MAX * E4M3_MAX)
    global_scale = torch.as_tensor(global_scale, dtype=torch.float32).reshape(())
    grouped = w.unflatten(-1, (-1, NVFP4_BLOCK))
    block = grouped.abs().amax(-1) / (E2M1_MAX * global_scale)
    block = torch.where(block == 0, torch.ones_like(block), block)
    block_scales = block.clamp(min=2.0**-9, max=E4M3_MAX).to(torch.float8_e4m3fn)
    codes = encode_e2m1(grouped / (block_scales.float() * global_scale).unsqueeze(-1))
    return pack_codes(codes.flatten(-2)), block_scales, global_scale


def quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weights [..., K] (K a multiple of 32) -> (blocks [..., K/32, 16] uint8, scales [..., K/32] uint8).

    The OCP MX rule: each block's scale is 2^(floor(log2(amax)) - 2), so the block's largest
    magnitude lands in E2M1's top binade [4, 6]; elements then round to the nearest E2M1 value.
    Used to write MXFP4 checkpoints (tests build tiny gpt-oss targets in the published layout).
    """
    if weight.shape[-1] % MXFP4_BLOCK:
        raise ValueError(f"the last dimension ({weight.shape[-1]}) must be a multiple of {MXFP4_BLOCK}")
    grouped = weight.float().unflatten(-1, (-1, MXFP4_BLOCK))
    amax = grouped.abs().amax(-1)
    exponent = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp(min=2.0**-126))) - 2, torch.full_like(amax, -127))
    exponent = exponent.clamp(-E8M0_BIAS, E8M0_BIAS)
    codes = encode_e2m1(torch.ldexp(grouped, -exponent.unsqueeze(-1)))
    return pack_codes(codes), (exponent + E8M0_BIAS).to(torch.uint8)


def expert_weight_layout(dequantized: torch.Tensor) -> torch.Tensor:
    """[E, out, in] (the checkpoint's order) -> [E, in, out] (transformers' GptOssExperts parameters)."""
    return dequantized.transpose(1, 2).contiguous()

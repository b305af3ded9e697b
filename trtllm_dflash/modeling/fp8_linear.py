"""FP8 linear layers with ModelOpt FP8 semantics: E4M3 weights, FP8-rounded inputs, per-tensor scales.

A ModelOpt FP8 checkpoint stores each quantized linear layer as E4M3 weights with a per-tensor
`weight_scale` and a calibrated per-tensor `input_scale`. `FP8Linear` keeps exactly that and
computes `linear(QDQ(x, input_scale), DQ(weight, weight_scale))` through two torch custom ops,
so that eager torch rounds as an FP8 GEMM does (the reference) and the ONNX export can translate
the ops into QuantizeLinear/DequantizeLinear (builder/fp8.py). Scales stay float32, as ModelOpt
calibrated them; the dequantized values are cast to the compute dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FP8_MAX = 448.0  # largest finite float8_e4m3fn


@torch.library.custom_op("dflash_build::fp8_qdq", mutates_args=())
def fp8_qdq(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Round to E4M3 with a per-tensor scale (saturating) and back, in x's dtype."""
    q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return (q.float() * scale).to(x.dtype)


@fp8_qdq.register_fake
def _fp8_qdq_fake(x, scale):
    return torch.empty_like(x)


@torch.library.custom_op("dflash_build::fp8_dequantize", mutates_args=())
def fp8_dequantize(weight: torch.Tensor, scale: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """E4M3 weights times their scale, in `like`'s dtype."""
    return (weight.float() * scale).to(like.dtype)


@fp8_dequantize.register_fake
def _fp8_dequantize_fake(weight, scale, like):
    return torch.empty(weight.shape, dtype=like.dtype, device=weight.device)


class FP8Linear(nn.Module):
    """A linear layer with FP8 weights and FP8-rounded inputs (ModelOpt FP8 semantics).

    The weights and scales are buffers: cast the model's *parameters* to a compute dtype
    (`graphs.dtypes.cast_parameters`), not the whole module, or the FP8 weights become 16-bit tensors.
    """

    def __init__(
        self, weight: torch.Tensor, weight_scale: torch.Tensor, input_scale: torch.Tensor | None, bias: torch.Tensor | None
    ) -> None:
        super().__init__()
        self.register_buffer("weight_fp8", weight.to(torch.float8_e4m3fn))
        self.register_buffer("weight_scale", weight_scale.float().reshape(()))
        self.register_buffer("input_scale", None if input_scale is None else input_scale.float().reshape(()))
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_scale is not None:
            x = torch.ops.dflash_build.fp8_qdq(x, self.input_scale)
        weight = torch.ops.dflash_build.fp8_dequantize(self.weight_fp8, self.weight_scale, x)
        return F.linear(x, weight, None if self.bias is None else self.bias.to(x.dtype))


def has_fp8(model: nn.Module) -> bool:
    return any(isinstance(module, FP8Linear) for module in model.modules())

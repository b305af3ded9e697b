"""FP8 linear layers export as explicit Q/DQ ONNX (what TensorRT builds FP8 GEMMs from).

`FP8Linear` (modeling/fp8_linear.py) runs its FP8 rounding through two torch custom ops; here
they are translated into QuantizeLinear/DequantizeLinear with FLOAT8E4M3FN, so the weights stay
1 byte per element in the graph.
"""

from __future__ import annotations

import torch

from trtllm_dflash.modeling.fp8_linear import FP8_MAX, FP8Linear, has_fp8

__all__ = ["FP8_MAX", "FP8Linear", "has_fp8", "translation_table"]  # FP8Linear and has_fp8 were defined here


def translation_table() -> dict:
    """onnxscript translations of the two ops for `torch.onnx.export(..., custom_translation_table=...)`."""
    from trtllm_dflash.extras import require

    onnx = require("onnx", "export", "FP8 ONNX export")
    op = require("onnxscript", "export", "FP8 ONNX export").opset20

    def zero_point():
        return op.Constant(value=onnx.helper.make_tensor("fp8_zero", onnx.TensorProto.FLOAT8E4M3FN, [], [0.0]))

    def qdq(x, scale):
        x32 = op.Cast(x, to=onnx.TensorProto.FLOAT)
        zero = zero_point()
        rounded = op.DequantizeLinear(op.QuantizeLinear(x32, scale, zero), scale, zero)
        return op.CastLike(rounded, x)

    def dequantize(weight, scale, like):
        return op.CastLike(op.DequantizeLinear(weight, scale, zero_point()), like)

    return {torch.ops.dflash_build.fp8_qdq.default: qdq, torch.ops.dflash_build.fp8_dequantize.default: dequantize}

"""Every dtype the package names, in one table: its spellings (recipe, torch, ONNX, TensorRT, Triton) and size.

Planning runs without torch or onnx, so the table holds names and ONNX's TensorProto numbers (fixed by
the ONNX spec), never the libraries' objects; `torch_dtype` resolves a torch dtype when one is asked for.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class DType:
    name: str  # the recipes' spelling where they have one ("bf16"), else torch's ("int64")
    torch: str | None  # torch attribute ("bfloat16"); None: no torch dtype holds one element of it
    onnx: int | None  # onnx.TensorProto data type
    tensorrt: str | None  # tensorrt attribute ("fp8"); None where no plugin input takes it
    triton: str | None  # Triton's kernel-signature spelling ("fp8e4nv"); None where no kernel takes it
    bits: int  # bits of one element
    scale_bits: float = 0.0  # block-quantized formats: each element's share of its block's scale

    @property
    def bytes(self) -> float:
        """Bytes stored per element, block scales included (NVFP4: 4.5 bits, MXFP4: 4.25)."""
        return (self.bits + self.scale_bits) / 8

    def to_torch(self) -> Any:
        """The torch dtype (imports torch: not for planning)."""
        import torch

        if self.torch is None:
            raise KeyError(f"torch has no dtype for {self.name!r}")
        return getattr(torch, self.torch)


TABLE: tuple[DType, ...] = (
    #     name               torch              onnx tensorrt   triton     bits
    DType("fp32", "float32", 1, "float32", "fp32", 32),
    DType("bf16", "bfloat16", 16, "bfloat16", "bf16", 16),
    DType("fp16", "float16", 10, "float16", "fp16", 16),
    DType("fp8", "float8_e4m3fn", 17, "fp8", "fp8e4nv", 8),
    DType("nvfp4", None, 23, None, None, 4, scale_bits=8 / 16),  # FP8 scale per 16
    DType("mxfp4", None, 23, None, None, 4, scale_bits=8 / 32),  # E8M0 scale per 32
    DType("int64", "int64", 7, "int64", "i64", 64),
    DType("int32", "int32", 6, "int32", "i32", 32),
    DType("int16", "int16", 5, None, None, 16),
    DType("int8", "int8", 3, None, None, 8),
    DType("uint8", "uint8", 2, None, None, 8),
    DType("uint16", "uint16", 4, None, None, 16),
    DType("uint32", "uint32", 12, None, None, 32),
    DType("uint64", "uint64", 13, None, None, 64),
    DType("bool", "bool", 9, None, None, 8),
    DType("float64", "float64", 11, None, None, 64),
    DType("complex64", "complex64", 14, None, None, 64),
    DType("complex128", "complex128", 15, None, None, 128),
    DType("float8_e4m3fnuz", "float8_e4m3fnuz", 18, None, None, 8),
    DType("float8_e5m2", "float8_e5m2", 19, None, None, 8),
    DType("float8_e5m2fnuz", "float8_e5m2fnuz", 20, None, None, 8),
    DType("uint4", None, 21, None, None, 4),
    DType("int4", None, 22, None, None, 4),
)

# What recipes and plans name (in the order error messages list them), and the unquantized ones
# among them: the dtypes a graph is exported and run in.
PRECISIONS = ("fp32", "bf16", "fp16", "fp8", "nvfp4", "mxfp4")
FLOATS = ("fp32", "bf16", "fp16")

_BY_NAME = {d.torch: d for d in TABLE if d.torch} | {d.name: d for d in TABLE}  # "float32" and "fp32" alike
# the first row of a number wins: FLOAT4E2M1 is the element of NVFP4 and MXFP4 alike (4 bits)
_BY_ONNX = {d.onnx: d for d in reversed(TABLE) if d.onnx is not None}


def find(name: str) -> DType | None:
    """The dtype spelled `name` (recipe or torch spelling: "bf16", "bfloat16"), or None."""
    return _BY_NAME.get(str(name).removeprefix("torch."))


def lookup(name: str) -> DType:
    """`find`, refusing a name the table does not hold."""
    found = find(name)
    if found is None:
        raise KeyError(f"unknown dtype {name!r}")
    return found


def bytes_per_element(name: str) -> float:
    """Bytes stored per element of `name`, block scales included."""
    return lookup(name).bytes


def from_onnx(data_type: int) -> DType | None:
    """The dtype of an ONNX TensorProto data type number, or None."""
    return _BY_ONNX.get(int(data_type))


def onnx_bits(data_type: int, default: int = 32) -> int:
    """Bits of one element of an ONNX TensorProto data type (block scales are tensors of their own)."""
    found = from_onnx(data_type)
    return found.bits if found else default


def torch_dtype(name: str) -> Any:
    """The torch dtype of `name` (imports torch: not for planning)."""
    return lookup(name).to_torch()


def torch_name(name: str) -> str:
    """ "bf16" -> "bfloat16": the spelling the kernels and TensorRT plugins use."""
    found = lookup(name).torch
    if found is None:
        raise KeyError(f"torch has no dtype for {name!r}")
    return found

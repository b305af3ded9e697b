"""The graphs' dtypes by recipe name, and casting a model's weights to one."""

from __future__ import annotations

import torch
from torch import nn

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def cast_parameters(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast weights in place but not buffers: RoPE frequencies stay as the torch runtime keeps them."""
    for parameter in module.parameters():
        parameter.data = parameter.data.to(dtype)
    return module

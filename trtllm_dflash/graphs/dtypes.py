"""The graphs' dtypes by recipe name, and casting a model's weights to one."""

from __future__ import annotations

import torch
from torch import nn

from trtllm_dflash.contracts import dtypes

# the recipe names a graph is exported in -> torch dtypes, from the one dtype table
DTYPES: dict[str, torch.dtype] = {name: dtypes.torch_dtype(name) for name in dtypes.FLOATS}


def cast_parameters(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast weights in place but not buffers: RoPE frequencies stay as the torch runtime keeps them."""
    for parameter in module.parameters():
        parameter.data = parameter.data.to(dtype)
    return module

"""What every DFlash plugin node is: the ONNX domain, TensorRT's plugin attributes and `NodeSpec`.

Shared by `onnx_nodes` (the V1 nodes, and the full node list) and `dflash2_nodes` (the V2 nodes),
so neither imports the other's node definitions back.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from onnx.reference.op_run import OpRun

DOMAIN = "dflash"
DOMAIN_VERSION = 1
PLUGIN_NAMESPACE = "dflash"
# 2: the drafter block attention's window is symmetric (never causal) and it takes `causal` (issue 29);
# engines built with version 1 plugins ran sliding draft layers causally and must be rebuilt.
PLUGIN_VERSION = "2"
PLUGIN_ATTRIBUTES = {"plugin_namespace": PLUGIN_NAMESPACE, "plugin_version": PLUGIN_VERSION, "aot": 1}


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    """One plugin node: op type (== TensorRT plugin name), inputs, outputs, attributes."""

    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: dict  # name -> default value (the type follows the default: float, int)
    output_dtypes: tuple[str, ...]  # per output: the input whose dtype it has, or a fixed dtype
    doc: str
    aliases: dict = dataclasses.field(default_factory=dict)  # output -> the input it updates in place

    def output_dtype(self, index: int, input_dtypes: dict):
        """Output `index`'s dtype given the inputs' dtypes (any dtype objects, keyed by input name)."""
        kind = self.output_dtypes[index]
        return input_dtypes[kind] if kind in self.inputs else kind

    @property
    def plugin_id(self) -> str:
        return f"{PLUGIN_NAMESPACE}::{self.op_type}"


def to_torch(array: np.ndarray) -> torch.Tensor:
    """A writable torch copy of an evaluator input (initializers are read-only)."""
    return torch.from_numpy(np.array(array))


class DFlashOp(OpRun):
    """Base of the CPU evaluators (`onnx.reference` ops) of the dflash domain."""

    op_domain = DOMAIN

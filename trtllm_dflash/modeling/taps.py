"""Tapping target hidden states: the OUTPUT of decoder layer i for each id i (DFLASH.md).

Forward hooks on the decoder layers, rather than `output_hidden_states`, so that the convention
does not depend on how a model family numbers (or post-normalises) its hidden states.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


class HiddenTaps:
    """Keeps the outputs of the given decoder layers from the latest forward pass."""

    def __init__(self, layers: nn.ModuleList, layer_ids: Sequence[int]) -> None:
        self.layer_ids = list(layer_ids)
        self._outputs: dict[int, torch.Tensor] = {}
        self._handles = [layers[i].register_forward_hook(self._hook(i)) for i in self.layer_ids]

    def _hook(self, layer_id: int):
        def hook(module, args, output):
            self._outputs[layer_id] = output[0] if isinstance(output, tuple) else output

        return hook

    def features(self) -> torch.Tensor:
        """`[b, T, len(ids) * H]`: the tapped layers' outputs concatenated on the feature axis."""
        return torch.cat([self._outputs[i] for i in self.layer_ids], dim=-1)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._outputs.clear()

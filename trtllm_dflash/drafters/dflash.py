"""DFlash V1 (`DFlashDraftModel`: z-lab, ModelOpt, Speculators layouts) as a drafter kind.

Its torch module (modeling/drafter.py) and graph (graphs/drafter.py) are the bases V2 extends; its
draft head is the decoding loop's sampler over the draft logits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trtllm_dflash.contracts.drafter_kinds import DFLASH, V1_ARCHITECTURE
from trtllm_dflash.drafters.base import DrafterKind

if TYPE_CHECKING:
    from trtllm_dflash.config import DrafterConfig


class DFlashKind(DrafterKind):
    name = DFLASH
    architecture = V1_ARCHITECTURE
    label = "drafter"
    candidate_selector = False

    def new_module(self, config: "DrafterConfig", vocab_size: int | None = None) -> Any:
        from trtllm_dflash.modeling.drafter import DFlashDrafter

        return DFlashDrafter(config)

    def graph_head(self, config: "DrafterConfig", plugin: bool) -> str:
        from trtllm_dflash.graphs.drafter import HEAD_LOGITS

        return HEAD_LOGITS

    def new_graph(self, drafter: Any, embedding: Any, lm_head: Any, plugin: bool) -> Any:
        from trtllm_dflash.graphs.drafter import DrafterGraph

        return DrafterGraph(drafter, embedding, lm_head, plugin)

    def graph_outputs(self, head: str) -> list[str]:
        from trtllm_dflash.contracts import names

        return [names.LOGITS]

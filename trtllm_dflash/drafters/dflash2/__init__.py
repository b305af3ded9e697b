"""DFlash V2 (`DFlash2DraftModel`, inco.ai) as a drafter kind: V1 plus grouped dynamic convolutions
and a candidate selector head.

    modeling.py    DFlash2Drafter: the torch module (and `from_v1`, where V2 training starts)
    graph.py       DrafterV2Graph: the export graph, its native and plugin heads
    plugin_ops.py  the one place the graph calls the V2 plugin ops

Its ops are ops/reference_dflash2.py and ops/kernels/dflash2*.py (plugins/dflash2_nodes.py for
TensorRT), its published shapes catalog/drafters_dflash2.py, the runtimes' walk over a native
graph's selector scores runtime/selector.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from trtllm_dflash.contracts import names
from trtllm_dflash.contracts.drafter_kinds import DFLASH2, V2_ARCHITECTURE
from trtllm_dflash.drafters.base import DrafterKind
from trtllm_dflash.errors import CheckpointError

if TYPE_CHECKING:
    from trtllm_dflash.config import DrafterConfig

CODEBOOK = "candidate_selector.predecessor_codebook"


class DFlash2Kind(DrafterKind):
    name = DFLASH2
    architecture = V2_ARCHITECTURE
    label = "DFlash V2 drafter"
    candidate_selector = True

    def new_module(self, config: "DrafterConfig", vocab_size: int | None = None) -> Any:
        from trtllm_dflash.drafters.dflash2.modeling import DFlash2Drafter

        if vocab_size is None:
            raise CheckpointError("a DFlash V2 drafter needs its vocabulary size", "set vocab_size in the drafter's config.json")
        return DFlash2Drafter(config, vocab_size)

    def module_vocab(self, config: "DrafterConfig", target_vocab: int | None, state: dict) -> int | None:
        """The rows of the selector's codebooks: the config's, else the target's, else the weights'."""
        if config.vocab_size is not None:
            return config.vocab_size
        if target_vocab is not None:
            return int(target_vocab)
        codebook = state.get(CODEBOOK)
        return None if codebook is None else int(codebook.shape[0])

    def owns_tensors(self, names: Iterable[str]) -> bool:
        return any(name.startswith("candidate_selector.") or "_conv." in name for name in names)

    def graph_head(self, config: "DrafterConfig", plugin: bool) -> str:
        from trtllm_dflash.drafters.dflash2 import plugin_ops
        from trtllm_dflash.drafters.dflash2.graph import HEAD_PLUGIN, HEAD_SCORES
        from trtllm_dflash.graphs.target import UnsupportedTargetError

        if not plugin:
            return HEAD_SCORES
        reason = plugin_ops.missing()
        if reason is not None:
            raise UnsupportedTargetError(
                f"no plugin graph of this DFlash V2 drafter: {reason}", "build the native variant (use_plugins: false)"
            )
        return HEAD_PLUGIN

    def new_graph(self, drafter: Any, embedding: Any, lm_head: Any, plugin: bool) -> Any:
        from trtllm_dflash.drafters.dflash2.graph import DrafterV2Graph

        return DrafterV2Graph(drafter, embedding, lm_head, plugin)

    def graph_outputs(self, head: str) -> list[str]:
        from trtllm_dflash.drafters.dflash2.graph import HEAD_PLUGIN

        if head == HEAD_PLUGIN:
            return [names.DRAFT_TOKENS, names.CANDIDATES, names.CANDIDATE_PROBS]
        return [names.LOGITS, names.CANDIDATES, names.SELECTOR_SCORES]

    def graph_sampling_inputs(self, head: str) -> list[str]:
        from trtllm_dflash.drafters.dflash2.graph import HEAD_PLUGIN

        return [names.TEMPERATURE, names.SEED] if head == HEAD_PLUGIN else []

    def plan_note(self, spec: Any) -> str | None:
        return (
            f"DFlash V2 drafter: its weights include {spec.conv_params() / 1e6:.1f}M convolution, "
            f"{spec.selector_projection_params() / 1e6:.1f}M selector projection and {spec.codebook_params() / 1e6:.1f}M "
            "codebook parameters"
        )

    def training_summary(self, config: "DrafterConfig") -> dict[str, Any]:
        return {"architecture": self.architecture, "selector_rank": config.selector_rank, "selector_top_k": config.selector_top_k}

"""What a drafter kind is: the one interface behind which DFlash V1, V2 and the next kinds differ.

A config names its kind (`DrafterConfig.kind`, read from config.json's `architectures`; the
catalog's `DrafterSpec.kind`) and `kind_of` (drafters/__init__.py) maps the name to the one
registered kind, so call sites ask the kind instead of testing which variant they hold. Options
of a kind (sliding windows, a bounded history, `causal`, quantized weights) are config fields, not
kinds. What a kind does not carry, because it sits below or above this layer: the config's
parsing (config.py), its ops (ops/, plugins/), the catalog's published shapes and bytes
(catalog/), a runtime's walk over a selector graph's outputs (runtime/selector.py) and how each
backend runs it (backends/). Heavy modules (torch) are imported by the methods that need them,
so naming a kind stays cheap.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    import torch

    from trtllm_dflash.catalog.drafters import DrafterSpec
    from trtllm_dflash.config import DrafterConfig
    from trtllm_dflash.graphs.drafter import DrafterGraph
    from trtllm_dflash.modeling.drafter import DFlashDrafter


class DrafterKind(abc.ABC):
    """One drafter kind: its torch module, its export graph, its draft head and what it reports."""

    name: str  # DrafterConfig.kind / DrafterSpec.kind
    architecture: str  # the config.json `architectures` entry of the kind
    label: str  # how a message names a drafter of this kind
    # The draft head. False: the drafter returns draft logits and the decoding loop samples the
    # drafts from them (constraints apply). True: the drafter proposes its tokens and their q itself
    # (a candidate selector), so runtimes and checks compare proposals, not only logits.
    candidate_selector: bool

    @abc.abstractmethod
    def new_module(self, config: "DrafterConfig", vocab_size: int | None = None) -> "DFlashDrafter":
        """An initialised torch module of this kind (`vocab_size`: from `module_vocab`)."""

    def module_vocab(self, config: "DrafterConfig", target_vocab: int | None, state: dict[str, "torch.Tensor"]) -> int | None:
        """The vocabulary the module's own tables need (None: it has none; the target's are used)."""
        return None

    def owns_tensors(self, names: Iterable[str]) -> bool:
        """Whether tensor `names` a checkpoint has beyond another kind's are this kind's (to say which
        architecture its config.json should name)."""
        return False

    @abc.abstractmethod
    def graph_head(self, config: "DrafterConfig", plugin: bool) -> str:
        """graphs.json `head` of this kind's drafter graph (what it ends in); refuses what cannot be exported."""

    @abc.abstractmethod
    def new_graph(self, drafter: "DFlashDrafter", embedding: Any, lm_head: Any, plugin: bool) -> "DrafterGraph":
        """The one-step drafter graph module export traces."""

    @abc.abstractmethod
    def graph_outputs(self, head: str) -> list[str]:
        """The graph outputs of `head`, before the new K/V."""

    def graph_sampling_inputs(self, head: str) -> list[str]:
        """Graph inputs after the caches (a head that samples inside takes temperature and seed)."""
        return []

    def plan_note(self, spec: "DrafterSpec") -> str | None:
        """What `dflash-trt plan` says about a catalog drafter of this kind's weights (None: nothing)."""
        return None

    def training_summary(self, config: "DrafterConfig") -> dict[str, Any]:
        """What a training run's summary records about a drafter of this kind beyond its shape."""
        return {}

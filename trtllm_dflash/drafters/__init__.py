"""Drafter kinds (DFlash V1, V2), each registered once; call sites ask `kind_of(config)`.

    base.py      DrafterKind: what differs between kinds (module, graph, draft head, reports)
    dflash.py    DFlash V1 (DFlashDraftModel)
    dflash2/     DFlash V2 (DFlash2DraftModel): its kind, torch module, graph and plugin-op calls

docs/architecture.md ("Adding a drafter kind") lists the files a new kind touches.
"""

from __future__ import annotations

from typing import Any

from trtllm_dflash.drafters.base import DrafterKind
from trtllm_dflash.drafters.dflash import DFlashKind
from trtllm_dflash.drafters.dflash2 import DFlash2Kind
from trtllm_dflash.errors import DFlashError

DRAFTER_KINDS: dict[str, DrafterKind] = {kind.name: kind for kind in (DFlashKind(), DFlash2Kind())}


def kind_of(drafter: Any) -> DrafterKind:
    """The kind of a DrafterConfig or a catalog DrafterSpec (anything with a `kind` name)."""
    try:
        return DRAFTER_KINDS[drafter.kind]
    except KeyError:
        raise DFlashError(f"no drafter kind named {drafter.kind!r}", f"the registered kinds are {sorted(DRAFTER_KINDS)}") from None


__all__ = ["DRAFTER_KINDS", "DrafterKind", "kind_of"]

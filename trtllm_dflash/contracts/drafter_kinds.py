"""The drafter kinds' names and the config.json architecture that selects each.

`config.py` reads a config's kind from its `architectures`, `drafters/` registers one DrafterKind
per name and the catalog names its drafters' kinds; no torch here, so planning can name a kind.
"""

DFLASH = "dflash"  # DFlash V1
DFLASH2 = "dflash2"  # DFlash V2 (convolutions + candidate selector)
V1_ARCHITECTURE = "DFlashDraftModel"
V2_ARCHITECTURE = "DFlash2DraftModel"

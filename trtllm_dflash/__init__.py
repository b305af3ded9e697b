"""trtllm-dflash: DFlash block-diffusion speculative decoding, from checkpoints to TensorRT and Triton.

Public API:
    DFlashPipeline      load a target (+ drafter) and generate (api.py)
    Decoder, Request, SamplingParams, SequenceResult
                        the decoding loop over any runtime (decoding.py)
    load_target, load_drafter, save_drafter, validate_pair
                        checkpoints (checkpoints.py)
    DrafterConfig       the drafter's config.json (config.py)
    DFlashDrafter       the PyTorch drafter (modeling/drafter.py)
    DFlashError         user-facing errors (errors.py)
"""

from __future__ import annotations

import importlib
from typing import Any

# Public names -> the module that defines them. Imported on first use, so that commands which do
# not need torch (`dflash-trt build --dry-run`, `--help`) start in well under a second.
_EXPORTS = {
    "DFlashPipeline": "trtllm_dflash.api",
    "GenerationOutput": "trtllm_dflash.api",
    "load_drafter": "trtllm_dflash.checkpoints",
    "load_target": "trtllm_dflash.checkpoints",
    "save_drafter": "trtllm_dflash.checkpoints",
    "validate_pair": "trtllm_dflash.checkpoints",
    "DrafterConfig": "trtllm_dflash.config",
    "Decoder": "trtllm_dflash.decoding",
    "Request": "trtllm_dflash.decoding",
    "SamplingParams": "trtllm_dflash.decoding",
    "SequenceResult": "trtllm_dflash.decoding",
    "DFlashError": "trtllm_dflash.errors",
    "DFlashDrafter": "trtllm_dflash.modeling.drafter",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'trtllm_dflash' has no attribute {name!r}")


__version__ = "0.1.0"

__all__ = [
    "DFlashPipeline",
    "GenerationOutput",
    "Decoder",
    "Request",
    "SamplingParams",
    "SequenceResult",
    "load_target",
    "load_drafter",
    "save_drafter",
    "validate_pair",
    "DrafterConfig",
    "DFlashDrafter",
    "DFlashError",
]

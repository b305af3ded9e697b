"""trtllm-dflash: DFlash block-diffusion speculative decoding, from checkpoints to TensorRT and Triton.

Public API:
    DFlashPipeline      load a target (+ drafter) and generate (api.py)
    Decoder, Request, SamplingParams, SequenceResult
                        the decoding loop over any runtime (decoding.py)
    load_target, load_drafter, save_drafter, validate_pair
                        checkpoints (checkpoints/)
    DrafterConfig       the drafter's config.json (config.py)
    DFlashDrafter       the PyTorch drafter (modeling/drafter.py)
    DFlashError         user-facing errors (errors.py)
"""

from typing import TYPE_CHECKING

# The public names are imported on first use (PEP 562), so light commands such as
# `dflash-trt plan` or `recipes list` do not pay for importing torch and transformers.
_EXPORTS = {
    "DFlashPipeline": "trtllm_dflash.api",
    "GenerationOutput": "trtllm_dflash.api",
    "Decoder": "trtllm_dflash.decoding",
    "Request": "trtllm_dflash.decoding",
    "SamplingParams": "trtllm_dflash.sampling_params",
    "SequenceResult": "trtllm_dflash.decoding",
    "load_target": "trtllm_dflash.checkpoints",
    "load_drafter": "trtllm_dflash.checkpoints",
    "save_drafter": "trtllm_dflash.checkpoints",
    "validate_pair": "trtllm_dflash.checkpoints",
    "DrafterConfig": "trtllm_dflash.config",
    "DFlashDrafter": "trtllm_dflash.modeling.drafter",
    "DFlashError": "trtllm_dflash.errors",
}

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from trtllm_dflash.api import DFlashPipeline, GenerationOutput
    from trtllm_dflash.checkpoints import load_drafter, load_target, save_drafter, validate_pair
    from trtllm_dflash.config import DrafterConfig
    from trtllm_dflash.decoding import Decoder, Request, SequenceResult
    from trtllm_dflash.errors import DFlashError
    from trtllm_dflash.modeling.drafter import DFlashDrafter
    from trtllm_dflash.sampling_params import SamplingParams


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
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

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

from trtllm_dflash.api import DFlashPipeline, GenerationOutput
from trtllm_dflash.checkpoints import load_drafter, load_target, save_drafter, validate_pair
from trtllm_dflash.config import DrafterConfig
from trtllm_dflash.decoding import Decoder, Request, SamplingParams, SequenceResult
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.modeling.drafter import DFlashDrafter

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

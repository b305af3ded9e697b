"""Loading target and drafter checkpoints, and checking that they belong together.

One module per format or concern; the rest of the package imports from here
(`from trtllm_dflash.checkpoints import load_target, load_drafter`):

    paths.py     where a checkpoint is: a directory, or the embedded demo pair for `demo`
    weights.py   the safetensors files: present (pickles refused), headers intact
    targets.py   Hugging Face targets (transformers) and their tokenizers
    mxfp4.py     gpt-oss targets with MXFP4 experts as published, dequantized by our codec
    modelopt.py  ModelOpt checkpoints: FP8 targets (the quantize stage's output), FP8 / NVFP4 drafters
    drafters.py  drafters in the z-lab, ModelOpt or Speculators layout; writing the z-lab layout
    pair.py      whether a drafter fits a target (`validate_pair`, vocabulary-sized weights)

The drafter's config.json is parsed by trtllm_dflash/config.py (DrafterConfig). Nothing here
imports the API, the runtimes, decoding, serving, the backends or the builder.
"""

from trtllm_dflash.checkpoints.drafters import (
    DrafterCheckpoint,
    load_drafter,
    new_drafter,
    read_drafter_checkpoint,
    read_drafter_weights,
    save_drafter,
)
from trtllm_dflash.checkpoints.pair import validate_pair
from trtllm_dflash.checkpoints.paths import resolve_checkpoint
from trtllm_dflash.checkpoints.targets import BUILD_TOKENIZER_FILES, TOKENIZER_FILES, Target, load_target
from trtllm_dflash.checkpoints.weights import check_safetensors_headers, require_safetensors, safetensors_header

__all__ = [
    "BUILD_TOKENIZER_FILES",
    "DrafterCheckpoint",
    "TOKENIZER_FILES",
    "Target",
    "check_safetensors_headers",
    "load_drafter",
    "load_target",
    "new_drafter",
    "read_drafter_checkpoint",
    "read_drafter_weights",
    "require_safetensors",
    "resolve_checkpoint",
    "safetensors_header",
    "save_drafter",
    "validate_pair",
]

"""Loading target and drafter checkpoints, and checking that they belong together."""

from trtllm_dflash.checkpoints.drafters import (
    TOKENIZER_FILES,
    Target,
    load_drafter,
    load_target,
    new_drafter,
    read_drafter_weights,
    resolve_checkpoint,
    safetensors_header,
    save_drafter,
    validate_pair,
)

__all__ = [
    "TOKENIZER_FILES", "Target", "load_drafter", "load_target", "new_drafter", "read_drafter_weights", "resolve_checkpoint",
    "safetensors_header", "save_drafter", "validate_pair",
]

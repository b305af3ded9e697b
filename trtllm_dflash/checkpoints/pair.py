"""Whether a drafter fits a target: `validate_pair` on their configs (before any weight is read),
and the checks of a loaded drafter's own weights against the target's vocabulary."""

from __future__ import annotations

import torch

from trtllm_dflash.config import DrafterConfig
from trtllm_dflash.errors import CompatibilityError
from trtllm_dflash.modeling.drafter import DFlashDrafter


def check_own_weights(drafter: DFlashDrafter, target_config) -> None:
    vocab = int(target_config.vocab_size)
    for name, module in (("lm_head", drafter.lm_head), ("embed_tokens", drafter.embed_tokens)):
        rows = None if module is None else (module.out_features if name == "lm_head" else module.num_embeddings)
        if rows is not None and rows != vocab:
            raise CompatibilityError(
                f"drafter's own {name} has {rows} rows, the target vocabulary has {vocab} tokens",
                "use the drafter trained for this target's tokenizer",
            )


def check_codebooks(state: dict[str, torch.Tensor], target_config) -> None:
    """A V2 drafter's selector codebooks have one row per target token."""
    vocab = int(target_config.vocab_size)
    for name in ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook"):
        if name in state and state[name].shape[0] != vocab:
            raise CompatibilityError(
                f"drafter's {name} has {state[name].shape[0]} rows, the target vocabulary has {vocab} tokens",
                "use the DFlash V2 drafter trained for this target's tokenizer",
            )


def validate_pair(target_config, drafter: DrafterConfig) -> None:
    """Check that a drafter fits a target; raise with the problem and the fix."""
    hidden = int(target_config.hidden_size)
    vocab = int(target_config.vocab_size)
    layers = int(target_config.num_hidden_layers)
    if drafter.hidden_size != hidden:
        raise CompatibilityError(
            f"drafter hidden_size {drafter.hidden_size} != target hidden_size {hidden}",
            "use the drafter trained for this target (its context features are the target's hidden states)",
        )
    if drafter.vocab_size is not None and drafter.vocab_size != vocab:
        raise CompatibilityError(
            f"drafter vocab_size {drafter.vocab_size} != target vocab_size {vocab}",
            "use the drafter trained for this target's tokenizer",
        )
    if drafter.num_target_layers is not None and drafter.num_target_layers != layers:
        raise CompatibilityError(
            f"drafter was trained on a {drafter.num_target_layers}-layer target, this target has {layers} layers",
            "use the drafter trained for this target",
        )
    bad = [i for i in drafter.target_layer_ids if not 0 <= i < layers]
    if bad:
        raise CompatibilityError(
            f"target_layer_ids {list(drafter.target_layer_ids)} has ids outside [0, {layers}): {bad}",
            "ids name target decoder layers, 0-based (id i is the output of layer i)",
        )
    check_mask_token(target_config, drafter)
    if drafter.block_size < 2:
        raise CompatibilityError(f"drafter block_size is {drafter.block_size}", "DFlash needs a block size >= 2")
    if drafter.layer_types and len(drafter.layer_types) != drafter.num_hidden_layers:
        raise CompatibilityError(
            f"layer_types has {len(drafter.layer_types)} entries for {drafter.num_hidden_layers} layers",
            "give one layer type per draft layer",
        )
    sliding = [t for t in drafter.layer_types if t == "sliding_attention"]
    if sliding and not drafter.sliding_window and drafter.swa_window_size is None:  # use_swa gives the window
        raise CompatibilityError("drafter has sliding_attention layers but no sliding_window", "set sliding_window in config.json")
    if drafter.sliding_window_size is not None and drafter.sliding_window_size <= 0:
        raise CompatibilityError(
            f"drafter sliding_window_size is {drafter.sliding_window_size}", "use a positive number of context positions or leave it unset"
        )


def check_mask_token(target_config, drafter: DrafterConfig) -> None:
    """The drafter's mask token (when it has one) is a token of the target's vocabulary."""
    vocab = int(target_config.vocab_size)
    if drafter.mask_token_id is not None and not 0 <= drafter.mask_token_id < vocab:
        raise CompatibilityError(
            f"mask_token_id {drafter.mask_token_id} is outside the target vocabulary [0, {vocab})",
            "set dflash_config.mask_token_id to a token id of the target's vocabulary",
        )

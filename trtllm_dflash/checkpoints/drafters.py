"""Drafter checkpoints: config.json + *.safetensors in the z-lab layout, ModelOpt's DFlash export
(same layout, optionally FP8 or NVFP4 with hf_quant_config.json, dequantized on load by
modelopt.py) or vLLM Speculators' DFlash layout (docs/generate.md lists what is supported); and
writing a drafter in the z-lab layout. Only safetensors are read, nothing is unpickled.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from trtllm_dflash.checkpoints.modelopt import dequantize_drafter
from trtllm_dflash.checkpoints.pair import check_codebooks, check_mask_token, check_own_weights, validate_pair
from trtllm_dflash.checkpoints.paths import resolve_checkpoint
from trtllm_dflash.checkpoints.targets import Target
from trtllm_dflash.checkpoints.weights import check_safetensors_headers, require_safetensors
from trtllm_dflash.config import DrafterConfig, read_drafter_json
from trtllm_dflash.drafters import DRAFTER_KINDS, kind_of
from trtllm_dflash.errors import CheckpointError, CompatibilityError
from trtllm_dflash.modeling.drafter import DFlashDrafter


def read_drafter_weights(path: Path) -> dict[str, torch.Tensor]:
    files = require_safetensors(path, "drafter")
    check_safetensors_headers(files)
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state.update(load_file(str(file)))
        except SafetensorError as exc:
            raise CheckpointError(f"{file} is not a valid safetensors file ({exc})", "re-download or re-export the drafter") from None
    return state


# Tensors a drafter export may carry that the drafter does not use: Speculators' copies of the
# verifier's final norm / LM head (used only in training), rotary buffers.
IGNORED_DRAFTER_TENSORS = ("verifier_norm.weight", "verifier_lm_head.weight")
OWN_WEIGHTS = ("lm_head.weight", "embed_tokens.weight")


@dataclasses.dataclass(frozen=True)
class DrafterCheckpoint:
    """A drafter directory with its config.json parsed once: the raw dict (what DrafterConfig does
    not keep: the quantization config, a mask token named by its text) and the DrafterConfig."""

    path: Path
    raw: dict[str, Any]
    config: DrafterConfig


def read_drafter_checkpoint(path: str | Path) -> DrafterCheckpoint:
    """A drafter's directory (a path, or `demo`) and its config.json, parsed once."""
    path = resolve_checkpoint(path, "drafter")
    raw = read_drafter_json(path)
    return DrafterCheckpoint(path, raw, DrafterConfig.from_dict(raw, source=str(path / "config.json")))


def load_drafter(
    path: str | Path | DrafterCheckpoint,
    target: Target | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    sliding_window_size: int | None = None,
    *,
    pair_checked: bool = False,
) -> DFlashDrafter:
    """Load a DFlash drafter (z-lab, ModelOpt or Speculators layout); with `target`, check first
    that the pair fits. `sliding_window_size` overrides the checkpoint's bounded draft history.

    `path` may be a DrafterCheckpoint already read (its config.json is not parsed again).
    `pair_checked`: the caller has run validate_pair on this target's config and this drafter's
    (a build's checkpoints stage), so only what it could not see is checked again: a mask token
    looked up here in the target's tokenizer."""
    checkpoint = path if isinstance(path, DrafterCheckpoint) else read_drafter_checkpoint(path)
    path, config = checkpoint.path, checkpoint.config
    if sliding_window_size is not None:
        if sliding_window_size <= 0:
            raise CompatibilityError(f"sliding_window_size is {sliding_window_size}", "pass a positive number of context positions")
        config = dataclasses.replace(config, sliding_window_size=sliding_window_size)
    mask_looked_up = config.mask_token_id is None
    if mask_looked_up:
        config = dataclasses.replace(config, mask_token_id=resolve_mask_token(path, target, checkpoint.raw))
    if target is not None and not pair_checked:
        validate_pair(target.config, config)
    elif target is not None and mask_looked_up:
        check_mask_token(target.config, config)
    elif target is None and config.block_size < 2:
        raise CompatibilityError(f"drafter block_size is {config.block_size}", "DFlash needs a block size >= 2")
    state = _normalize_drafter_state(read_drafter_weights(path), path, checkpoint.raw)
    kind = kind_of(config)
    target_vocab = None if target is None else getattr(target.config, "vocab_size", None)
    drafter = kind.new_module(config, kind.module_vocab(config, target_vocab, state))
    drafter.attach_own_weights(state.get("lm_head.weight"), state.get("embed_tokens.weight"))
    if target is not None:
        check_own_weights(drafter, target.config)
        check_codebooks(state, target.config)
    expected = drafter.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing:
        raise CheckpointError(
            f"drafter {path} is missing {len(missing)} tensor(s), e.g. {', '.join(missing[:3])}",
            "check that num_hidden_layers and target_layer_ids in config.json match the weights",
        )
    if unexpected:
        other = next((k for k in DRAFTER_KINDS.values() if k is not kind and k.owns_tensors(unexpected)), None)
        raise CheckpointError(
            f"drafter {path} has {len(unexpected)} unexpected tensor(s), e.g. {', '.join(unexpected[:3])}",
            f'these are {other.label} tensors: set architectures to ["{other.architecture}"] in config.json'
            if other is not None
            else "use a z-lab DFlash layout (layers.N.*, fc, hidden_norm, norm) or fix num_hidden_layers in config.json",
        )
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise CheckpointError(
                f"drafter tensor {name} has shape {tuple(tensor.shape)}, config.json implies {tuple(expected[name].shape)}",
                "fix config.json (hidden_size, heads, head_dim, target_layer_ids) to match the weights",
            )
    drafter.load_state_dict(state)
    if target is not None:
        dtype = dtype or next(target.model.parameters()).dtype
        device = next(target.model.parameters()).device
    return drafter.to(device=device, dtype=dtype or torch.float32).eval()


def new_drafter(config: DrafterConfig, vocab_size: int | None = None) -> DFlashDrafter:
    """An initialised drafter of the config's kind (`vocab_size`: for a kind with its own tables)."""
    return kind_of(config).new_module(config, vocab_size)


def resolve_mask_token(path: Path, target: Target | None, raw: dict[str, Any] | None = None) -> int:
    """The mask token of a drafter whose config has no id: the token the config names
    (`dflash_config.mask_token`, as SGLang reads it), else the target tokenizer's mask token,
    else the token `<|MASK|>` in its vocabulary. `raw`: the drafter's config.json, when parsed already."""
    tokenizer = target.tokenizer if target is not None else None
    raw = raw if raw is not None else read_drafter_json(path)
    named = (raw.get("dflash_config") or {}).get("mask_token") or raw.get("mask_token")
    if tokenizer is not None:
        vocab = tokenizer.get_vocab()
        if isinstance(named, str):
            if named not in vocab:
                raise CheckpointError(
                    f"drafter {path}/config.json names mask token {named!r}, which the target's tokenizer does not have",
                    "set dflash_config.mask_token_id, or use the target the drafter was trained for",
                )
            return int(vocab[named])
        if getattr(tokenizer, "mask_token_id", None) is not None:
            return int(tokenizer.mask_token_id)
        if MASK_TOKEN in vocab:
            return int(vocab[MASK_TOKEN])
    where = "the target's tokenizer has no mask token" if tokenizer is not None else "no target tokenizer to look it up in"
    raise CheckpointError(
        f"drafter {path}/config.json has no mask_token_id and {where}",
        "set dflash_config.mask_token_id in the drafter's config.json (the id the drafter was trained with)",
    )


MASK_TOKEN = "<|MASK|>"


def _normalize_drafter_state(state: dict[str, torch.Tensor], path: Path, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Tensor names and dtypes as DFlashDrafter expects them, from any supported export (`config`: its config.json)."""
    if "fc.weight" not in state:  # names under a module prefix (e.g. `model.fc.weight`)
        prefixes = [name[: -len("fc.weight")] for name in state if name.endswith(".fc.weight")]
        if len(prefixes) == 1:
            prefix = prefixes[0]
            state = {name.removeprefix(prefix): tensor for name, tensor in state.items()}
    state = {name: t for name, t in state.items() if name not in IGNORED_DRAFTER_TENSORS and "rotary_emb" not in name}
    return dequantize_drafter(state, path, config)


def save_drafter(drafter: DFlashDrafter, path: str | Path) -> Path:
    """Write a drafter in the z-lab layout (config.json + model.safetensors), loadable by other tools."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in drafter.state_dict().items()}
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(drafter.config.to_dict(), indent=2) + "\n")
    return path

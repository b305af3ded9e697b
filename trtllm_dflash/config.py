"""The DFlash drafter configuration, read from a z-lab style `config.json`.

Values are read from `dflash_config` first and then from the top level, as newer checkpoints
move fields (such as `block_size`) into `dflash_config`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from trtllm_dflash.errors import CheckpointError

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Target layers tapped when a checkpoint does not list them (z-lab's rule).

    Layer id i is the OUTPUT of target decoder layer i (Hugging Face hidden_states[i + 1]).
    """
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [int(round(start + k * span / (num_draft_layers - 1))) for k in range(num_draft_layers)]


@dataclasses.dataclass(frozen=True)
class DrafterConfig:
    """Shape and DFlash parameters of a block-diffusion drafter."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    block_size: int
    vocab_size: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 40960
    attention_bias: bool = False
    hidden_act: str = "silu"
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    input_embedding_scale: float | None = None
    output_multiplier: float | None = None
    final_logit_softcapping: float | None = None
    model_type: str = "qwen3"
    architectures: tuple[str, ...] = ("DFlashDraftModel",)

    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)

    def window_of(self, layer: int) -> int:
        """Sliding window of a draft layer, 0 for full (non-causal) attention."""
        if self.layer_types and self.layer_types[layer] == SLIDING_ATTENTION:
            return int(self.sliding_window or 0)
        return 0

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> "DrafterConfig":
        dflash = raw.get("dflash_config") or {}

        def get(name: str, default: Any = dataclasses.MISSING) -> Any:
            if name in dflash and dflash[name] is not None:
                return dflash[name]
            if name in raw and raw[name] is not None:
                return raw[name]
            if default is dataclasses.MISSING:
                raise CheckpointError(
                    f"{source} has no '{name}'",
                    f"add '{name}' to the drafter config (top level or under 'dflash_config')",
                )
            return default

        try:
            num_layers = int(get("num_hidden_layers"))
            heads = int(get("num_attention_heads"))
            hidden = int(get("hidden_size"))
            num_target_layers = int(get("num_target_layers"))
            layer_ids = get("target_layer_ids", None)
            if layer_ids is None:
                layer_ids = default_target_layer_ids(num_target_layers, num_layers)
            layer_types = tuple(get("layer_types", ()) or ())
            rope = get("rope_parameters", None) or {}
            return cls(
                hidden_size=hidden,
                intermediate_size=int(get("intermediate_size")),
                num_hidden_layers=num_layers,
                num_attention_heads=heads,
                num_key_value_heads=int(get("num_key_value_heads", heads)),
                head_dim=int(get("head_dim", hidden // heads)),
                num_target_layers=num_target_layers,
                target_layer_ids=tuple(int(i) for i in layer_ids),
                mask_token_id=int(get("mask_token_id")),
                block_size=int(get("block_size")),
                vocab_size=None if get("vocab_size", None) is None else int(get("vocab_size")),
                rms_norm_eps=float(get("rms_norm_eps", 1e-6)),
                rope_theta=float(get("rope_theta", rope.get("rope_theta", 1_000_000.0))),
                rope_scaling=get("rope_scaling", None) or _scaling_from_parameters(rope),
                max_position_embeddings=int(get("max_position_embeddings", 40960)),
                attention_bias=bool(get("attention_bias", False)),
                hidden_act=str(get("hidden_act", "silu")),
                layer_types=layer_types,
                sliding_window=None if get("sliding_window", None) is None else int(get("sliding_window")),
                input_embedding_scale=_optional_float(get("input_embedding_scale", None)),
                output_multiplier=_optional_float(get("output_multiplier", None)),
                final_logit_softcapping=_optional_float(get("final_logit_softcapping", None)),
                model_type=str(get("model_type", "qwen3")),
                architectures=tuple(get("architectures", ("DFlashDraftModel",))),
            )
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{source} has a field of the wrong type ({exc})", "fix the value in config.json")

    @classmethod
    def from_dir(cls, path: str | Path) -> "DrafterConfig":
        config_path = Path(path) / "config.json"
        if not config_path.is_file():
            raise CheckpointError(
                f"drafter directory {path} has no config.json",
                "point --drafter at a z-lab style DFlash checkpoint (config.json + model.safetensors)",
            )
        try:
            raw = json.loads(config_path.read_text())
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{config_path} is not valid JSON ({exc.msg}, line {exc.lineno})", "fix or re-download it")
        return cls.from_dict(raw, source=str(config_path))

    def to_dict(self) -> dict[str, Any]:
        """The z-lab `config.json` layout (DFlash fields under `dflash_config`)."""
        out: dict[str, Any] = {
            "architectures": list(self.architectures),
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "num_target_layers": self.num_target_layers,
            "block_size": self.block_size,
            "dflash_config": {
                "mask_token_id": self.mask_token_id,
                "target_layer_ids": list(self.target_layer_ids),
            },
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": self.attention_bias,
            "hidden_act": self.hidden_act,
            "layer_types": list(self.layer_types) or [FULL_ATTENTION] * self.num_hidden_layers,
        }
        optional = {
            "vocab_size": self.vocab_size,
            "rope_scaling": self.rope_scaling,
            "sliding_window": self.sliding_window,
            "input_embedding_scale": self.input_embedding_scale,
            "output_multiplier": self.output_multiplier,
            "final_logit_softcapping": self.final_logit_softcapping,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        return out


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _scaling_from_parameters(rope: dict[str, Any]) -> dict[str, Any] | None:
    """transformers 5 writes `rope_parameters`; keep only a non-default scaling."""
    if rope.get("rope_type", "default") == "default":
        return None
    return {k: v for k, v in rope.items() if k != "rope_theta"}

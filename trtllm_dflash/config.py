"""The DFlash drafter configuration, read from a z-lab style `config.json`.

Values are read from `dflash_config` first and then from the top level, as newer checkpoints
move fields (such as `block_size`) into `dflash_config`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from trtllm_dflash.contracts.draft_window import DraftWindow
from trtllm_dflash.contracts.drafter_kinds import DFLASH, DFLASH2, V2_ARCHITECTURE
from trtllm_dflash.errors import CheckpointError

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
SUPPORTED_FORMATS = (
    "DFlash V1 drafters (DFlashDraftModel) in the z-lab, ModelOpt or Speculators layout, and DFlash V2 drafters (DFlash2DraftModel)"
)
# DFlash V2's published sizes, used where a config leaves one out
V2_DEFAULTS = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}
MAX_BLOCK_SIZE = 16
# Drafter heads other than DFlash's own that checkpoints name in dflash_config.projector_type, and what defines them.
PROJECTOR_RUNNERS = {
    "dspark": "TensorRT-LLM's decoding_type DSpark (deepseek-ai/DeepSpec)",
    "domino": "ModelOpt's Domino head export",
    "lilicorr": "ModelOpt's LiliCorr head export",
}
# The DSpark head switches TensorRT-LLM recognises in a drafter config (any of them set: a DSpark drafter).
DSPARK_HEAD_KEYS = ("shift_label", "use_confidence_head", "enable_confidence_head", "markov_rank")


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Target layers tapped when a checkpoint does not list them (z-lab's rule).

    Layer id i is the OUTPUT of target decoder layer i (Hugging Face hidden_states[i + 1]).
    """
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [int(round(start + k * span / (num_draft_layers - 1))) for k in range(num_draft_layers)]


def read_drafter_json(path: str | Path) -> dict[str, Any]:
    """The parsed config.json of a drafter directory (CheckpointError when it is missing or not JSON)."""
    config_path = Path(path) / "config.json"
    if not config_path.is_file():
        raise CheckpointError(
            f"drafter directory {path} has no config.json",
            "point --drafter at a z-lab style DFlash checkpoint (config.json + model.safetensors)",
        )
    try:
        return json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{config_path} is not valid JSON ({exc.msg}, line {exc.lineno})", "fix or re-download it")


@dataclasses.dataclass(frozen=True)
class DrafterConfig:
    """Shape and DFlash parameters of a block-diffusion drafter."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_target_layers: int | None  # None: not recorded (Speculators checkpoints)
    target_layer_ids: tuple[int, ...]
    mask_token_id: int | None  # None: resolved from the target's tokenizer by load_drafter
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
    # z-lab's draft sliding window: the block sees only the most recent `sliding_window_size`
    # committed context positions, in every layer (bounds the draft KV history for long contexts).
    sliding_window_size: int | None = None
    # ModelOpt `causal: true`: causal attention inside the block in full layers too.
    causal: bool = False
    # ModelOpt / DeepSpec `dflash_config.use_swa: true, swa_window_size: W`: the same symmetric
    # window as a sliding layer's, on the sliding layers when layer_types says which, else on all.
    swa_window_size: int | None = None
    # DFlash V2 (DFlash2DraftModel): grouped dynamic convolutions around every sublayer and the
    # candidate selector head; all 0 for a V1 drafter.
    conv_kernel_size: int = 0
    conv_group_size: int = 0
    selector_rank: int = 0
    selector_top_k: int = 0

    @property
    def kind(self) -> str:
        """The drafter kind's name (`trtllm_dflash.drafters.kind_of` gives the kind): DFLASH2 for a
        DFlash2DraftModel (convolutions + candidate selector), else DFLASH."""
        return DFLASH2 if V2_ARCHITECTURE in self.architectures else DFLASH

    @property
    def conv_groups(self) -> int:
        """Channel groups of the V2 convolutions (each group shares one dynamic coefficient); 0 without them."""
        return self.hidden_size // self.conv_group_size if self.conv_group_size else 0

    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)

    def attention_of(self, layer: int) -> DraftWindow:
        """Which keys layer `layer`'s block queries see (`draft_window`: never causal unless the
        export says `causal: true`; a sliding layer's window is symmetric)."""
        sliding = bool(self.layer_types) and self.layer_types[layer] == SLIDING_ATTENTION
        if self.swa_window_size is not None:
            window = self.swa_window_size if sliding or not self.layer_types else 0
        else:
            window = int(self.sliding_window or 0) if sliding else 0
        return DraftWindow(window, self.causal)

    @property
    def attentions(self) -> list[DraftWindow]:
        """The distinct layer windows, in a stable order (one mask each)."""
        return sorted({self.attention_of(i) for i in range(self.num_hidden_layers)}, key=lambda w: (w.window, w.causal))

    @property
    def history(self) -> int:
        """Context positions a block may see (the bounded draft KV history), 0 for all."""
        return int(self.sliding_window_size or 0)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> "DrafterConfig":
        """Parse a drafter config.json: the z-lab layout, ModelOpt's export or Speculators'."""
        _refuse_unsupported_formats(raw, source)
        if "speculators_config" in raw or "speculators_model_type" in raw:
            return cls._from_speculators(raw, source)
        dflash = raw.get("dflash_config") or {}
        _refuse_unsupported_modelopt_options(dflash, source)

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
            layer_ids = get("target_layer_ids", None)
            # the target's depth is needed only to place default taps
            num_target_layers = _optional_int(get("num_target_layers", None if layer_ids else dataclasses.MISSING))
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
                mask_token_id=_optional_int(get("mask_token_id", None)),
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
                sliding_window_size=_optional_int(get("sliding_window_size", None)),
                causal=bool(get("causal", False)),
                swa_window_size=_swa_window(dflash, source),
                **_v2_fields(get, source),
            )
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{source} has a field of the wrong type ({exc})", "fix the value in config.json")

    @classmethod
    def _from_speculators(cls, raw: dict[str, Any], source: str) -> "DrafterConfig":
        """vLLM Speculators' DFlash layout: shapes in `transformer_layer_config`, DFlash fields at the
        top level, and `aux_hidden_state_layer_ids` counted from the embedding (= z-lab id + 1)."""
        spec = raw.get("speculators_config") or {}
        algorithm = spec.get("algorithm", raw.get("speculators_model_type"))
        if algorithm != "dflash":
            raise CheckpointError(
                f"{source} is a Speculators '{algorithm}' checkpoint, not DFlash",
                f"use one of the supported drafters: {SUPPORTED_FORMATS}",
            )
        layer = raw.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise CheckpointError(f"{source} has no 'transformer_layer_config'", "re-save the drafter with Speculators")
        aux = raw.get("aux_hidden_state_layer_ids")
        if not aux:
            raise CheckpointError(
                f"{source} has no 'aux_hidden_state_layer_ids'", "add the tapped target layers (Hugging Face hidden_states indices)"
            )
        if 0 in aux:
            raise CheckpointError(
                f"{source} taps hidden_states[0] (the embedding output), which DFlash drafters do not use",
                "aux_hidden_state_layer_ids count from 1 (id k is the output of decoder layer k-1)",
            )
        target_vocab = layer.get("vocab_size")
        draft_vocab = raw.get("draft_vocab_size", target_vocab)
        if target_vocab is not None and draft_vocab != target_vocab:
            raise CheckpointError(
                f"{source} drafts over a reduced vocabulary ({draft_vocab} of {target_vocab} tokens, d2t mapping)",
                "use a Speculators DFlash drafter trained with the full target vocabulary (draft_vocab_size == vocab_size)",
            )
        if raw.get("sample_from_anchor"):
            raise CheckpointError(
                f"{source} samples a draft at the anchor position (sample_from_anchor: true)",
                "use a DFlash drafter that drafts block positions 1..B-1 (sample_from_anchor: false)",
            )
        if SLIDING_ATTENTION in (layer.get("layer_types") or ()):
            raise CheckpointError(
                f"{source} has Speculators sliding-window layers, whose window is counted from the anchor",
                "use a drafter with full-attention layers, or a z-lab checkpoint with sliding layers",
            )
        try:  # Speculators saves only the fields that differ from Qwen3Config's defaults
            from transformers import Qwen3Config

            layer = Qwen3Config(**layer).to_dict()
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{source} has an invalid transformer_layer_config ({exc})", "re-save the drafter with Speculators")
        merged = {
            **layer,
            "target_layer_ids": [int(i) - 1 for i in aux],
            "mask_token_id": raw.get("mask_token_id"),
            "block_size": raw.get("block_size"),
            "architectures": ["DFlashDraftModel"],
        }
        merged.pop("dflash_config", None)
        merged.pop("num_target_layers", None)
        return cls.from_dict(merged, source)

    @classmethod
    def from_dir(cls, path: str | Path) -> "DrafterConfig":
        return cls.from_dict(read_drafter_json(path), source=str(Path(path) / "config.json"))

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
            "sliding_window_size": self.sliding_window_size,
            "causal": self.causal or None,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        if self.swa_window_size is not None:
            out["dflash_config"].update({"use_swa": True, "swa_window_size": self.swa_window_size})
        if self.kind == DFLASH2:
            out["dflash_config"].update(
                {"block_size": self.block_size, "is_causal": False, **{name: getattr(self, name) for name in V2_DEFAULTS}}
            )
        if self.mask_token_id is None:
            del out["dflash_config"]["mask_token_id"]
        if self.num_target_layers is None:
            del out["num_target_layers"]
        return out


def _v2_fields(get, source: str) -> dict[str, int]:
    """The V2 fields of a DFlash2DraftModel config (checked), or nothing for V1."""
    if V2_ARCHITECTURE not in tuple(get("architectures", ()) or ()):
        return {}
    if bool(get("is_causal", False)):
        raise CheckpointError(
            f"{source} is a DFlash V2 drafter with is_causal: true; V2 drafts the block non-causally",
            "set is_causal to false (the published V2 drafters are non-causal)",
        )
    if get("mask_token_id", None) is None:
        raise CheckpointError(f"{source} is a DFlash V2 drafter without mask_token_id", "add mask_token_id under dflash_config")
    fields = {name: int(get(name, default)) for name, default in V2_DEFAULTS.items()}
    block, hidden = int(get("block_size")), int(get("hidden_size"))
    if not 2 <= block <= MAX_BLOCK_SIZE:
        raise CheckpointError(f"{source} has block_size {block}; DFlash V2 blocks are 2..{MAX_BLOCK_SIZE}", "fix block_size")
    if min(fields.values()) < 1 or hidden % fields["conv_group_size"]:
        raise CheckpointError(
            f"{source} has V2 sizes {fields} that do not fit hidden_size {hidden}",
            "conv_kernel_size, selector_rank and selector_top_k must be >= 1 and conv_group_size must divide hidden_size",
        )
    return fields


def _swa_window(dflash: dict[str, Any], source: str) -> int | None:
    """ModelOpt's / DeepSpec's `use_swa` + `swa_window_size` (TensorRT-LLM reads them from
    dflash_config), checked; None when the drafter does not use them."""
    if not dflash.get("use_swa"):
        return None
    window = dflash.get("swa_window_size")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise CheckpointError(
            f"{source} sets dflash_config.use_swa but swa_window_size is {window!r}",
            "set dflash_config.swa_window_size to the window the drafter was trained with (a positive integer)",
        )
    return window


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _refuse_unsupported_formats(raw: dict[str, Any], source: str) -> None:
    """Drafter families that look like DFlash but run differently: refuse them by name."""
    if (raw.get("speculators_config") or {}).get("algorithm") == "dflash2":
        raise CheckpointError(
            f"{source} is a Speculators 'dflash2' checkpoint (experimental, its tensor layout is not published)",
            f"use the drafter in the inco.ai / z-lab DFlash2DraftModel layout, or one of: {SUPPORTED_FORMATS}",
        )
    dflash = raw.get("dflash_config") or {}
    projector = dflash.get("projector_type")
    if projector not in (None, "dflash"):
        runner = PROJECTOR_RUNNERS.get(str(projector).lower(), f"ModelOpt's {projector} export")
        raise CheckpointError(
            f"{source} is a DFlash drafter with a '{projector}' head, which this toolkit does not run ({runner} defines it)",
            f"use one of the supported drafters: {SUPPORTED_FORMATS}",
        )
    dspark = [key for key in DSPARK_HEAD_KEYS if dflash.get(key) or raw.get(key) or raw.get(f"dspark_{key}")]
    if dspark or raw.get("dspark_config"):
        raise CheckpointError(
            f"{source} declares DSpark heads ({', '.join(dspark) or 'dspark_config'}), which this toolkit does not run "
            "(TensorRT-LLM runs them with speculative_config.decoding_type: DSpark)",
            f"use one of the supported drafters: {SUPPORTED_FORMATS}",
        )
    if any("laguna" in str(arch).lower() for arch in raw.get("architectures") or ()):
        raise CheckpointError(
            f"{source} is a Laguna DFlash drafter (causal sliding layers, per-head output gates, per-tap feature norms), "
            "which this toolkit does not run (TensorRT-LLM's DFlashLagunaForCausalLM and vLLM's laguna_dflash do)",
            f"serve it with TensorRT-LLM or vLLM, or use one of: {SUPPORTED_FORMATS}",
        )


def _refuse_unsupported_modelopt_options(dflash: dict[str, Any], source: str) -> None:
    """ModelOpt export options that this drafter cannot run exactly."""
    if dflash.get("attention_sink_bias"):
        raise CheckpointError(
            f"{source} uses draft attention sinks (attention_sink_bias), whose definition for DFlash drafters "
            "is not published; this toolkit does not run them",
            "use a drafter trained without attention sinks",
        )


def _scaling_from_parameters(rope: dict[str, Any]) -> dict[str, Any] | None:
    """transformers 5 writes `rope_parameters`; keep only a non-default scaling."""
    if rope.get("rope_type", "default") == "default":
        return None
    return {k: v for k, v in rope.items() if k != "rope_theta"}

"""TensorRT-LLM's DFlash mode and our drafters: how it runs each one, and the config overlay that
makes it run a drafter as its reference defines it (the evidence below).

`drafter_support(config)` answers, per drafter: None (runs as published, with the overlay where
needed), a `DrafterNote` (runs differently: lower acceptance, output still exact) or (problem, fix)
(refused). docs/drafters.md's backend table is generated from it.

Drafters, as TensorRT-LLM's DFlash mode runs them (read in NVIDIA/TensorRT-LLM, the newest versions the
search index holds; v1.4.0rc1 was cut from main on 2026-10-22, after PR #19159 merged on 2026-09-14):
- tensorrt_llm/_torch/models/modeling_dflash.py, the DFlash 2 version (DFlash2BlockConv,
  DFlash2CandidateSelector, _is_dflash2_architecture; the index gives no commit for it) and
  7c7504c08f1f (FA4): a checkpoint whose `architectures` has the "dflash2" stem, or whose dflash_config
  has conv_kernel_size / selector_rank, is a DFlash 2 drafter; it needs dflash_config.{conv_kernel_size,
  conv_group_size, selector_rank, selector_top_k} and honours the TOP-LEVEL `is_causal` (V2 only): false
  gives non-causal sliding layers with flash-attention window (W-1, W-1). V1 drafters ignore is_causal:
  a layer with a sliding window runs CAUSALLY, window (W-1, 0). dflash_config.use_swa / swa_window_size
  replaces the window with (W-1, W-1) on the sliding layers (all layers without layer_types) but leaves
  `causal` as it was.
- tests/unittest/_torch/speculative/hw_agnostic/test_dflash2_semantics.py @10e95278445b (PR #19159):
  the drafter attention backends VANILLA and FA4 run the released V2 drafter's non-causal 2048 window;
  TRTLLM refuses any non-causal finite window ("flashinfer's trtllm-gen context kernel refuses causal=False
  with any finite window_left").
- tensorrt_llm/_torch/pyexecutor/config_utils.py @2c36f34b5d18 (get_layer_attention_window): an explicit
  `use_sliding_window: false` turns the inferred window off.
So V2 drafters run here with drafter attention VANILLA (written explicitly) or FA4, never TRTLLM, and a
drafter whose reference semantics TensorRT-LLM would not reproduce from its own config.json gets a config
overlay (drafter_overlay: config.json patched, every other file linked) that makes it run them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trtllm_dflash.contracts.drafter_kinds import DFLASH2
from trtllm_dflash.drafters import kind_of

SLIDING = "sliding_attention"
V2_DFLASH_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
# A finite non-causal window is what TensorRT-LLM's TRTLLM drafter attention cannot run (PR #19159).
TWO_SIDED_BACKENDS = ("VANILLA", "FA4")
OVERLAY_RECORD = "dflash-trt-overlay.json"
Attention = tuple[bool, tuple[int, int]]  # (causal, flash-attention (left, right) window; -1: unbounded)


class DrafterNote(tuple):
    """drafter_support's answer for a drafter TensorRT-LLM runs, but not as its reference defines it:
    (what differs, how to run it exactly). A plain tuple is a refusal; None runs as published."""

    def __new__(cls, note: str, fix: str) -> "DrafterNote":
        return super().__new__(cls, (note, fix))


def runs_two_sided(drafter: Any) -> bool:
    """Whether TensorRT-LLM runs a drafter (a DrafterConfig or a catalog DrafterSpec) in its DFlash 2 mode,
    which honours the top-level is_causal: its sliding windows then run two-sided as published, never
    causally, so its drafter attention must be one of TWO_SIDED_BACKENDS."""
    return kind_of(drafter).name == DFLASH2


def _read_as_dflash2(raw: dict[str, Any]) -> bool:
    """TensorRT-LLM's DFlash 2 test: the "dflash2" stem in architectures, or V2 sizes in dflash_config."""
    dflash = raw.get("dflash_config") or {}
    stem = any("dflash2" in str(a).lower().replace("_", "").replace("-", "") for a in raw.get("architectures") or ())
    return stem or int(dflash.get("conv_kernel_size") or 0) > 0 or int(dflash.get("selector_rank") or 0) > 0


def _trtllm_window(raw: dict[str, Any], layer: int) -> int | None:
    """config_utils.get_layer_attention_window: the sliding window TensorRT-LLM infers for a layer."""
    if raw.get("use_sliding_window") is False or raw.get("sliding_window") is None:
        return None
    types = raw.get("layer_types")
    if types:
        if "sliding" not in str(types[layer % len(types)]).lower():
            return None
    elif isinstance(raw.get("max_window_layers"), int) and layer < raw["max_window_layers"]:
        return None
    return int(raw["sliding_window"])


def trtllm_block_attention(raw: dict[str, Any], layer: int) -> Attention:
    """How TensorRT-LLM's DFlash block decode attends in draft layer `layer` of a drafter config.json
    (DFlashForCausalLM._get_attention_mask_args, then the use_swa window; see the module docstring)."""
    types = raw.get("layer_types")
    window = _trtllm_window(raw, layer)
    sliding = (bool(types) and "sliding" in str(types[layer % len(types)]).lower()) or window is not None
    explicit = raw.get("is_causal") if _read_as_dflash2(raw) else None  # the top-level key, V2 only
    if explicit is not None:
        causal = bool(explicit)
    else:
        causal = sliding and window is not None
    span = (-1, -1) if window is None else ((window - 1, 0) if causal else (window - 1, window - 1))
    dflash = raw.get("dflash_config") or {}
    if dflash.get("use_swa") and (not types or layer >= len(types) or types[layer] == SLIDING):
        swa = int(dflash.get("swa_window_size") or 0)
        span = (swa - 1, swa - 1)
    return causal, span


def reference_block_attention(raw: dict[str, Any], layer: int) -> Attention:
    """How the drafter's reference attends (z-lab's DFlashDraftModel, ModelOpt / DeepSpec exports, our
    runtimes): non-causal unless the export says `causal: true`; a sliding layer (with use_swa and no
    layer_types: every layer) sees |q - k| <= W - 1."""
    dflash = raw.get("dflash_config") or {}
    types = raw.get("layer_types") or ()
    sliding = bool(types) and types[layer] == SLIDING
    window = 0
    if dflash.get("use_swa"):
        window = int(dflash.get("swa_window_size") or 0) if sliding or not types else 0
    elif sliding:
        window = int(raw.get("sliding_window") or 0)
    causal = bool(raw.get("causal") or dflash.get("causal"))
    span = (-1, -1) if not window else ((window - 1, 0) if causal else (window - 1, window - 1))
    return causal, span


def _trtllm_layers(raw: dict[str, Any]) -> list[Attention]:
    return [trtllm_block_attention(raw, i) for i in range(int(raw.get("num_hidden_layers") or 0))]


def _reference_layers(raw: dict[str, Any]) -> list[Attention]:
    return [reference_block_attention(raw, i) for i in range(int(raw.get("num_hidden_layers") or 0))]


def drafter_overlay(raw: dict[str, Any]) -> dict[str, Any] | None:
    """config.json for TensorRT-LLM when the drafter's own would not run as its reference: V2 sizes and
    the top-level is_causal where TensorRT-LLM reads them, and for sliding layers `use_sliding_window:
    false` (no causal inferred window) + use_swa with the same window. None when the drafter's config.json
    already runs as published, or when no config TensorRT-LLM reads expresses it (drafter_support)."""
    config = json.loads(json.dumps(raw))
    dflash = config.setdefault("dflash_config", {})
    if _read_as_dflash2(raw):
        for key in V2_DFLASH_KEYS + ("mask_token_id", "block_size"):
            if dflash.get(key) is None and config.get(key) is not None:
                dflash[key] = config[key]
        if config.get("is_causal") is None:
            config["is_causal"] = bool(dflash.get("is_causal", False))
    reference = _reference_layers(raw)
    if _trtllm_layers(config) != reference:
        config["use_sliding_window"] = False
        if SLIDING in (config.get("layer_types") or ()) and not dflash.get("use_swa") and config.get("sliding_window"):
            dflash.update(use_swa=True, swa_window_size=int(config["sliding_window"]))
    if _trtllm_layers(config) != reference or config == raw:
        return None
    return config


def drafter_support(config, attention_backend: str | None = None) -> tuple[str, str] | None:
    """Whether the trtllm backend runs a drafter (a trtllm_dflash.config.DrafterConfig) as published.

    None: TensorRT-LLM runs it as its reference defines it (through drafter_overlay where its
    config.json alone would not). A DrafterNote (note, fix): it runs, differently (lower acceptance,
    output still exact). Any other (problem, fix): the backend refuses it. `attention_backend` is the
    recipe's trtllm.attention_backend (None: VANILLA, TensorRT-LLM's default).
    """
    raw = config.to_dict()
    if getattr(config, "causal", False):
        raw["causal"] = True
    name = kind_of(config).label
    backend = attention_backend or "VANILLA"
    if getattr(config, "sliding_window_size", None):
        return DrafterNote(
            f"the {name} bounds its context to the last {config.sliding_window_size} positions "
            "(z-lab sliding_window_size); TensorRT-LLM's DFlash mode lets it see the whole context",
            "use --backend torch or trt for the bounded history",
        )
    runs = drafter_overlay(raw) or raw
    differ = [
        f"layer {i}: (causal, window) {got} instead of {want}"
        for i, (got, want) in enumerate(zip(_trtllm_layers(runs), _reference_layers(raw)))
        if got != want
    ]
    if differ:
        return DrafterNote(
            f"TensorRT-LLM runs this {name} differently ({differ[0]}): lower acceptance, output still exact",
            "use --backend torch or trt to run it as published",
        )
    two_sided = [i for i, (causal, span) in enumerate(_trtllm_layers(runs)) if not causal and span != (-1, -1)]
    if backend not in TWO_SIDED_BACKENDS and two_sided:
        problem = (
            f"the {name} attends non-causally within a sliding window in layers {two_sided}, which TensorRT-LLM's "
            f"{backend} drafter attention refuses (NVIDIA/TensorRT-LLM PR #19159)"
        )
        fix = "set trtllm.attention_backend to VANILLA (or FA4 on Hopper)"
        causal_fallback = (
            not runs_two_sided(config)
            and _trtllm_layers(raw) != _reference_layers(raw)
            and not any(not c and s != (-1, -1) for c, s in _trtllm_layers(raw))
        )
        if causal_fallback:  # its own config.json runs causally there, which the TRTLLM kernel can do
            return DrafterNote(
                f"with drafter attention {backend}, TensorRT-LLM runs this drafter's sliding layers {two_sided} "
                "causally (no overlay: its kernel has no non-causal window): lower acceptance, output still exact",
                fix + " to run them as published",
            )
        return problem, fix
    return None


def write_drafter_overlay(drafter_dir: str | Path, dest: str | Path, overlay: dict[str, Any]) -> Path:
    """The overlay drafter directory: `overlay` as config.json, every other file of the drafter linked
    (absolute links: serve_command mounts the source at the same path), and a record of the source."""
    source, dest = Path(drafter_dir).resolve(), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for item in sorted(source.iterdir()):
        if item.name not in ("config.json", OVERLAY_RECORD) and not (dest / item.name).exists():
            (dest / item.name).symlink_to(item)
    (dest / "config.json").write_text(json.dumps(overlay, indent=2) + "\n")
    (dest / OVERLAY_RECORD).write_text(json.dumps({"source": str(source), "why": "TensorRT-LLM runs the drafter as published"}) + "\n")
    return dest


def local_drafter_overlay(drafter_dir: str | Path, attention_backend: str | None = None) -> dict[str, Any] | None:
    """The overlay config.json a local drafter needs on this backend, or None."""
    from trtllm_dflash.checkpoints import resolve_checkpoint
    from trtllm_dflash.config import DrafterConfig

    path = resolve_checkpoint(drafter_dir, "drafter")
    if drafter_support(DrafterConfig.from_dir(path), attention_backend) is not None:
        return None  # refused, or run without the overlay (a note says how)
    return drafter_overlay(json.loads((path / "config.json").read_text()))

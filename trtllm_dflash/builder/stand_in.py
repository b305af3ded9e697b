"""`build --model NAME --target DIR`: a local checkpoint standing in for a catalog model's.

`--model` keeps naming the catalog model, so its recipe (backend, parallel layout, precision,
limits) and its memory plan are used; the local directory replaces only the checkpoint the build
reads and the deployment points at. A stand-in of another family is refused: the recipe's
choices (backend, expert precision, MoE kernels) are made for that family. A stand-in of the same
family with other sizes (a tiny test model, a pruned variant) is accepted, with a note that the
memory plan describes the catalog model. With a local drafter the speculative options name the
pair that was validated together: the drafter's own mask token and tapped layers replace recipe
values written for the catalog drafter, each replacement noted. No torch import.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from trtllm_dflash.errors import DFlashError

# (config.json key(s) of the local target, ModelSpec attribute): the sizes the memory plan depends on
SIZES = (
    (("num_hidden_layers",), "num_layers"),
    (("hidden_size",), "hidden_size"),
    (("num_local_experts", "num_experts", "n_routed_experts"), "num_experts"),
    (("vocab_size",), "vocab_size"),
)


class StandInError(DFlashError):
    """A local target that cannot stand in for the catalog model."""


@dataclasses.dataclass(frozen=True)
class StandIn:
    """The local target directory, and what the plan should say about it."""

    path: Path
    notes: tuple[str, ...]


def _read_config(path: Path, role: str) -> dict[str, Any]:
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        raise StandInError(f"{role} {path} has no readable config.json", f"pass a Hugging Face checkpoint directory as --{role}") from None
    if not isinstance(raw, dict):
        raise StandInError(f"{role} {path}/config.json is not a JSON object", "re-export the checkpoint")
    return raw


def _families(raw: dict[str, Any]) -> set[str]:
    """The catalog families a config.json belongs to (its own model_type and its text part's)."""
    from trtllm_dflash.catalog.families import family_spec

    text = raw.get("text_config") or {}
    types = {t for t in (raw.get("model_type"), text.get("model_type")) if t}
    return types | {spec.model_type for t in types if (spec := family_spec(t)) is not None}


def check_stand_in(model, target: str) -> StandIn:
    """Refuse a stand-in of another family (one line); note where its sizes differ from `model`'s."""
    path = Path(target).expanduser()
    if not path.is_dir():
        raise StandInError(f"--target {target} is not a directory", "pass a local checkpoint directory (config.json + *.safetensors)")
    raw = _read_config(path, "target")
    families = _families(raw)
    wanted = _families({"model_type": model.family})
    if not families & wanted:
        found = raw.get("model_type") or "unknown"
        raise StandInError(
            f"--target {path} is a {found} checkpoint, {model.name} is a {model.family} model: the recipe's choices do not carry over",
            f"pass a {model.family} checkpoint as --target, or build it as its own model (--model {path})",
        )
    text = raw.get("text_config") or raw
    differences = []
    for keys, attribute in SIZES:
        local = next((text[k] for k in keys if text.get(k) is not None), None)
        catalog = getattr(model, attribute)
        if local is not None and catalog and int(local) != int(catalog):
            differences.append(f"{attribute} {local} vs {catalog}")
    notes = []
    if differences:
        notes.append(
            f"--target {path} stands in for {model.name} with other sizes ({', '.join(differences)}): "
            f"the memory plan and concurrency are {model.name}'s, not the local checkpoint's"
        )
    stored = (raw.get("quantization_config") or {}).get("quant_method") or "unquantized"
    if model.native_expert_precision == "mxfp4" and stored != "mxfp4":
        notes.append(
            f"--target {path} stores its experts {stored}, not MXFP4 as {model.name} publishes them: TensorRT-LLM serves them as stored"
        )
    return StandIn(path.resolve(), tuple(notes))


def drafter_overrides(recipe_drafter: dict[str, Any], drafter: str) -> tuple[dict[str, Any], list[str]]:
    """The recipe's drafter section for a local drafter that is validated with a stand-in target:
    its own mask token and tapped layers where the recipe pins others (they name the catalog drafter).

    A drafter trained on shorter blocks than the recipe drafts is refused (its draft schedule would
    ask for positions the drafter never learned)."""
    from trtllm_dflash.config import DrafterConfig

    path = Path(drafter).expanduser()
    if not path.is_dir():
        return recipe_drafter, []
    _read_config(path, "drafter")
    config = DrafterConfig.from_dir(path)
    if config.block_size < recipe_drafter["block_size"]:
        raise StandInError(
            f"drafter {path} was trained with block_size {config.block_size}, the recipe drafts blocks of {recipe_drafter['block_size']}",
            f"pass a drafter trained with block_size >= {recipe_drafter['block_size']}, "
            f"or a --recipe FILE with drafter.block_size {config.block_size}",
        )
    out, notes = dict(recipe_drafter), []
    own = {"mask_token_id": config.mask_token_id, "target_layer_ids": list(config.target_layer_ids)}
    for key, value in own.items():
        pinned = out.get(key)
        if pinned is not None and value is not None and pinned != value:
            out[key] = value
            notes.append(
                f"speculative_config.{key}: {value} from the local drafter's config.json (the recipe's {pinned} is the catalog drafter's)"
            )
    return out, notes

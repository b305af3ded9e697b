"""The build's artifact (backends/artifact.py) from its finished stages: made once per change, for
the repository stage (in memory) and for manifest.json (what `repo --build` reads)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtllm_dflash.backends.artifact import BuildArtifact
from trtllm_dflash.builder.spec import BuildSpec
from trtllm_dflash.served_model.model_parameters import RecipeLimits


def build_artifact(
    spec: BuildSpec, out: Path, records: dict[str, dict[str, Any]], llmapi_model: Path | None = None
) -> BuildArtifact | None:
    """What the build has made so far (`records`: the finished stages by name); None before its
    checkpoints stage finished. `llmapi_model`: the folder given with --llmapi-model (trtllm)."""
    checkpoints = records.get("checkpoints")
    if checkpoints is None:
        return None
    summary = checkpoints["summary"]
    quantize = (records.get("quantize") or {}).get("summary") or {}
    trtllm = (records.get("trtllm") or {}).get("summary") or {}
    return BuildArtifact(
        backend=spec.backend,
        recipe=spec.recipe.name,
        build_dir=str(out),
        target=summary["target"]["path"],
        drafter=summary["drafter"]["path"],
        quantized_target=f"quantize/{quantize['target_dir']}" if quantize.get("target_dir") else None,
        quantized_drafter=f"quantize/{quantize['drafter_dir']}" if quantize.get("drafter_dir") else None,
        engines="engines" if "engines" in records else None,
        limits=RecipeLimits.of(spec.recipe),
        decoupled=spec.recipe.triton.decoupled,
        trtllm_options=f"trtllm/{trtllm['file']}" if trtllm.get("file") else None,
        llmapi_model=str(llmapi_model) if llmapi_model is not None else None,
    )

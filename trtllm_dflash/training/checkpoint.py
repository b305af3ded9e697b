"""Resumable training state in safetensors: weights, optimizer moments, RNG, step.

A checkpoint directory holds `weights.safetensors` (the trained module's state dict),
`optimizer.safetensors` (AdamW moments as tensors; the param groups' hyper-parameters as JSON in
the file's metadata), and `state.json` (step, metrics and anything the caller adds). Nothing is
pickled, so resuming from a checkpoint someone else wrote cannot execute code. The directory is
written under a temporary name and renamed into place, so an interrupted save never leaves a
checkpoint that looks complete.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from trtllm_dflash.errors import CheckpointError

WEIGHTS = "weights.safetensors"
OPTIMIZER = "optimizer.safetensors"
STATE = "state.json"


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], str]:
    """Flatten `optimizer.state_dict()` to named tensors plus the param groups as JSON."""
    state = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    for index, values in state["state"].items():
        for key, value in values.items():
            tensor = value if torch.is_tensor(value) else torch.tensor(value)
            tensors[f"state.{index}.{key}"] = tensor.detach().to("cpu").contiguous()
    return tensors, json.dumps(state["param_groups"])


def load_optimizer_tensors(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], groups_json: str) -> None:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        _, index, key = name.split(".", 2)
        state.setdefault(int(index), {})[key] = tensor
    optimizer.load_state_dict({"state": state, "param_groups": json.loads(groups_json)})


def save_checkpoint(
    path: str | Path,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    generator: torch.Generator | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write a resumable checkpoint atomically (temporary directory, then rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_model(module, str(tmp / WEIGHTS), metadata={"format": "pt"})  # handles tied weights
    tensors, groups = optimizer_tensors(optimizer)
    if generator is not None:
        tensors["rng.generator"] = generator.get_state()
    save_file(tensors, str(tmp / OPTIMIZER), metadata={"format": "pt", "param_groups": groups})
    (tmp / STATE).write_text(json.dumps({"step": step, **(extra or {})}, indent=2) + "\n")
    old = path.with_name(path.name + ".old")
    if path.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
    return path


def load_checkpoint(
    path: str | Path,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator | None = None,
) -> dict[str, Any]:
    """Restore a checkpoint written by `save_checkpoint`; returns its state.json."""
    from safetensors import safe_open

    path = Path(path)
    if not all((path / name).is_file() for name in (WEIGHTS, OPTIMIZER, STATE)):
        raise CheckpointError(
            f"{path} is not a complete training checkpoint (needs {WEIGHTS}, {OPTIMIZER}, {STATE})",
            "start without --resume, or point at the run's output directory",
        )
    try:
        missing, unexpected = load_model(module, str(path / WEIGHTS), strict=False)
        if missing or unexpected:
            raise ValueError(f"weights do not match the model ({len(missing)} missing, {len(unexpected)} unexpected)")
        tensors = load_file(str(path / OPTIMIZER))
        with safe_open(str(path / OPTIMIZER), "pt") as handle:
            groups = (handle.metadata() or {})["param_groups"]
        rng_state = tensors.pop("rng.generator", None)
        load_optimizer_tensors(optimizer, tensors, groups)
        if generator is not None and rng_state is not None:
            generator.set_state(rng_state)
        return json.loads((path / STATE).read_text())
    except (ValueError, KeyError, RuntimeError, json.JSONDecodeError) as exc:
        raise CheckpointError(
            f"cannot resume from {path} ({str(exc).splitlines()[0]})",
            "resume with the same model settings as the run that wrote it, or start without --resume",
        ) from None

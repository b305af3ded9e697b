"""The steps `dflash-trt build` runs for a planned deployment, as `dflash-trt plan` lists them.

The checkpoints step is common; the rest is the backend's (`Backend.plan_steps`).
"""

from __future__ import annotations

from trtllm_dflash.backends import get_backend
from trtllm_dflash.planning.candidate import Candidate
from trtllm_dflash.planning.records import BuildStep


def build_steps(cfg: Candidate) -> tuple[BuildStep, ...]:
    model = cfg.model
    drafter = model.drafter.checkpoint if model.drafter else "(none)"
    checkpoints = BuildStep(
        "checkpoints", f"resolve the target {model.checkpoint} and the drafter {drafter}; validate the pair", ("torch", "transformers")
    )
    return (checkpoints, *get_backend(cfg.backend).plan_steps(cfg))

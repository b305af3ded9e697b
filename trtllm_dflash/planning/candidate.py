"""One deployment the planner considers: model, GPU, backend, precision, layout, limits."""

from __future__ import annotations

import dataclasses
from typing import Any

from trtllm_dflash.catalog.gpus import GPUSpec
from trtllm_dflash.catalog.models import ModelSpec
from trtllm_dflash.planning.records import Layout
from trtllm_dflash.recipes.precision import Precision


@dataclasses.dataclass(frozen=True)
class Candidate:
    model: ModelSpec
    gpu: GPUSpec | None  # None: CPU
    backend: str  # deployment backend: trt, trtllm or torch
    precision: Precision
    layout: Layout
    context: int
    max_batch: int
    max_num_tokens: int
    block_size: int
    draft_lengths: frozenset[int]
    kv_fraction: float
    recipe: Any = None
    backend_reason: str = ""
    prefix_cache_bytes: int = 0  # the served model's prefix cache (serving's prefix_cache_mib), on the device


def with_changes(cfg: Candidate, **changes: Any) -> Candidate:
    return dataclasses.replace(cfg, **changes)

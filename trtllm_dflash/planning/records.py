"""The values a deployment plan is made of: layout, memory budget, build steps, refusals (and the
precision, which is recipes/precision.py's value)."""

from __future__ import annotations

import dataclasses
from typing import Any

from trtllm_dflash.backends.base import BuildStep
from trtllm_dflash.errors import PlanRefusedError
from trtllm_dflash.recipes.precision import Precision  # the one precision value (recipes/precision.py)


@dataclasses.dataclass(frozen=True)
class Layout:
    num_gpus: int
    tp: int
    ep: int
    attention_dp: bool = False


@dataclasses.dataclass(frozen=True)
class Refusal:
    kind: str  # "precision", "layout", "too-few-gpus", "does-not-fit"
    problem: str
    fix: str


@dataclasses.dataclass(frozen=True)
class MemoryBudget:
    """Bytes per GPU."""

    target_weights: int
    drafter_weights: int
    activations: int
    cuda_graphs: int
    runtime_reserve: int
    kv_cache: int  # what is left for KV caches (after the runtime's free-memory fraction)
    capacity: int  # the GPU's memory
    prefix_cache: int = 0  # the prefix cache's bound (runtime/prefix_cache.py), taken before the KV caches

    @property
    def fixed(self) -> int:
        return self.target_weights + self.drafter_weights + self.activations + self.cuda_graphs + self.runtime_reserve + self.prefix_cache


@dataclasses.dataclass(frozen=True)
class Plan:
    model: str
    checkpoint: str
    drafter: str | None
    block_size: int
    gpu: str
    backend: str  # the deployment backend (trt / trtllm / torch)
    precision: Precision
    layout: Layout
    context: int
    max_batch_size: int
    max_num_tokens: int
    budget: MemoryBudget
    kv_bytes_per_token: int  # target, full-attention layers, per GPU
    kv_bytes_per_sequence: int  # target + drafter at `context`, per GPU
    drafter_kv_bytes_per_sequence: int
    max_concurrency: int
    backend_reason: str
    attention: str  # dense / sliding / sinks / hybrid-linear / mla
    linear_state_bytes_per_sequence: int  # Gated DeltaNet state incl. rollback copies (in kv_bytes_per_sequence); 0 if none
    prefix_cache_tokens: int  # prompt tokens the prefix cache holds (target + drafter K/V per token; 0: off)
    recipe: str | None
    steps: tuple[BuildStep, ...]
    refusals: tuple[Refusal, ...]
    notes: tuple[str, ...]
    placeholder_shapes: bool = False

    @property
    def ok(self) -> bool:
        return not self.refusals

    def check(self) -> "Plan":
        """Raise PlanRefusedError (one line: reason; nearest working combination) if refused."""
        if self.refusals:
            first = self.refusals[0]
            raise PlanRefusedError(first.problem, first.fix)
        return self

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["ok"] = self.ok
        out["precision"] = self.precision.to_dict()
        out["budget"]["fixed"] = self.budget.fixed
        return out


# ----------------------------------------------------------------------------------------------
# The budget

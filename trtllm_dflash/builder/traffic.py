"""Bytes each engine reads and writes per verify step: a model of DRAM traffic from the graphs.

A verify step is one drafter call and one target call over `batch` rows, each with `context`
committed tokens and a cache of `capacity` slots, verifying a block of `block` tokens (anchor +
drafts) after the drafter appended `new_rows` context rows. The model reads the exported graph
(`onnx.load(..., load_external_data=False)`: shapes and dtypes, never the weights) and counts:

- weights: every initializer once per call at its stored dtype (E4M3 for FP8 Q/DQ weights; at
  the cast's dtype when only Cast nodes read it), except tables read only by `Gather` (the
  embeddings), of which only the looked-up rows count;
- caches: a cache input read by plain ONNX ops (the native graphs' Concat) is read whole, every
  bound slot (`capacity` per row: the runtime binds each row's whole cache); one read only by a
  DFlash attention node is read as the node's contract says: `DFlashTargetAttention` reads each
  row's slots `[max(0, context - window + 1), context + block)` and writes the block's `block`
  slots in place, `DFlashBlockAttention` reads the row's `context` slots (the last `window - 1`
  of them for a sliding layer) and writes the `new_rows` new ones;
- the graph boundary: every other input read and every output written whole, dims resolved by
  name (`batch`, `tokens`, `picked`, `drafts`, `past`, `capacity`, `block`, `ctx_rows`);
  outputs aliased to a cache (`present_*`) cost nothing more;
- inside a verifying (plugin) target: the logits, written by the LM head and read once by
  `DFlashVerifyPositions` (a plugin's input is a tensor in memory, so they make the round trip
  too, but never leave the engine);
- the runtime around the engines (`runtime/trt_runtime.py`, the decoding loop): the native
  target's new K/V scattered into the cache, the drafter's new context K/V appended
  (`append_rows`), the native target's logits read by the verification kernel, the drafter's
  logits read to pick the drafts, and the draft distributions of sampled rows.

It is an estimate, not a profile: intermediate activations (the native graphs' transposed and
concatenated caches, attention scratch, MLP activations) are not counted, so a plain-op figure
is a lower bound; caches and weights are assumed read once per call (no re-reads across
tiles, nothing served from L2); verification passes beyond the first over a sampled row's
logits are not counted; the features handed to the drafter are counted at the two graph
boundaries, not the runtime's gather in between. Both variants are counted by the same rules,
so their difference is what the plugin nodes change. `closed_form` gives the same numbers
from a model's shape (config or catalog), without exporting its weights.

One job per module: traffic_steps.py (the data types and the per-step arithmetic),
traffic_onnx.py (summaries read from the exported graphs), traffic_closed_form.py (summaries
from a model's shape); this one runs them over a build and writes its traffic.json.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Iterable

# The model lives in three modules, one job each; their public names are importable from here.
from trtllm_dflash.builder.traffic_closed_form import LayerShape, ModelShape, V2Shape, closed_form, explain_model, v2_items
from trtllm_dflash.builder.traffic_onnx import find_graphs_json, load_build, summarize_graph
from trtllm_dflash.builder.traffic_steps import (
    CATEGORIES,
    CacheTensor,
    GraphSummary,
    Item,
    Step,
    StepTraffic,
    Tensor,
    TrafficError,
    cache_reads,
    graph_items,
    resolve_dim,
    runtime_items,
    verify_step,
)

__all__ = [
    "CATEGORIES",
    "TRAFFIC_FILE",
    "CacheTensor",
    "GraphSummary",
    "Item",
    "LayerShape",
    "ModelShape",
    "Step",
    "StepTraffic",
    "Tensor",
    "TrafficError",
    "V2Shape",
    "cache_reads",
    "closed_form",
    "default_step",
    "explain",
    "explain_model",
    "find_graphs_json",
    "graph_items",
    "load_build",
    "resolve_dim",
    "runtime_items",
    "summarize_graph",
    "v2_items",
    "verify_step",
    "write_traffic_json",
]

TRAFFIC_FILE = "traffic.json"


def explain(directory: Path, step: Step, variants: Iterable[str] | None = None) -> dict[str, StepTraffic]:
    """Bytes per verify step of each variant of a build."""
    step.check()
    return {variant: verify_step(target, drafter, step, variant) for variant, (target, drafter) in load_build(directory, variants).items()}


def default_step(bounds: dict[str, int]) -> Step:
    """The step a build's traffic.json describes: its max batch and block, capacity = max_seq_len,
    half of it committed."""
    block = max(2, int(bounds["block_size"]))
    capacity = max(int(bounds["max_seq_len"]), block + 1)
    return Step(
        batch=max(1, int(bounds["max_batch"])), context=max(1, min(capacity - block, capacity // 2)), capacity=capacity, block=block
    )


def write_traffic_json(export_dir: Path, step: Step | None = None) -> dict[str, Any]:
    """`export/traffic.json`: bytes per verify step of every variant at `step` (default: `default_step`)."""
    info = json.loads((Path(export_dir) / "graphs.json").read_text())
    step = step or default_step(info["bounds"])
    report = explain(export_dir, step)
    payload = {
        "model": "DRAM traffic estimate from the graphs (trtllm_dflash/builder/traffic.py), not a profile",
        "step": {**dataclasses.asdict(step), "new_rows": step.rows},
        "variants": {variant: traffic.to_dict() for variant, traffic in report.items()},
    }
    (Path(export_dir) / TRAFFIC_FILE).write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    return {variant: traffic.total for variant, traffic in report.items()}

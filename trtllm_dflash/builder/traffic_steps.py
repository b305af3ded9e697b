"""The step-traffic arithmetic: what one verify step moves, from the graphs' summaries.

The data types of the traffic model (a step's sizes, a graph's summary, the counted items) and
the rules that turn a summary and a step into bytes (builder/traffic.py documents the rules).
Summaries come from the exported ONNX files (traffic_onnx.py) or a model's shape
(traffic_closed_form.py).
"""

from __future__ import annotations

import ast
import dataclasses
import math
from typing import Any

from trtllm_dflash.contracts import names
from trtllm_dflash.contracts.defaults import PLANNED_CONTEXT, PLANNED_MAX_BATCH
from trtllm_dflash.errors import DFlashError

CATEGORIES = ("weights", "target cache", "draft cache", "logits", "draft probs", "activations")
_NEW_KV_PREFIXES = names.prefixes(names.NEW)


class TrafficError(DFlashError):
    """A directory or graph the traffic model cannot read."""


@dataclasses.dataclass(frozen=True)
class Step:
    """The sizes of one verify step; `new_rows` defaults to the block (a step commits at most that)."""

    batch: int = PLANNED_MAX_BATCH
    context: int = PLANNED_CONTEXT  # committed tokens per row before the step (the target's `starts`)
    capacity: int = 2 * PLANNED_CONTEXT  # cache slots bound per row; the context is half (as `explain-bytes --capacity` sets it)
    block: int = 16  # tokens verified per row (anchor + drafts), also the drafter's block
    new_rows: int | None = None  # context rows the drafter appends per row
    sampled: int = 0  # rows with temperature > 0 (their draft distributions are written and read)

    @property
    def rows(self) -> int:
        return self.block if self.new_rows is None else self.new_rows

    def check(self) -> None:
        """Refuse sizes no step can have (one line, with the fix)."""
        for name in ("batch", "context", "capacity", "block"):
            if getattr(self, name) < 1:
                raise TrafficError(f"--{name} must be at least 1, not {getattr(self, name)}", "pass a positive size")
        if self.block < 2:
            raise TrafficError("--block must be at least 2 (an anchor and one draft)", "pass --block 2 or more")
        if self.context + self.block > self.capacity:
            raise TrafficError(
                f"context {self.context} + block {self.block} does not fit a cache of {self.capacity} slots",
                "pass a larger --capacity or a smaller --context",
            )
        if not 0 <= self.rows <= self.context:
            raise TrafficError(f"--new-rows {self.rows} must be between 0 and the context ({self.context})", "lower --new-rows")
        if not 0 <= self.sampled <= self.batch:
            raise TrafficError(f"--sampled {self.sampled} must be between 0 and the batch ({self.batch})", "lower --sampled")

    def dims(self, role: str) -> dict[str, int]:
        """Values of the graphs' named dims at this step (GraphInfo / graphs.json names)."""
        if role == "target":
            return {
                "batch": self.batch,
                "tokens": self.block,
                "picked": self.block,
                "drafts": self.block - 1,
                "past": self.capacity,
                "capacity": self.capacity,
            }
        return {"batch": self.batch, "block": self.block, "ctx_rows": self.rows, "past": self.capacity}


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A tensor at a graph boundary: dims by name or size, bytes per element, and how it is read."""

    name: str
    dims: tuple[str | int, ...]
    itemsize: float
    sampled_rows_only: bool = False  # draft_probs read straight by the verify node: only sampled rows

    def nbytes(self, dims: dict[str, int]) -> int:
        return math.ceil(math.prod(resolve_dim(d, dims) for d in self.dims) * self.itemsize)


@dataclasses.dataclass(frozen=True)
class CacheTensor:
    """A cache input and who reads it: `bound` (plain ops: the whole bound tensor), `target_attention`
    or `block_attention` (a DFlash node: the row's own slots, in place), `unused`."""

    name: str
    slot_bytes: int  # one slot of one row: kv_heads x dim x itemsize
    access: str
    window: int = 0  # the node's window attribute (0: full attention)


@dataclasses.dataclass(frozen=True)
class GraphSummary:
    """What one graph moves, independent of the step: from its ONNX file or from a model's shape."""

    role: str  # "target" | "drafter"
    variant: str
    dense_weight_bytes: int  # initializers read whole every call
    gathered: tuple[tuple[str, int], ...]  # (index input, bytes per looked-up row) of Gather-only tables
    caches: tuple[CacheTensor, ...]
    inputs: tuple[Tensor, ...]  # the other inputs
    outputs: tuple[Tensor, ...]  # outputs that are not aliased caches
    internal_logits: Tensor | None = None  # a verifying target: the LM head output the verify node reads
    file: str = ""


@dataclasses.dataclass(frozen=True)
class Item:
    """One counted transfer: which side does it (target / drafter engine, or runtime), what, bytes."""

    graph: str
    category: str
    what: str
    read: int
    written: int


@dataclasses.dataclass
class StepTraffic:
    """The bytes of one verify step of one variant, itemised."""

    variant: str
    step: Step
    items: list[Item]

    @property
    def read(self) -> int:
        return sum(item.read for item in self.items)

    @property
    def written(self) -> int:
        return sum(item.written for item in self.items)

    @property
    def total(self) -> int:
        return self.read + self.written

    def by_category(self) -> dict[str, dict[str, int]]:
        out = {category: {"read": 0, "written": 0} for category in CATEGORIES}
        for item in self.items:
            out[item.category]["read"] += item.read
            out[item.category]["written"] += item.written
        return out

    def graph_total(self, graph: str) -> int:
        return sum(item.read + item.written for item in self.items if item.graph == graph)

    def to_dict(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "step": {**dataclasses.asdict(self.step), "new_rows": self.step.rows},
            "read": self.read,
            "written": self.written,
            "total": self.total,
            "by_category": self.by_category(),
            "by_graph": {graph: self.graph_total(graph) for graph in ("target", "drafter", "runtime")},
            "items": [dataclasses.asdict(item) for item in self.items],
        }


# ----------------------------------------------------------------------------- dims


def resolve_dim(dim: str | int, dims: dict[str, int]) -> int:
    """A dim by value, name, or the exporter's expression of names (`block - 1`, `Min(drafts, picked - 1)`)."""
    if isinstance(dim, int):
        return dim
    try:
        tree = ast.parse(str(dim), mode="eval").body
    except SyntaxError:
        raise TrafficError(f"cannot read the graph dim {dim!r}", "re-export the graphs with this version") from None

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in dims:
                raise TrafficError(
                    f"the graph dim {dim!r} names {node.id!r}, which a verify step does not size", f"known dims: {', '.join(sorted(dims))}"
                )
            return dims[node.id]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv)):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            return left * right if isinstance(node.op, ast.Mult) else left // max(right, 1)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("Min", "Max", "min", "max"):
            args = [value(arg) for arg in node.args]
            return min(args) if node.func.id.lower() == "min" else max(args)
        raise TrafficError(f"cannot read the graph dim {dim!r}", "re-export the graphs with this version")

    return value(tree)


# ----------------------------------------------------------------------------- one step


def cache_reads(cache: CacheTensor, role: str, step: Step) -> tuple[int, int]:
    """(slots read, slots written) per row of one cache tensor in one call."""
    if cache.access == "bound":
        return step.capacity, 0
    if cache.access == "target_attention":  # queries at context .. context+block-1, causal, windowed
        span = step.context + step.block
        return (min(span, cache.window + step.block - 1) if cache.window else span), step.block
    if cache.access == "block_attention":  # the row's context (new rows included); the block is not cached
        return (min(step.context, cache.window - 1) if cache.window else step.context), step.rows
    return 0, 0


def graph_items(summary: GraphSummary, step: Step) -> list[Item]:
    """What one engine call reads and writes (weights, caches, boundary, internal logits)."""
    dims = step.dims(summary.role)
    cache_category = "target cache" if summary.role == "target" else "draft cache"
    items = [Item(summary.role, "weights", "initializers (read once per call)", summary.dense_weight_bytes, 0)]
    inputs = {tensor.name: tensor for tensor in summary.inputs}
    for index_input, row_bytes in summary.gathered:
        lookups = math.prod(resolve_dim(d, dims) for d in inputs[index_input].dims)
        items.append(Item(summary.role, "weights", f"embedding rows looked up by {index_input}", lookups * row_bytes, 0))
    for cache in summary.caches:
        read, written = cache_reads(cache, summary.role, step)
        if read or written:
            how = {
                "bound": "whole bound tensor (plain ops)",
                "target_attention": "DFlashTargetAttention",
                "block_attention": "DFlashBlockAttention",
            }[cache.access]
            window = f", window {cache.window}" if cache.window else ""
            items.append(
                Item(
                    summary.role,
                    cache_category,
                    f"{cache.name}: {how}{window}",
                    step.batch * read * cache.slot_bytes,
                    step.batch * written * cache.slot_bytes,
                )
            )
    for tensor in summary.inputs:
        if tensor.name == names.DRAFT_PROBS:
            rows = step.sampled if tensor.sampled_rows_only else step.batch
            size = math.ceil(rows * math.prod(resolve_dim(d, dims) for d in tensor.dims[1:]) * tensor.itemsize)
            how = "sampled rows, read by DFlashVerifyPositions" if tensor.sampled_rows_only else "every row (read by plain ops)"
            items.append(Item(summary.role, "draft probs", f"draft_probs input: {how}", size, 0))
        else:
            items.append(Item(summary.role, "activations", f"input {tensor.name}", tensor.nbytes(dims), 0))
    for tensor in summary.outputs:
        if tensor.name == names.LOGITS:
            category = "logits"
        elif tensor.name.startswith(_NEW_KV_PREFIXES):
            category = cache_category
        else:
            category = "activations"
        items.append(Item(summary.role, category, f"output {tensor.name}", 0, tensor.nbytes(dims)))
    if summary.internal_logits is not None:
        size = summary.internal_logits.nbytes(dims)
        items.append(Item(summary.role, "logits", "logits inside the engine: LM head -> DFlashVerifyPositions", size, size))
    return items


def runtime_items(target: GraphSummary, drafter: GraphSummary | None, step: Step) -> list[Item]:
    """What the TensorRT runtime and the decoding loop move around the two engines in one step."""
    items: list[Item] = []
    target_dims = step.dims("target")
    for tensor in target.outputs:
        if tensor.name.startswith(_NEW_KV_PREFIXES):  # trt_runtime.target_forward: cache[rows, positions] = new
            size = tensor.nbytes(target_dims)
            items.append(Item("runtime", "target cache", f"scatter {tensor.name} into the cache", size, size))
        if tensor.name == names.LOGITS:  # BaseRuntime.verify: the verification kernel's pass over the logits
            items.append(Item("runtime", "logits", "target logits read by the verification kernel", tensor.nbytes(target_dims), 0))
    probs = math.ceil(step.sampled * (step.block - 1) * _vocab(target, drafter) * 4)
    if probs:
        items.append(Item("runtime", "draft probs", "draft distributions of sampled rows (float32)", 0, probs))
        if target.internal_logits is None:
            items.append(Item("runtime", "draft probs", "read by the verification kernel", probs, 0))
    if drafter is not None:
        drafter_dims = step.dims("drafter")
        for tensor in drafter.outputs:
            if tensor.name.startswith(_NEW_KV_PREFIXES):  # trt_runtime.append_rows: where(valid, new, old) -> slots
                size = tensor.nbytes(drafter_dims)
                items.append(Item("runtime", "draft cache", f"append {tensor.name} (reads it and the slots it replaces)", 2 * size, size))
            if tensor.name == names.LOGITS:  # the decoding loop picks the drafts from them
                items.append(Item("runtime", "logits", "drafter logits read to pick the drafts", tensor.nbytes(drafter_dims), 0))
    return items


def _vocab(target: GraphSummary, drafter: GraphSummary | None) -> int:
    for summary in (target, drafter):
        if summary is None:
            continue
        for tensor in list(summary.outputs) + [summary.internal_logits] + list(summary.inputs):
            if tensor is not None and tensor.name in (names.LOGITS, names.DRAFT_PROBS) and isinstance(tensor.dims[-1], int):
                return tensor.dims[-1]
    return 0


def verify_step(target: GraphSummary, drafter: GraphSummary | None, step: Step, variant: str = "") -> StepTraffic:
    """Every counted transfer of one verify step: drafter call, target call, runtime glue."""
    step.check()
    items = graph_items(target, step)
    if drafter is not None:
        items += graph_items(drafter, step)
    items += runtime_items(target, drafter, step)
    return StepTraffic(variant or target.variant, step, items)

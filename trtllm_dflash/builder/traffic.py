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
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Iterable

from trtllm_dflash.errors import DFlashError

CATEGORIES = ("weights", "target cache", "draft cache", "logits", "draft probs", "activations")
TRAFFIC_FILE = "traffic.json"

# bits per element of each ONNX TensorProto data type (onnx.TensorProto.DataType)
_BITS = {
    1: 32, 2: 8, 3: 8, 4: 16, 5: 16, 6: 32, 7: 64, 9: 8, 10: 16, 11: 64, 12: 32, 13: 64,
    14: 64, 15: 128, 16: 16, 17: 8, 18: 8, 19: 8, 20: 8, 21: 4, 22: 4, 23: 4,
}
_DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "fp16": 2, "float16": 2, "bfloat16": 2, "fp8": 1, "int64": 8, "int32": 4}
_CACHE_PREFIXES = ("past_key_", "past_value_", "cache_key_", "cache_value_")
_NEW_KV_PREFIXES = ("new_key_", "new_value_")
_SHAPE_ONLY = {"Shape", "Size"}  # read a tensor's shape, not its data


class TrafficError(DFlashError):
    """A directory or graph the traffic model cannot read."""


@dataclasses.dataclass(frozen=True)
class Step:
    """The sizes of one verify step; `new_rows` defaults to the block (a step commits at most that)."""

    batch: int = 64
    context: int = 8192  # committed tokens per row before the step (the target's `starts`)
    capacity: int = 16384  # cache slots bound per row
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
            return {"batch": self.batch, "tokens": self.block, "picked": self.block, "drafts": self.block - 1,
                    "past": self.capacity, "capacity": self.capacity}
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
                raise TrafficError(f"the graph dim {dim!r} names {node.id!r}, which a verify step does not size",
                                   f"known dims: {', '.join(sorted(dims))}")
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


# ----------------------------------------------------------------------------- reading a graph


def _tensor_bytes(dims: Iterable[int], data_type: int) -> int:
    return math.ceil(math.prod(dims) * _BITS.get(data_type, 32) / 8)


def _onnx_dims(value) -> tuple[str | int, ...] | None:
    tensor = value.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    return tuple(d.dim_param if d.dim_param else d.dim_value for d in tensor.shape.dim)


def summarize_graph(path: Path, info: dict[str, Any], role: str) -> GraphSummary:
    """Walk one exported graph (no weights loaded) into what it moves per call.

    `info` is its graphs.json entry (`GraphInfo.to_dict()`): input dims by name come from it;
    output dims, dtypes, initializers and who reads each tensor come from the ONNX file.
    """
    import onnx

    if not path.is_file():
        raise TrafficError(f"{path} is missing", "re-run the export stage of `dflash-trt build`")
    graph = onnx.load(str(path), load_external_data=False).graph
    readers: dict[str, list[tuple[Any, int]]] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name:
                readers.setdefault(name, []).append((node, index))

    dense, gathered = 0, []
    graph_inputs = {value.name for value in graph.input}
    for init in graph.initializer:
        size = _tensor_bytes(init.dims, init.data_type)
        users = readers.get(init.name, [])
        if users and all(node.op_type == "Gather" and index == 0 for node, index in users):
            indices = {node.input[1] for node, _ in users}
            if len(indices) == 1 and next(iter(indices)) in graph_inputs and len(init.dims) == 2:
                gathered.append((next(iter(indices)), _tensor_bytes(init.dims[1:], init.data_type)))
                continue
        if users and all(node.op_type == "Cast" for node, _ in users):  # folded into the engine at the cast's dtype
            to = next(a.i for a in users[0][0].attribute if a.name == "to")
            size = _tensor_bytes(init.dims, to)
        dense += size
    for node in graph.node:  # tensors held by Constant nodes are weights too (the exporter folds most into initializers)
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    dense += _tensor_bytes(attribute.t.dims, attribute.t.data_type)

    onnx_inputs = {value.name: value for value in graph.input}
    declared = {entry["name"]: entry for entry in info.get("inputs", [])}
    caches, inputs = [], []
    for name, value in onnx_inputs.items():
        entry = declared.get(name)
        dims = tuple(entry["dims"]) if entry is not None else _onnx_dims(value)
        if dims is None:
            raise TrafficError(f"input {name} of {path.name} has no shape", "re-export the graphs with this version")
        itemsize = _BITS.get(value.type.tensor_type.elem_type, 32) / 8
        users = [(node, index) for node, index in readers.get(name, []) if node.op_type not in _SHAPE_ONLY]
        if name.startswith(_CACHE_PREFIXES):
            slot = math.ceil(math.prod(int(d) for d in dims[2:]) * itemsize)
            caches.append(_cache_access(name, slot, users))
        else:
            only_verify = bool(users) and all(node.op_type == "DFlashVerifyPositions" for node, _ in users)
            inputs.append(Tensor(name, dims, itemsize, sampled_rows_only=name == "draft_probs" and only_verify))

    aliased = _aliased_outputs(graph)
    outputs = []
    for value in graph.output:
        if value.name in aliased:
            continue
        dims = _onnx_dims(value)
        if dims is None:
            raise TrafficError(f"output {value.name} of {path.name} has no shape", "re-export the graphs with this version")
        outputs.append(Tensor(value.name, dims, _BITS.get(value.type.tensor_type.elem_type, 32) / 8))

    internal = None
    verify = [node for node in graph.node if node.op_type == "DFlashVerifyPositions"]
    if verify:
        logits = verify[0].input[0]
        known = {value.name: value for value in list(graph.value_info) + list(graph.output)}
        if logits in known and _onnx_dims(known[logits]) is not None:
            value = known[logits]
            internal = Tensor("logits", _onnx_dims(value), _BITS.get(value.type.tensor_type.elem_type, 32) / 8)
        else:  # no recorded shape: [batch, picked, vocab] at the graph's dtype
            vocab = next(int(e["dims"][-1]) for e in info["inputs"] if e["name"] == "draft_probs")
            internal = Tensor("logits", ("batch", "picked", vocab), _DTYPE_BYTES.get(info.get("dtype", "fp32"), 4))
    return GraphSummary(
        role, info.get("variant", ""), dense, tuple(gathered), tuple(caches), tuple(inputs), tuple(outputs), internal,
        str(Path(info.get("dir") or info.get("variant", "")) / info.get("file", path.name)),
    )


def _cache_access(name: str, slot_bytes: int, users: list[tuple[Any, int]]) -> CacheTensor:
    """How a cache input is read, from the nodes that read it."""
    if not users:
        return CacheTensor(name, slot_bytes, "unused")
    kinds = set()
    window = 0
    for node, index in users:
        if node.op_type == "DFlashTargetAttention" and index in (3, 4):
            kinds.add("target_attention")
        elif node.op_type in ("DFlashBlockAttention", "DFlashBlockAttentionSplit") and index in (6, 7):
            kinds.add("block_attention")
        else:
            kinds.add("bound")
            continue
        window = next((a.i for a in node.attribute if a.name == "window"), 0)
    if "bound" in kinds or len(kinds) > 1:
        return CacheTensor(name, slot_bytes, "bound")
    return CacheTensor(name, slot_bytes, kinds.pop(), int(window))


def _aliased_outputs(graph) -> set[str]:
    """Outputs that are a DFlash node's updated cache (aliased to the cache input in an engine)."""
    from trtllm_dflash.plugins.onnx_nodes import NODES

    aliases = {spec.op_type: {spec.outputs.index(out) for out in spec.aliases} for spec in NODES if spec.aliases}
    names = set()
    for node in graph.node:
        for index in aliases.get(node.op_type, ()):
            if index < len(node.output):
                names.add(node.output[index])
    return {value.name for value in graph.output if value.name in names}


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
            how = {"bound": "whole bound tensor (plain ops)", "target_attention": "DFlashTargetAttention",
                   "block_attention": "DFlashBlockAttention"}[cache.access]
            window = f", window {cache.window}" if cache.window else ""
            items.append(Item(summary.role, cache_category, f"{cache.name}: {how}{window}",
                              step.batch * read * cache.slot_bytes, step.batch * written * cache.slot_bytes))
    for tensor in summary.inputs:
        if tensor.name == "draft_probs":
            rows = step.sampled if tensor.sampled_rows_only else step.batch
            size = math.ceil(rows * math.prod(resolve_dim(d, dims) for d in tensor.dims[1:]) * tensor.itemsize)
            how = "sampled rows, read by DFlashVerifyPositions" if tensor.sampled_rows_only else "every row (read by plain ops)"
            items.append(Item(summary.role, "draft probs", f"draft_probs input: {how}", size, 0))
        else:
            items.append(Item(summary.role, "activations", f"input {tensor.name}", tensor.nbytes(dims), 0))
    for tensor in summary.outputs:
        if tensor.name == "logits":
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
        if tensor.name == "logits":  # BaseRuntime.verify: the verification kernel's pass over the logits
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
            if tensor.name == "logits":  # the decoding loop picks the drafts from them
                items.append(Item("runtime", "logits", "drafter logits read to pick the drafts", tensor.nbytes(drafter_dims), 0))
    return items


def _vocab(target: GraphSummary, drafter: GraphSummary | None) -> int:
    for summary in (target, drafter):
        if summary is None:
            continue
        for tensor in list(summary.outputs) + [summary.internal_logits] + list(summary.inputs):
            if tensor is not None and tensor.name in ("logits", "draft_probs") and isinstance(tensor.dims[-1], int):
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


# ----------------------------------------------------------------------------- a build


def find_graphs_json(directory: Path) -> Path:
    """graphs.json of a build (`OUT/export/`) or of an export directory; one-line error otherwise."""
    directory = Path(directory)
    for candidate in (directory / "export" / "graphs.json", directory / "graphs.json"):
        if candidate.is_file():
            return candidate
    if not directory.is_dir():
        raise TrafficError(f"{directory} does not exist", "point at the --out directory of `dflash-trt build`")
    raise TrafficError(
        f"{directory} is not a dflash-trt build (no export/graphs.json)",
        "point at the --out directory of a `dflash-trt build` that finished its export stage",
    )


def load_build(directory: Path, variants: Iterable[str] | None = None) -> dict[str, tuple[GraphSummary, GraphSummary | None]]:
    """(target, drafter) summaries of every exported variant (or the ones asked for)."""
    graphs_json = find_graphs_json(directory)
    try:
        info = json.loads(graphs_json.read_text())
        available = info["variants"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        raise TrafficError(f"{graphs_json} is not a graphs.json of `dflash-trt build`", "re-run the export stage") from None
    wanted = list(available) if variants is None else list(variants)
    for variant in wanted:
        if variant not in available:
            raise TrafficError(f"the build has no {variant} graphs (it has {', '.join(available)})", "pick one of those with --variant")
    root = graphs_json.parent
    out: dict[str, tuple[GraphSummary, GraphSummary | None]] = {}
    for variant in wanted:
        summaries: dict[str, GraphSummary] = {}
        for role in ("target", "drafter"):
            entry = available[variant].get(role)
            if entry is None:
                continue
            folder = entry.get("dir") or entry.get("variant") or variant
            summary = summarize_graph(root / folder / entry["file"], entry, role)
            summaries[role] = dataclasses.replace(summary, variant=variant)
        if "target" not in summaries:
            raise TrafficError(f"the {variant} graphs of {root} have no target graph", "re-run the export stage")
        out[variant] = (summaries["target"], summaries.get("drafter"))
    return out


def explain(directory: Path, step: Step, variants: Iterable[str] | None = None) -> dict[str, StepTraffic]:
    """Bytes per verify step of each variant of a build."""
    step.check()
    return {variant: verify_step(target, drafter, step, variant) for variant, (target, drafter) in load_build(directory, variants).items()}


def default_step(bounds: dict[str, int]) -> Step:
    """The step a build's traffic.json describes: its max batch and block, capacity = max_seq_len,
    half of it committed."""
    block = max(2, int(bounds["block_size"]))
    capacity = max(int(bounds["max_seq_len"]), block + 1)
    return Step(batch=max(1, int(bounds["max_batch"])), context=max(1, min(capacity - block, capacity // 2)), capacity=capacity, block=block)


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


# ----------------------------------------------------------------------------- closed form


@dataclasses.dataclass(frozen=True)
class LayerShape:
    """The cache of one attention layer: K/V per token `[kv_heads, key_dim]`, `[kv_heads, value_dim]`."""

    kv_heads: int
    key_dim: int
    value_dim: int
    window: int = 0


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """A target + drafter pair as the traffic model needs it: no weights, just sizes.

    `*_weight_bytes`: what each call reads whole (every linear layer, norm and the LM head; the
    drafter graph carries the target's LM head); `*_row_bytes`: one embedding row (looked up per
    token); `features` = taps x hidden; `act_bytes` the graphs' dtype (KV cache, logits, features).
    """

    target_layers: tuple[LayerShape, ...]
    target_weight_bytes: int
    target_row_bytes: int
    drafter_layers: tuple[LayerShape, ...]
    drafter_weight_bytes: int
    drafter_row_bytes: int
    vocab: int
    features: int
    act_bytes: int = 2

    @classmethod
    def from_catalog(cls, spec, weight_bytes: float = 2, act_bytes: int = 2) -> "ModelShape":
        """From a catalog entry or a local config (`catalog.models.resolve_model`): linear weights at
        `weight_bytes` (1 for FP8), norms, embedding and LM head at `act_bytes`."""
        p, d = spec.params(), spec.hidden_size
        if spec.drafter is None:
            raise TrafficError(f"{spec.name} has no DFlash drafter in the catalog", "pass a build directory instead")
        linear = p.attention_linear + p.mlp_linear + p.expert_linear
        target_layers = []
        for layer in range(spec.num_layers):
            shape = spec.attention(layer)
            if shape.num_kv_heads:
                target_layers.append(LayerShape(shape.num_kv_heads, shape.head_dim, shape.head_dim, shape.window))
        drafter = spec.drafter
        drafter_layers = [
            LayerShape(drafter.num_kv_heads, drafter.head_dim, drafter.head_dim, drafter.attention(i).window) for i in range(drafter.num_layers)
        ]
        lm_head = spec.vocab_size * d  # tied or not, the LM head GEMM reads the whole table
        return cls(
            tuple(target_layers),
            math.ceil(linear * weight_bytes) + (p.other + lm_head) * act_bytes,
            d * act_bytes,
            tuple(drafter_layers),
            drafter.num_params() * act_bytes + lm_head * act_bytes,
            d * act_bytes,
            spec.vocab_size,
            len(drafter.target_layer_ids) * drafter.hidden_size,
            act_bytes,
        )


def closed_form(shape: ModelShape, variant: str) -> tuple[GraphSummary, GraphSummary]:
    """The (target, drafter) summaries the export of `variant` would have, from the shape alone.

    Mirrors `export.export_target` / `export_verifying_target` / `export_drafter`: the same I/O
    names and dims, the caches read as the native graphs (`bound`) or the plugin nodes read them.
    """
    a, v = shape.act_bytes, shape.vocab
    plugin = variant != "native"
    caches = []
    for i, layer in enumerate(shape.target_layers):
        access = "target_attention" if plugin else "bound"
        prefix = "cache" if plugin else "past"
        caches.append(CacheTensor(f"{prefix}_key_{i}", layer.kv_heads * layer.key_dim * a, access, layer.window if plugin else 0))
        caches.append(CacheTensor(f"{prefix}_value_{i}", layer.kv_heads * layer.value_dim * a, access, layer.window if plugin else 0))
    ids = (Tensor("input_ids", ("batch", "tokens"), 8), Tensor("starts", ("batch",), 8), Tensor("logit_index", ("batch", "picked"), 8))
    features = Tensor("features", ("batch", "tokens", shape.features), a)
    if plugin:
        inputs = ids + (
            Tensor("draft_probs", ("batch", "drafts", v), 4),  # read through a Slice in the exported graph: every row
            Tensor("temperature", ("batch",), 4), Tensor("top_k", ("batch",), 8), Tensor("top_p", ("batch",), 4), Tensor("seed", ("batch",), 8),
        )
        outputs = (Tensor("result", ("batch", 5), 8), features)
        internal = Tensor("logits", ("batch", "picked", v), a)
    else:
        inputs = ids
        new = [Tensor(f"new_{kind}_{i}", ("batch", "tokens", layer.kv_heads, dim), a)
               for kind in ("key", "value") for i, layer in enumerate(shape.target_layers)
               for dim in ((layer.key_dim,) if kind == "key" else (layer.value_dim,))]
        outputs = (Tensor("logits", ("batch", "picked", v), a), features, *new)
        internal = None
    target = GraphSummary("target", variant, shape.target_weight_bytes, (("input_ids", shape.target_row_bytes),),
                          tuple(caches), inputs, outputs, internal, "closed form")

    draft_caches = []
    for i, layer in enumerate(shape.drafter_layers):
        access = "block_attention" if plugin else "bound"
        draft_caches.append(CacheTensor(f"past_key_{i}", layer.kv_heads * layer.key_dim * a, access, layer.window if plugin else 0))
        draft_caches.append(CacheTensor(f"past_value_{i}", layer.kv_heads * layer.value_dim * a, access, layer.window if plugin else 0))
    draft_inputs = (Tensor("block_ids", ("batch", "block"), 8), Tensor("ctx_features", ("batch", "ctx_rows", shape.features), a),
                    Tensor("new_counts", ("batch",), 8), Tensor("cache_lens", ("batch",), 8))
    draft_new = [Tensor(f"new_{kind}_{i}", ("batch", "ctx_rows", layer.kv_heads, layer.key_dim if kind == "key" else layer.value_dim), a)
                 for kind in ("key", "value") for i, layer in enumerate(shape.drafter_layers)]
    drafter = GraphSummary("drafter", variant, shape.drafter_weight_bytes, (("block_ids", shape.drafter_row_bytes),),
                           tuple(draft_caches), draft_inputs, (Tensor("logits", ("batch", "block - 1", v), a), *draft_new), None, "closed form")
    return target, drafter


def explain_model(shape: ModelShape, step: Step, variants: Iterable[str] = ("native", "plugin")) -> dict[str, StepTraffic]:
    """Bytes per verify step of a model from its shape alone (no export), per variant."""
    return {variant: verify_step(*closed_form(shape, variant), step, variant) for variant in variants}

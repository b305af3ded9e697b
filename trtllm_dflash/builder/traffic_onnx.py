"""Graph summaries from the exported ONNX files: what each graph moves per call (no weights loaded).

`summarize_graph` walks one graph's initializers, inputs, outputs and the nodes that read them;
`load_build` summarizes every graph of a build. The counting rules: builder/traffic.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Iterable

from trtllm_dflash.builder.traffic_steps import CacheTensor, GraphSummary, Tensor, TrafficError
from trtllm_dflash.contracts import dtypes, names

_CACHE_PREFIXES = names.prefixes(names.PAST, names.CACHE)
_SHAPE_ONLY = {"Shape", "Size"}  # read a tensor's shape, not its data


def _tensor_bytes(dims: Iterable[int], data_type: int) -> int:
    return math.ceil(math.prod(dims) * dtypes.onnx_bits(data_type) / 8)


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
        itemsize = dtypes.onnx_bits(value.type.tensor_type.elem_type) / 8
        users = [(node, index) for node, index in readers.get(name, []) if node.op_type not in _SHAPE_ONLY]
        if name.startswith(_CACHE_PREFIXES):
            slot = math.ceil(math.prod(int(d) for d in dims[2:]) * itemsize)
            caches.append(_cache_access(name, slot, users))
        else:
            only_verify = bool(users) and all(node.op_type == "DFlashVerifyPositions" for node, _ in users)
            inputs.append(Tensor(name, dims, itemsize, sampled_rows_only=name == names.DRAFT_PROBS and only_verify))

    aliased = _aliased_outputs(graph)
    outputs = []
    for value in graph.output:
        if value.name in aliased:
            continue
        dims = _onnx_dims(value)
        if dims is None:
            raise TrafficError(f"output {value.name} of {path.name} has no shape", "re-export the graphs with this version")
        outputs.append(Tensor(value.name, dims, dtypes.onnx_bits(value.type.tensor_type.elem_type) / 8))

    internal = None
    verify = [node for node in graph.node if node.op_type == "DFlashVerifyPositions"]
    if verify:
        logits = verify[0].input[0]
        known = {value.name: value for value in list(graph.value_info) + list(graph.output)}
        if logits in known and _onnx_dims(known[logits]) is not None:
            value = known[logits]
            internal = Tensor(names.LOGITS, _onnx_dims(value), dtypes.onnx_bits(value.type.tensor_type.elem_type) / 8)
        else:  # no recorded shape: [batch, picked, vocab] at the graph's dtype
            vocab = next(int(e["dims"][-1]) for e in info["inputs"] if e["name"] == names.DRAFT_PROBS)
            dtype = dtypes.find(info.get("dtype", "fp32"))
            internal = Tensor(names.LOGITS, ("batch", "picked", vocab), dtype.bytes if dtype else 4)
    return GraphSummary(
        role,
        info.get("variant", ""),
        dense,
        tuple(gathered),
        tuple(caches),
        tuple(inputs),
        tuple(outputs),
        internal,
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

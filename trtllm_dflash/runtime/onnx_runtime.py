"""A runtime over the exported ONNX graphs, evaluated on CPU.

This is how CI shows that the graphs a TensorRT engine is built from compute the same thing as
the torch runtime: the same decoding loop drives them, token for token. The KV caches live
here (torch CPU tensors, slot == position); the graphs return the new K/V of each call and this
runtime writes them into place, exactly as the TensorRT runtime does on the GPU.

Backends, per graph: onnxruntime (fast; plain ONNX ops), or onnx's reference evaluator with the
CPU evaluators of the DFlash plugin nodes (slow; for graphs that hold plugin nodes).
16-bit graphs are evaluated as a float32 copy with the same rounded weights: onnxruntime has no
BF16 kernels on CPU, and float32 makes the comparison with the torch runtime exact up to the order
of operations (16-bit arithmetic on the GPU is what the engine check of docs/build.md covers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from trtllm_dflash.config import DrafterConfig
from trtllm_dflash.contracts import names
from trtllm_dflash.drafters.dflash2.graph import HEAD_PLUGIN
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.extras import require
from trtllm_dflash.ops import reference_attention
from trtllm_dflash.runtime import selector
from trtllm_dflash.runtime.artifacts import read_index
from trtllm_dflash.runtime.base import (
    CachedRuntime,
    CacheShape,
    SamplingTensors,
    TargetOutput,
    VerifyOutput,
    contiguous_slots,
    verifying_graph_inputs,
)


def upcast_to_float32(model) -> Any:
    """A float32 copy of a BF16/FP16 ONNX model (initializers, I/O types, casts, constants)."""
    onnx = require("onnx", "export", "reading ONNX graphs")
    from onnx import numpy_helper

    half = {onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT16}
    f32 = onnx.TensorProto.FLOAT

    def tensor(t: onnx.TensorProto) -> onnx.TensorProto:
        if t.data_type not in half:
            return t
        return numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name)

    def retype(value_info) -> None:
        if value_info.type.tensor_type.elem_type in half:
            value_info.type.tensor_type.elem_type = f32

    def graph(g) -> None:
        for i, init in enumerate(g.initializer):
            if init.data_type in half:
                g.initializer[i].CopyFrom(tensor(init))
        for value_info in list(g.input) + list(g.output) + list(g.value_info):
            retype(value_info)
        for node in g.node:
            for attr in node.attribute:
                if node.op_type == "Cast" and attr.name == "to" and attr.i in half:
                    attr.i = f32
                if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in half:
                    attr.t.CopyFrom(tensor(attr.t))
                if attr.type == onnx.AttributeProto.GRAPH:
                    graph(attr.g)

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph(out.graph)
    return out


class GraphSession:
    """One ONNX graph behind `run(feed) -> {name: array}`, on onnxruntime or the reference evaluator."""

    def __init__(self, path: Path, backend: str = "auto", custom_ops: Sequence[type] = ()) -> None:
        onnx = require("onnx", "export", "running ONNX graphs")
        model = upcast_to_float32(onnx.load(str(path)))
        self.output_names = [o.name for o in model.graph.output]
        if backend == "auto":  # onnxruntime has no kernels for custom-domain (plugin) nodes
            plugin_nodes = any(node.domain not in ("", "ai.onnx") for node in model.graph.node)
            backend = "reference" if plugin_nodes else "onnxruntime"
        self.backend = backend
        if backend == "onnxruntime":
            ort = require("onnxruntime", "export", "running ONNX graphs on CPU")

            options = ort.SessionOptions()
            options.log_severity_level = 3
            if any(init.data_type == onnx.TensorProto.FLOAT8E4M3FN for init in model.graph.initializer):
                # onnxruntime's CPU fusions turn FP8 Q/DQ + MatMul into integer kernels that reject FP8
                options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            self._session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        elif backend == "reference":
            from onnx.reference import ReferenceEvaluator

            self._session = ReferenceEvaluator(model, new_ops=list(custom_ops))
        else:
            raise DFlashError(f"unknown ONNX backend {backend!r}", "use onnxruntime or reference")

    def run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.output_names, self._session.run(None, feed)))


def plugin_evaluators(variant: str) -> list[type]:
    """`onnx.reference` OpRun classes for the plugin nodes of a graph variant (none for native)."""
    if variant == "native":
        return []
    from trtllm_dflash.plugins import onnx_nodes  # needs onnx, which only plugin graphs need here

    return onnx_nodes.evaluators()


def _graph_file(export_dir: Path, variant: str, graph: dict) -> Path:
    return export_dir / (graph.get("dir") or variant) / graph["file"]


def _cached(layers) -> list:
    """(index, layer) of the layers that keep a cache (Gemma 4's KV-sharing layers keep none)."""
    return [(i, layer) for i, layer in enumerate(layers) if layer.keys is not None]


def _numpy(t: torch.Tensor, dtype=None) -> np.ndarray:
    array = t.detach().cpu()
    if dtype is not None:
        array = array.to(dtype)
    return np.ascontiguousarray(array.numpy())


class OnnxRuntime(selector.GraphDrafterHead, CachedRuntime):
    """Runs an export directory's target and drafter graphs with the decoding loop's interface."""

    def __init__(
        self,
        export_dir: str | Path,
        variant: str = "native",
        backend: str = "auto",
        custom_ops: Sequence[type] | None = None,
        drafter: bool = True,
    ) -> None:
        """`drafter=False` runs the target graph alone (autoregressive: the bench's baseline)."""
        export_dir = Path(export_dir)
        info = read_index(export_dir, "graphs.json", "point at the export/ directory of a `dflash-trt build`")
        if variant not in info["variants"]:
            raise DFlashError(f"{export_dir} has no '{variant}' graphs", f"use one of: {', '.join(info['variants'])}")
        graphs = info["variants"][variant]
        if custom_ops is None:  # the plugin nodes' CPU evaluators, when the graphs have plugin nodes
            custom_ops = plugin_evaluators(variant)
        self.info = info
        self.device = torch.device("cpu")
        self.vocab_size = int(info["vocab_size"])
        self.target = graphs["target"]
        self.target_session = GraphSession(_graph_file(export_dir, variant, self.target), backend, custom_ops)
        self.drafter = graphs.get("drafter") if drafter else None
        self.drafter_session = None
        self.drafter_config = None
        if self.drafter is not None:
            self.drafter_config = DrafterConfig.from_dir(export_dir / "drafter")
            self.drafter_session = GraphSession(_graph_file(export_dir, variant, self.drafter), backend, custom_ops)
        self.cache_dtype = torch.float32  # 16-bit graphs run as float32 copies

    def allocate(self, max_batch: int, capacity: int) -> None:
        drafter = CacheShape.of(self.drafter) if self.drafter is not None else None
        self.allocate_caches(max_batch, capacity, CacheShape.of(self.target), drafter, self.cache_dtype, self.device)

    def _cache_feed(self, layers, past_len: int) -> dict[str, np.ndarray]:
        """`past_key_i` / `past_value_i` of every layer i that owns a cache (unallocated layers have no inputs)."""
        feed = {}
        for i, layer in _cached(layers):
            feed[names.key_name(names.PAST, i)] = _numpy(layer.keys[:, :past_len])
            feed[names.value_name(names.PAST, i)] = _numpy(layer.values[:, :past_len])
        return feed

    @property
    def target_verifies(self) -> bool:
        """Whether the target graph verifies inside (the plugin target graph: no logits out)."""
        return bool(self.target.get("verifies"))

    @property
    def masks_logits(self) -> bool:
        return not self.target_verifies  # a verifying target hands out no logits to mask

    @torch.inference_mode()
    @contiguous_slots
    def target_verify(
        self, rows, tokens, starts, span, draft_probs, sampling: SamplingTensors, logits_at=None, allowed=None
    ) -> VerifyOutput:
        if not self.target_verifies:
            return super().target_verify(rows, tokens, starts, span, draft_probs, sampling, logits_at, allowed)
        inputs = verifying_graph_inputs(
            tokens, starts, draft_probs, sampling, logits_at, lambda batch, rows: torch.zeros(batch, rows, self.vocab_size)
        )
        feed = {name: _numpy(t, torch.float32 if t.is_floating_point() else torch.int64) for name, t in inputs.items()}
        slots = min(span, self.capacity)  # the graph reads and writes slots < span only
        layers = self.target_cache.rows(rows)
        for i, layer in _cached(layers):
            feed[names.key_name(names.CACHE, i)] = _numpy(layer.keys[:, :slots])
            feed[names.value_name(names.CACHE, i)] = _numpy(layer.values[:, :slots])
        out = self.target_session.run(feed)
        for i, layer in _cached(layers):  # an engine updates them in place (aliased outputs)
            layer.keys[:, :slots] = torch.from_numpy(out[names.key_name(names.PRESENT, i)]).to(layer.keys.dtype)
            layer.values[:, :slots] = torch.from_numpy(out[names.value_name(names.PRESENT, i)]).to(layer.values.dtype)
        result = torch.from_numpy(out[names.RESULT])
        return VerifyOutput(result[:, 0].clone(), result[:, 1].clone(), torch.from_numpy(out[names.FEATURES]))

    @torch.inference_mode()
    @contiguous_slots
    def target_forward(self, rows, tokens, starts, span, logits_at=None) -> TargetOutput:
        if self.target_verifies:
            raise DFlashError("the plugin target graph verifies inside and returns no logits", "call target_verify")
        batch, count = tokens.shape
        past_len = max(span - count, 1)
        layers = self.target_cache.rows(rows)
        if logits_at is not None:
            index = logits_at.view(-1, 1)
        else:
            index = torch.arange(count).expand(batch, -1)
        feed = {
            names.INPUT_IDS: _numpy(tokens, torch.int64),
            names.STARTS: _numpy(starts, torch.int64),
            names.LOGIT_INDEX: _numpy(index, torch.int64),
        }
        feed.update(self._cache_feed(layers, past_len))
        out = self.target_session.run(feed)
        positions = starts.view(-1, 1) + torch.arange(count)
        row_index = torch.arange(batch).view(-1, 1)
        for i, layer in _cached(layers):
            layer.keys[row_index, positions] = torch.from_numpy(out[names.key_name(names.NEW, i)]).to(layer.keys.dtype)
            layer.values[row_index, positions] = torch.from_numpy(out[names.value_name(names.NEW, i)]).to(layer.values.dtype)
        return TargetOutput(logits=torch.from_numpy(out[names.LOGITS]).float(), features=torch.from_numpy(out[names.FEATURES]))

    @torch.inference_mode()
    @contiguous_slots
    def draft_forward(self, rows, block, ctx_features, new_counts, cache_lens) -> torch.Tensor:
        """Draft logits (a V2 drafter's unary logits, before its selector)."""
        out = self._draft_outputs(rows, block, ctx_features, new_counts, cache_lens)
        return selector.draft_logits(self.drafter_head, out).float()

    def _sampling_feed(self, sampling: SamplingTensors) -> dict[str, np.ndarray]:
        return {names.TEMPERATURE: _numpy(sampling.temperature, torch.float32), names.SEED: _numpy(sampling.seed, torch.int64)}

    def _draft_outputs(self, rows, block, ctx_features, new_counts, cache_lens, sampling_feed=None) -> dict[str, torch.Tensor]:
        """One drafter graph call (the new context appended to the draft cache); its outputs by name."""
        layers = self.draft_cache.rows(rows)
        # room for the new context too: plugin nodes append it to the cache they are given
        past_len = max(int((cache_lens + new_counts).max()), 1)
        feed = {
            names.BLOCK_IDS: _numpy(block, torch.int64),
            names.CTX_FEATURES: _numpy(ctx_features, self.cache_dtype),
            names.NEW_COUNTS: _numpy(new_counts, torch.int64),
            names.CACHE_LENS: _numpy(cache_lens, torch.int64),
        }
        feed.update(self._cache_feed(layers, past_len))
        if self.drafter_head == HEAD_PLUGIN:
            feed.update(sampling_feed or {})
        out = {name: torch.from_numpy(array) for name, array in self.drafter_session.run(feed).items()}
        for i, layer in enumerate(layers):
            reference_attention.append_context(
                layer.keys, layer.values, cache_lens, out[names.key_name(names.NEW, i)], out[names.value_name(names.NEW, i)], new_counts
            )
        return out

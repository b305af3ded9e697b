"""ONNX export of the target and the drafter graphs, with explicit KV-cache inputs and outputs, and graphs.json.

The graph modules themselves (`TargetGraph`, `VerifyingTargetGraph`, `DrafterGraph`, masks, the
cache-shape probe, dense MoE experts) live in trtllm_dflash/graphs, below the runtimes; their
tensor names in trtllm_dflash/contracts/names.py. This module traces them and writes the files.

Target graph (prefill and block verification in one graph):
    inputs   input_ids [b, T] int64       tokens at positions starts[r] + t
             starts [b] int64             first position of each row (its committed length)
             logit_index [b, n] int64     which of the T positions get logits (last prompt
                                          token at prefill, every block position at verify)
             past_key_i / past_value_i    [b, S, kv_heads_i, key_dim_i / value_dim_i] for each
                                          layer i that owns a cache: slots 0..S-1 (slot ==
                                          position); slots >= starts[r] are ignored, so the
                                          runtime may pass any S >= max(starts)
    outputs  logits [b, n, V], features [b, T, taps * H] (outputs of the tapped decoder layers,
             id i = output of layer i), new_key_i / new_value_i [b, T, kv_heads_i, ...]
             (the K/V of the T tokens; the runtime writes them at slots starts[r] + t)
    Per-layer shapes are what each attention layer writes (Gemma 4: global layers have other
    head dims and KV-head counts than sliding ones); layers that reuse another layer's K/V
    (Gemma 4's KV-sharing layers) own no cache and have no inputs or outputs. graphs.json
    records every layer's shape (`cache_layers`). Hybrid (linear attention) and MLA targets are
    refused (`check_exportable`).

Drafter graph (one block-diffusion step, the target's embedding and LM head included):
    inputs   block_ids [b, B] int64 (anchor + masks), ctx_features [b, n, taps * H] (new context
             rows, the first new_counts[r] valid), new_counts [b], cache_lens [b], and the draft
             cache past_key_i / past_value_i [b, S, kv_heads, head_dim]
    outputs  logits [b, B - 1, V] (predictions for block positions 1..B-1) and
             new_key_i / new_value_i [b, n, kv_heads, head_dim] (context K/V the runtime appends
             at slots cache_lens[r] + i for i < new_counts[r]; the block's K/V are not kept)
    V2 drafters (drafters/dflash2/graph.py; graphs.json `head`): native graphs return logits (unary),
             candidates [b, B - 1, k] and selector_scores [b, B - 1, k, k] before the new K/V, and
             the runtime walks the scores; plugin graphs also take temperature [b] and seed [b]
             (after the caches) and return draft_tokens, candidates and candidate_probs instead

Native graphs concatenate [past cache; new keys] and mask by position instead of scattering into
the cache inside the graph, so they use only plain ONNX ops (the `native` variant); the `plugin`
variant's target (`VerifyingTargetGraph`) instead updates its caches in place through the DFlash
target-attention node and verifies inside, returning no logits. In both, the same
graph serves prefill (starts = 0) and verify (starts = committed length). The exporter is
torch.onnx's dynamo exporter with dynamic batch/length axes bounded by the recipe; examples use
batch >= 2 so no axis is specialised to 1. Node metadata (stack traces, counters) is stripped,
so the same model and bounds give byte-identical files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from trtllm_dflash.contracts import names
from trtllm_dflash.contracts.dtypes import from_onnx
from trtllm_dflash.drafters import kind_of
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.graphs.concat_cache import LayerCache
from trtllm_dflash.graphs.dense_experts import dense_experts
from trtllm_dflash.graphs.dtypes import DTYPES, cast_parameters
from trtllm_dflash.graphs.target import (
    TargetGraph,
    UnsupportedTargetError,
    VerifyingTargetGraph,
    check_exportable,
    verifying_target_refusal,
)
from trtllm_dflash.modeling.drafter import DFlashDrafter

# DTYPES, cast_parameters, TargetGraph and UnsupportedTargetError are imported from here by older
# callers; they live in trtllm_dflash.graphs.
__all__ = [
    "DTYPES",
    "OPSET",
    "Bounds",
    "GraphInfo",
    "TargetGraph",
    "UnsupportedTargetError",
    "cast_parameters",
    "export_drafter",
    "export_pair",
    "export_target",
    "export_verifying_target",
    "write_graphs_json",
]

OPSET = 20


@dataclasses.dataclass(frozen=True)
class Bounds:
    """Largest shapes the graphs (and engines) accept; from the recipe."""

    max_batch: int
    max_input_len: int  # tokens per target call (prefill) and context rows per drafter call
    max_seq_len: int  # cache slots
    block_size: int


# ----------------------------------------------------------------------------- export


@dataclasses.dataclass
class GraphInfo:
    """What a runtime needs to know about an exported graph (saved in graphs.json)."""

    file: str
    inputs: list[dict[str, Any]]
    outputs: list[str]
    num_layers: int
    kv_heads: int  # of every cached layer when they are all alike, else 0 (see cache_layers)
    head_dim: int
    dtype: str
    variant: str = "native"
    dir: str = ""  # folder of the file under the export directory (default: the variant's)
    # per decoder layer: {"kv_heads", "key_dim", "value_dim"} of its past_/new_key_i and _value_i,
    # or None for a layer without a cache (no inputs or outputs named after it)
    cache_layers: list[dict[str, int] | None] = dataclasses.field(default_factory=list)
    # a verifying target graph (VerifyingTargetGraph): caches in place, returns verification results
    verifies: bool = False
    # a drafter graph's head (its kind's graph_head): V1 logits, or a V2 selector's scores or walk
    head: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _uniform(shapes: list[LayerCache | None]) -> tuple[int, int]:
    """(kv_heads, head_dim) when every cached layer has the same K and V shape, else (0, 0)."""
    present = {(s.kv_heads, s.key_dim, s.value_dim) for s in shapes if s is not None}
    if len(present) == 1:
        heads, key_dim, value_dim = present.pop()
        if key_dim == value_dim:
            return heads, key_dim
    return 0, 0


def normalize(program) -> None:
    """Strip what differs between two exports of the same model (stack traces, counters)."""
    model = program.model
    model.doc_string = None
    model.metadata_props.clear()
    model.producer_version = None
    for graph in model.graphs():
        graph.metadata_props.clear()
        graph.doc_string = None
        for value in list(graph.inputs) + list(graph.outputs) + list(graph.initializers.values()):
            value.metadata_props.clear()
            value.doc_string = None
        for node in graph.all_nodes():
            node.metadata_props.clear()
            node.doc_string = None
            for value in node.outputs:
                value.metadata_props.clear()
                value.doc_string = None


def _export(
    module: nn.Module,
    args: tuple,
    dynamic_shapes: tuple,
    input_names: list[str],
    output_names: list[str],
    path: Path,
    translations: dict | None,
):
    import logging
    import warnings

    # the exporter's notes on axis names, torchvision, and the (unused, untyped) cache outputs of
    # plugin nodes are noise here
    quiet = [logging.getLogger(name) for name in ("onnx_ir", "onnxscript", "torch.onnx")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            program = _export_program(module, args, dynamic_shapes, input_names, output_names, translations)
        normalize(program)
        path.parent.mkdir(parents=True, exist_ok=True)
        program.save(str(path), external_data=_needs_external_data(module))
    finally:
        for logger, level in zip(quiet, levels):
            logger.setLevel(level)
    return program


def attention_translation() -> dict:
    """Our ONNX translation of `F.scaled_dot_product_attention`: the scale applied once, exactly.

    torch.onnx's own translation casts the scale to the query's dtype and multiplies Q and K by
    its square root: in a BF16 graph sqrt(1/sqrt(32)) rounds to 0.41992 instead of 0.42045, so
    every attention runs 0.25% cooler than torch's, which applies the scale in float32 at any
    dtype. Here Q is multiplied by the float32 scale in float32 and cast back (Q scaled before
    the first matmul is the form TensorRT fuses into one attention kernel: TensorRT-RTX 1.7 builds
    it, as the old form, into one `_gemm_mha_v2` kernel); the rest is MatMul / mask / Softmax / MatMul.
    """
    import math

    from trtllm_dflash.extras import require

    onnx = require("onnx", "export", "ONNX export")
    op = require("onnxscript", "export", "ONNX export").opset20
    f32 = onnx.TensorProto.FLOAT

    def attention(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False, scale=None, enable_gqa: bool = False):
        if dropout_p or is_causal:
            raise DFlashError(
                "the graphs call scaled_dot_product_attention with dropout or is_causal, which the export does not translate",
                "pass an explicit attention mask and no dropout (eval mode)",
            )
        scale = float(scale) if scale is not None else 1.0 / math.sqrt(int(query.shape[-1]))
        scaled = op.CastLike(op.Mul(op.Cast(query, to=f32), op.Constant(value_float=scale)), query)
        heads, kv_heads = query.shape[1], key.shape[1]
        if enable_gqa and heads != kv_heads:  # repeat each K/V head for its group of query heads
            group = op.Constant(value_ints=[1, 1, heads // kv_heads, 1, 1])
            key, value = (
                op.Reshape(
                    op.Tile(op.Unsqueeze(t, op.Constant(value_ints=[2])), group),
                    op.Concat(op.Shape(t, start=0, end=1), op.Constant(value_ints=[heads]), op.Shape(t, start=2), axis=0),
                )
                for t in (key, value)
            )
        scores = op.MatMul(scaled, op.Transpose(key, perm=[0, 1, 3, 2]))
        if attn_mask is not None:
            if attn_mask.dtype == onnx.TensorProto.BOOL:  # hidden keys get the dtype's lowest value, as torch's
                lowest = float(torch.finfo(from_onnx(int(query.dtype)).to_torch()).min)
                attn_mask = op.Where(
                    attn_mask, op.CastLike(op.Constant(value_float=0.0), scores), op.CastLike(op.Constant(value_float=lowest), scores)
                )
            scores = op.Add(scores, attn_mask)
        return op.MatMul(op.Softmax(scores, axis=-1), value)

    return {torch.ops.aten.scaled_dot_product_attention.default: attention}


def _export_program(module, args, dynamic_shapes, input_names, output_names, translations):
    import torch.onnx

    return torch.onnx.export(
        module,
        args,
        dynamo=True,
        dynamic_shapes=dynamic_shapes,
        input_names=input_names,
        output_names=output_names,
        opset_version=OPSET,
        custom_translation_table={**attention_translation(), **(translations or {})},
        optimize=True,
        verbose=False,
    )


def _needs_external_data(module: nn.Module) -> bool:
    """Protobuf files stop at 2 GB; bigger models keep their weights in a side file."""
    size = sum(p.numel() * p.element_size() for p in module.parameters())
    return size > 1_500_000_000


def _describe(tensor_names: list[str], dims: list[list[str | int]], dtypes: list[str]) -> list[dict[str, Any]]:
    return [{"name": n, "dims": d, "dtype": t} for n, d, t in zip(tensor_names, dims, dtypes)]


def _cache_examples(shapes: list[LayerCache | None], cached: list[int], batch: int, slots: int, dtype: torch.dtype):
    """Example (keys, values) cache inputs `[batch, slots, kv_heads, dim]` of every cached layer."""
    keys = tuple(torch.zeros(batch, slots, shapes[i].kv_heads, shapes[i].key_dim, dtype=dtype) for i in cached)
    values = tuple(torch.zeros(batch, slots, shapes[i].kv_heads, shapes[i].value_dim, dtype=dtype) for i in cached)
    return keys, values


def _cache_dims(shapes: list[LayerCache | None], cached: list[int], slots: str) -> list[list[str | int]]:
    """graphs.json dims of the key inputs then the value inputs of every cached layer (slot axis `slots`)."""
    keys = [["batch", slots, shapes[i].kv_heads, shapes[i].key_dim] for i in cached]
    values = [["batch", slots, shapes[i].kv_heads, shapes[i].value_dim] for i in cached]
    return keys + values


@contextlib.contextmanager
def _dense_target_graph(graph_class: type, model: nn.Module, layer_ids: list[int], torch_dtype: torch.dtype):
    """A target graph (`graph_class`) of `model` cast to torch_dtype, its experts dense while it is exported."""
    with dense_experts(model):
        yield graph_class(cast_parameters(model, torch_dtype).eval(), layer_ids).eval()


def _target_info(
    path: Path,
    input_names: list[str],
    input_dims: list[list[str | int]],
    input_dtypes: list[str],
    output_names: list[str],
    num_layers: int,
    shapes: list[LayerCache | None],
    dtype: str,
    variant: str,
    **extra: Any,
) -> GraphInfo:
    """The GraphInfo of a target graph (native or verifying): its inputs, outputs and per-layer caches."""
    kv_heads, head_dim = _uniform(shapes)
    return GraphInfo(
        file=path.name,
        inputs=_describe(input_names, input_dims, input_dtypes),
        outputs=output_names,
        num_layers=num_layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        variant=variant,
        cache_layers=[shape.to_dict() if shape is not None else None for shape in shapes],
        **extra,
    )


def export_target(model: nn.Module, layer_ids: list[int], path: Path, dtype: str, bounds: Bounds, variant: str = "native") -> GraphInfo:
    """Export the target as one prefill/verify graph (see the module docstring for its I/O)."""
    from torch.export import Dim

    check_exportable(model.config)
    config = model.config.get_text_config()
    torch_dtype = DTYPES[dtype]
    with _dense_target_graph(TargetGraph, model, layer_ids, torch_dtype) as graph:
        shapes, cached = graph.cache_shapes, graph.cache_layers

        batch = Dim("batch", min=1, max=bounds.max_batch)
        tokens = Dim("tokens", min=1, max=bounds.max_input_len)
        picks = Dim("picked", min=1, max=bounds.max_input_len)
        past = Dim("past", min=1, max=bounds.max_seq_len)
        b, t, n, s = 2, min(3, bounds.max_input_len), 2, min(5, bounds.max_seq_len)  # distinct sizes, none of them 1
        args = (
            torch.randint(0, int(config.vocab_size), (b, t)),
            torch.tensor([s, 1]),
            torch.tensor([[t - 1, 0], [1, t - 1]])[:, :n],
            *_cache_examples(shapes, cached, b, s, torch_dtype),
        )
        cache_dims = tuple({0: batch, 1: past} for _ in cached)
        dynamic = ({0: batch, 1: tokens}, {0: batch}, {0: batch, 1: picks}, cache_dims, cache_dims)
        past_k, past_v = names.cache_names(names.PAST, cached)
        new_k, new_v = names.cache_names(names.NEW, cached)
        input_names = [names.INPUT_IDS, names.STARTS, names.LOGIT_INDEX, *past_k, *past_v]
        output_names = [names.LOGITS, names.FEATURES, *new_k, *new_v]
        from trtllm_dflash.builder import fp8

        translations = fp8.translation_table() if fp8.has_fp8(graph) else None  # FP8 layers -> Q/DQ
        with torch.no_grad():
            _export(graph, args, dynamic, input_names, output_names, path, translations)
    return _target_info(
        path,
        input_names,
        [["batch", "tokens"], ["batch"], ["batch", "picked"]] + _cache_dims(shapes, cached, "past"),
        ["int64", "int64", "int64"] + [dtype] * (2 * len(cached)),
        output_names,
        int(config.num_hidden_layers),
        shapes,
        dtype,
        variant,
    )


def export_verifying_target(
    model: nn.Module, layer_ids: list[int], path: Path, dtype: str, bounds: Bounds, variant: str = "plugin"
) -> GraphInfo:
    """Export the plugin target graph (`VerifyingTargetGraph`): in-place caches, verification inside.

    Inputs: input_ids [b, T], starts [b], logit_index [b, n], draft_probs [b, drafts, V] float32,
    temperature [b] float32, top_k [b] int64, top_p [b] float32, seed [b] int64, and
    cache_key_i / cache_value_i [b, capacity, kv_heads_i, dim_i] per cached layer. Outputs:
    result [b, 5] int64 (`reference.VERIFY_RESULT_COLUMNS`), features [b, T, taps * H], and
    present_key_i / present_value_i (the caches, aliased to the inputs by the plugin nodes).
    """
    from torch.export import Dim

    from trtllm_dflash.builder import fp8
    from trtllm_dflash.plugins import onnx_nodes

    check_exportable(model.config)
    reason = verifying_target_refusal(model)
    if reason is not None:
        raise UnsupportedTargetError(f"no plugin target graph: {reason}", "use the native variant")
    config = model.config.get_text_config()
    vocab = int(config.vocab_size)
    torch_dtype = DTYPES[dtype]
    with _dense_target_graph(VerifyingTargetGraph, model, layer_ids, torch_dtype) as graph:
        shapes, cached = graph.cache_shapes, graph.cache_layers
        batch = Dim("batch", min=1, max=bounds.max_batch)
        tokens = Dim("tokens", min=1, max=bounds.max_input_len)
        picks = Dim("picked", min=1, max=max(bounds.block_size, 2))
        drafts = Dim("drafts", min=1, max=max(bounds.block_size, 2))
        capacity = Dim("capacity", min=1, max=bounds.max_seq_len)
        b, t, n, d, s = 2, min(3, bounds.max_input_len), 2, 3, min(8, bounds.max_seq_len)
        args = (
            torch.randint(0, vocab, (b, t)),
            torch.tensor([min(4, s - t), 1]).clamp_min(0),
            torch.tensor([[0, 1], [1, 2]])[:, :n].clamp_max(t - 1),
            torch.zeros(b, d, vocab),
            torch.tensor([0.0, 0.8]),
            torch.tensor([0, 5]),
            torch.tensor([1.0, 0.9]),
            torch.tensor([3, 4]),
            *_cache_examples(shapes, cached, b, s, torch_dtype),
        )
        cache_dims = tuple({0: batch, 1: capacity} for _ in cached)
        rows = {0: batch}
        dynamic = ({0: batch, 1: tokens}, rows, {0: batch, 1: picks}, {0: batch, 1: drafts}, rows, rows, rows, rows, cache_dims, cache_dims)
        cache_k, cache_v = names.cache_names(names.CACHE, cached)
        present_k, present_v = names.cache_names(names.PRESENT, cached)
        input_names = [names.INPUT_IDS, names.STARTS, names.LOGIT_INDEX, names.DRAFT_PROBS, *names.SAMPLING_INPUTS, *cache_k, *cache_v]
        output_names = [names.RESULT, names.FEATURES, *present_k, *present_v]
        translations = dict(onnx_nodes.custom_translation_table(kv_splits=1))
        if fp8.has_fp8(graph):
            translations.update(fp8.translation_table())
        with torch.no_grad():
            _export(graph, args, dynamic, input_names, output_names, path, translations)
    return _target_info(
        path,
        input_names,
        [["batch", "tokens"], ["batch"], ["batch", "picked"], ["batch", "drafts", vocab], ["batch"], ["batch"], ["batch"], ["batch"]]
        + _cache_dims(shapes, cached, "capacity"),
        ["int64", "int64", "int64", "fp32", "fp32", "int64", "fp32", "int64"] + [dtype] * (2 * len(cached)),
        output_names,
        int(config.num_hidden_layers),
        shapes,
        dtype,
        variant,
        dir=variant,
        verifies=True,
    )


def export_drafter(
    drafter: DFlashDrafter,
    embedding: nn.Module,
    lm_head: nn.Module,
    path: Path,
    dtype: str,
    bounds: Bounds,
    variant: str = "native",
    plugin: bool = False,
    translations: dict | None = None,
) -> GraphInfo:
    """Export one drafting step (see the module docstring for its I/O)."""
    import copy

    from torch.export import Dim

    config = drafter.config
    refusal = drafter_graph_refusal(config)
    if refusal is not None:
        raise UnsupportedTargetError(*refusal)
    torch_dtype = DTYPES[dtype]
    num_layers = config.num_hidden_layers
    kind = kind_of(config)
    head = kind.graph_head(config, plugin)
    graph = kind.new_graph(
        cast_parameters(drafter, torch_dtype).eval(),
        cast_parameters(copy.deepcopy(embedding), torch_dtype),
        cast_parameters(copy.deepcopy(lm_head), torch_dtype),
        plugin,
    ).eval()
    if lm_head.weight is embedding.weight:  # tied: export one table
        graph.lm_head.weight = graph.embedding.weight

    batch = Dim("batch", min=1, max=bounds.max_batch)
    block = Dim("block", min=2, max=max(bounds.block_size, 3))
    rows = Dim("ctx_rows", min=1, max=bounds.max_input_len)
    past = Dim("past", min=1, max=bounds.max_seq_len)
    b, blk, n, s = 2, min(bounds.block_size, 4) if bounds.block_size > 2 else 2, 3, min(5, bounds.max_seq_len)
    features = config.num_taps * config.hidden_size
    args = (
        torch.randint(0, int(config.vocab_size or 2), (b, blk)),
        torch.zeros(b, n, features, dtype=torch_dtype),
        torch.tensor([n, 1]),
        torch.tensor([s, 2]),
        tuple(torch.zeros(b, s, config.num_key_value_heads, config.head_dim, dtype=torch_dtype) for _ in range(num_layers)),
        tuple(torch.zeros(b, s, config.num_key_value_heads, config.head_dim, dtype=torch_dtype) for _ in range(num_layers)),
    )
    cache_dims = tuple({0: batch, 1: past} for _ in range(num_layers))
    dynamic = ({0: batch, 1: block}, {0: batch, 1: rows}, {0: batch}, {0: batch}, cache_dims, cache_dims)
    past_k, past_v = names.cache_names(names.PAST, list(range(num_layers)))
    new_k, new_v = names.cache_names(names.NEW, list(range(num_layers)))
    sampling = kind.graph_sampling_inputs(head)  # the plugin walk samples inside: temperature, seed
    args += (torch.tensor([0.0, 0.8]), torch.tensor([3, 4]))[: len(sampling)]
    dynamic += ({0: batch},) * len(sampling)
    input_names = [names.BLOCK_IDS, names.CTX_FEATURES, names.NEW_COUNTS, names.CACHE_LENS, *past_k, *past_v, *sampling]
    output_names = [*kind.graph_outputs(head), *new_k, *new_v]
    with torch.no_grad():
        _export(graph, args, dynamic, input_names, output_names, path, translations)
    cache = ["batch", "past", config.num_key_value_heads, config.head_dim]
    return GraphInfo(
        file=path.name,
        inputs=_describe(
            input_names,
            [["batch", "block"], ["batch", "ctx_rows", features], ["batch"], ["batch"]]
            + [cache] * (2 * num_layers)
            + [["batch"]] * len(sampling),
            ["int64", dtype, "int64", "int64"] + [dtype] * (2 * num_layers) + ["fp32", "int64"][: len(sampling)],
        ),
        outputs=output_names,
        num_layers=num_layers,
        kv_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        dtype=dtype,
        variant=variant,
        dir=variant,
        cache_layers=[LayerCache(config.num_key_value_heads, config.head_dim, config.head_dim).to_dict()] * num_layers,
        head=head,
    )


def write_graphs_json(directory: Path, info: dict[str, Any]) -> Path:
    path = directory / "graphs.json"
    path.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return path


def drafter_graph_refusal(config) -> tuple[str, str] | None:
    """(problem, fix) when the drafter graphs (and so the trt backend's engines) cannot run this
    drafter (a DrafterConfig) as published, else None."""
    if config.sliding_window_size:
        return (
            f"the drafter bounds its draft history (sliding_window_size={config.sliding_window_size}), "
            "which the drafter graph does not implement (it would attend to the whole history)",
            "build without the bound (drop sliding_window_size) or serve the pair with backend: torch",
        )
    return None


def export_pair(
    target_model: nn.Module,
    drafter: DFlashDrafter | None,
    out_dir: Path,
    dtype: str,
    bounds: Bounds,
    variants: tuple[str, ...] = ("native",),
    progress: Callable[..., None] = lambda text, done=None, total=None: None,
) -> dict[str, Any]:
    """Export the target (and drafter) graphs of every variant into out_dir; write graphs.json.

    Layout: `<variant>/target.onnx`, `<variant>/drafter.onnx`, `drafter/config.json`, `graphs.json`.
    The models are cast to `dtype` in place. `progress(text, done, total)` is told each graph
    before its export starts (one graph can take minutes), then once more when all are done.
    """
    from trtllm_dflash.builder import plugin_graphs

    config = target_model.config.get_text_config()
    layer_ids = list(drafter.config.target_layer_ids) if drafter is not None else []
    info: dict[str, Any] = {
        "format": 1,
        "dtype": dtype,
        "vocab_size": int(config.vocab_size),
        "hidden_size": int(config.hidden_size),
        "target_layer_ids": layer_ids,
        "bounds": dataclasses.asdict(bounds),
        "opset": OPSET,
        "variants": {},
    }
    embedding, lm_head = target_model.get_input_embeddings(), target_model.get_output_embeddings()
    refused = verifying_target_refusal(target_model) if any(v != "native" for v in variants) else None
    exports = export_order(variants, refused is None, drafter is not None)

    def exporting(variant: str, graph: str) -> None:
        progress(f"exporting the {variant} {graph} graph", exports.index((variant, graph)), len(exports))

    for variant in variants:
        graphs: dict[str, Any] = {}
        if variant == "native":
            exporting(variant, "target")
            graphs["target"] = export_target(target_model, layer_ids, out_dir / "native" / "target.onnx", dtype, bounds).to_dict()
            graphs["target"]["dir"] = "native"
        else:  # the plugin target: in-place cache attention and verification inside the graph
            if refused is None:
                exporting(variant, "target")
                graphs["target"] = export_verifying_target(
                    target_model, layer_ids, out_dir / variant / "target.onnx", dtype, bounds, variant
                ).to_dict()
            elif "native" in info["variants"]:  # a target the op cannot run keeps the native target graph
                graphs["target"] = {**info["variants"]["native"]["target"], "variant": variant, "plugin_refused": refused}
            else:
                raise UnsupportedTargetError(f"no plugin target graph: {refused}", "build the native variant too")
        if drafter is not None:
            exporting(variant, "drafter")
            plugin, translations = plugin_graphs.export_options(variant)
            graphs["drafter"] = export_drafter(
                drafter, embedding, lm_head, out_dir / variant / "drafter.onnx", dtype, bounds, variant, plugin, translations
            ).to_dict()
        info["variants"][variant] = graphs
    if drafter is not None:
        (out_dir / "drafter").mkdir(parents=True, exist_ok=True)
        (out_dir / "drafter" / "config.json").write_text(json.dumps(drafter.config.to_dict(), indent=2) + "\n")
    progress("writing graphs.json", len(exports), len(exports))
    write_graphs_json(out_dir, info)
    return info


def export_order(variants: tuple[str, ...], plugin_target: bool, drafter: bool) -> list[tuple[str, str]]:
    """(variant, graph) of every graph export_pair writes, in its order: a variant's target then its
    drafter; a plugin variant whose target the op cannot run reuses the native target graph."""
    graphs = []
    for variant in variants:
        if variant == "native" or plugin_target:
            graphs.append((variant, "target"))
        if drafter:
            graphs.append((variant, "drafter"))
    return graphs

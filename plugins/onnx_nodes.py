"""ONNX nodes of the DFlash plugins: the contract between an exported graph and TensorRT.

TensorRT's ONNX parser turns a node whose op type it does not know into the plugin of the same
name, selected by the string attributes `plugin_namespace` and `plugin_version`; the other
attributes become plugin fields, and `aot=1` selects the plugin's ahead-of-time implementation
(the Triton kernel embedded in the engine, `tensorrt_plugins.py`). Every node here carries those
three attributes and lives in the ONNX domain `dflash`. The attention nodes' option inputs and
attributes (scale, window, sinks + has_sinks) come from `attention_options`.

Each plugin kernel is one node (a TensorRT AOT plugin launches exactly one kernel):
- `DFlashBlockAttention`: KV-injected block attention with the context in one pass;
- `DFlashBlockAttentionSplit` + `DFlashAttentionMerge`: the same, with the context split over
  `kv_splits` programs per KV head (long contexts, small batches), then merged;
- `DFlashTargetAttention`: causal attention of a target layer over its in-place cache (the
  block's K/V written at each row's positions; sliding windows and attention sinks);
- `DFlashTargetAttentionSplit` + `DFlashAttentionMerge`: the same, with each row's committed prefix
  split over `kv_splits` programs per KV head and query tile (small batches, long contexts);
- `DFlashVerifyPartials` + `DFlashVerifyPositions` + `DFlashVerifyCommit`: tree-free block
  verification (the argmax split over vocabulary chunks, per-position decisions, the commit);
- DFlash V2's drafter nodes (`DFlash2GroupedConv`, `DFlash2TopKPartials` + `DFlash2TopKMerge` +
  `DFlash2CandidateSelect`), defined in `dflash2_nodes` and part of NODES, `evaluators()` and
  `custom_translation_table()` here.

The caches are updated in place: the attention nodes output the updated caches, and the
TensorRT plugins declare those outputs aliased to the cache inputs (`TensorDesc.aliased()`),
so nothing is copied. This module provides, for each node: its schema (registered with
`onnx.defs` so exporters and checkers accept it), a CPU evaluator for `onnx.reference`, and the
translation of the `dflash::` torch ops for `torch.onnx.export(..., dynamo=True,
custom_translation_table=custom_translation_table())`.
"""

from __future__ import annotations

import functools

import onnx
import torch
from onnx import helper
from onnx.defs import OpSchema
from onnx.reference.op_run import OpRun

from trtllm_dflash.ops import attention_options, custom_ops, reference, reference_attention, specs  # noqa: F401  (custom_ops registers torch.ops.dflash.*)
from trtllm_dflash.ops.attention_options import AttentionOptions
from trtllm_dflash.ops.kernels import launch
from trtllm_dflash.plugins import dflash2_nodes  # noqa: F401
from trtllm_dflash.plugins.node_spec import (  # noqa: F401  (re-exported: the node contract)
    DOMAIN,
    DOMAIN_VERSION,
    PLUGIN_ATTRIBUTES,
    PLUGIN_NAMESPACE,
    PLUGIN_VERSION,
    NodeSpec,
)
from trtllm_dflash.plugins.node_spec import DFlashOp as _DFlashOp
from trtllm_dflash.plugins.node_spec import to_torch as _torch

BLOCK_SPEC, TARGET_SPEC = specs.BLOCK_ATTENTION, specs.TARGET_ATTENTION
BLOCK_OPTIONS, TARGET_OPTIONS = attention_options.BLOCK_ATTENTION, attention_options.TARGET_ATTENTION


def attention_node(op_type: str, spec: specs.OpSpec, split: bool, doc: str) -> NodeSpec:
    """An attention node from its op's spec (`ops.specs`): the op's inputs and tensor options, its
    option attributes; outputs the functional op's (out, k_cache_out, v_cache_out), or for a split
    node (attribute `kv_splits`) float32 (partial_out, partial_lse) and the caches; caches in place."""
    caches = tuple(spec.aliases)
    if split:
        outputs, dtypes, attributes = (
            ("partial_out", "partial_lse", *caches),
            ("float32", "float32"),
            {**spec.options.attributes(), "kv_splits": 2},
        )
    else:
        outputs, dtypes, attributes = spec.functional().outputs, (spec.inputs[0].name,), spec.options.attributes()
    return NodeSpec(op_type, spec.node_inputs, outputs, attributes, dtypes + spec.mutates, doc, spec.aliases)


BLOCK_ATTENTION = attention_node(
    "DFlashBlockAttention", BLOCK_SPEC, False, "KV-injected block attention (reference_attention.block_attention); caches updated in place."
)
BLOCK_ATTENTION_SPLIT = attention_node(
    "DFlashBlockAttentionSplit",
    BLOCK_SPEC,
    True,
    "Per-split attention outputs and log-sum-exps (reference_attention.block_attention_partials).",
)
ATTENTION_MERGE = NodeSpec(
    "DFlashAttentionMerge",
    ("partial_out", "partial_lse", "like"),
    ("out",),
    {},
    ("like",),
    "Merge of split attention (reference_attention.merge_partials); `like` (the queries) gives batch, tokens, heads "
    "and dtype, partial_out the head dim (a target's value head dim).",
)
TARGET_ATTENTION = attention_node(
    "DFlashTargetAttention",
    TARGET_SPEC,
    False,
    "Causal target attention over an in-place cache (reference_attention.target_attention); with has_sinks=0 "
    "the sinks input is a placeholder and is not read.",
)
TARGET_ATTENTION_SPLIT = attention_node(
    "DFlashTargetAttentionSplit",
    TARGET_SPEC,
    True,
    "Per-split target attention outputs and log-sum-exps (reference_attention.target_attention_partials), merged by "
    "DFlashAttentionMerge; caches updated in place.",
)
VERIFY_PARTIALS = NodeSpec(
    "DFlashVerifyPartials",
    ("target_logits",),
    ("chunk_max", "chunk_index"),
    {},
    ("float32", "int32"),
    "Per chunk of launch.VERIFY_CHUNK_V logits, the maximum and the first index of it "
    "(reference.verify_partials): the argmax split over the vocabulary.",
)
VERIFY_POSITIONS = NodeSpec(
    "DFlashVerifyPositions",
    specs.VERIFY_POSITIONS.input_names + ("chunk_max", "chunk_index"),
    specs.VERIFY_POSITIONS.outputs,
    {"has_draft_probs": 1},
    ("int32",),
    "Per-position accept flags and emitted tokens (reference.verify_positions); chunk_max/chunk_index "
    "are DFlashVerifyPartials' outputs for the same logits; with has_draft_probs=0 the draft_probs "
    "input is a placeholder and is not read.",
)
VERIFY_COMMIT = NodeSpec(
    "DFlashVerifyCommit",
    specs.VERIFY_COMMIT.input_names,
    specs.VERIFY_COMMIT.outputs,
    {},
    ("int64",),
    "Accepted count, bonus, next start, committed length, stop flag (reference.verify_commit); stop_ids [b, S] padded with -1.",
)
V1_NODES = (
    BLOCK_ATTENTION,
    BLOCK_ATTENTION_SPLIT,
    ATTENTION_MERGE,
    TARGET_ATTENTION,
    TARGET_ATTENTION_SPLIT,
    VERIFY_PARTIALS,
    VERIFY_POSITIONS,
    VERIFY_COMMIT,
)
NODES = V1_NODES + dflash2_nodes.NODES  # DFlash V2's drafter nodes: `dflash2_nodes`


def make_node(spec: NodeSpec, inputs: list[str], outputs: list[str], name: str | None = None, **attributes) -> onnx.NodeProto:
    """A NodeProto for `spec` with its plugin attributes (for graphs built without torch)."""
    unknown = set(attributes) - set(spec.attributes)
    if unknown:
        raise ValueError(f"{spec.op_type} has no attribute(s) {sorted(unknown)}; known: {sorted(spec.attributes)}")
    values = {**spec.attributes, **attributes, **PLUGIN_ATTRIBUTES}
    return helper.make_node(spec.op_type, inputs, outputs, name=name, domain=DOMAIN, **values)


# ----------------------------------------------------------------------------- schemas


def _schema(spec: NodeSpec) -> OpSchema:
    any_tensor = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)", "tensor(float8e4m3fn)", "tensor(int32)", "tensor(int64)"]
    inputs = [OpSchema.FormalParameter(name, f"T{i}") for i, name in enumerate(spec.inputs)]
    outputs = [OpSchema.FormalParameter(name, f"O{i}") for i, name in enumerate(spec.outputs)]
    constraints = [(f"T{i}", any_tensor, "") for i in range(len(spec.inputs))]
    constraints += [(f"O{i}", any_tensor, "") for i in range(len(spec.outputs))]
    attributes = [
        OpSchema.Attribute(name, helper.make_attribute(name, value), "") for name, value in {**spec.attributes, **PLUGIN_ATTRIBUTES}.items()
    ]
    return OpSchema(
        spec.op_type, DOMAIN, DOMAIN_VERSION, spec.doc, inputs=inputs, outputs=outputs, type_constraints=constraints, attributes=attributes
    )


@functools.cache
def register_schemas() -> None:
    """Register the node schemas with `onnx.defs` (once per process; exporters need them)."""
    for spec in NODES:
        if not onnx.defs.has(spec.op_type, DOMAIN):
            onnx.defs.register_schema(_schema(spec))


# ----------------------------------------------------------------------------- CPU evaluators


def _options(options: AttentionOptions, inputs: tuple, attributes: dict) -> dict:
    """An attention node's option values for the reference: its option inputs (None where the
    `has_<name>` attribute says placeholder) and its attributes, by name."""
    present = options.present_in(attributes)
    tensors = {o.name: _torch(x) if present[o.name] else None for o, x in zip(options.tensors, inputs)}
    scalars = {o.name: o.type(attributes.get(o.name, o.default)) for o in options.scalars}
    return {o.name: {**tensors, **scalars}[o.name] for o in options.call_order}


def _attention_evaluator(node: NodeSpec, spec: specs.OpSpec, reference_fn, splits: bool = False) -> type[OpRun]:
    """The evaluator of an attention node: `reference_fn` on the op's inputs (copies: `_torch`), its
    options from the option inputs and attributes (`kv_splits` as `splits` for a split node); outputs
    the reference's, then the updated caches."""
    count = len(spec.inputs)
    updated = [spec.index(name) for name in spec.mutates]

    def _run(self, *inputs, **attributes):
        args = [_torch(x) for x in inputs[:count]]
        extra = dict(splits=int(attributes.get("kv_splits", 2))) if splits else {}
        outputs = reference_fn(*args, **_options(spec.options, inputs[count:], attributes), **extra)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        return (*(o.numpy() for o in outputs), *(args[i].numpy() for i in updated))

    return type(node.op_type, (_DFlashOp,), {"_run": _run})


DFlashBlockAttention = _attention_evaluator(BLOCK_ATTENTION, BLOCK_SPEC, reference_attention.block_attention)
DFlashBlockAttentionSplit = _attention_evaluator(
    BLOCK_ATTENTION_SPLIT, BLOCK_SPEC, reference_attention.block_attention_partials, splits=True
)
DFlashTargetAttention = _attention_evaluator(TARGET_ATTENTION, TARGET_SPEC, reference_attention.target_attention)
DFlashTargetAttentionSplit = _attention_evaluator(
    TARGET_ATTENTION_SPLIT, TARGET_SPEC, reference_attention.target_attention_partials, splits=True
)


class DFlashAttentionMerge(_DFlashOp):
    def _run(self, partial_out, partial_lse, like, **_):
        return (reference_attention.merge_partials(_torch(partial_out), _torch(partial_lse), _torch(like)).numpy(),)


class DFlashVerifyPartials(_DFlashOp):
    def _run(self, target_logits, **_):
        chunk_max, chunk_index = reference.verify_partials(_torch(target_logits), launch.VERIFY_CHUNK_V)
        return chunk_max.numpy(), chunk_index.numpy()


class DFlashVerifyPositions(_DFlashOp):
    def _run(
        self,
        target_logits,
        block_tokens,
        draft_probs,
        temperature,
        top_k,
        top_p,
        seed,
        start,
        chunk_max,
        chunk_index,
        has_draft_probs=1,
        **_,
    ):
        draft = _torch(draft_probs) if has_draft_probs else None
        decisions = reference.verify_positions(
            _torch(target_logits),
            _torch(block_tokens),
            draft,
            _torch(temperature),
            _torch(top_k),
            _torch(top_p),
            _torch(seed),
            _torch(start),
        )
        return (decisions.numpy(),)


class DFlashVerifyCommit(_DFlashOp):
    def _run(self, decisions, block_tokens, start, stop_ids, **_):
        return (reference.verify_commit(_torch(decisions), _torch(block_tokens), _torch(start), _torch(stop_ids)).numpy(),)


def evaluators() -> list[type[OpRun]]:
    """The OpRun classes for `onnx.reference.ReferenceEvaluator(model, new_ops=evaluators())`."""
    return [
        DFlashBlockAttention,
        DFlashBlockAttentionSplit,
        DFlashAttentionMerge,
        DFlashTargetAttention,
        DFlashTargetAttentionSplit,
        DFlashVerifyPartials,
        DFlashVerifyPositions,
        DFlashVerifyCommit,
        *dflash2_nodes.evaluators(),
    ]


# ----------------------------------------------------------------------------- torch.onnx translation


def custom_translation_table(kv_splits: int = 1, target_kv_splits: int = 1) -> dict:
    """Translations of the `dflash::` torch ops into plugin nodes for the dynamo ONNX exporter.

    `kv_splits` > 1 exports block attention in its split form (two nodes), which keeps a long
    context spread over the GPU at small batch; pick it for the deployment's batch sizes
    (`launch.default_kv_splits`). `target_kv_splits` > 1 does the same for the target's attention
    (DFlashTargetAttentionSplit + DFlashAttentionMerge; `launch.target_kv_splits` picks it from the
    batch, KV heads and context an engine is built for). Export the drafter through
    `dflash::block_attention_functional` (the in-place `dflash::block_attention` cannot be exported).
    """
    import onnxscript
    from onnxscript import opset18 as op

    register_schemas()
    dflash = onnxscript.values.Opset(DOMAIN, DOMAIN_VERSION)
    plugin = dict(PLUGIN_ATTRIBUTES)
    if kv_splits < 1:
        raise ValueError(f"kv_splits must be >= 1, not {kv_splits}")
    if target_kv_splits < 1:
        raise ValueError(f"target_kv_splits must be >= 1, not {target_kv_splits}")

    def option_inputs(options: AttentionOptions, values: dict) -> list:
        """Each tensor option as float32, or a placeholder the kernel does not read (its flag is 0)."""
        return [
            op.Cast(values[o.name], to=onnx.TensorProto.FLOAT) if values[o.name] is not None else op.Constant(value_floats=[0.0])
            for o in options.tensors
        ]

    def attention(spec: specs.OpSpec, node, split_node, splits: int, int64: tuple[str, ...] = ()):
        """An attention op's translation: one node, or with `splits` > 1 its split node + the merge;
        the inputs named in `int64` cast to int64, each tensor option an input (`option_inputs`)."""
        count = len(spec.inputs)

        def translate(*args):
            inputs = [op.Cast(x, to=onnx.TensorProto.INT64) if name in int64 else x for name, x in zip(spec.input_names, args)]
            options = dict(zip(spec.names[count:], args[count:]))
            inputs += option_inputs(spec.options, options)
            attributes = {**spec.options.attribute_values(options), **plugin}
            if splits == 1:
                return node(*inputs, **attributes)
            partial_out, partial_lse, k_out, v_out = split_node(*inputs, **attributes, kv_splits=splits)
            return dflash.DFlashAttentionMerge(partial_out, partial_lse, args[0], **plugin), k_out, v_out

        return spec.functional().takes(None, name=spec.name)(translate)

    block_attention = attention(BLOCK_SPEC, dflash.DFlashBlockAttention, dflash.DFlashBlockAttentionSplit, kv_splits)
    target_attention = attention(
        TARGET_SPEC, dflash.DFlashTargetAttention, dflash.DFlashTargetAttentionSplit, target_kv_splits, int64=("starts",)
    )

    def verify_block(target_logits, block_tokens, draft_probs, temperature, top_k, top_p, seed, start, stop_ids=None):
        has_draft_probs = int(draft_probs is not None)
        if draft_probs is None:
            draft_probs = op.Constant(value_floats=[0.0])
        if stop_ids is None:
            batch = op.Shape(block_tokens, start=0, end=1)
            stop_ids = op.Expand(op.Constant(value_ints=[-1]), op.Concat(batch, op.Constant(value_ints=[1]), axis=0))
        chunk_max, chunk_index = dflash.DFlashVerifyPartials(target_logits, **plugin)
        decisions = dflash.DFlashVerifyPositions(
            target_logits,
            block_tokens,
            draft_probs,
            temperature,
            top_k,
            top_p,
            seed,
            start,
            chunk_max,
            chunk_index,
            has_draft_probs=has_draft_probs,
            **plugin,
        )
        return dflash.DFlashVerifyCommit(decisions, block_tokens, start, stop_ids, **plugin)

    return {
        torch.ops.dflash.block_attention_functional.default: block_attention,
        torch.ops.dflash.target_attention_functional.default: target_attention,
        torch.ops.dflash.verify_block.default: verify_block,
        **dflash2_nodes.translations(dflash, op),
    }

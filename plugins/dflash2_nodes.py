"""ONNX nodes of DFlash V2's two drafter ops (semantics: `reference_dflash2`).

One node per kernel (`kernels/dflash2.py`), in the `dflash` domain with the plugin attributes of
every DFlash node (`node_spec`); `onnx_nodes` lists them in NODES, `evaluators()` and
`custom_translation_table()`:
- `DFlash2GroupedConv` (x, delta, base, residual) -> out: the grouped dynamic causal conv; with
  has_residual=1 the output is float32 `residual + conv`, with has_residual=0 it has x's dtype and
  the residual input is a placeholder that is not read;
- `DFlash2TopKPartials` (unary) -> (partial_values, partial_ids): the top_k largest logits of each
  chunk of `dflash2_launch.SELECT_CHUNK_V`, float32 / int32 `[b, T, chunks, top_k]`;
- `DFlash2TopKMerge` (partial_values, partial_ids) -> (cand, cand_unary): the candidates, int64 ids
  and float32 logits `[b, T, top_k]`, best first, ties to the smaller id;
- `DFlash2CandidateSelect` (cand, cand_unary, z, anchor, predecessor, successor, temperature, seed,
  positions) -> (tokens, cand_probs): the walk; int64 `[b, T]` and float32 `[b, T, top_k]` (the
  draft distribution q over the candidates, one-hot at the pick for greedy rows).

`dflash::candidate_select` exports as the last three nodes in a row.
"""

from __future__ import annotations

import onnx
import torch
from onnx.reference.op_run import OpRun

from trtllm_dflash.ops import custom_ops, reference_dflash2, specs  # noqa: F401  (custom_ops registers torch.ops.dflash.*)
from trtllm_dflash.ops.kernels import dflash2_launch
from trtllm_dflash.plugins.node_spec import PLUGIN_ATTRIBUTES, DFlashOp, NodeSpec, to_torch

GROUPED_CONV = NodeSpec(
    "DFlash2GroupedConv",
    specs.GROUPED_DYNAMIC_CONV.input_names,
    specs.GROUPED_DYNAMIC_CONV.outputs,
    {"has_residual": 1},
    ("x",),
    "DFlash V2's grouped dynamic causal conv along a block (reference_dflash2.grouped_dynamic_conv); "
    "float32 residual + conv with has_residual=1 (then out is float32), else x's dtype and the residual "
    "input is a placeholder that is not read.",
)
TOPK_PARTIALS = NodeSpec(
    "DFlash2TopKPartials",
    ("unary",),
    ("partial_values", "partial_ids"),
    {"top_k": 16},
    ("float32", "int32"),
    "Per chunk of dflash2_launch.SELECT_CHUNK_V unary logits, the top_k largest, ties to the smaller id "
    "(reference_dflash2.topk_partials); empty slots are (-inf, -1).",
)
TOPK_MERGE = NodeSpec(
    "DFlash2TopKMerge",
    ("partial_values", "partial_ids"),
    ("cand", "cand_unary"),
    {"top_k": 16},
    ("int64", "float32"),
    "The top_k largest of DFlash2TopKPartials' outputs: the selector's candidates (reference_dflash2.topk_merge).",
)
CANDIDATE_SELECT = NodeSpec(
    "DFlash2CandidateSelect",
    specs.CANDIDATE_WALK.input_names,
    specs.CANDIDATE_WALK.outputs,
    {},
    ("int64", "float32"),
    "The selector's walk over the block, greedy or sampled with the counter RNG (reference_dflash2.candidate_walk).",
)
NODES = (GROUPED_CONV, TOPK_PARTIALS, TOPK_MERGE, CANDIDATE_SELECT)


class DFlash2GroupedConv(DFlashOp):
    def _run(self, x, delta, base, residual, has_residual=1, **_):
        res = to_torch(residual) if has_residual else None
        return (reference_dflash2.grouped_dynamic_conv(to_torch(x), to_torch(delta), to_torch(base), res).numpy(),)


class DFlash2TopKPartials(DFlashOp):
    def _run(self, unary, top_k=16, **_):
        values, ids = reference_dflash2.topk_partials(to_torch(unary), int(top_k), dflash2_launch.SELECT_CHUNK_V)
        return values.numpy(), ids.numpy()


class DFlash2TopKMerge(DFlashOp):
    def _run(self, partial_values, partial_ids, top_k=16, **_):
        cand, cand_unary = reference_dflash2.topk_merge(to_torch(partial_values), to_torch(partial_ids), int(top_k))
        return cand.numpy(), cand_unary.numpy()


class DFlash2CandidateSelect(DFlashOp):
    def _run(self, cand, cand_unary, z, anchor, predecessor, successor, temperature, seed, positions, **_):
        tokens, probs = reference_dflash2.candidate_walk(
            to_torch(cand),
            to_torch(cand_unary),
            to_torch(z),
            to_torch(anchor),
            to_torch(predecessor),
            to_torch(successor),
            to_torch(temperature),
            to_torch(seed),
            to_torch(positions),
        )
        return tokens.numpy(), probs.numpy()


def evaluators() -> list[type[OpRun]]:
    """The V2 nodes' OpRun classes for `onnx.reference.ReferenceEvaluator`."""
    return [DFlash2GroupedConv, DFlash2TopKPartials, DFlash2TopKMerge, DFlash2CandidateSelect]


def translations(dflash, op) -> dict:
    """The `dflash::` V2 torch ops as plugin nodes, for `onnx_nodes.custom_translation_table`
    (`dflash`: the onnxscript opset of the domain, `op`: the standard opset)."""
    plugin = dict(PLUGIN_ATTRIBUTES)
    int64, float32 = onnx.TensorProto.INT64, onnx.TensorProto.FLOAT

    def grouped_dynamic_conv(x, delta, base, residual=None):
        has_residual = int(residual is not None)
        residual = op.Cast(residual, to=float32) if residual is not None else op.Constant(value_floats=[0.0])
        return dflash.DFlash2GroupedConv(x, delta, base, residual, has_residual=has_residual, **plugin)

    def candidate_select(unary, z, anchor, predecessor, successor, temperature, seed, positions, top_k):
        values, ids = dflash.DFlash2TopKPartials(unary, top_k=top_k, **plugin)
        cand, cand_unary = dflash.DFlash2TopKMerge(values, ids, top_k=top_k, **plugin)
        tokens, probs = dflash.DFlash2CandidateSelect(
            cand,
            cand_unary,
            z,
            op.Cast(anchor, to=int64),
            predecessor,
            successor,
            op.Cast(temperature, to=float32),
            op.Cast(seed, to=int64),
            op.Cast(positions, to=int64),
            **plugin,
        )
        return tokens, cand, probs

    return {
        torch.ops.dflash.grouped_dynamic_conv.default: grouped_dynamic_conv,
        torch.ops.dflash.candidate_select.default: candidate_select,
    }

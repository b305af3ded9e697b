"""Graph summaries from a model's shape alone (config or catalog), without exporting its weights.

`closed_form` gives the summaries the export of a variant would have, so `explain_model` gives the
same bytes per step as a build's graphs. The counting rules: builder/traffic.py.

A DFlash V2 drafter (DFlash2DraftModel) adds `v2_items` to every variant: its convolution weights
(kernel_projection, base_kernel) and the selector's hidden_projection, read once per call; the
codebook rows the candidate walk gathers (P[prev] and S[c_k] of the top-k candidates per drafted
position, never the whole [V, R] codebooks); and the candidates the top-k writes and the walk reads.
The top-k's pass over the unary logits is the drafter-logits read the runtime items already count.
Like the V1 counts, intermediate activations (conv inputs and outputs, the FP32 residual) are not.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable

from trtllm_dflash.builder.traffic_steps import (
    CacheTensor,
    GraphSummary,
    Item,
    Step,
    StepTraffic,
    Tensor,
    TrafficError,
    verify_step,
)
from trtllm_dflash.contracts import names
from trtllm_dflash.drafters import kind_of


@dataclasses.dataclass(frozen=True)
class LayerShape:
    """The cache of one attention layer: K/V per token `[kv_heads, key_dim]`, `[kv_heads, value_dim]`."""

    kv_heads: int
    key_dim: int
    value_dim: int
    window: int = 0


@dataclasses.dataclass(frozen=True)
class V2Shape:
    """What a DFlash V2 drafter reads beyond V1's: weights read whole, and the codebooks' row size."""

    conv_weight_bytes: int
    projection_weight_bytes: int
    codebook_row_bytes: int  # one row of one codebook: R x itemsize
    top_k: int

    @classmethod
    def from_drafter(cls, drafter, act_bytes: int = 2) -> "V2Shape":
        return cls(
            drafter.conv_params() * act_bytes,
            drafter.selector_projection_params() * act_bytes,
            drafter.selector_rank * act_bytes,
            drafter.selector_top_k,
        )


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
    v2: V2Shape | None = None  # a DFlash V2 drafter's extra reads (v2_items)

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
            LayerShape(drafter.num_kv_heads, drafter.head_dim, drafter.head_dim, drafter.attention(i).window)
            for i in range(drafter.num_layers)
        ]
        lm_head = spec.vocab_size * d  # tied or not, the LM head GEMM reads the whole table
        v2 = V2Shape.from_drafter(drafter, act_bytes) if kind_of(drafter).candidate_selector else None
        v1_drafter = drafter.dense_params() - drafter.conv_params() - drafter.selector_projection_params()
        return cls(
            tuple(target_layers),
            math.ceil(linear * weight_bytes) + (p.other + lm_head) * act_bytes,
            d * act_bytes,
            tuple(drafter_layers),
            v1_drafter * act_bytes + lm_head * act_bytes,
            d * act_bytes,
            spec.vocab_size,
            len(drafter.target_layer_ids) * drafter.hidden_size,
            act_bytes,
            v2,
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
        prefix = names.CACHE if plugin else names.PAST
        caches.append(CacheTensor(names.key_name(prefix, i), layer.kv_heads * layer.key_dim * a, access, layer.window if plugin else 0))
        caches.append(CacheTensor(names.value_name(prefix, i), layer.kv_heads * layer.value_dim * a, access, layer.window if plugin else 0))
    ids = (
        Tensor(names.INPUT_IDS, ("batch", "tokens"), 8),
        Tensor(names.STARTS, ("batch",), 8),
        Tensor(names.LOGIT_INDEX, ("batch", "picked"), 8),
    )
    features = Tensor(names.FEATURES, ("batch", "tokens", shape.features), a)
    if plugin:
        inputs = ids + (
            Tensor(names.DRAFT_PROBS, ("batch", "drafts", v), 4),  # read through a Slice in the exported graph: every row
            Tensor(names.TEMPERATURE, ("batch",), 4),
            Tensor(names.TOP_K, ("batch",), 8),
            Tensor(names.TOP_P, ("batch",), 4),
            Tensor(names.SEED, ("batch",), 8),
        )
        outputs = (Tensor(names.RESULT, ("batch", 5), 8), features)
        internal = Tensor(names.LOGITS, ("batch", "picked", v), a)
    else:
        inputs = ids
        new = [
            Tensor(names.key_name(names.NEW, i), ("batch", "tokens", layer.kv_heads, layer.key_dim), a)
            for i, layer in enumerate(shape.target_layers)
        ]
        new += [
            Tensor(names.value_name(names.NEW, i), ("batch", "tokens", layer.kv_heads, layer.value_dim), a)
            for i, layer in enumerate(shape.target_layers)
        ]
        outputs = (Tensor(names.LOGITS, ("batch", "picked", v), a), features, *new)
        internal = None
    target = GraphSummary(
        "target",
        variant,
        shape.target_weight_bytes,
        ((names.INPUT_IDS, shape.target_row_bytes),),
        tuple(caches),
        inputs,
        outputs,
        internal,
        "closed form",
    )

    draft_caches = []
    for i, layer in enumerate(shape.drafter_layers):
        access = "block_attention" if plugin else "bound"
        draft_caches.append(
            CacheTensor(names.key_name(names.PAST, i), layer.kv_heads * layer.key_dim * a, access, layer.window if plugin else 0)
        )
        draft_caches.append(
            CacheTensor(names.value_name(names.PAST, i), layer.kv_heads * layer.value_dim * a, access, layer.window if plugin else 0)
        )
    draft_inputs = (
        Tensor(names.BLOCK_IDS, ("batch", "block"), 8),
        Tensor(names.CTX_FEATURES, ("batch", "ctx_rows", shape.features), a),
        Tensor(names.NEW_COUNTS, ("batch",), 8),
        Tensor(names.CACHE_LENS, ("batch",), 8),
    )
    draft_new = [
        Tensor(names.key_name(names.NEW, i), ("batch", "ctx_rows", layer.kv_heads, layer.key_dim), a)
        for i, layer in enumerate(shape.drafter_layers)
    ]
    draft_new += [
        Tensor(names.value_name(names.NEW, i), ("batch", "ctx_rows", layer.kv_heads, layer.value_dim), a)
        for i, layer in enumerate(shape.drafter_layers)
    ]
    drafter = GraphSummary(
        "drafter",
        variant,
        shape.drafter_weight_bytes,
        ((names.BLOCK_IDS, shape.drafter_row_bytes),),
        tuple(draft_caches),
        draft_inputs,
        (Tensor(names.LOGITS, ("batch", "block - 1", v), a), *draft_new),
        None,
        "closed form",
    )
    return target, drafter


def v2_items(v2: V2Shape, step: Step) -> list[Item]:
    """A V2 drafter's reads beyond V1's in one step (the module docstring says what is counted)."""
    drafted = step.batch * (step.block - 1)  # positions the candidate walk scores
    candidates = drafted * v2.top_k * (8 + 4)  # int64 ids + fp32 unary scores
    return [
        Item(
            "drafter", "weights", "V2 grouped dynamic convolutions (kernel_projection, base_kernel; 2 per layer)", v2.conv_weight_bytes, 0
        ),
        Item("drafter", "weights", "V2 selector hidden_projection", v2.projection_weight_bytes, 0),
        Item(
            "drafter",
            "weights",
            f"V2 codebook rows: P[prev] + S[c_k] of {v2.top_k} candidates per drafted position",
            drafted * (1 + v2.top_k) * v2.codebook_row_bytes,
            0,
        ),
        Item(
            "drafter", "activations", f"V2 top-{v2.top_k} candidates (ids, unary scores): written, read by the walk", candidates, candidates
        ),
    ]


def explain_model(shape: ModelShape, step: Step, variants: Iterable[str] = ("native", "plugin")) -> dict[str, StepTraffic]:
    """Bytes per verify step of a model from its shape alone (no export), per variant."""
    report = {}
    for variant in variants:
        traffic = verify_step(*closed_form(shape, variant), step, variant)
        if shape.v2 is not None:
            traffic.items.extend(v2_items(shape.v2, step))
        report[variant] = traffic
    return report

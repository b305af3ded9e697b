"""Graph summaries from a model's shape alone (config or catalog), without exporting its weights.

`closed_form` gives the summaries the export of a variant would have, so `explain_model` gives the
same bytes per step as a build's graphs. The counting rules: builder/traffic.py.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable

from trtllm_dflash.builder.traffic_steps import CacheTensor, GraphSummary, Step, StepTraffic, Tensor, TrafficError, verify_step
from trtllm_dflash.graphs import names


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
        prefix = names.CACHE if plugin else names.PAST
        caches.append(CacheTensor(names.key_name(prefix, i), layer.kv_heads * layer.key_dim * a, access, layer.window if plugin else 0))
        caches.append(CacheTensor(names.value_name(prefix, i), layer.kv_heads * layer.value_dim * a, access, layer.window if plugin else 0))
    ids = (Tensor(names.INPUT_IDS, ("batch", "tokens"), 8), Tensor(names.STARTS, ("batch",), 8),
           Tensor(names.LOGIT_INDEX, ("batch", "picked"), 8))
    features = Tensor(names.FEATURES, ("batch", "tokens", shape.features), a)
    if plugin:
        inputs = ids + (
            Tensor(names.DRAFT_PROBS, ("batch", "drafts", v), 4),  # read through a Slice in the exported graph: every row
            Tensor(names.TEMPERATURE, ("batch",), 4), Tensor(names.TOP_K, ("batch",), 8), Tensor(names.TOP_P, ("batch",), 4),
            Tensor(names.SEED, ("batch",), 8),
        )
        outputs = (Tensor(names.RESULT, ("batch", 5), 8), features)
        internal = Tensor(names.LOGITS, ("batch", "picked", v), a)
    else:
        inputs = ids
        new = [Tensor(names.key_name(names.NEW, i), ("batch", "tokens", layer.kv_heads, layer.key_dim), a)
               for i, layer in enumerate(shape.target_layers)]
        new += [Tensor(names.value_name(names.NEW, i), ("batch", "tokens", layer.kv_heads, layer.value_dim), a)
                for i, layer in enumerate(shape.target_layers)]
        outputs = (Tensor(names.LOGITS, ("batch", "picked", v), a), features, *new)
        internal = None
    target = GraphSummary("target", variant, shape.target_weight_bytes, ((names.INPUT_IDS, shape.target_row_bytes),),
                          tuple(caches), inputs, outputs, internal, "closed form")

    draft_caches = []
    for i, layer in enumerate(shape.drafter_layers):
        access = "block_attention" if plugin else "bound"
        draft_caches.append(CacheTensor(names.key_name(names.PAST, i), layer.kv_heads * layer.key_dim * a, access, layer.window if plugin else 0))
        draft_caches.append(CacheTensor(names.value_name(names.PAST, i), layer.kv_heads * layer.value_dim * a, access, layer.window if plugin else 0))
    draft_inputs = (Tensor(names.BLOCK_IDS, ("batch", "block"), 8), Tensor(names.CTX_FEATURES, ("batch", "ctx_rows", shape.features), a),
                    Tensor(names.NEW_COUNTS, ("batch",), 8), Tensor(names.CACHE_LENS, ("batch",), 8))
    draft_new = [Tensor(names.key_name(names.NEW, i), ("batch", "ctx_rows", layer.kv_heads, layer.key_dim), a)
                 for i, layer in enumerate(shape.drafter_layers)]
    draft_new += [Tensor(names.value_name(names.NEW, i), ("batch", "ctx_rows", layer.kv_heads, layer.value_dim), a)
                  for i, layer in enumerate(shape.drafter_layers)]
    drafter = GraphSummary("drafter", variant, shape.drafter_weight_bytes, ((names.BLOCK_IDS, shape.drafter_row_bytes),),
                           tuple(draft_caches), draft_inputs, (Tensor(names.LOGITS, ("batch", "block - 1", v), a), *draft_new), None, "closed form")
    return target, drafter


def explain_model(shape: ModelShape, step: Step, variants: Iterable[str] = ("native", "plugin")) -> dict[str, StepTraffic]:
    """Bytes per verify step of a model from its shape alone (no export), per variant."""
    return {variant: verify_step(*closed_form(shape, variant), step, variant) for variant in variants}

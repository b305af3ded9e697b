"""ONNX graphs of the target and the drafter, with explicit KV-cache inputs and outputs.

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

from trtllm_dflash import hf_compat
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.hf_compat import Cache, CacheLayerMixin
from trtllm_dflash.modeling.drafter import DFlashDrafter

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ONNX_FLOATS = {1: torch.float32, 16: torch.bfloat16, 10: torch.float16}  # onnx.TensorProto FLOAT, BFLOAT16, FLOAT16
OPSET = 20


@dataclasses.dataclass(frozen=True)
class Bounds:
    """Largest shapes the graphs (and engines) accept; from the recipe."""

    max_batch: int
    max_input_len: int  # tokens per target call (prefill) and context rows per drafter call
    max_seq_len: int  # cache slots
    block_size: int


# ----------------------------------------------------------------------------- masks


def visibility(
    key_positions: torch.Tensor, key_valid: torch.Tensor, query_positions: torch.Tensor, window: int, causal: bool
) -> torch.Tensor:
    """`[b, 1, Q, K]` mask: a valid key is visible (causally, and within `window` if > 0)."""
    keys = key_positions.unsqueeze(1)  # [b, 1, K]
    queries = query_positions.unsqueeze(2)  # [b, Q, 1]
    visible = key_valid.unsqueeze(1).expand(-1, queries.shape[1], -1)
    if causal or window > 0:
        visible = visible & (keys <= queries)
    if window > 0:
        visible = visible & (keys > queries - window)
    return visible.unsqueeze(1)


# ----------------------------------------------------------------------------- target


class _ConcatLayer(CacheLayerMixin):
    """A transformers cache layer that returns [past inputs; new K/V] and remembers the new K/V.

    A layer without past inputs (the shape probe, see TargetGraph.probe_cache_layers) returns the
    new K/V alone. A layer whose attention never calls `update` (Gemma 4's KV-sharing layers read
    the producer layer's [past; new] K/V) keeps no cache: the graph has no inputs or outputs for it.
    """

    is_compileable = False
    is_sliding = False

    def __init__(self, owner: "ConcatCache", index: int) -> None:
        super().__init__()
        self.owner = owner
        self.index = index
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        # Hugging Face attention hands over [b, kv_heads, T, D]; our caches are token-major
        self.owner.new[self.index] = (key_states.transpose(1, 2), value_states.transpose(1, 2))
        past = self.owner.past.get(self.index)
        if past is None:
            return key_states, value_states
        past_k, past_v = past
        keys = torch.cat([past_k.transpose(1, 2).to(key_states.dtype), key_states], dim=2)
        values = torch.cat([past_v.transpose(1, 2).to(value_states.dtype), value_states], dim=2)
        return keys, values

    def get_seq_length(self) -> int:
        return self.owner.total

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.total, 0

    def get_max_length(self) -> int:
        return self.owner.total


class ConcatCache(Cache):
    """Cache object for one traced forward pass: past K/V are graph inputs, new K/V graph outputs.

    `past` maps a decoder layer index to its past (keys, values) `[b, S, kv_heads, D]`; layers
    that own no cache are absent from it.
    """

    def __init__(self, past: dict[int, tuple[torch.Tensor, torch.Tensor]], total: int, num_layers: int) -> None:
        self.past = past
        self.total = total
        self.new: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers
        super().__init__(layers=[_ConcatLayer(self, i) for i in range(num_layers)])


@dataclasses.dataclass(frozen=True)
class LayerCache:
    """The per-token K/V shape one decoder layer writes: `[kv_heads, key_dim]` and `[kv_heads, value_dim]`."""

    kv_heads: int
    key_dim: int
    value_dim: int

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class UnsupportedTargetError(DFlashError):
    """A target whose layers our engines cannot run (recurrent state, latent attention)."""


def check_exportable(config) -> None:
    """Refuse targets whose layers our graphs cannot express: they keep K/V caches only.

    Gated DeltaNet hybrids (Qwen3.5 / Qwen3.6 / Qwen3-Next) carry a recurrent state per row that
    must be rolled back per accepted draft; DeepSeek-style MLA would need its compressed latent
    cache. TensorRT-LLM (and the torch runtime) run both.
    """
    config = config.get_text_config()
    model_type = getattr(config, "model_type", "this target")
    if "linear_attention" in (getattr(config, "layer_types", None) or []):
        raise UnsupportedTargetError(
            f"{model_type} has Gated DeltaNet linear-attention layers; our engines keep no recurrent state",
            "use runtime: trtllm or torch",
        )
    if getattr(config, "kv_lora_rank", None):
        raise UnsupportedTargetError(
            f"{model_type} has multi-head latent attention (MLA) layers; our engines keep no latent KV cache",
            "use runtime: trtllm or torch",
        )


class TargetGraph(nn.Module):
    """A Hugging Face causal LM as one prefill/verify step with explicit caches and hidden taps.

    `past_keys` / `past_values` hold one tensor per layer in `cache_layers` (the layers whose
    attention writes K/V, in order), found by running the model once (`probe_cache_layers`), so
    per-layer shapes and KV-sharing layers come from the model's own code, not from its config.
    Eager-attention models (gpt-oss: attention sinks) add the mask to the scores, so they get
    additive float masks (0 / dtype min) as in the torch runtime.
    """

    def __init__(self, model: nn.Module, layer_ids: list[int]) -> None:
        super().__init__()
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        config = model.config.get_text_config()
        self.num_layers = int(config.num_hidden_layers)
        self.layer_types = list(getattr(config, "layer_types", None) or ["full_attention"] * self.num_layers)
        self.sliding_window = int(getattr(config, "sliding_window", None) or 0)
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self.additive_masks = hf_compat.attention_implementation(config) == "eager"
        self.dtype = model.get_input_embeddings().weight.dtype  # the compute dtype (FP8 layers keep E4M3 weights)
        self.layer_ids = list(layer_ids)
        self.cache_shapes = self.probe_cache_layers()
        self.cache_layers = [i for i, shape in enumerate(self.cache_shapes) if shape is not None]

    def _masks(self, key_positions: torch.Tensor, key_valid: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype):
        """One mask per attention kind (a single 4D mask where there is one kind), as the torch runtime builds them."""
        masks = {}
        for kind in set(self.layer_types):
            visible = visibility(key_positions, key_valid, positions, self.sliding_window if kind == "sliding_attention" else 0, True)
            if self.additive_masks:  # eager attention adds the mask to the scores
                visible = torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill(~visible, torch.finfo(dtype).min)
            masks[kind] = visible
        return masks if len(masks) > 1 else next(iter(masks.values()))

    def _decode(self, input_ids, positions, masks, cache: ConcatCache | None) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        taps: dict[int, torch.Tensor] = {}
        hooks = [
            self.decoder.layers[i].register_forward_hook(
                lambda module, args, output, i=i: taps.__setitem__(i, output[0] if isinstance(output, tuple) else output)
            )
            for i in self.layer_ids
        ]
        try:
            hidden = hf_compat.forward_with_cache(
                self.decoder, cache, input_ids=input_ids, position_ids=positions, attention_mask=masks, use_cache=cache is not None
            ).last_hidden_state
        finally:
            for hook in hooks:
                hook.remove()
        return hidden, taps

    @torch.no_grad()
    def probe_cache_layers(self) -> list[LayerCache | None]:
        """Run two tokens through the model and record the K/V shape each layer writes (None: no cache)."""
        device = self.lm_head.weight.device  # the torch runtime probes a model on its GPU
        input_ids = torch.zeros(2, 2, dtype=torch.long, device=device)
        positions = torch.arange(2, device=device).expand(2, -1)
        masks = self._masks(positions, torch.ones(2, 2, dtype=torch.bool, device=device), positions, self.dtype)
        cache = ConcatCache({}, 2, self.num_layers)
        self._decode(input_ids, positions, masks, cache)
        shapes: list[LayerCache | None] = []
        for written in cache.new:  # token-major [b, T, kv_heads, D]
            shapes.append(None if written is None else LayerCache(int(written[0].shape[2]), int(written[0].shape[3]), int(written[1].shape[3])))
        return shapes

    def forward(self, input_ids, starts, logit_index, past_keys: tuple, past_values: tuple):
        batch, tokens = input_ids.shape
        past_len = past_keys[0].shape[1]
        steps = torch.arange(tokens, device=input_ids.device)
        positions = starts.view(-1, 1) + steps
        slots = torch.arange(past_len, device=input_ids.device).view(1, -1)
        key_positions = torch.cat([slots.expand(batch, -1), positions], dim=1)
        key_valid = torch.cat([slots < starts.view(-1, 1), torch.ones_like(positions, dtype=torch.bool)], dim=1)
        masks = self._masks(key_positions, key_valid, positions, self.dtype)
        past = {layer: (k, v) for layer, k, v in zip(self.cache_layers, past_keys, past_values)}
        cache = ConcatCache(past, past_len + tokens, self.num_layers)
        hidden, taps = self._decode(input_ids, positions, masks, cache)
        features = torch.cat([taps[i] for i in self.layer_ids], dim=-1)
        picked = hidden.gather(1, logit_index.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        logits = self.lm_head(picked)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        new_keys = tuple(cache.new[i][0] for i in self.cache_layers)
        new_values = tuple(cache.new[i][1] for i in self.cache_layers)
        return logits, features, new_keys, new_values


def _pick(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`values [b, T, ...]` at `index [b, n]` per row, as one flat Gather (onnx.reference's
    GatherElements cannot index more than 32 positions)."""
    batch, tokens = values.shape[:2]
    flat = (torch.arange(batch, device=index.device).view(-1, 1) * tokens + index).reshape(-1)
    picked = values.reshape(batch * tokens, *values.shape[2:]).index_select(0, flat)
    return picked.reshape(batch, index.shape[1], *values.shape[2:])


class VerifyingTargetGraph(TargetGraph):
    """The plugin variant of the target: in-place cache attention, verification inside the graph.

    Every attention layer runs `dflash::target_attention_functional` (the `DFlashTargetAttention`
    node): the block's K/V are written into `cache_key_i` / `cache_value_i` `[b, capacity, ...]` at
    each row's positions and attention reads only the row's own slots, so nothing is concatenated
    or copied and the cost follows each row's length, not the capacity. The caches come back as
    `present_key_i` / `present_value_i`, which the node aliases to its inputs (one buffer per layer
    in an engine). The logits at `logit_index` go straight into `dflash::verify_block` (the
    `DFlashVerifyPositions` + `DFlashVerifyCommit` nodes): the graph returns per row the packed
    verification result `[b, 5]` (accepted drafts, bonus token, next start, committed, stopped)
    and the tapped features of every position, never the logits.

    The verified block is `input_ids` at `logit_index`; its first token sits at position
    `starts + logit_index[:, 0]`. At prefill `logit_index` is each row's last prompt token (a block
    of one: no drafts, the first token is sampled); at verify it is every block position.
    `draft_probs [b, >= n-1, V]` (float32) is the drafter's processed distribution for sampled rows
    (zeros read as q = 0, what greedy and autoregressive rows pass).
    """

    def __init__(self, model: nn.Module, layer_ids: list[int]) -> None:
        super().__init__(model, layer_ids)
        from trtllm_dflash.modeling import target_attention

        self.model = model
        self.windows = target_attention.layer_windows(model.config)

    def forward(self, input_ids, starts, logit_index, draft_probs, temperature, top_k, top_p, seed, cache_keys: tuple, cache_values: tuple):
        from trtllm_dflash.modeling import target_attention

        positions = starts.view(-1, 1) + torch.arange(input_ids.shape[1], device=input_ids.device)
        caches = {layer: (k, v) for layer, k, v in zip(self.cache_layers, cache_keys, cache_values)}
        step = target_attention.TargetAttentionStep(caches, starts, self.windows, functional=True)
        masks = target_attention.placeholder_masks(self.model.config, input_ids)
        with target_attention.use_dflash_attention(self.model), step.active():
            hidden, taps = self._decode(input_ids, positions, masks, None)
        features = torch.cat([taps[i] for i in self.layer_ids], dim=-1)
        logits = self.lm_head(_pick(hidden, logit_index))
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        block = _pick(input_ids, logit_index)
        drafts = draft_probs[:, : logit_index.shape[1] - 1]
        result = torch.ops.dflash.verify_block(logits, block, drafts, temperature, top_k, top_p, seed, starts + logit_index[:, 0])
        present_keys = tuple(step.updated[i][0] for i in self.cache_layers)
        present_values = tuple(step.updated[i][1] for i in self.cache_layers)
        return result, features, present_keys, present_values


# ----------------------------------------------------------------------------- drafter


def native_block_attention(q, keys, values, mask, scale: float) -> torch.Tensor:
    """Masked attention of `q [b, B, Hq, D]` over `keys/values [b, K, Hkv, D]` with plain ops."""
    heads, kv_heads = q.shape[2], keys.shape[2]
    if heads != kv_heads:
        keys = keys.repeat_interleave(heads // kv_heads, dim=2)
        values = values.repeat_interleave(heads // kv_heads, dim=2)
    out = nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), attn_mask=mask, scale=scale
    )
    return out.transpose(1, 2)


class DrafterGraph(nn.Module):
    """One DFlash drafting step with the draft cache as inputs/outputs (KV injection, non-causal).

    `plugin=False`: attention over [past cache; new context; block] with plain ops and a mask.
    `plugin=True`: the DFlash block-attention plugin op (`dflash::block_attention_functional`),
    which appends the new context to the cache itself (in place inside an engine); the new
    context K/V are graph outputs in both variants, so a runtime treats them the same.
    """

    def __init__(self, drafter: DFlashDrafter, embedding: nn.Module, lm_head: nn.Module, plugin: bool = False) -> None:
        super().__init__()
        self.drafter = drafter
        self.embedding = embedding
        self.lm_head = lm_head
        self.plugin = plugin

    def forward(self, block_ids, ctx_features, new_counts, cache_lens, past_keys: tuple, past_values: tuple):
        drafter = self.drafter
        batch, block = block_ids.shape
        rows, past_len = ctx_features.shape[1], past_keys[0].shape[1]
        device = block_ids.device
        ctx_steps = torch.arange(rows, device=device).view(1, -1)
        ctx_positions = cache_lens.view(-1, 1) + ctx_steps
        context_len = cache_lens + new_counts
        block_positions = context_len.view(-1, 1) + torch.arange(block, device=device)
        slots = torch.arange(past_len, device=device).view(1, -1)
        key_positions = torch.cat([slots.expand(batch, -1), ctx_positions, block_positions], dim=1)
        key_valid = torch.cat(
            [slots < cache_lens.view(-1, 1), ctx_steps < new_counts.view(-1, 1), torch.ones_like(block_positions, dtype=torch.bool)],
            dim=1,
        )
        windows = sorted({layer.self_attn.window for layer in drafter.layers})
        masks = {} if self.plugin else {w: visibility(key_positions, key_valid, block_positions, w, False) for w in windows}

        embeds = drafter.embed(block_ids, self.embedding)
        ctx_hidden = drafter.context_hidden(ctx_features)
        ctx_rope = drafter.rope(ctx_hidden, ctx_positions)
        block_rope = drafter.rope(embeds, block_positions)
        x = embeds
        new_keys, new_values = [], []
        for layer, past_k, past_v in zip(drafter.layers, past_keys, past_values):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.project_queries(h, block_rope)
            k_block, v_block = attn.project_keys_values(h, block_rope)
            k_ctx, v_ctx = attn.project_keys_values(ctx_hidden, ctx_rope)
            if self.plugin:
                out, _, _ = torch.ops.dflash.block_attention_functional(
                    q, k_block, v_block, k_ctx, v_ctx, new_counts, past_k, past_v, cache_lens, float(attn.scale), int(attn.window)
                )
            else:
                keys = torch.cat([past_k.to(k_block.dtype), k_ctx, k_block], dim=1)
                values = torch.cat([past_v.to(v_block.dtype), v_ctx, v_block], dim=1)
                out = native_block_attention(q, keys, values, masks[attn.window], attn.scale)
            x = layer._finish(x, attn.o_proj(out.flatten(-2)))
            new_keys.append(k_ctx)
            new_values.append(v_ctx)
        hidden = drafter.norm(x)
        logits = drafter.logits(hidden[:, 1:], self.lm_head)
        return logits, tuple(new_keys), tuple(new_values)


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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def cast_parameters(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast weights in place but not buffers: RoPE frequencies stay as the torch runtime keeps them."""
    for parameter in module.parameters():
        parameter.data = parameter.data.to(dtype)
    return module


def _cache_names(layers: list[int], prefix: str) -> tuple[list[str], list[str]]:
    return [f"{prefix}_key_{i}" for i in layers], [f"{prefix}_value_{i}" for i in layers]


def _uniform(shapes: list[LayerCache | None]) -> tuple[int, int]:
    """(kv_heads, head_dim) when every cached layer has the same K and V shape, else (0, 0)."""
    present = {(s.kv_heads, s.key_dim, s.value_dim) for s in shapes if s is not None}
    if len(present) == 1:
        heads, key_dim, value_dim = present.pop()
        if key_dim == value_dim:
            return heads, key_dim
    return 0, 0


DENSE_EXPERTS = "dflash_dense"


def dense_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """MoE experts as plain batched matmuls over ALL experts, weighted by a dense routing matrix.

    For export only (a transformers experts implementation, see `exportable_experts`): every token
    goes through every expert and unselected experts get weight 0, so the result is the routed
    sum; the graph is MatMul/Equal/ReduceSum with the weights kept as `[experts, ...]` tensors,
    no data-dependent shapes and no per-token weight copies.
    """
    experts = torch.arange(self.num_experts, device=hidden_states.device)
    routing = ((top_k_index.unsqueeze(-1) == experts).to(hidden_states.dtype) * top_k_weights.unsqueeze(-1).to(hidden_states.dtype)).sum(1)

    def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        # x [E or 1, T, in]; weight [E, in, out] (transposed layout) or [E, out, in]
        out = torch.matmul(x, weight if self.is_transposed else weight.transpose(1, 2))
        return out + bias.unsqueeze(1) if bias is not None else out

    x = hidden_states.unsqueeze(0)  # [1, T, H], broadcast over the experts
    if self.has_gate:
        projected = self._apply_gate(linear(x, self.gate_up_proj, self.gate_up_proj_bias if self.has_bias else None))
    else:
        projected = self.act_fn(linear(x, self.up_proj, self.up_proj_bias if self.has_bias else None))
    out = linear(projected, self.down_proj, self.down_proj_bias if self.has_bias else None)  # [E, T, H]
    if self.has_post_expert_norm:
        out = self.post_expert_norm(out)
    return (out * routing.transpose(0, 1).unsqueeze(-1)).sum(0).to(hidden_states.dtype)


def exportable_experts(model: nn.Module) -> str | None:
    """Switch MoE experts to `dense_experts_forward`; returns the implementation to restore (None: no experts).

    transformers' default `grouped_mm` experts are a custom op without an ONNX translation, its
    eager path loops over the experts a batch hits (data-dependent control flow), and its
    `batched_mm` path copies each token's top-k expert weights (gigabytes per step at gpt-oss
    sizes). Dense experts compute num_experts / top_k times the routed FLOPs but read each expert
    weight once per call, which is what a decode step of a batch of blocks needs anyway.
    """
    if not hf_compat.can_set_experts(model):
        return None
    hf_compat.register_experts(DENSE_EXPERTS, dense_experts_forward)
    previous = hf_compat.experts_implementation(model)
    model.set_experts_implementation(DENSE_EXPERTS)
    return previous


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


def _export(module: nn.Module, args: tuple, dynamic_shapes: tuple, input_names: list[str], output_names: list[str], path: Path, translations: dict | None):
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
                op.Reshape(op.Tile(op.Unsqueeze(t, op.Constant(value_ints=[2])), group), op.Concat(
                    op.Shape(t, start=0, end=1), op.Constant(value_ints=[heads]), op.Shape(t, start=2), axis=0))
                for t in (key, value)
            )
        scores = op.MatMul(scaled, op.Transpose(key, perm=[0, 1, 3, 2]))
        if attn_mask is not None:
            if attn_mask.dtype == onnx.TensorProto.BOOL:  # hidden keys get the dtype's lowest value, as torch's
                lowest = float(torch.finfo(ONNX_FLOATS[int(query.dtype)]).min)
                attn_mask = op.Where(attn_mask, op.CastLike(op.Constant(value_float=0.0), scores), op.CastLike(op.Constant(value_float=lowest), scores))
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


def _describe(names: list[str], dims: list[list[str | int]], dtypes: list[str]) -> list[dict[str, Any]]:
    return [{"name": n, "dims": d, "dtype": t} for n, d, t in zip(names, dims, dtypes)]


@contextlib.contextmanager
def _dense_experts(model: nn.Module):
    """MoE experts as `dense_experts_forward` for the duration of an export, restored afterwards."""
    previous = exportable_experts(model)
    try:
        yield
    finally:
        if previous is not None:
            model.set_experts_implementation(previous)


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


def export_target(
    model: nn.Module, layer_ids: list[int], path: Path, dtype: str, bounds: Bounds, variant: str = "native"
) -> GraphInfo:
    """Export the target as one prefill/verify graph (see the module docstring for its I/O)."""
    from torch.export import Dim

    check_exportable(model.config)
    config = model.config.get_text_config()
    num_layers = int(config.num_hidden_layers)
    torch_dtype = DTYPES[dtype]
    with _dense_experts(model):
        graph = TargetGraph(cast_parameters(model, torch_dtype).eval(), layer_ids).eval()
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
        past_k, past_v = _cache_names(cached, "past")
        new_k, new_v = _cache_names(cached, "new")
        input_names = ["input_ids", "starts", "logit_index", *past_k, *past_v]
        output_names = ["logits", "features", *new_k, *new_v]
        from trtllm_dflash.builder import fp8

        translations = fp8.translation_table() if fp8.has_fp8(graph) else None  # FP8 layers -> Q/DQ
        with torch.no_grad():
            _export(graph, args, dynamic, input_names, output_names, path, translations)
    kv_heads, head_dim = _uniform(shapes)
    return GraphInfo(
        file=path.name,
        inputs=_describe(
            input_names,
            [["batch", "tokens"], ["batch"], ["batch", "picked"]] + _cache_dims(shapes, cached, "past"),
            ["int64", "int64", "int64"] + [dtype] * (2 * len(cached)),
        ),
        outputs=output_names,
        num_layers=num_layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        variant=variant,
        cache_layers=[shape.to_dict() if shape is not None else None for shape in shapes],
    )


def verifying_target_refusal(model: nn.Module) -> str | None:
    """Why this target gets no verifying (plugin) target graph (None: it does)."""
    from trtllm_dflash.modeling import target_attention

    return target_attention.unsupported_reason(model.config)


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
    with _dense_experts(model):
        graph = VerifyingTargetGraph(cast_parameters(model, torch_dtype).eval(), layer_ids).eval()
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
        cache_k, cache_v = _cache_names(cached, "cache")
        present_k, present_v = _cache_names(cached, "present")
        input_names = ["input_ids", "starts", "logit_index", "draft_probs", "temperature", "top_k", "top_p", "seed", *cache_k, *cache_v]
        output_names = ["result", "features", *present_k, *present_v]
        translations = dict(onnx_nodes.custom_translation_table(kv_splits=1))
        if fp8.has_fp8(graph):
            translations.update(fp8.translation_table())
        with torch.no_grad():
            _export(graph, args, dynamic, input_names, output_names, path, translations)
    kv_heads, head_dim = _uniform(shapes)
    return GraphInfo(
        file=path.name,
        inputs=_describe(
            input_names,
            [["batch", "tokens"], ["batch"], ["batch", "picked"], ["batch", "drafts", vocab], ["batch"], ["batch"], ["batch"], ["batch"]]
            + _cache_dims(shapes, cached, "capacity"),
            ["int64", "int64", "int64", "fp32", "fp32", "int64", "fp32", "int64"] + [dtype] * (2 * len(cached)),
        ),
        outputs=output_names,
        num_layers=int(config.num_hidden_layers),
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        variant=variant,
        dir=variant,
        cache_layers=[shape.to_dict() if shape is not None else None for shape in shapes],
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
    if config.sliding_window_size:
        raise UnsupportedTargetError(
            f"the drafter bounds its draft history (sliding_window_size={config.sliding_window_size}), "
            "which the drafter graph does not implement (it would attend to the whole history)",
            "build without the bound (drop sliding_window_size) or serve the pair with runtime: torch",
        )
    torch_dtype = DTYPES[dtype]
    num_layers = config.num_hidden_layers
    graph = DrafterGraph(
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
    past_k, past_v = _cache_names(list(range(num_layers)), "past")
    new_k, new_v = _cache_names(list(range(num_layers)), "new")
    input_names = ["block_ids", "ctx_features", "new_counts", "cache_lens", *past_k, *past_v]
    output_names = ["logits", *new_k, *new_v]
    with torch.no_grad():
        _export(graph, args, dynamic, input_names, output_names, path, translations)
    cache = ["batch", "past", config.num_key_value_heads, config.head_dim]
    return GraphInfo(
        file=path.name,
        inputs=_describe(
            input_names,
            [["batch", "block"], ["batch", "ctx_rows", features], ["batch"], ["batch"]] + [cache] * (2 * num_layers),
            ["int64", dtype, "int64", "int64"] + [dtype] * (2 * num_layers),
        ),
        outputs=output_names,
        num_layers=num_layers,
        kv_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        dtype=dtype,
        variant=variant,
        dir=variant,
        cache_layers=[LayerCache(config.num_key_value_heads, config.head_dim, config.head_dim).to_dict()] * num_layers,
    )


def write_graphs_json(directory: Path, info: dict[str, Any]) -> Path:
    path = directory / "graphs.json"
    path.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return path


def export_pair(
    target_model: nn.Module,
    drafter: DFlashDrafter | None,
    out_dir: Path,
    dtype: str,
    bounds: Bounds,
    variants: tuple[str, ...] = ("native",),
    progress: Callable[[str], None] = lambda text: None,
) -> dict[str, Any]:
    """Export the target (and drafter) graphs of every variant into out_dir; write graphs.json.

    Layout: `<variant>/target.onnx`, `<variant>/drafter.onnx`, `drafter/config.json`, `graphs.json`.
    The models are cast to `dtype` in place.
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
    for variant in variants:
        graphs: dict[str, Any] = {}
        if variant == "native":
            progress("exporting the target graph")
            graphs["target"] = export_target(target_model, layer_ids, out_dir / "native" / "target.onnx", dtype, bounds).to_dict()
            graphs["target"]["dir"] = "native"
        else:  # the plugin target: in-place cache attention and verification inside the graph
            refused = verifying_target_refusal(target_model)
            if refused is None:
                progress(f"exporting the {variant} target graph")
                graphs["target"] = export_verifying_target(
                    target_model, layer_ids, out_dir / variant / "target.onnx", dtype, bounds, variant
                ).to_dict()
            elif "native" in info["variants"]:  # a target the op cannot run keeps the native target graph
                graphs["target"] = {**info["variants"]["native"]["target"], "variant": variant, "plugin_refused": refused}
            else:
                raise UnsupportedTargetError(f"no plugin target graph: {refused}", "build the native variant too")
        if drafter is not None:
            progress(f"exporting the {variant} drafter graph")
            plugin, translations = plugin_graphs.export_options(variant)
            graphs["drafter"] = export_drafter(
                drafter, embedding, lm_head, out_dir / variant / "drafter.onnx", dtype, bounds, variant, plugin, translations
            ).to_dict()
        info["variants"][variant] = graphs
    if drafter is not None:
        (out_dir / "drafter").mkdir(parents=True, exist_ok=True)
        (out_dir / "drafter" / "config.json").write_text(json.dumps(drafter.config.to_dict(), indent=2) + "\n")
    write_graphs_json(out_dir, info)
    return info

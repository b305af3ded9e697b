"""ONNX graphs of the target and the drafter, with explicit KV-cache inputs and outputs.

Target graph (prefill and block verification in one graph):
    inputs   input_ids [b, T] int64       tokens at positions starts[r] + t
             starts [b] int64             first position of each row (its committed length)
             logit_index [b, n] int64     which of the T positions get logits (last prompt
                                          token at prefill, every block position at verify)
             past_key_i / past_value_i    [b, S, kv_heads, head_dim] per layer: cache slots
                                          0..S-1 (slot == position); slots >= starts[r] are
                                          ignored, so the runtime may pass any S >= max(starts)
    outputs  logits [b, n, V], features [b, T, taps * H] (outputs of the tapped decoder layers,
             id i = output of layer i), new_key_i / new_value_i [b, T, kv_heads, head_dim]
             (the K/V of the T tokens; the runtime writes them at slots starts[r] + t)

Drafter graph (one block-diffusion step, the target's embedding and LM head included):
    inputs   block_ids [b, B] int64 (anchor + masks), ctx_features [b, n, taps * H] (new context
             rows, the first new_counts[r] valid), new_counts [b], cache_lens [b], and the draft
             cache past_key_i / past_value_i [b, S, kv_heads, head_dim]
    outputs  logits [b, B - 1, V] (predictions for block positions 1..B-1) and
             new_key_i / new_value_i [b, n, kv_heads, head_dim] (context K/V the runtime appends
             at slots cache_lens[r] + i for i < new_counts[r]; the block's K/V are not kept)

Graphs concatenate [past cache; new keys] and mask by position instead of scattering into the
cache inside the graph, so they use only plain ONNX ops (the `native` variant), and the same
graph serves prefill (starts = 0) and verify (starts = committed length). The exporter is
torch.onnx's dynamo exporter with dynamic batch/length axes bounded by the recipe; examples use
batch >= 2 so no axis is specialised to 1. Node metadata (stack traces, counters) is stripped,
so the same model and bounds give byte-identical files.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from transformers.cache_utils import Cache, CacheLayerMixin

from trtllm_dflash.modeling.drafter import DFlashDrafter

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
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
    """A transformers cache layer that returns [past inputs; new K/V] and remembers the new K/V."""

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
        past_k, past_v = self.owner.past[self.index]
        self.owner.new[self.index] = (key_states.transpose(1, 2), value_states.transpose(1, 2))
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
    """Cache object for one traced forward pass: past K/V are graph inputs, new K/V graph outputs."""

    def __init__(self, past: list[tuple[torch.Tensor, torch.Tensor]], total: int) -> None:
        self.past = past
        self.total = total
        self.new: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(past)
        super().__init__(layers=[_ConcatLayer(self, i) for i in range(len(past))])


class TargetGraph(nn.Module):
    """A Hugging Face causal LM as one prefill/verify step with explicit caches and hidden taps."""

    def __init__(self, model: nn.Module, layer_ids: list[int]) -> None:
        super().__init__()
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        config = model.config.get_text_config()
        self.num_layers = int(config.num_hidden_layers)
        self.layer_types = list(getattr(config, "layer_types", None) or ["full_attention"] * self.num_layers)
        self.sliding_window = int(getattr(config, "sliding_window", None) or 0)
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self.layer_ids = list(layer_ids)

    def forward(self, input_ids, starts, logit_index, past_keys: tuple, past_values: tuple):
        batch, tokens = input_ids.shape
        past_len = past_keys[0].shape[1]
        steps = torch.arange(tokens, device=input_ids.device)
        positions = starts.view(-1, 1) + steps
        slots = torch.arange(past_len, device=input_ids.device).view(1, -1)
        key_positions = torch.cat([slots.expand(batch, -1), positions], dim=1)
        key_valid = torch.cat([slots < starts.view(-1, 1), torch.ones_like(positions, dtype=torch.bool)], dim=1)
        masks = {
            kind: visibility(
                key_positions, key_valid, positions, self.sliding_window if kind == "sliding_attention" else 0, True
            )
            for kind in set(self.layer_types)
        }
        cache = ConcatCache(list(zip(past_keys, past_values)), past_len + tokens)
        taps: dict[int, torch.Tensor] = {}
        hooks = [
            self.decoder.layers[i].register_forward_hook(
                lambda module, args, output, i=i: taps.__setitem__(i, output[0] if isinstance(output, tuple) else output)
            )
            for i in self.layer_ids
        ]
        try:
            hidden = self.decoder(
                input_ids=input_ids,
                position_ids=positions,
                attention_mask=masks if len(masks) > 1 else next(iter(masks.values())),
                past_key_values=cache,
                use_cache=True,
            ).last_hidden_state
        finally:
            for hook in hooks:
                hook.remove()
        features = torch.cat([taps[i] for i in self.layer_ids], dim=-1)
        picked = hidden.gather(1, logit_index.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        logits = self.lm_head(picked)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        new_keys = tuple(k for k, _ in cache.new)
        new_values = tuple(v for _, v in cache.new)
        return logits, features, new_keys, new_values


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
    kv_heads: int
    head_dim: int
    dtype: str
    variant: str = "native"
    dir: str = ""  # folder of the file under the export directory (default: the variant's)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def cast_parameters(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast weights in place but not buffers: RoPE frequencies stay as the torch runtime keeps them."""
    for parameter in module.parameters():
        parameter.data = parameter.data.to(dtype)
    return module


def _cache_names(num_layers: int, prefix: str) -> tuple[list[str], list[str]]:
    return [f"{prefix}_key_{i}" for i in range(num_layers)], [f"{prefix}_value_{i}" for i in range(num_layers)]


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
        custom_translation_table=translations,
        optimize=True,
        verbose=False,
    )


def _needs_external_data(module: nn.Module) -> bool:
    """Protobuf files stop at 2 GB; bigger models keep their weights in a side file."""
    size = sum(p.numel() * p.element_size() for p in module.parameters())
    return size > 1_500_000_000


def _describe(names: list[str], dims: list[list[str | int]], dtypes: list[str]) -> list[dict[str, Any]]:
    return [{"name": n, "dims": d, "dtype": t} for n, d, t in zip(names, dims, dtypes)]


def export_target(
    model: nn.Module, layer_ids: list[int], path: Path, dtype: str, bounds: Bounds, variant: str = "native"
) -> GraphInfo:
    """Export the target as one prefill/verify graph (see the module docstring for its I/O)."""
    from torch.export import Dim

    config = model.config.get_text_config()
    num_layers = int(config.num_hidden_layers)
    kv_heads = int(config.num_key_value_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    torch_dtype = DTYPES[dtype]
    graph = TargetGraph(cast_parameters(model, torch_dtype).eval(), layer_ids).eval()

    batch = Dim("batch", min=1, max=bounds.max_batch)
    tokens = Dim("tokens", min=1, max=bounds.max_input_len)
    picks = Dim("picked", min=1, max=bounds.max_input_len)
    past = Dim("past", min=1, max=bounds.max_seq_len)
    b, t, n, s = 2, min(3, bounds.max_input_len), 2, min(5, bounds.max_seq_len)  # distinct sizes, none of them 1
    args = (
        torch.randint(0, int(config.vocab_size), (b, t)),
        torch.tensor([s, 1]),
        torch.tensor([[t - 1, 0], [1, t - 1]])[:, :n],
        tuple(torch.zeros(b, s, kv_heads, head_dim, dtype=torch_dtype) for _ in range(num_layers)),
        tuple(torch.zeros(b, s, kv_heads, head_dim, dtype=torch_dtype) for _ in range(num_layers)),
    )
    cache_dims = tuple({0: batch, 1: past} for _ in range(num_layers))
    dynamic = ({0: batch, 1: tokens}, {0: batch}, {0: batch, 1: picks}, cache_dims, cache_dims)
    past_k, past_v = _cache_names(num_layers, "past")
    new_k, new_v = _cache_names(num_layers, "new")
    input_names = ["input_ids", "starts", "logit_index", *past_k, *past_v]
    output_names = ["logits", "features", *new_k, *new_v]
    from trtllm_dflash.builder import fp8

    translations = fp8.translation_table() if fp8.has_fp8(graph) else None  # FP8 layers -> Q/DQ
    with torch.no_grad():
        _export(graph, args, dynamic, input_names, output_names, path, translations)
    cache = ["batch", "past", kv_heads, head_dim]
    return GraphInfo(
        file=path.name,
        inputs=_describe(
            input_names,
            [["batch", "tokens"], ["batch"], ["batch", "picked"]] + [cache] * (2 * num_layers),
            ["int64", "int64", "int64"] + [dtype] * (2 * num_layers),
        ),
        outputs=output_names,
        num_layers=num_layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        variant=variant,
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
    past_k, past_v = _cache_names(num_layers, "past")
    new_k, new_v = _cache_names(num_layers, "new")
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
        else:  # the target has no plugin node: every variant shares the native target graph
            graphs["target"] = {**info["variants"]["native"]["target"], "variant": variant}
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

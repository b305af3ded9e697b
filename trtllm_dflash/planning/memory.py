"""Bytes per GPU: weights, KV cache per sequence, activations, CUDA graphs, as explicit formulas.

Every figure comes from published shapes (catalog/models.py) and datasheet memory (catalog/gpus.py);
the estimates (activations, CUDA graphs, runtime reserve) use the named constants below.
"""

from __future__ import annotations

import os

from trtllm_dflash.backends import get_backend
from trtllm_dflash.catalog.models import ModelSpec
from trtllm_dflash.contracts import defaults, dtypes
from trtllm_dflash.planning.candidate import Candidate
from trtllm_dflash.planning.records import Layout, MemoryBudget
from trtllm_dflash.recipes.precision import Precision

GIB = 1024**3
MIB = 1024**2

ACTIVATION_BYTES = 2  # activations run in BF16/FP16 on GPUs
LOGIT_BYTES = 4  # verification compares FP32 logits at every block position

# Estimates (not measurements): keep them named so the arithmetic in the docs and tests is explicit.
WORKSPACE_BYTES = 256 * MIB  # cuBLAS / attention kernel workspace
CUDA_GRAPH_BYTES = 16 * MIB  # per captured graph (batch size x draft length)
RUNTIME_RESERVE_BYTES = 1 * GIB  # CUDA context, kernels, allocator slack
NCCL_RESERVE_BYTES = GIB // 2  # communication buffers when the model spans several GPUs
DEFAULT_KV_FRACTION = 0.90  # share of the remaining memory given to KV caches (trt / torch runtimes)
DEFAULT_CONTEXT = defaults.PLANNED_CONTEXT
DEFAULT_MAX_BATCH = defaults.PLANNED_MAX_BATCH
GPU_COUNTS = (1, 2, 4, 8)


def bytes_of(count: int | float, precision: str) -> int:
    """Bytes of `count` elements stored at `precision`, block scales included (contracts/dtypes.py)."""
    return int(round(count * dtypes.bytes_per_element(precision)))


def kv_heads_per_gpu(num_kv_heads: int, tp: int) -> int:
    """KV heads each GPU caches: split over TP, replicated when TP exceeds the KV head count."""
    return max(1, num_kv_heads // tp)


def target_weight_bytes(model: ModelSpec, precision: Precision, layout: Layout) -> int:
    """Per GPU: quantized linear layers + BF16 embedding / LM head (vocab-parallel) + replicated small tensors."""
    p = model.params()
    attention_tp = 1 if layout.attention_dp else layout.tp
    # Experts: moe_tp x ep = tp, so each GPU holds 1/tp of the expert weights either way.
    return (
        bytes_of(p.attention_linear, precision.weights) // attention_tp
        + bytes_of(p.mlp_linear, precision.weights) // layout.tp
        + bytes_of(p.expert_linear, precision.moe_experts) // layout.tp
        + bytes_of(p.embedding + p.lm_head, "bf16") // layout.tp
        + bytes_of(p.other, "bf16")
    )


def kv_bytes_per_sequence(model: ModelSpec, context: int, kv_precision: str, tp: int) -> int:
    """Per GPU, one sequence of `context` tokens: sliding-window layers hold at most their window.

    MLA layers cache one latent of kv_lora_rank + qk_rope_head_dim per token (not split over tp);
    Gated DeltaNet layers cache nothing per token (their fixed state: linear_state_bytes_per_sequence).
    """
    if model.is_mla:
        return bytes_of(model.num_layers * model.mla_kv_per_token() * context, kv_precision)
    total = 0
    for layer in range(model.num_layers):
        shape = model.attention(layer)
        tokens = min(context, shape.window) if shape.window else context
        # K and V for every layer, also Gemma 4's K = V layers (conservative: a runtime may share them).
        total += 2 * kv_heads_per_gpu(shape.num_kv_heads, tp) * shape.head_dim * tokens
    return bytes_of(total, kv_precision)


LINEAR_STATE_PRECISION = "fp32"  # Gated DeltaNet recurrent state (TensorRT-LLM, SGLang and vLLM keep it in FP32)
LINEAR_CONV_PRECISION = "bf16"


PREFIX_KEPT_STATES = 2  # with a prefix cache, a hybrid row keeps two more states per prefill (modeling/linear_attention.py)


def linear_state_bytes_per_sequence(model: ModelSpec, tp: int, block_size: int, prefix_cache: bool = False) -> int:
    """Per GPU, one sequence: the Gated DeltaNet state of every linear layer, which does not grow with context.

    Per layer: recurrent num_v_heads x k_dim x v_dim (FP32) + conv (kernel-1) x conv_dim (BF16), heads split
    over tp; times (1 + block_size): speculative rollback keeps one state copy per block position (as
    SGLang's extra_buffer does) so that the state after any accepted prefix can be restored; plus
    PREFIX_KEPT_STATES copies with a prefix cache (the states its blocks store are within its bound).
    """
    layers = model.linear_layers
    if not layers:
        return 0
    recurrent, conv = model.linear_state_elements()
    split = max(1, min(tp, model.linear_num_value_heads or 1))
    one = bytes_of(recurrent, LINEAR_STATE_PRECISION) // split + bytes_of(conv, LINEAR_CONV_PRECISION) // split
    return layers * one * (1 + block_size + (PREFIX_KEPT_STATES if prefix_cache else 0))


def prefix_cache_tokens(model: ModelSpec, cache_bytes: int, kv_precision: str, tp: int) -> int:
    """Prompt tokens a prefix cache of `cache_bytes` holds: per token, every attention layer's K/V (sliding
    layers too: a block keeps all its positions) and the drafter's context K/V. A hybrid target's
    stored states (one per stored prompt end) come out of the same bound."""
    per_token = kv_bytes_per_sequence(model, 1, kv_precision, tp)  # one token: sliding layers count whole
    per_token += drafter_kv_bytes_per_sequence(model, 1, kv_precision)
    return cache_bytes // per_token if per_token and cache_bytes else 0


def drafter_kv_bytes_per_sequence(model: ModelSpec, context: int, kv_precision: str) -> int:
    """The drafter caches the projected context K/V of every position (its sliding layers: a window)."""
    drafter = model.drafter
    if drafter is None:
        return 0
    total = 0
    for layer in range(drafter.num_layers):
        shape = drafter.attention(layer)
        tokens = min(context, shape.window) if shape.window else context
        total += 2 * shape.num_kv_heads * shape.head_dim * tokens
    return bytes_of(total, kv_precision)


def activation_bytes(model: ModelSpec, layout: Layout, max_batch: int, max_num_tokens: int, block_size: int) -> int:
    """Largest live tensors of one forward pass, per GPU.

    Tokens per pass T = max(max_num_tokens (a prefill chunk), max_batch x block_size (a verify step)).
    hidden-sized buffers (residual, norm, attention and MLP outputs) 4 x T x hidden; Q/K/V;
    MLP inner (gate+up), for MoE the routed share top_k x T / tp; drafter taps T x taps x hidden;
    FP32 logits of every verified position; plus a fixed kernel workspace.
    """
    tp = 1 if layout.attention_dp else layout.tp
    tokens = max(max_num_tokens, max_batch * block_size)
    kv = kv_heads_per_gpu(model.num_kv_heads, layout.tp) * model.head_dim
    qkv = tokens * (model.num_heads * model.head_dim // tp + 2 * kv)
    hidden = 4 * tokens * model.hidden_size
    if model.is_moe:
        mlp = tokens * model.experts_per_token * 2 * model.moe_intermediate_size // layout.tp
    else:
        mlp = tokens * 2 * model.intermediate_size // layout.tp
    taps = tokens * len(model.drafter.target_layer_ids) * model.hidden_size if model.drafter else 0
    logits = max_batch * block_size * (model.vocab_size // layout.tp) * LOGIT_BYTES
    return (hidden + qkv + mlp + taps) * ACTIVATION_BYTES + logits + WORKSPACE_BYTES


def cuda_graph_batch_sizes(max_batch: int) -> list[int]:
    """Batch sizes a CUDA-graph runtime captures (TensorRT-LLM's default list with padding):
    1, 2, 4, multiples of 8 up to 128, then powers of two, and max_batch itself."""
    sizes = [1, 2, 4] + [8 * i for i in range(1, 17)] + [2**i for i in range(8, 16)]
    sizes = sorted(s for s in set(sizes) if s <= max_batch)
    if not sizes or sizes[-1] != max_batch:
        sizes.append(max_batch)
    return sizes


def cuda_graph_bytes(max_batch: int, draft_lengths: set[int]) -> int:
    """One graph per (captured batch size, draft length of the schedule)."""
    return len(cuda_graph_batch_sizes(max_batch)) * max(1, len(draft_lengths)) * CUDA_GRAPH_BYTES


def host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 * GIB


def memory_budget(cfg: Candidate) -> tuple[MemoryBudget, int, int, int, int]:
    """Per GPU. The drafter is counted whole on every GPU (conservative: a runtime may shard it)."""
    model, layout = cfg.model, cfg.layout
    weights = target_weight_bytes(model, cfg.precision, layout)
    drafter = bytes_of(model.drafter.num_params(), cfg.precision.drafter) if model.drafter else 0
    if cfg.gpu is None:
        capacity, graphs, reserve = host_memory_bytes(), 0, 0
        activations = 0  # the CPU runtime allocates per step; no static workspace
    else:
        capacity = cfg.gpu.memory_bytes
        activations = activation_bytes(model, layout, cfg.max_batch, cfg.max_num_tokens, cfg.block_size)
        graphs = cuda_graph_bytes(cfg.max_batch, set(cfg.draft_lengths)) if uses_cuda_graphs(cfg) else 0
        reserve = RUNTIME_RESERVE_BYTES + (NCCL_RESERVE_BYTES if layout.num_gpus > 1 else 0)
    prefix = cfg.prefix_cache_bytes
    fixed = weights + drafter + activations + graphs + reserve + prefix
    kv_budget = max(0, int((capacity - fixed) * cfg.kv_fraction))
    # Growth per token of context: the full-attention layers (sliding layers stop at their window).
    full_per_token = (
        model.num_layers * model.mla_kv_per_token()
        if model.is_mla
        else sum(
            2 * kv_heads_per_gpu(model.attention(i).num_kv_heads, layout.tp) * model.attention(i).head_dim
            for i in range(model.num_layers)
            if not model.attention(i).window
        )
    )
    target_seq = kv_bytes_per_sequence(model, cfg.context, cfg.precision.kv_cache, layout.tp)
    target_seq += linear_state_bytes_per_sequence(model, layout.tp, cfg.block_size, prefix_cache=prefix > 0)
    drafter_seq = drafter_kv_bytes_per_sequence(model, cfg.context, cfg.precision.kv_cache)
    per_gpu = MemoryBudget(weights, drafter, activations, graphs, reserve, kv_budget, capacity, prefix)
    return per_gpu, bytes_of(full_per_token, cfg.precision.kv_cache), target_seq, drafter_seq, kv_budget


def uses_cuda_graphs(cfg: Candidate) -> bool:
    return get_backend(cfg.backend).uses_cuda_graphs(cfg.recipe)


def max_concurrency(cfg: Candidate) -> tuple[MemoryBudget, int, int, int, int]:
    budget, per_token, target_seq, drafter_seq, kv_budget = memory_budget(cfg)
    per_seq = target_seq + drafter_seq
    concurrency = kv_budget // per_seq if per_seq and budget.fixed < budget.capacity else 0
    return budget, per_token, target_seq, drafter_seq, int(concurrency)

"""Host side of the plugin kernels: grids, argument checks, launches (tiles: `tiles.py`).

The same configuration functions feed the torch launches here and the ahead-of-time builds
(`plugins/aot.py`, `plugins/tensorrt_plugins.py`), so an engine runs the tiles that were tested.
Grid and scalar formulas use only `+ - * //`, so they evaluate on ints here and on TensorRT's
symbolic shape expressions there.
"""

from __future__ import annotations

import torch

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.ops import kernels, specs
from trtllm_dflash.ops.attention_options import BLOCK_ATTENTION, TARGET_ATTENTION, AttentionOptions, float_bits  # noqa: F401  (float_bits: re-exported)
from trtllm_dflash.ops.kernels import dependent_launch, tile_counters
from trtllm_dflash.ops.kernels.tiles import (  # noqa: F401  (re-exported: the launch API)
    ATTENTION_HEAD_DIMS,
    COMMIT_BLOCK_S,
    ENGINE_SHARED_BUDGET,
    FLOAT32_SHARED_BUDGET,
    MAX_BLOCK,
    MAX_REGISTERS,
    VERIFY_BLOCK_V,
    AttentionConfig,
    TargetAttentionConfig,
    attention_config,
    attention_config_for_tile,
    cdiv,
    dtype_name,
    element_bytes,
    fit_tiles,
    next_power_of_2,
    shared_budget_for,
    target_attention_config,
    target_attention_config_for_tile,
    tile_shared_bytes,
)

# Logits per program of the split argmax: 38 chunks of a 151,936 vocabulary, so batch 1 x block 16
# launches 608 programs (4.6 per SM of an H100's 132); each reads 8 KB (bf16) in four 16-byte
# vector loads per thread.
VERIFY_CHUNK_V = 4 * VERIFY_BLOCK_V
VERIFY_BLOCK_C = 64  # chunk maxima combined per step by the positions kernel
VERIFY_ALIGN = 16  # a vocabulary that is a multiple of this starts every row 16-byte aligned


# Grids and int32 scalars of every kernel, shared by the torch launches below and the TensorRT
# plugins (where the sizes are symbolic shape expressions). `options` are an attention op's option
# values or its node's attributes, by name (`attention_options`); what is not given takes its default.


def attention_grid(batch, block, kv_heads, group: int, block_m: int, splits):
    return (cdiv(block * group, block_m) * splits, kv_heads, batch)


def attention_scalars(block, num_new, capacity, kv_heads, group: int, options: dict, splits):
    return (block, num_new, capacity, kv_heads, group, *BLOCK_ATTENTION.kernel_scalars(options), splits)


def merge_grid(batch, block, kv_heads, group: int, block_m: int):
    return (cdiv(block * group, block_m), kv_heads, batch)


def merge_scalars(block, kv_heads, group: int, splits):
    return (block, kv_heads, group, splits)


def target_attention_grid(batch, tokens, kv_heads, group: int, block_m: int, splits=1):
    return (cdiv(tokens * group, block_m) * splits, kv_heads, batch)


def target_attention_scalars(tokens, capacity, kv_heads, group: int, options: dict):
    return (tokens, capacity, kv_heads, group, *TARGET_ATTENTION.kernel_scalars(options))


def target_attention_split_scalars(tokens, capacity, kv_heads, group: int, options: dict, splits):
    return (*target_attention_scalars(tokens, capacity, kv_heads, group, options), splits)


def merge_block_m(head_dim: int, tokens, group: int, dtype: str = "bfloat16") -> int:
    """The merge kernel's query tile: the drafter's tile for the partials' head dim (a target's value
    head dim) and the output dtype. A prefill, or a token count that is not a build-time constant,
    takes the MAX_BLOCK tile."""
    tile_tokens = tokens if isinstance(tokens, int) and 1 <= tokens <= MAX_BLOCK else MAX_BLOCK
    return attention_config(head_dim, tile_tokens, group, dtype).block_m


def verify_num_chunks(vocab, chunk_v: int = VERIFY_CHUNK_V):
    return cdiv(vocab, chunk_v)


def verify_partials_grid(batch, block, vocab, chunk_v: int = VERIFY_CHUNK_V):
    return (verify_num_chunks(vocab, chunk_v), block, batch)


def verify_positions_grid(batch, block):
    return (block, batch, 1)


def verify_vocab_divisible(vocab: int | None) -> bool:
    """Whether rows of this vocabulary start 16-element aligned (False when unknown at build time)."""
    return vocab is not None and vocab % VERIFY_ALIGN == 0


def verify_commit_grid(batch):
    return (batch, 1, 1)


def drafter_kv_splits(batch: int, num_kv_heads: int, m_tiles: int, capacity: int, sms: int) -> int:
    """KV splits of a drafter block-attention launch: enough programs to fill `sms` SMs twice over,
    but at least 512 keys per split."""
    programs = max(batch * num_kv_heads * m_tiles, 1)
    wanted = cdiv(2 * sms, programs)
    return int(max(1, min(wanted, cdiv(capacity, 512), 64)))


def default_kv_splits(batch: int, num_kv_heads: int, m_tiles: int, capacity: int, device: torch.device) -> int:
    """`drafter_kv_splits` for this device (1 off CUDA)."""
    if device.type != "cuda":
        return 1
    return drafter_kv_splits(batch, num_kv_heads, m_tiles, capacity, torch.cuda.get_device_properties(device).multi_processor_count)


# each split writes, and the merge reads, T*g*Dv fp32 partials: at a Qwen3-8B verify step 512 keys
# per split keep those under 25% of the K/V bytes (docs/plugins.md, "KV split")
MIN_KEYS_PER_SPLIT = 512
MAX_KV_SPLITS = 64


def target_kv_splits(batch: int, num_kv_heads: int, m_tiles: int, prefix: int, sms: int) -> int:
    """KV splits of a target-attention launch: about two programs per SM when batch x KV heads x query
    tiles is fewer, but at least MIN_KEYS_PER_SPLIT prefix keys per split; 1 when the grid is full.

    `prefix` is the committed length the launch is sized for (the cache capacity less the block, or
    a recipe's context). A pure function of the shape, so an export or a CUDA graph can fix it.
    """
    programs = max(batch * num_kv_heads * m_tiles, 1)
    if programs >= sms:
        return 1
    wanted = cdiv(2 * sms, programs)
    return int(max(1, min(wanted, prefix // MIN_KEYS_PER_SPLIT, MAX_KV_SPLITS)))


def default_target_kv_splits(batch: int, num_kv_heads: int, m_tiles: int, tokens: int, capacity: int, device: torch.device) -> int:
    """`target_kv_splits` for this device (1 off CUDA), with the prefix bounded by the capacity."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return target_kv_splits(batch, num_kv_heads, m_tiles, max(capacity - tokens, 0), sms)


def attention_supported(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether the attention kernel covers these inputs (else callers use the reference)."""
    return (
        q.dtype in (torch.float16, torch.bfloat16, torch.float32)
        and k_cache.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn)
        and q.shape[-1] in ATTENTION_HEAD_DIMS
        and 1 <= q.shape[1] <= MAX_BLOCK
        and k_cache.is_contiguous()
    )


TARGET_ATTENTION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def target_attention_supported(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether the target-attention kernel covers these inputs (else callers use the reference).

    Any block or prefill length; key/value head dims from ATTENTION_HEAD_DIMS (they may differ);
    fp16/bf16/fp32 queries and caches. Not covered: float8 caches (a target's FP8 cache needs
    its scales), other head dims (e.g. MLA's 192), non-contiguous caches.
    """
    return (
        q.dim() == 4
        and k_cache.dim() == 4
        and v_cache.dim() == 4
        and q.dtype in TARGET_ATTENTION_DTYPES
        and k_cache.dtype in TARGET_ATTENTION_DTYPES
        and v_cache.dtype in TARGET_ATTENTION_DTYPES
        and q.shape[-1] in ATTENTION_HEAD_DIMS
        and k_cache.shape[-1] == q.shape[-1]
        and v_cache.shape[-1] in ATTENTION_HEAD_DIMS
        and k_cache.shape[2] > 0
        and q.shape[2] % k_cache.shape[2] == 0
        and k_cache.is_contiguous()
        and v_cache.is_contiguous()
    )


def _check_heads(num_heads: int, kv_heads: int, model: str) -> None:
    if kv_heads == 0 or num_heads % kv_heads:
        raise DFlashError(f"{num_heads} query heads are not a multiple of {kv_heads} KV heads", f"check the {model} config")


def _check_contiguous_caches(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not t.is_contiguous():
            raise DFlashError(f"{name} is not contiguous", "pass a contiguous cache (a slice of rows of a contiguous buffer is fine)")


def _check_dtype(op: str, q: torch.Tensor, dtypes: tuple) -> None:
    if q.dtype not in dtypes:
        raise DFlashError(f"{op} runs in float16/bfloat16/float32, not {q.dtype}")


def _check_target_attention_inputs(inputs, options: dict) -> None:
    q, k_cache, v_cache = inputs.q, inputs.k_cache, inputs.v_cache
    if q.dim() != 4 or k_cache.dim() != 4 or v_cache.dim() != 4:
        raise DFlashError("target attention takes q [b,T,Hq,Dk] and caches [b,S,Hkv,D]")
    batch, tokens, num_heads, head_dim_k = q.shape
    capacity, kv_heads, head_dim_v = k_cache.shape[1], k_cache.shape[2], v_cache.shape[3]
    _check_heads(num_heads, kv_heads, "target")
    expected = {
        "k_new": (batch, tokens, kv_heads, head_dim_k),
        "v_new": (batch, tokens, kv_heads, head_dim_v),
        "k_cache": (batch, capacity, kv_heads, head_dim_k),
        "v_cache": (batch, capacity, kv_heads, head_dim_v),
    }
    for name, want in expected.items():
        t = getattr(inputs, name)
        if tuple(t.shape) != want:
            raise DFlashError(f"{name} has shape {tuple(t.shape)}, expected {want}")
    _check_contiguous_caches(k_cache, v_cache)
    if tuple(inputs.starts.shape) != (batch,):
        raise DFlashError(f"starts has shape {tuple(inputs.starts.shape)}, expected {(batch,)}")
    TARGET_ATTENTION.check_shapes(options, q.shape, DFlashError)
    _check_dtype("target attention", q, TARGET_ATTENTION_DTYPES)


@specs.TARGET_ATTENTION.launcher(torch.Tensor)
def target_attention(inputs, *, kv_splits: int | None = None, merge_in_launch: bool = True, **options) -> torch.Tensor:
    """Run the target-attention kernel(s): writes the block into the caches in place, returns `[b,T,Hq,Dv]`.

    One launch with one split (what DFlashTargetAttention does), else the split kernel with the
    merge in the same launch, or with `merge_in_launch` False the two launches of the plugins
    (DFlashTargetAttentionSplit + DFlashAttentionMerge); see `reference_attention.target_attention`.
    `kv_splits` overrides the split count `default_target_kv_splits` picks from the shape. Options
    (sinks, scale, window): `attention_options.TARGET_ATTENTION`.
    """
    _check_target_attention_inputs(inputs, options)
    q, k_cache, v_cache = inputs.q, inputs.k_cache, inputs.v_cache
    batch, tokens, num_heads, head_dim_k = q.shape
    capacity, kv_heads, head_dim_v = k_cache.shape[1], k_cache.shape[2], v_cache.shape[3]
    out = q.new_empty(batch, tokens, num_heads, head_dim_v)
    if batch == 0 or tokens == 0:
        return out
    group = num_heads // kv_heads
    config = target_attention_config(head_dim_k, head_dim_v, tokens, group, dtype_name(q.dtype))
    m_tiles = config.m_tiles(tokens, group)
    splits = kv_splits or default_target_kv_splits(batch, kv_heads, m_tiles, tokens, capacity, q.device)
    module = kernels.for_tensor_device("attention", q.device)
    grid = target_attention_grid(batch, tokens, kv_heads, group, config.block_m, splits)
    kernel_args = (
        q.contiguous(),
        inputs.k_new.contiguous(),
        inputs.v_new.contiguous(),
        k_cache,
        v_cache,
        inputs.starts.to(torch.int64).contiguous(),
        *_option_tensors(TARGET_ATTENTION, options, q.device),
    )
    constants = dict(
        HEAD_DIM_K=head_dim_k,
        HEAD_DIM_V=head_dim_v,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        **TARGET_ATTENTION.kernel_constexprs(TARGET_ATTENTION.present(options)),
        IEEE=q.dtype == torch.float32,
    )
    launch_options = _launch_options(q.device, config.num_warps, config.num_stages)
    if splits == 1:
        scalars = target_attention_scalars(tokens, capacity, kv_heads, group, options)
        module.target_attention_kernel[grid](*kernel_args, *scalars, out, k_cache, v_cache, **constants, **launch_options)
        return out
    scalars = target_attention_split_scalars(tokens, capacity, kv_heads, group, options, splits)
    merge_m = merge_block_m(head_dim_v, tokens, group, dtype_name(q.dtype))
    return _split_and_merge(
        "target_attention",
        merge_in_launch,
        grid,
        (*kernel_args, *scalars),
        constants,
        launch_options,
        q,
        k_cache,
        v_cache,
        out,
        kv_heads,
        group,
        splits,
        merge_m,
    )


def _split_and_merge(
    kernel, merge_in_launch, grid, args, constants, launch_options, q, k_cache, v_cache, out, kv_heads, group, splits, merge_m
):
    """The split form of attention kernel `kernel` (`args`: its inputs and scalars) into `out
    [b, T, Hq, Dv]`, through float32 partials `[b, Hkv, splits, T*g, (Dv)]`: one launch whose last
    split per query tile merges (attention_merge.py; while the tiles fit the device's counters), or
    the split launch then the merge launch."""
    batch, tokens, _, head_dim_v = out.shape
    rows = tokens * group
    partial_out = torch.empty(batch, kv_heads, splits, rows, head_dim_v, dtype=torch.float32, device=q.device)
    partial_lse = torch.empty(batch, kv_heads, splits, rows, dtype=torch.float32, device=q.device)
    merge = kernels.for_tensor_device("attention_merge", q.device)
    if merge_in_launch and batch * kv_heads * (grid[0] // splits) <= tile_counters.MAX_TILES:
        counters = tile_counters.tile_counters(q.device)
        merged_kernel = getattr(merge, f"{kernel}_merged_kernel")
        merged_kernel[grid](*args, partial_out, partial_lse, counters, out, k_cache, v_cache, **constants, **launch_options)
        return out
    split_kernel = getattr(kernels.for_tensor_device("attention", q.device), f"{kernel}_split_kernel")
    split_kernel[grid](*args, partial_out, partial_lse, k_cache, v_cache, **constants, **launch_options)
    merge.merge_kernel[merge_grid(batch, tokens, kv_heads, group, merge_m)](
        partial_out,
        partial_lse,
        q,
        *merge_scalars(tokens, kv_heads, group, splits),
        out,
        HEAD_DIM=head_dim_v,
        BLOCK_M=merge_m,
        **_launch_options(q.device, 4, 1),
    )
    return out


def _option_tensors(op_options: AttentionOptions, options: dict, device: torch.device) -> list[torch.Tensor]:
    """The kernel's option pointers: each tensor option in float32, or a placeholder it does not read
    (allocated, never written: a fill would be one more kernel per layer in every captured pass)."""
    return [
        options[o.name].to(torch.float32).contiguous()
        if options.get(o.name) is not None
        else torch.empty(1, dtype=torch.float32, device=device)
        for o in op_options.tensors
    ]


def verify_supported(target_logits: torch.Tensor) -> bool:
    """Whether the verification kernels cover these logits (else callers use the reference)."""
    return target_logits.dtype in (torch.float16, torch.bfloat16, torch.float32) and 1 <= target_logits.shape[1] <= MAX_BLOCK


def _check_attention_inputs(inputs) -> None:
    q, k_cache, v_cache = inputs.q, inputs.k_cache, inputs.v_cache
    batch, block, num_heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    _check_heads(num_heads, kv_heads, "drafter")
    for name, t in (("k_block", inputs.k_block), ("v_block", inputs.v_block)):
        if tuple(t.shape) != (batch, block, kv_heads, head_dim):
            raise DFlashError(f"{name} has shape {tuple(t.shape)}, expected {(batch, block, kv_heads, head_dim)}")
    for name, t in (("k_ctx_new", inputs.k_ctx_new), ("v_ctx_new", inputs.v_ctx_new)):
        if t.dim() != 4 or t.shape[0] != batch or tuple(t.shape[2:]) != (kv_heads, head_dim):
            raise DFlashError(f"{name} has shape {tuple(t.shape)}, expected [{batch}, n, {kv_heads}, {head_dim}]")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.shape != k_cache.shape or t.shape[0] != batch or t.shape[3] != head_dim:
            raise DFlashError(f"{name} has shape {tuple(t.shape)}, expected [{batch}, capacity, {kv_heads}, {head_dim}]")
    _check_contiguous_caches(k_cache, v_cache)
    _check_dtype("block attention", q, (torch.float16, torch.bfloat16, torch.float32))


@specs.BLOCK_ATTENTION.launcher(torch.Tensor)
def block_attention(inputs, *, kv_splits: int | None = None, merge_in_launch: bool = True, **options) -> torch.Tensor:
    """Run the block-attention kernel(s); appends the new context to the caches in place.

    Options (scale, window): `attention_options.BLOCK_ATTENTION`; `kv_splits` overrides the split
    count; `merge_in_launch` as in `target_attention`.
    """
    _check_attention_inputs(inputs)
    q, k_cache, v_cache, k_ctx_new, v_ctx_new = inputs.q, inputs.k_cache, inputs.v_cache, inputs.k_ctx_new, inputs.v_ctx_new
    BLOCK_ATTENTION.check_shapes(options, q.shape, DFlashError)
    batch, block, num_heads, head_dim = q.shape
    capacity, kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(q)
    if batch == 0 or block == 0:
        return out
    group = num_heads // kv_heads
    config = attention_config(head_dim, block, group, dtype_name(q.dtype))
    m_tiles = config.m_tiles(block, group)
    splits = kv_splits or default_kv_splits(batch, kv_heads, m_tiles, capacity, q.device)
    module = kernels.for_tensor_device("attention", q.device)
    num_new = k_ctx_new.shape[1]
    if num_new == 0:  # a zero-size tensor may have no storage; the kernel never reads it then
        k_ctx_new = k_ctx_new.new_zeros(batch, 1, kv_heads, head_dim)
        v_ctx_new = v_ctx_new.new_zeros(batch, 1, kv_heads, head_dim)
    kernel_args = (
        q.contiguous(),
        inputs.k_block.contiguous(),
        inputs.v_block.contiguous(),
        k_ctx_new.contiguous(),
        v_ctx_new.contiguous(),
        inputs.new_counts.to(torch.int64).contiguous(),
        k_cache,
        v_cache,
        inputs.cache_lens.to(torch.int64).contiguous(),
        *_option_tensors(BLOCK_ATTENTION, options, q.device),
    )
    constants = dict(
        HEAD_DIM=head_dim,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_T=config.block_t,
        **BLOCK_ATTENTION.kernel_constexprs(BLOCK_ATTENTION.present(options)),
        IEEE=q.dtype == torch.float32,
    )
    launch_options = _launch_options(q.device, config.num_warps, config.num_stages)
    grid = attention_grid(batch, block, kv_heads, group, config.block_m, splits)
    scalars = attention_scalars(block, num_new, capacity, kv_heads, group, options, splits)
    if splits == 1:
        module.block_attention_kernel[grid](*kernel_args, *scalars, out, k_cache, v_cache, **constants, **launch_options)
        return out
    return _split_and_merge(
        "block_attention",
        merge_in_launch,
        grid,
        (*kernel_args, *scalars),
        constants,
        launch_options,
        q,
        k_cache,
        v_cache,
        out,
        kv_heads,
        group,
        splits,
        config.block_m,
    )


def verify_partials(
    target_logits: torch.Tensor, chunk_v: int = VERIFY_CHUNK_V, block_v: int = VERIFY_BLOCK_V
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1 of the argmax: per chunk of `chunk_v` logits, float32 `[b, B, chunks]` maxima and
    int32 first indices of them (`reference.verify_partials`)."""
    batch, block, vocab = target_logits.shape
    device = target_logits.device
    if chunk_v % block_v:
        raise DFlashError(f"the verification chunk ({chunk_v}) must be a multiple of the tile ({block_v})")
    chunks = verify_num_chunks(vocab, chunk_v)
    chunk_max = torch.empty(batch, block, chunks, dtype=torch.float32, device=device)
    chunk_index = torch.empty(batch, block, chunks, dtype=torch.int32, device=device)
    if batch == 0 or chunks == 0:
        return chunk_max, chunk_index
    kernels.for_tensor_device("verify", device).verify_partials_kernel[verify_partials_grid(batch, block, vocab, chunk_v)](
        target_logits.contiguous(),
        block,
        vocab,
        chunk_max,
        chunk_index,
        BLOCK_V=block_v,
        CHUNK_V=chunk_v,
        VOCAB_DIVISIBLE=verify_vocab_divisible(vocab),
        **_launch_options(device, 4, 1, fp_fusion=False),
    )
    return chunk_max, chunk_index


def check_verify_inputs(target_logits: torch.Tensor, block_tokens: torch.Tensor, draft_probs: torch.Tensor | None) -> None:
    batch, block, vocab = target_logits.shape
    if tuple(block_tokens.shape) != (batch, block):
        raise DFlashError(f"block_tokens has shape {tuple(block_tokens.shape)}, expected {(batch, block)}")
    if draft_probs is not None and tuple(draft_probs.shape) != (batch, block - 1, vocab):
        raise DFlashError(f"draft_probs has shape {tuple(draft_probs.shape)}, expected {(batch, block - 1, vocab)}")
    if not 1 <= block <= MAX_BLOCK:
        raise DFlashError(f"verification supports blocks of 1..{MAX_BLOCK} tokens, not {block}")


def verify_first_stage(target_logits: torch.Tensor, draft_probs: torch.Tensor | None, block_v: int, chunk_v: int | None) -> tuple:
    """What both verification forms start from: (contiguous logits, the split argmax's chunk maxima
    and indices, whether there are drafts, q as contiguous float32 or a one-element dummy)."""
    target_logits = target_logits.contiguous()
    chunk_max, chunk_index = verify_partials(target_logits, chunk_v or VERIFY_CHUNK_V // VERIFY_BLOCK_V * block_v, block_v)
    has_draft = draft_probs is not None and target_logits.shape[1] > 1
    dummy = torch.empty(1, dtype=torch.float32, device=target_logits.device)  # not read without drafts
    return target_logits, chunk_max, chunk_index, has_draft, draft_probs.to(torch.float32).contiguous() if has_draft else dummy


@specs.VERIFY_POSITIONS.launcher(torch.Tensor)
def verify_positions(inputs, *, block_v: int = VERIFY_BLOCK_V, chunk_v: int | None = None) -> torch.Tensor:
    """Both stages: the split argmax, then the per-position kernel: int32 `[b, B, 2]` decisions
    (`reference.verify_positions`). `chunk_v` (default 4 tiles) is the split's chunk size.
    `verify_spread_launch` splits the sampled rows' passes over the chunks too."""
    target_logits, block_tokens, draft_probs = inputs.target_logits, inputs.block_tokens, inputs.draft_probs
    check_verify_inputs(target_logits, block_tokens, draft_probs)
    batch, block, vocab = target_logits.shape
    device = target_logits.device
    decisions = torch.empty(batch, block, 2, dtype=torch.int32, device=device)
    if batch == 0:
        return decisions
    target_logits, chunk_max, chunk_index, has_draft, draft_probs = verify_first_stage(target_logits, draft_probs, block_v, chunk_v)
    kernels.for_tensor_device("verify", device).verify_positions_kernel[verify_positions_grid(batch, block)](
        target_logits,
        block_tokens.to(torch.int64).contiguous(),
        draft_probs,
        inputs.temperature.to(torch.float32).contiguous(),
        inputs.top_k.to(torch.int64).contiguous(),
        inputs.top_p.to(torch.float32).contiguous(),
        inputs.seed.to(torch.int64).contiguous(),
        inputs.start.to(torch.int64).contiguous(),
        chunk_max,
        chunk_index,
        block,
        vocab,
        int(has_draft),
        chunk_max.shape[2],
        decisions,
        BLOCK_V=block_v,
        BLOCK_C=VERIFY_BLOCK_C,
        VOCAB_DIVISIBLE=verify_vocab_divisible(vocab),
        **_launch_options(device, 4, 1, fp_fusion=False),
    )
    return decisions


@specs.VERIFY_COMMIT.launcher(torch.Tensor)
def verify_commit(inputs) -> torch.Tensor:
    """The per-sequence kernel: int64 `[b, 5]` (`reference.verify_commit`)."""
    block_tokens, stop_ids = inputs.block_tokens, inputs.stop_ids
    batch, block = block_tokens.shape
    device = block_tokens.device
    result = torch.empty(batch, 5, dtype=torch.int64, device=device)
    if batch == 0:
        return result
    num_stop = 0 if stop_ids is None else stop_ids.shape[1]
    if num_stop == 0:
        stop_ids = torch.full((1, 1), -1, dtype=torch.int64, device=device)
    kernels.for_tensor_device("verify", device).verify_commit_kernel[verify_commit_grid(batch)](
        inputs.decisions.contiguous(),
        block_tokens.to(torch.int64).contiguous(),
        inputs.start.to(torch.int64).contiguous(),
        stop_ids.to(torch.int64).contiguous(),
        block,
        num_stop,
        result,
        BLOCK_T=MAX_BLOCK,
        BLOCK_S=COMMIT_BLOCK_S,
        **_launch_options(device, 1, 1),
    )
    return result


@specs.VERIFY_BLOCK_PACKED.launcher(torch.Tensor)
def verify_block(inputs, *, block_v: int = VERIFY_BLOCK_V, chunk_v: int | None = None) -> torch.Tensor:
    """The verification kernels; returns the packed `[b, 5]` int64 result (`reference.VERIFY_RESULT_COLUMNS`)."""
    decisions = verify_positions(*inputs[: len(specs.VERIFY_POSITIONS.inputs)], block_v=block_v, chunk_v=chunk_v)
    return verify_commit(decisions, inputs.block_tokens, inputs.start, inputs.stop_ids)


def _launch_options(device: torch.device, num_warps: int, num_stages: int, fp_fusion: bool = True) -> dict:
    """Compile options for GPU launches (the interpreter takes none), and the dependent launch's
    arguments where the context asks for them (dependent_launch.py; every kernel launched with
    these options waits for the kernel ahead first)."""
    dependent = dependent_launch.launch_args(device)
    if device.type != "cuda":
        return dependent
    return dict(num_warps=num_warps, num_stages=num_stages, enable_fp_fusion=fp_fusion, maxnreg=MAX_REGISTERS) | dependent

"""Which kernel variants the plugins launch: one compilation unit per kernel function, pointer
dtypes and compile-time constants, and the set a deployment needs (`KernelSpace`).

The signatures follow the kernels' calling convention (inputs, int32 scalars, outputs; see
`kernels/attention.py`); the attention kernels' option parameters and the constexprs that key a
variant (`HAS_SINKS`) come from `attention_options`. The variant labels name the files of a
`dflash-trt plugins build` and are how a prebuilt directory is searched, so they stay stable.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping

from trtllm_dflash.contracts import dtypes
from trtllm_dflash.ops.attention_options import BLOCK_ATTENTION, TARGET_ATTENTION
from trtllm_dflash.ops.kernels import dflash2_launch, launch, tiles

# Every pointer a kernel receives is 16-byte aligned: TensorRT requires 256-byte aligned engine I/O
# addresses (`IExecutionContext::setTensorAddress`) and allocates activations itself, and the torch
# path's launches pass whole (caching-allocator, 256-byte aligned) tensors, where Triton's JIT
# specializes the same way. Telling the compiler (`tt.divisibility`) is what turns the K/V and
# logits loads into 16-byte vectors and `cp.async` copies instead of 2-byte loads.
POINTER_ALIGNMENT = 16

# torch's dtype names -> Triton's signature spelling, from the one dtype table
TORCH_TO_TRITON = {d.torch: d.triton for d in dtypes.TABLE if d.torch and d.triton}


@dataclasses.dataclass(frozen=True)
class KernelVariant:
    """One compilation unit: a kernel function with its pointer dtypes and compile-time constants."""

    node: str  # the ONNX node (TensorRT plugin) that launches it
    source: str  # kernel file: attention | verify
    function: str
    signature: tuple[tuple[str, str], ...]  # parameter -> Triton type, in kernel order
    constexprs: tuple[tuple[str, object], ...]
    num_warps: int
    num_stages: int
    enable_fp_fusion: bool
    # integer parameters the launch always passes as multiples of 16, which Triton's JIT specializes
    # on (a torch launch only; an engine's AOT launch makes no such promise)
    divisible_ints: tuple[str, ...] = ()

    def compile_attrs(self) -> dict:
        """Triton's per-parameter attributes: every pointer parameter divisible by POINTER_ALIGNMENT
        bytes, and the `divisible_ints` by 16."""
        return {
            (index,): [["tt.divisibility", POINTER_ALIGNMENT]]
            for index, (name, kind) in enumerate(self.signature)
            if kind.startswith("*") or name in self.divisible_ints
        }

    @property
    def label(self) -> str:
        """A stable, readable identifier, e.g. `block_attention_kernel.bf16.head_dim128.block_m64...`."""
        dtypes = "-".join(sorted({t.lstrip("*") for _, t in self.signature if t.startswith("*") and not t.startswith("*i")}))
        consts = [f"{k.lower()}{int(v) if isinstance(v, bool) else v}" for k, v in self.constexprs]
        return ".".join(part for part in [self.function, dtypes, *consts] if part)


def _attention_signature(dtype: str, cache_dtype: str, split: bool) -> tuple:
    t, c = f"*{TORCH_TO_TRITON[dtype]}", f"*{TORCH_TO_TRITON[cache_dtype]}"
    outputs = (("partial_out_ptr", "*fp32"), ("partial_lse_ptr", "*fp32")) if split else (("out_ptr", t),)
    return (
        ("q_ptr", t),
        ("k_block_ptr", t),
        ("v_block_ptr", t),
        ("k_ctx_ptr", t),
        ("v_ctx_ptr", t),
        ("new_counts_ptr", "*i64"),
        ("k_cache_ptr", c),
        ("v_cache_ptr", c),
        ("cache_lens_ptr", "*i64"),
        *BLOCK_ATTENTION.kernel_pointer_params(),
        ("block", "i32"),
        ("num_new", "i32"),
        ("capacity", "i32"),
        ("num_kv_heads", "i32"),
        ("group", "i32"),
        *BLOCK_ATTENTION.kernel_scalar_params(),
        ("num_splits", "i32"),
        *outputs,
        ("k_cache_out_ptr", c),
        ("v_cache_out_ptr", c),
    )


def attention_variants(
    head_dim: int,
    dtype: str,
    cache_dtype: str,
    block_m: int,
    present: Mapping[str, bool] | None = None,
    shared_budget: int | None = None,
) -> list[KernelVariant]:
    """The direct and split attention kernels and the merge kernel for one query-tile size (and, per
    tensor option of `attention_options.BLOCK_ATTENTION`, whether it is present), with the tiles that
    fit `shared_budget` (default: the dtype's)."""
    config = launch.attention_config_for_tile(head_dim, block_m, dtype, shared_budget)
    block_m = config.block_m
    constexprs = (
        ("HEAD_DIM", head_dim),
        ("BLOCK_M", block_m),
        ("BLOCK_N", config.block_n),
        ("BLOCK_T", config.block_t),
        *BLOCK_ATTENTION.kernel_constexprs(present or {}).items(),
        ("IEEE", dtype == "float32"),
    )
    variants = [
        KernelVariant(
            node,
            "attention",
            function,
            _attention_signature(dtype, cache_dtype, split),
            constexprs,
            config.num_warps,
            config.num_stages,
            True,
        )
        for node, function, split in (
            ("DFlashBlockAttention", "block_attention_kernel", False),
            ("DFlashBlockAttentionSplit", "block_attention_split_kernel", True),
        )
    ]
    t = f"*{TORCH_TO_TRITON[dtype]}"
    merge_signature = (
        ("partial_out_ptr", "*fp32"),
        ("partial_lse_ptr", "*fp32"),
        ("like_ptr", t),
        ("block", "i32"),
        ("num_kv_heads", "i32"),
        ("group", "i32"),
        ("num_splits", "i32"),
        ("out_ptr", t),
    )
    variants.append(
        KernelVariant(
            "DFlashAttentionMerge",
            "attention_merge",
            "merge_kernel",
            merge_signature,
            (("HEAD_DIM", head_dim), ("BLOCK_M", block_m)),
            4,
            1,
            True,
        )
    )
    return variants


def _target_attention_signature(dtype: str, cache_dtype: str) -> tuple:
    t, c = f"*{TORCH_TO_TRITON[dtype]}", f"*{TORCH_TO_TRITON[cache_dtype]}"
    return (
        ("q_ptr", t),
        ("k_new_ptr", t),
        ("v_new_ptr", t),
        ("k_cache_ptr", c),
        ("v_cache_ptr", c),
        ("starts_ptr", "*i64"),
        *TARGET_ATTENTION.kernel_pointer_params(),
        ("tokens", "i32"),
        ("capacity", "i32"),
        ("num_kv_heads", "i32"),
        ("group", "i32"),
        *TARGET_ATTENTION.kernel_scalar_params(),
        ("out_ptr", t),
        ("k_cache_out_ptr", c),
        ("v_cache_out_ptr", c),
    )


def target_attention_variant(
    head_dim_k: int,
    head_dim_v: int,
    dtype: str,
    cache_dtype: str,
    block_m: int,
    present: Mapping[str, bool],
    shared_budget: int | None = None,
) -> KernelVariant:
    """The DFlashTargetAttention kernel for one (key, value) head-dim pair, dtype, query tile and the
    tensor options present (`{"sinks": True}`); scalar options such as the window are runtime
    scalars: full and sliding layers share a variant."""
    config = launch.target_attention_config_for_tile(head_dim_k, head_dim_v, block_m, dtype, shared_budget)
    block_m = config.block_m
    constexprs = (
        ("HEAD_DIM_K", head_dim_k),
        ("HEAD_DIM_V", head_dim_v),
        ("BLOCK_M", block_m),
        ("BLOCK_N", config.block_n),
        *TARGET_ATTENTION.kernel_constexprs(present).items(),
        ("IEEE", dtype == "float32"),
    )
    return KernelVariant(
        "DFlashTargetAttention",
        "attention",
        "target_attention_kernel",
        _target_attention_signature(dtype, cache_dtype),
        constexprs,
        config.num_warps,
        config.num_stages,
        True,
    )


def _target_attention_split_signature(dtype: str, cache_dtype: str) -> tuple:
    t, c = f"*{TORCH_TO_TRITON[dtype]}", f"*{TORCH_TO_TRITON[cache_dtype]}"
    return (
        ("q_ptr", t),
        ("k_new_ptr", t),
        ("v_new_ptr", t),
        ("k_cache_ptr", c),
        ("v_cache_ptr", c),
        ("starts_ptr", "*i64"),
        *TARGET_ATTENTION.kernel_pointer_params(),
        ("tokens", "i32"),
        ("capacity", "i32"),
        ("num_kv_heads", "i32"),
        ("group", "i32"),
        *TARGET_ATTENTION.kernel_scalar_params(),
        ("num_splits", "i32"),
        ("partial_out_ptr", "*fp32"),
        ("partial_lse_ptr", "*fp32"),
        ("k_cache_out_ptr", c),
        ("v_cache_out_ptr", c),
    )


def target_attention_split_variant(
    head_dim_k: int,
    head_dim_v: int,
    dtype: str,
    cache_dtype: str,
    block_m: int,
    present: Mapping[str, bool],
    shared_budget: int | None = None,
) -> KernelVariant:
    """The DFlashTargetAttentionSplit kernel: the tiles and constexprs of `target_attention_variant`
    (the split count is a runtime scalar: one variant serves every count)."""
    unsplit = target_attention_variant(head_dim_k, head_dim_v, dtype, cache_dtype, block_m, present, shared_budget)
    return dataclasses.replace(
        unsplit,
        node="DFlashTargetAttentionSplit",
        function="target_attention_split_kernel",
        signature=_target_attention_split_signature(dtype, cache_dtype),
    )


def target_merge_variant(head_dim_v: int, dtype: str, block_m: int) -> KernelVariant:
    """The DFlashAttentionMerge kernel that combines a target's partials: the drafter's merge kernel
    for the value head dim, with the tile `launch.merge_block_m` gives."""
    return attention_variants(head_dim_v, dtype, dtype, block_m)[2]


def target_query_tiles(
    head_dim_k: int,
    head_dim_v: int,
    blocks: Iterable[int],
    groups: Iterable[int],
    dtype: str = "bfloat16",
    shared_budget: int | None = None,
) -> list[int]:
    """The query tiles a target with these GQA groups launches for verify blocks of these sizes,
    and for a prefill or a dynamic token dimension (which take the MAX_BLOCK tile)."""
    tokens = set(blocks) | {launch.MAX_BLOCK}
    return sorted(
        {launch.target_attention_config(head_dim_k, head_dim_v, t, g, dtype, shared_budget).block_m for t in tokens for g in groups}
    )


def target_merge_tiles(head_dim_v: int, blocks: Iterable[int], groups: Iterable[int], dtype: str = "bfloat16") -> list[int]:
    """The merge tiles a target's split attention launches for these verify blocks and a prefill."""
    tokens = set(blocks) | {launch.MAX_BLOCK}
    return sorted({launch.merge_block_m(head_dim_v, t, g, dtype) for t in tokens for g in groups})


def verify_partials_variant(logits_dtype: str, vocab_divisible: bool = True) -> KernelVariant:
    """Stage 1 of the split argmax (DFlashVerifyPartials): chunk maxima and their first indices."""
    signature = (
        ("logits_ptr", f"*{TORCH_TO_TRITON[logits_dtype]}"),
        ("block", "i32"),
        ("vocab", "i32"),
        ("chunk_max_ptr", "*fp32"),
        ("chunk_index_ptr", "*i32"),
    )
    constexprs = (("BLOCK_V", launch.VERIFY_BLOCK_V), ("CHUNK_V", launch.VERIFY_CHUNK_V), ("VOCAB_DIVISIBLE", vocab_divisible))
    return KernelVariant("DFlashVerifyPartials", "verify", "verify_partials_kernel", signature, constexprs, 4, 1, False)


def verify_variants(logits_dtype: str, vocab_divisible: bool = True) -> list[KernelVariant]:
    """The per-position kernel (DFlashVerifyPositions) for one logits dtype; `vocab_divisible`: the
    vocabulary is a multiple of 16, so rows are 16-byte aligned (`launch.verify_vocab_divisible`)."""
    positions = (
        ("logits_ptr", f"*{TORCH_TO_TRITON[logits_dtype]}"),
        ("tokens_ptr", "*i64"),
        ("draft_probs_ptr", "*fp32"),
        ("temperature_ptr", "*fp32"),
        ("top_k_ptr", "*i64"),
        ("top_p_ptr", "*fp32"),
        ("seed_ptr", "*i64"),
        ("start_ptr", "*i64"),
        ("chunk_max_ptr", "*fp32"),
        ("chunk_index_ptr", "*i32"),
        ("block", "i32"),
        ("vocab", "i32"),
        ("has_draft_probs", "i32"),
        ("num_chunks", "i32"),
        ("decisions_ptr", "*i32"),
    )
    constexprs = (("BLOCK_V", launch.VERIFY_BLOCK_V), ("BLOCK_C", launch.VERIFY_BLOCK_C), ("VOCAB_DIVISIBLE", vocab_divisible))
    return [KernelVariant("DFlashVerifyPositions", "verify", "verify_positions_kernel", positions, constexprs, 4, 1, False)]


def commit_variant() -> KernelVariant:
    signature = (
        ("decisions_ptr", "*i32"),
        ("tokens_ptr", "*i64"),
        ("start_ptr", "*i64"),
        ("stop_ids_ptr", "*i64"),
        ("block", "i32"),
        ("num_stop", "i32"),
        ("result_ptr", "*i64"),
    )
    return KernelVariant(
        "DFlashVerifyCommit",
        "verify",
        "verify_commit_kernel",
        signature,
        (("BLOCK_T", launch.MAX_BLOCK), ("BLOCK_S", launch.COMMIT_BLOCK_S)),
        1,
        1,
        False,
    )


def fused_layer_variants(dtype: str, hidden: int = 4096, head_dim: int = 128, ffn: int = 12288) -> list[KernelVariant]:
    """The fused decoding passes' kernels (kernels/fused_layer.py) at a Qwen3-8B layer's sizes, with
    the tiles and warps `modeling/fused_ops.py` launches them with (tiles.py). Only torch launches
    them (Triton's JIT, on a GPU), so the sizes that are multiples of 16 are marked as the JIT
    specializes them. Compiled and audited without a GPU (tests/test_kernel_audit.py)."""
    t = f"*{TORCH_TO_TRITON[dtype]}"
    block_h, norm_warps = tiles.norm_tile(hidden)
    kernels = {
        "add_rms_norm_kernel": (
            (("x_ptr", t), ("delta_ptr", t), ("weight_ptr", t), ("eps", "fp32"), ("hidden", "i32"), ("sum_ptr", t), ("norm_ptr", t)),
            (("HAS_DELTA", True), ("BLOCK_H", block_h)),
            norm_warps,
        ),
        "qk_norm_rope_kernel": (
            (("qkv_ptr", t), ("cos_ptr", t), ("sin_ptr", t), ("norm_weight_ptr", t), ("eps", "fp32"), ("q_heads", "i32"))
            + (("kv_heads", "i32"), ("count", "i32"), ("rope_batch_stride", "i32"), ("q_ptr", t), ("k_ptr", t), ("v_ptr", t)),
            (("HAS_NORM", True), ("HEAD_DIM", head_dim)),
            tiles.QK_NORM_ROPE_WARPS,
        ),
        "silu_mul_kernel": (
            (("gate_up_ptr", t), ("width", "i32"), ("out_ptr", t)),
            (("BLOCK_F", tiles.silu_block(ffn)),),
            tiles.SILU_WARPS,
        ),
    }
    multiples = tuple(name for name, size in (("hidden", hidden), ("width", ffn), ("rope_batch_stride", head_dim)) if size % 16 == 0)
    return [
        KernelVariant(f"FusedLayer.{function}", "fused_layer", function, signature, constexprs, warps, 1, True, multiples)
        for function, (signature, constexprs, warps) in kernels.items()
    ]


def verify_spread_variants(logits_dtype: str, vocab_divisible: bool = True) -> list[KernelVariant]:
    """The vocabulary-spread verification kernels (verify_spread.py), for one logits dtype.

    Compiled and audited without a GPU (tests/test_kernel_audit.py); the torch runtime launches
    them (`verify_spread_launch`). They are not TensorRT plugin nodes yet: the engines' verify
    plugin is still DFlashVerifyPartials / Positions / Commit."""
    logits = ("logits_ptr", f"*{TORCH_TO_TRITON[logits_dtype]}")
    rows = (("temperature_ptr", "*fp32"), ("top_k_ptr", "*i64"), ("top_p_ptr", "*fp32"))
    sampling = (("draft_probs_ptr", "*fp32"), *rows, ("seed_ptr", "*i64"), ("start_ptr", "*i64"))
    top_k = (("topk_hist_ptr", "*i32"), ("topk_state_ptr", "*i64"))
    kept = (*top_k, ("topp_hist_ptr", "*fp32"), ("topp_state_ptr", "*fp32"), ("topp_prefix_ptr", "*i64"), ("mass_ptr", "*fp32"))
    sizes = (("block", "i32"), ("vocab", "i32"))
    tiles = (("CHUNK_V", launch.VERIFY_CHUNK_V), ("BLOCK_V", launch.VERIFY_BLOCK_V))
    with_c = (*tiles, ("BLOCK_C", launch.VERIFY_BLOCK_C), ("VOCAB_DIVISIBLE", vocab_divisible))
    kernels = {
        "topk_pass_kernel": (
            (logits, *rows[:2], ("rnd", "i32"), *sizes, ("num_chunks", "i32"), ("hist_ptr", "*i32"), ("state_ptr", "*i64")),
            (*tiles, ("VOCAB_DIVISIBLE", vocab_divisible)),
        ),
        "topp_pass_kernel": (
            (logits, *rows, ("chunk_max_ptr", "*fp32"), *top_k, ("rnd", "i32"), *sizes, ("num_chunks", "i32"))
            + (("hist_ptr", "*fp32"), ("state_ptr", "*fp32"), ("prefix_ptr", "*i64")),
            with_c,
        ),
        "mass_kernel": ((logits, *rows, ("chunk_max_ptr", "*fp32"), *top_k, *sizes, ("num_chunks", "i32"), ("mass_ptr", "*fp32")), with_c),
        "race_kernel": (
            (logits, *sampling, ("chunk_max_ptr", "*fp32"), *kept, *sizes, ("has_draft_probs", "i32"), ("num_chunks", "i32"))
            + (("race_ptr", "*fp32"), ("race_index_ptr", "*i32")),
            with_c,
        ),
        "decide_kernel": (
            (logits, ("tokens_ptr", "*i64"), *sampling, ("chunk_max_ptr", "*fp32"), ("chunk_index_ptr", "*i32"), *kept)
            + (("race_ptr", "*fp32"), ("race_index_ptr", "*i32"), *sizes, ("has_draft_probs", "i32"), ("num_chunks", "i32"))
            + (("decisions_ptr", "*i32"),),
            (("BLOCK_C", launch.VERIFY_BLOCK_C), ("VOCAB_DIVISIBLE", vocab_divisible)),
        ),
    }
    return [
        KernelVariant(f"DFlashVerifySpread.{function}", "verify_spread", function, signature, constexprs, 4, 1, False)
        for function, (signature, constexprs) in kernels.items()
    ]


def verify_shortlist_variants(logits_dtype: str, vocab_divisible: bool = True) -> list[KernelVariant]:
    """The shortlist verification kernels (verify_shortlist.py), for one logits dtype, with the
    warps `verify_shortlist_launch` launches them with. Compiled and audited without a GPU
    (tests/test_kernel_audit.py); like the spread kernels, not TensorRT plugin nodes yet."""
    logits = ("logits_ptr", f"*{TORCH_TO_TRITON[logits_dtype]}")
    rows = (("temperature_ptr", "*fp32"), ("top_k_ptr", "*i64"))
    shortlist = (("shortlist_logit_ptr", "*fp32"), ("shortlist_index_ptr", "*i32"))
    chunks = (("chunk_max_ptr", "*fp32"), ("chunk_index_ptr", "*i32"))
    kept = (("kept_logit_ptr", "*fp32"), ("kept_index_ptr", "*i32"), ("threshold_ptr", "*i64"), ("flag_ptr", "*i32"))
    sampling = (("draft_probs_ptr", "*fp32"), *rows, ("top_p_ptr", "*fp32"), ("seed_ptr", "*i64"), ("start_ptr", "*i64"))
    num_chunks = tiles.cdiv(151936, tiles.SHORTLIST_CHUNK_V)  # Qwen3's vocabulary
    candidates = tiles.next_power_of_2(num_chunks * tiles.SHORTLIST)
    kernels = {
        "shortlist_maxima_kernel": (
            (logits, *rows, ("block", "i32"), ("vocab", "i32"), *chunks, ("top_keys_ptr", "*i64")),
            (("CHUNK_V", tiles.SHORTLIST_CHUNK_V), ("SHORTLIST", tiles.SHORTLIST), ("VOCAB_DIVISIBLE", vocab_divisible)),
            8,
        ),
        "shortlist_bound_kernel": (
            (*rows, ("top_keys_ptr", "*i64"), ("block", "i32"), ("num_chunks", "i32"), ("bound_ptr", "*i64")),
            (("TOP_KEYS", tiles.next_power_of_2(num_chunks * 2)), ("SHORTLIST", tiles.SHORTLIST)),
            1,
        ),
        "shortlist_select_kernel": (
            (logits, *rows, ("bound_ptr", "*i64"), ("block", "i32"), ("vocab", "i32"), *shortlist, ("cut_ptr", "*i64")),
            (("CHUNK_V", tiles.SHORTLIST_CHUNK_V), ("SHORTLIST", tiles.SHORTLIST), ("VOCAB_DIVISIBLE", vocab_divisible)),
            8,
        ),
        "shortlist_threshold_kernel": (
            (*rows, *shortlist, ("cut_ptr", "*i64"), ("block", "i32"), ("num_chunks", "i32"), *kept),
            (
                ("CANDIDATES", candidates),
                ("SHORTLIST", tiles.SHORTLIST),
                ("KEPT", tiles.SHORTLIST_KEPT),
                ("BLOCK_C", launch.VERIFY_BLOCK_C),
            ),
            8,
        ),
        "shortlist_sample_kernel": (
            (logits, *rows, ("top_p_ptr", "*fp32"), ("seed_ptr", "*i64"), ("positions_ptr", "*i64"), *chunks, *kept)
            + (("block", "i32"), ("vocab", "i32"), ("num_chunks", "i32"), ("tokens_ptr", "*i64"), ("probs_ptr", "*fp32")),
            (("BLOCK_V", launch.VERIFY_BLOCK_V), ("BLOCK_C", launch.VERIFY_BLOCK_C), ("KEPT", tiles.SHORTLIST_KEPT))
            + (("VOCAB_DIVISIBLE", vocab_divisible),),
            4,
        ),
        "shortlist_decide_kernel": (
            (logits, ("tokens_ptr", "*i64"), *sampling, *chunks, *kept, ("block", "i32"), ("vocab", "i32"))
            + (("has_draft_probs", "i32"), ("num_chunks", "i32"), ("decisions_ptr", "*i32")),
            (("BLOCK_V", launch.VERIFY_BLOCK_V), ("BLOCK_C", launch.VERIFY_BLOCK_C), ("KEPT", tiles.SHORTLIST_KEPT))
            + (("VOCAB_DIVISIBLE", vocab_divisible),),
            4,
        ),
    }
    return [
        KernelVariant(f"DFlashVerifyShortlist.{function}", "verify_shortlist", function, signature, constexprs, warps, 1, False)
        for function, (signature, constexprs, warps) in kernels.items()
    ]


# ----------------------------------------------------------------------------- DFlash V2
# The V2 drafter's kernels (`kernels/dflash2.py`) with the published V2 configuration as defaults:
# conv_kernel_size 2, conv_group_size 16, selector_top_k 16, selector_rank 256.


def dflash2_conv_variant(dtype: str, has_residual: bool, aligned: bool = True, kernel_size: int = 2, group: int = 16) -> KernelVariant:
    """DFlash2GroupedConv: x, delta and base in `dtype`; a float32 residual and output when
    `has_residual`, else x's dtype out; `aligned`: the hidden size is a multiple of the channel tile."""
    t = f"*{TORCH_TO_TRITON[dtype]}"
    signature = (
        ("x_ptr", t),
        ("delta_ptr", t),
        ("base_ptr", t),
        ("residual_ptr", "*fp32"),
        ("steps", "i32"),
        ("hidden", "i32"),
        ("out_ptr", "*fp32" if has_residual else t),
    )
    constexprs = (
        ("KERNEL_SIZE", kernel_size),
        ("GROUP", group),
        ("BLOCK_T", launch.MAX_BLOCK),
        ("BLOCK_C", dflash2_launch.CONV_BLOCK_C),
        ("HAS_RESIDUAL", has_residual),
        ("ALIGNED", aligned),
    )
    return KernelVariant("DFlash2GroupedConv", "dflash2", "grouped_conv_kernel", signature, constexprs, dflash2_launch.CONV_WARPS, 1, True)


def dflash2_topk_partials_variant(unary_dtype: str, vocab_divisible: bool = True, top_k: int = 16) -> KernelVariant:
    """DFlash2TopKPartials: the top-k of each vocabulary chunk of the unary logits."""
    signature = (("unary_ptr", f"*{TORCH_TO_TRITON[unary_dtype]}"), ("vocab", "i32"), ("values_ptr", "*fp32"), ("ids_ptr", "*i32"))
    constexprs = (
        ("TOP_K", top_k),
        ("BLOCK_K", dflash2_launch.block_k(top_k)),
        ("BLOCK_V", dflash2_launch.SELECT_BLOCK_V),
        ("CHUNK_V", dflash2_launch.SELECT_CHUNK_V),
        ("VOCAB_DIVISIBLE", vocab_divisible),
    )
    return KernelVariant("DFlash2TopKPartials", "dflash2", "topk_partials_kernel", signature, constexprs, 4, 1, False)


def dflash2_topk_merge_variant(top_k: int = 16) -> KernelVariant:
    """DFlash2TopKMerge: the top-k of the chunks' partials (float32 values, int32 ids in every case)."""
    signature = (("values_ptr", "*fp32"), ("ids_ptr", "*i32"), ("num_chunks", "i32"), ("cand_ptr", "*i64"), ("cand_unary_ptr", "*fp32"))
    constexprs = (("TOP_K", top_k), ("BLOCK_K", dflash2_launch.block_k(top_k)), ("BLOCK_M", dflash2_launch.SELECT_BLOCK_M))
    return KernelVariant("DFlash2TopKMerge", "dflash2", "topk_merge_kernel", signature, constexprs, 4, 1, False)


def dflash2_select_variant(dtype: str, top_k: int = 16, rank: int = 256) -> KernelVariant:
    """DFlash2CandidateSelect: the walk, with z and the codebooks in `dtype`."""
    t = f"*{TORCH_TO_TRITON[dtype]}"
    signature = (
        ("cand_ptr", "*i64"),
        ("cand_unary_ptr", "*fp32"),
        ("z_ptr", t),
        ("anchor_ptr", "*i64"),
        ("predecessor_ptr", t),
        ("successor_ptr", t),
        ("temperature_ptr", "*fp32"),
        ("seed_ptr", "*i64"),
        ("positions_ptr", "*i64"),
        ("steps", "i32"),
        ("tokens_ptr", "*i64"),
        ("probs_ptr", "*fp32"),
    )
    constexprs = (("TOP_K", top_k), ("BLOCK_K", dflash2_launch.block_k(top_k)), ("RANK", rank))
    return KernelVariant("DFlash2CandidateSelect", "dflash2", "candidate_select_kernel", signature, constexprs, 4, 1, False)


def dflash2_variants(
    dtype: str, aligned: Iterable[bool] = (True, False), kernel_size: int = 2, top_k: int = 16, rank: int = 256
) -> list[KernelVariant]:
    """Every V2 kernel a drafter with activations (and unary logits) in `dtype` launches; `aligned`
    lists the ALIGNED / VOCAB_DIVISIBLE values to build (hidden sizes of a multiple of 128 and
    vocabularies of a multiple of 16, and the others)."""
    variants = []
    for is_aligned in aligned:
        variants += [dflash2_conv_variant(dtype, has_residual, is_aligned, kernel_size) for has_residual in (False, True)]
        variants.append(dflash2_topk_partials_variant(dtype, is_aligned, top_k))
    return variants + [dflash2_topk_merge_variant(top_k), dflash2_select_variant(dtype, top_k, rank)]


def query_tiles(
    head_dim: int, blocks: Iterable[int], groups: Iterable[int], dtype: str = "bfloat16", shared_budget: int | None = None
) -> list[int]:
    """The query-tile sizes (BLOCK_M) that drafters with these block sizes, GQA groups and dtype use."""
    return sorted({launch.attention_config(head_dim, b, g, dtype, shared_budget).block_m for b in blocks for g in groups})


def kernel_variants(
    head_dims: Iterable[int] = (64, 128, 256),
    dtypes: Iterable[str] = ("bfloat16", "float16"),
    blocks: Iterable[int] = range(2, launch.MAX_BLOCK + 1),
    groups: Iterable[int] = (1, 2, 4, 8),
    fp8_kv_cache: bool = False,
    logits_dtypes: Iterable[str] = ("float32", "bfloat16", "float16"),
    target_head_dims: Iterable[tuple[int, int]] | None = None,
    target_groups: Iterable[int] | None = None,
    target_dtypes: Iterable[str] | None = None,
    target_sinks: Iterable[bool] = (False,),
    shared_budget: int | None = None,
    vocab_divisible: Iterable[bool] = (True, False),
    dflash2_dtypes: Iterable[str] = (),
) -> list[KernelVariant]:
    """Every kernel variant a drafter and its target in this space launch (default: the whole
    supported space, without attention-sink variants).

    The target's attention takes its (key, value) head dims, GQA groups and activation dtypes from
    `target_*`, defaulting to the drafter's (square head dims); its cache has the activation dtype.
    `target_sinks` lists the HAS_SINKS values to build: (True,) for gpt-oss, (False, True) for both.
    `shared_budget` bounds every tile's shared memory (default: the dtype's, `launch.shared_budget_for`).
    Each target variant comes with its KV-split form and the merges of its partials.
    `vocab_divisible` lists the verification kernels' VOCAB_DIVISIBLE values (vocabularies that are
    multiples of 16, and the others). `dflash2_dtypes`: the DFlash V2 drafter kernels
    (`dflash2_variants`) for these activation dtypes; none by default (a V1 drafter launches none).
    """
    blocks, groups = list(blocks), list(groups)
    variants = []
    for head_dim in head_dims:
        for dtype in dtypes:
            caches = [dtype] + (["float8_e4m3fn"] if fp8_kv_cache else [])
            for cache_dtype in caches:
                for block_m in query_tiles(head_dim, blocks, groups, dtype, shared_budget):
                    for variant in attention_variants(head_dim, dtype, cache_dtype, block_m, shared_budget=shared_budget):
                        if variant not in variants:
                            variants.append(variant)
    target_head_dims = list(target_head_dims) if target_head_dims is not None else [(d, d) for d in head_dims]
    target_groups = list(target_groups) if target_groups is not None else groups
    for head_dim_k, head_dim_v in target_head_dims:
        for dtype in target_dtypes if target_dtypes is not None else dtypes:
            for block_m in target_query_tiles(head_dim_k, head_dim_v, blocks, target_groups, dtype, shared_budget):
                for has_sinks in target_sinks:
                    for make in (target_attention_variant, target_attention_split_variant):
                        variant = make(head_dim_k, head_dim_v, dtype, dtype, block_m, {"sinks": has_sinks}, shared_budget)
                        if variant not in variants:
                            variants.append(variant)
            for block_m in target_merge_tiles(head_dim_v, blocks, target_groups, dtype):
                variant = target_merge_variant(head_dim_v, dtype, block_m)
                if variant not in variants:
                    variants.append(variant)
    for logits_dtype in logits_dtypes:
        for divisible in vocab_divisible:
            variants += [verify_partials_variant(logits_dtype, divisible), *verify_variants(logits_dtype, divisible)]
    variants.append(commit_variant())
    for dtype in dflash2_dtypes:
        variants += [variant for variant in dflash2_variants(dtype, tuple(vocab_divisible)) if variant not in variants]
    return variants


# a recipe's unquantized precision -> the activation dtype its kernels take ("bf16" -> "bfloat16")
PRECISION_DTYPES = {name: dtypes.torch_name(name) for name in dtypes.FLOATS}


@dataclasses.dataclass(frozen=True)
class KernelSpace:
    """The kernel variants one deployment launches (kernel_variants(**space.options()))."""

    arch: str  # the recipe GPU's kernel target
    head_dims: tuple[int, ...]
    dtypes: tuple[str, ...]
    blocks: tuple[int, ...]
    groups: tuple[int, ...]
    fp8_kv_cache: bool
    logits_dtypes: tuple[str, ...]
    target_head_dims: tuple[tuple[int, int], ...] = ()  # (key, value) per target attention layer kind
    target_groups: tuple[int, ...] = ()
    target_dtypes: tuple[str, ...] = ()
    target_sinks: tuple[bool, ...] = (False,)
    dflash2_dtypes: tuple[str, ...] = ()  # a DFlash V2 drafter's activation dtypes (its extra kernels)

    def options(self) -> dict:
        fields = dataclasses.asdict(self)
        fields.pop("arch")
        return fields

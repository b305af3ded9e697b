"""Which kernel variants a recipe's deployment launches: read from the model and GPU catalogs.

Why here and not in plugins/: the plugins package compiles and packages whatever kernel space it is
given; choosing that space from a recipe reads the catalogs, which belong to the build side.
"""

from __future__ import annotations

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.ops.kernels import launch
from trtllm_dflash.plugins.aot_variants import PRECISION_DTYPES, KernelSpace


def target_attention_shapes(model) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...]]:
    """((key, value) head dims, GQA groups) of a target's attention layers that the target-attention
    kernel covers. Layers it does not cover (linear attention, MLA, head dims like Gemma 4's 512)
    are left out: those layers keep the native path."""
    if model.is_mla:
        return (), ()
    dims, groups = set(), set()
    for layer in range(model.num_layers):
        shape = model.attention(layer)
        if shape.num_kv_heads == 0 or shape.head_dim not in launch.ATTENTION_HEAD_DIMS or model.num_heads % shape.num_kv_heads:
            continue
        dims.add((shape.head_dim, shape.head_dim))
        groups.add(model.num_heads // shape.num_kv_heads)
    return tuple(sorted(dims)), tuple(sorted(groups))


def recipe_kernel_space(recipe) -> KernelSpace:
    """Only what the recipe launches. The drafter: its head dim and GQA ratio (model catalog), the
    recipe's block size (and the shorter blocks of its draft-length schedule), the drafter's
    activation dtype, an FP8 KV cache if the recipe uses one, and the target's logits dtype. The
    target's attention: its layers' head dims and GQA ratios, its activation dtype and sinks (gpt-oss),
    over a cache in the activation dtype: the TensorRT engines keep the target's K/V in the graph's
    dtype even when the recipe's (TensorRT-LLM) KV cache is FP8 (see builder/stage_plan.py)."""
    from trtllm_dflash.catalog.gpus import resolve_gpu
    from trtllm_dflash.catalog.models import resolve_model

    model = resolve_model(recipe.model.name)
    drafter = model.drafter
    if drafter is None:
        raise DFlashError(
            f"the model catalog has no drafter shape for {recipe.model.name}", "pass --head-dim/--gqa-group/... instead of --recipe"
        )
    if recipe.gpu == "cpu":
        raise DFlashError(
            f"recipe {recipe.model.name}/cpu runs on CPU and needs no kernels", "pick a GPU recipe (`dflash-trt recipes list`)"
        )
    block = min(recipe.drafter.block_size, launch.MAX_BLOCK)
    blocks = {block} | {d + 1 for d in (recipe.drafter.draft_len_schedule or {}).values() if 0 < d and d + 1 < block}
    precision = recipe.precision
    dtype = PRECISION_DTYPES.get(precision.drafter, "bfloat16")  # FP8 drafter weights: BF16 activations
    logits = PRECISION_DTYPES.get(precision.weights, "bfloat16")
    target_dims, target_groups = target_attention_shapes(model)
    return KernelSpace(
        arch=resolve_gpu(recipe.gpu).sm_arch,
        head_dims=(drafter.head_dim,),
        dtypes=(dtype,),
        blocks=tuple(sorted(blocks)),
        groups=(drafter.num_heads // drafter.num_kv_heads,),
        fp8_kv_cache=precision.fp8_kv_cache,
        logits_dtypes=tuple(dict.fromkeys(("float32", logits))),
        target_head_dims=target_dims,
        target_groups=target_groups,
        target_dtypes=(logits,),  # the target's activations: BF16 unless its weights are FP16/FP32
        target_sinks=(model.attention_sinks,),
    )

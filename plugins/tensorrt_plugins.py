"""Registration of the DFlash plugins with TensorRT (`tensorrt.plugin`, TensorRT >= 10.9).

Each ONNX node of `onnx_nodes.py` is a Quickly Deployable Plugin `dflash::<op type>` with:
- `@trtp.register`: output shapes/dtypes from the inputs; the attention nodes' cache outputs are
  `aliased()` to the cache inputs, so the append (drafter) and the block write (target) happen in
  place inside the engine;
- `@trtp.aot_impl`: the Triton kernel compiled ahead of time for the build GPU (or read from a
  `dflash-trt plugins build` directory), with its grid, block size, shared memory and int32
  scalars. TensorRT embeds the PTX in the engine: no plugin library or Python at run time.

TensorRT cannot be installed on the CI machines (its wheels come from NVIDIA's index and need a
GPU), so `tensorrt` is imported only inside `register_plugins`. Everything the AOT implementation
computes (which kernel variant, grid, scalars, the compiled PTX) is `plan_launch` +
`aot.compile_kernel`: plain functions, tested on CPU with integer shapes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from trtllm_dflash.errors import DFlashError, MissingDependencyError
from trtllm_dflash.graphs import names
from trtllm_dflash.plugins import aot, onnx_nodes
from trtllm_dflash.plugins.kernels import launch

DTYPE_NAMES = ("float32", "float16", "bfloat16", "float8_e4m3fn", "int32", "int64")


def constant(value) -> int | None:
    """The value of a build-time-constant dimension (an int, or a TensorRT ShapeExpr), else None."""
    if isinstance(value, int):
        return value
    if getattr(value, "is_constant", False):
        return int(value.constant_value())
    return None


@dataclasses.dataclass
class Launch:
    """What TensorRT needs to launch one plugin node: the kernel variant, grid and int32 scalars."""

    variant: aot.KernelVariant
    grid: tuple  # (x, y, z): ints or shape expressions
    scalars: tuple  # the kernel's scalar parameters, in order: ints or shape expressions


def _required(value, what: str) -> int:
    known = constant(value)
    if known is None:
        raise DFlashError(f"the {what} must be fixed when the engine is built", "give that dimension one value in the optimization profile")
    return known


def plan_launch(node: str, shapes: dict, dtypes: dict, attributes: dict) -> Launch:
    """The launch of plugin `node` for input shapes (per input name) and dtypes (torch dtype names)."""
    if node in ("DFlashBlockAttention", "DFlashBlockAttentionSplit"):
        batch, block, heads, head_dim = shapes["q"]
        capacity, kv_heads = shapes["k_cache"][1], shapes["k_cache"][2]
        group = _required(heads, "number of query heads") // _required(kv_heads, "number of KV heads")
        tile_block = constant(block) or launch.MAX_BLOCK  # a dynamic block size gets the tile of the largest
        config = launch.attention_config(_required(head_dim, "head dimension"), tile_block, group)
        split = node == "DFlashBlockAttentionSplit"
        splits = int(attributes.get("kv_splits", 2)) if split else 1
        variants = aot.attention_variants(config.head_dim, dtypes["q"], dtypes["k_cache"], config.block_m)
        return Launch(
            variants[1 if split else 0],
            launch.attention_grid(batch, block, kv_heads, group, config.block_m, splits),
            launch.attention_scalars(block, shapes["k_ctx_new"][1], capacity, kv_heads, group,
                                     int(attributes.get("window", 0)), float(attributes.get("scale", 1.0)), splits),
        )
    if node == "DFlashAttentionMerge":
        batch, block, heads, head_dim = shapes["like"]
        kv_heads, splits = shapes["partial_out"][1], shapes["partial_out"][2]
        group = _required(heads, "number of query heads") // _required(kv_heads, "number of KV heads")
        config = launch.attention_config(_required(head_dim, "head dimension"), constant(block) or launch.MAX_BLOCK, group)
        variant = aot.attention_variants(config.head_dim, dtypes["like"], dtypes["like"], config.block_m)[2]
        return Launch(variant, launch.merge_grid(batch, block, kv_heads, group, config.block_m),
                      launch.merge_scalars(block, kv_heads, group, splits))
    if node == "DFlashTargetAttention":
        return _plan_target_attention(shapes, dtypes, attributes)
    if node == "DFlashVerifyPositions":
        batch, block, vocab = shapes["target_logits"]
        return Launch(aot.verify_variants(dtypes["target_logits"])[0], launch.verify_positions_grid(batch, block),
                      (block, vocab, int(attributes.get("has_draft_probs", 1))))
    if node == "DFlashVerifyCommit":
        batch, block = shapes["block_tokens"]
        return Launch(aot.commit_variant(), launch.verify_commit_grid(batch), (block, shapes["stop_ids"][1]))
    raise DFlashError(f"unknown DFlash plugin node {node!r}", f"use one of {', '.join(s.op_type for s in onnx_nodes.NODES)}")


def _plan_target_attention(shapes: dict, dtypes: dict, attributes: dict) -> Launch:
    """DFlashTargetAttention: one kernel variant per (key, value) head dims, dtypes, query tile and sinks flag."""
    batch, tokens, heads, head_dim_k = shapes["q"]
    capacity, kv_heads, head_dim_v = shapes["v_cache"][1], shapes["v_cache"][2], shapes["v_cache"][3]
    for name, expected in (("k_new", dtypes["q"]), ("v_new", dtypes["q"]), ("v_cache", dtypes["k_cache"]), (names.STARTS, "int64"), ("sinks", "float32")):
        if name in dtypes and dtypes[name] != expected:
            raise DFlashError(f"DFlashTargetAttention input {name} is {dtypes[name]}, expected {expected}", "export with onnx_nodes.custom_translation_table (it casts starts and sinks)")
    group = _required(heads, "number of query heads") // _required(kv_heads, "number of KV heads")
    head_dim_k, head_dim_v = _required(head_dim_k, "key head dimension"), _required(head_dim_v, "value head dimension")
    # a dynamic token dimension (verify and prefill in one engine) gets the tile of the largest block
    config = launch.target_attention_config(head_dim_k, head_dim_v, constant(tokens) or launch.MAX_BLOCK, group)
    variant = aot.target_attention_variant(head_dim_k, head_dim_v, dtypes["q"], dtypes["k_cache"], config.block_m,
                                           bool(int(attributes.get("has_sinks", 0))))
    return Launch(
        variant,
        launch.target_attention_grid(batch, tokens, kv_heads, group, config.block_m),
        launch.target_attention_scalars(tokens, capacity, kv_heads, group, int(attributes.get("window", 0)), float(attributes.get("scale", 1.0))),
    )


def compiled_kernel(variant: aot.KernelVariant, arch: aot.Arch, prebuilt: str | Path | None = None) -> tuple[str, str, int]:
    """(kernel name, PTX, shared memory bytes): from a `plugins build` directory if given, else compiled now."""
    if prebuilt is not None:
        manifest = aot.load_manifest(str(prebuilt))
        for entry in manifest["kernels"]:
            if entry["label"] == variant.label and entry["arch"] == arch.name:
                return entry["kernel"], (Path(prebuilt) / entry["ptx"]).read_text(), int(entry["shared_memory"])
        raise DFlashError(
            f"{prebuilt} has no kernel {variant.label} for {arch.name}",
            "rebuild it with `dflash-trt plugins build` for this drafter's head dim, dtype and block size",
        )
    kernel = aot.compile_kernel(variant, arch)
    return kernel.name, kernel.ptx, kernel.shared


def current_arch() -> aot.Arch:
    """The deployment target of the GPU TensorRT builds on."""
    import torch

    if not torch.cuda.is_available():
        raise MissingDependencyError("no CUDA GPU is visible to pick the plugin kernels' architecture", "pass arch=... explicitly")
    major, minor = torch.cuda.get_device_capability()
    by_capability = {a.capability: a for a in aot.ARCHES.values()}
    if major * 10 + minor not in by_capability:
        raise DFlashError(f"GPU sm_{major}{minor} has no plugin kernel target", f"supported: {', '.join(aot.ARCHES)}")
    return by_capability[major * 10 + minor]


def require_tensorrt():
    """`tensorrt` and `tensorrt.plugin`, or a clear message on how to get them."""
    try:
        import tensorrt
        import tensorrt.plugin as trtp
    except ImportError as exc:
        raise MissingDependencyError(
            f"TensorRT >= {aot.MIN_TENSORRT} with the `tensorrt.plugin` module is not installed ({exc})",
            "on a GPU machine run `pip install 'trtllm-dflash[trt]'` (TensorRT downloads from NVIDIA's index)",
        ) from None
    version = tuple(int(x) for x in tensorrt.__version__.split(".")[:2])
    if version < tuple(int(x) for x in aot.MIN_TENSORRT.split(".")):
        raise MissingDependencyError(
            f"TensorRT {tensorrt.__version__} has no ahead-of-time Python plugins", f"install TensorRT >= {aot.MIN_TENSORRT}"
        )
    return tensorrt, trtp


_REGISTERED: dict[str, tuple] = {}


def register_plugins(arch: str | None = None, prebuilt: str | Path | None = None) -> list[str]:
    """Register every `dflash::` plugin with TensorRT's plugin registry; returns the plugin ids.

    Call before parsing an ONNX file with DFlash nodes. `arch` (e.g. "sm_90a") defaults to the
    GPU present; `prebuilt` is a `dflash-trt plugins build` output to take the PTX from.
    """
    trt, trtp = require_tensorrt()
    target = aot.parse_arches(arch)[0] if arch else current_arch()
    if _REGISTERED:
        if _REGISTERED["config"] != (target.name, str(prebuilt)):
            raise DFlashError("the DFlash plugins are already registered for another target in this process", "use one process per target")
        return [spec.plugin_id for spec in onnx_nodes.NODES]
    dtype_names = {
        trt.float32: "float32", trt.float16: "float16", trt.bfloat16: "bfloat16", trt.fp8: "float8_e4m3fn",
        trt.int32: "int32", trt.int64: "int64",
    }

    def aot_result(node: str, inputs: dict, attributes: dict):
        shapes = {name: tuple(desc.shape_expr) for name, desc in inputs.items()}
        dtypes = {name: dtype_names[desc.dtype] for name, desc in inputs.items()}
        plan = plan_launch(node, shapes, dtypes, attributes)
        name, ptx, shared = compiled_kernel(plan.variant, target, prebuilt)
        params = trtp.KernelLaunchParams()
        params.grid_x, params.grid_y, params.grid_z = plan.grid
        params.block_x = plan.variant.num_warps * 32
        params.shared_mem = shared
        scalars = trtp.SymIntExprs(len(plan.scalars))
        for i, value in enumerate(plan.scalars):
            scalars[i] = trtp.SymInt32(value)
        return name, ptx, params, scalars

    TensorDesc = trtp.TensorDesc

    @trtp.register("dflash::DFlashBlockAttention")
    def _attention_desc(q: TensorDesc, k_block: TensorDesc, v_block: TensorDesc, k_ctx_new: TensorDesc, v_ctx_new: TensorDesc,
                        new_counts: TensorDesc, k_cache: TensorDesc, v_cache: TensorDesc, cache_lens: TensorDesc,
                        scale: float, window: int) -> tuple[TensorDesc, TensorDesc, TensorDesc]:
        return q.like(), k_cache.aliased(), v_cache.aliased()

    @trtp.aot_impl("dflash::DFlashBlockAttention")
    def _attention_aot(q, k_block, v_block, k_ctx_new, v_ctx_new, new_counts, k_cache, v_cache, cache_lens, scale: float, window: int, outputs, tactic):
        inputs = dict(q=q, k_ctx_new=k_ctx_new, k_cache=k_cache)
        return aot_result("DFlashBlockAttention", inputs, dict(scale=scale, window=window))

    @trtp.register("dflash::DFlashBlockAttentionSplit")
    def _split_desc(q: TensorDesc, k_block: TensorDesc, v_block: TensorDesc, k_ctx_new: TensorDesc, v_ctx_new: TensorDesc,
                    new_counts: TensorDesc, k_cache: TensorDesc, v_cache: TensorDesc, cache_lens: TensorDesc,
                    scale: float, window: int, kv_splits: int) -> tuple[TensorDesc, TensorDesc, TensorDesc, TensorDesc]:
        b, block, heads, head_dim = q.shape_expr
        kv_heads = k_cache.shape_expr[2]
        rows = block * (heads // kv_heads)
        partial_out = trtp.from_shape_expr((b, kv_heads, kv_splits, rows, head_dim), dtype=trt.float32)
        partial_lse = trtp.from_shape_expr((b, kv_heads, kv_splits, rows), dtype=trt.float32)
        return partial_out, partial_lse, k_cache.aliased(), v_cache.aliased()

    @trtp.aot_impl("dflash::DFlashBlockAttentionSplit")
    def _split_aot(q, k_block, v_block, k_ctx_new, v_ctx_new, new_counts, k_cache, v_cache, cache_lens, scale: float, window: int, kv_splits: int, outputs, tactic):
        inputs = dict(q=q, k_ctx_new=k_ctx_new, k_cache=k_cache)
        return aot_result("DFlashBlockAttentionSplit", inputs, dict(scale=scale, window=window, kv_splits=kv_splits))

    @trtp.register("dflash::DFlashAttentionMerge")
    def _merge_desc(partial_out: TensorDesc, partial_lse: TensorDesc, like: TensorDesc) -> TensorDesc:
        return like.like()

    @trtp.aot_impl("dflash::DFlashAttentionMerge")
    def _merge_aot(partial_out, partial_lse, like, outputs, tactic):
        return aot_result("DFlashAttentionMerge", dict(partial_out=partial_out, like=like), {})

    @trtp.register("dflash::DFlashTargetAttention")
    def _target_desc(q: TensorDesc, k_new: TensorDesc, v_new: TensorDesc, k_cache: TensorDesc, v_cache: TensorDesc,
                     starts: TensorDesc, sinks: TensorDesc, scale: float, window: int, has_sinks: int) -> tuple[TensorDesc, TensorDesc, TensorDesc]:
        b, tokens, heads, _ = q.shape_expr
        out = trtp.from_shape_expr((b, tokens, heads, v_cache.shape_expr[3]), dtype=q.dtype)  # q's dtype, v's head dim
        return out, k_cache.aliased(), v_cache.aliased()

    @trtp.aot_impl("dflash::DFlashTargetAttention")
    def _target_aot(q, k_new, v_new, k_cache, v_cache, starts, sinks, scale: float, window: int, has_sinks: int, outputs, tactic):
        inputs = dict(q=q, k_new=k_new, v_new=v_new, k_cache=k_cache, v_cache=v_cache, starts=starts, sinks=sinks)
        return aot_result("DFlashTargetAttention", inputs, dict(scale=scale, window=window, has_sinks=has_sinks))

    @trtp.register("dflash::DFlashVerifyPositions")
    def _positions_desc(target_logits: TensorDesc, block_tokens: TensorDesc, draft_probs: TensorDesc, temperature: TensorDesc,
                        top_k: TensorDesc, top_p: TensorDesc, seed: TensorDesc, start: TensorDesc, has_draft_probs: int) -> TensorDesc:
        b, block, _ = target_logits.shape_expr
        return trtp.from_shape_expr((b, block, 2), dtype=trt.int32)

    @trtp.aot_impl("dflash::DFlashVerifyPositions")
    def _positions_aot(target_logits, block_tokens, draft_probs, temperature, top_k, top_p, seed, start, has_draft_probs: int, outputs, tactic):
        return aot_result("DFlashVerifyPositions", dict(target_logits=target_logits), dict(has_draft_probs=has_draft_probs))

    @trtp.register("dflash::DFlashVerifyCommit")
    def _commit_desc(decisions: TensorDesc, block_tokens: TensorDesc, start: TensorDesc, stop_ids: TensorDesc) -> TensorDesc:
        return trtp.from_shape_expr((block_tokens.shape_expr[0], 5), dtype=trt.int64)

    @trtp.aot_impl("dflash::DFlashVerifyCommit")
    def _commit_aot(decisions, block_tokens, start, stop_ids, outputs, tactic):
        return aot_result("DFlashVerifyCommit", dict(block_tokens=block_tokens, stop_ids=stop_ids), {})

    _REGISTERED["config"] = (target.name, str(prebuilt))
    return [spec.plugin_id for spec in onnx_nodes.NODES]


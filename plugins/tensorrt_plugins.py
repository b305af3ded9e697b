"""Registration of the DFlash plugins with TensorRT (`tensorrt.plugin`, TensorRT >= 10.9).

Each ONNX node of `onnx_nodes.py` is a Quickly Deployable Plugin `dflash::<op type>` with:
- `@trtp.register`: output shapes/dtypes from the inputs; the attention nodes' cache outputs are
  `aliased()` to the cache inputs, so the append (drafter) and the block write (target) happen in
  place inside the engine. Its parameters are the node's: every input a TensorDesc, every attribute
  a field typed by its default (`NodeSpec.attributes`, for the attention nodes from
  `attention_options`), so a new attention option needs no change here;
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
import inspect
from pathlib import Path

from trtllm_dflash.contracts import dtypes as dtype_table  # `dtypes` here names a launch's {input: dtype}
from trtllm_dflash.contracts import names
from trtllm_dflash.errors import DFlashError, MissingDependencyError
from trtllm_dflash.ops.attention_options import with_signature
from trtllm_dflash.ops.kernels import dflash2_launch, launch
from trtllm_dflash.plugins import aot, onnx_nodes

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
        config = launch.attention_config(_required(head_dim, "head dimension"), tile_block, group, dtypes["q"])
        split = node == "DFlashBlockAttentionSplit"
        splits = int(attributes.get("kv_splits", 2)) if split else 1
        options = onnx_nodes.BLOCK_OPTIONS
        _check_option_dtypes(node, options, dtypes)
        variants = aot.attention_variants(config.head_dim, dtypes["q"], dtypes["k_cache"], config.block_m, options.present_in(attributes))
        return Launch(
            variants[1 if split else 0],
            launch.attention_grid(batch, block, kv_heads, group, config.block_m, splits),
            launch.attention_scalars(block, shapes["k_ctx_new"][1], capacity, kv_heads, group, attributes, splits),
        )
    if node == "DFlashAttentionMerge":
        # the partials' head dim: the drafter's, or a target's value head dim (its queries' may differ)
        batch, block, heads = shapes["like"][:3]
        kv_heads, splits, head_dim = shapes["partial_out"][1], shapes["partial_out"][2], shapes["partial_out"][4]
        group = _required(heads, "number of query heads") // _required(kv_heads, "number of KV heads")
        head_dim = _required(head_dim, "head dimension")
        block_m = launch.merge_block_m(head_dim, constant(block), group, dtypes["like"])
        variant = aot.attention_variants(head_dim, dtypes["like"], dtypes["like"], block_m)[2]
        return Launch(
            variant, launch.merge_grid(batch, block, kv_heads, group, block_m), launch.merge_scalars(block, kv_heads, group, splits)
        )
    if node in ("DFlashTargetAttention", "DFlashTargetAttentionSplit"):
        return _plan_target_attention(node, shapes, dtypes, attributes)
    if node == "DFlashVerifyPartials":
        batch, block, vocab = shapes["target_logits"]
        divisible = launch.verify_vocab_divisible(constant(vocab))
        return Launch(
            aot.verify_partials_variant(dtypes["target_logits"], divisible),
            launch.verify_partials_grid(batch, block, vocab),
            (block, vocab),
        )
    if node == "DFlashVerifyPositions":
        batch, block, vocab = shapes["target_logits"]
        divisible = launch.verify_vocab_divisible(constant(vocab))
        return Launch(
            aot.verify_variants(dtypes["target_logits"], divisible)[0],
            launch.verify_positions_grid(batch, block),
            (block, vocab, int(attributes.get("has_draft_probs", 1)), shapes["chunk_max"][2]),
        )
    if node == "DFlashVerifyCommit":
        batch, block = shapes["block_tokens"]
        return Launch(aot.commit_variant(), launch.verify_commit_grid(batch), (block, shapes["stop_ids"][1]))
    if node.startswith("DFlash2"):
        return _plan_dflash2(node, shapes, dtypes, attributes)
    raise DFlashError(f"unknown DFlash plugin node {node!r}", f"use one of {', '.join(s.op_type for s in onnx_nodes.NODES)}")


def _check_option_dtypes(node: str, options, dtypes: dict) -> None:
    """Tensor options reach the kernel as float32 (the exporter casts them)."""
    for option in options.tensors:
        if option.name in dtypes and dtypes[option.name] != option.dtype:
            raise DFlashError(
                f"{node} input {option.name} is {dtypes[option.name]}, expected {option.dtype}",
                "export with onnx_nodes.custom_translation_table (it casts the option inputs)",
            )


def _plan_target_attention(node: str, shapes: dict, dtypes: dict, attributes: dict) -> Launch:
    """DFlashTargetAttention(Split): one kernel variant per (key, value) head dims, dtypes, query tile and
    tensor options present; the split form's count is the node's `kv_splits`."""
    batch, tokens, heads, head_dim_k = shapes["q"]
    capacity, kv_heads, head_dim_v = shapes["v_cache"][1], shapes["v_cache"][2], shapes["v_cache"][3]
    for name, expected in (("k_new", dtypes["q"]), ("v_new", dtypes["q"]), ("v_cache", dtypes["k_cache"]), (names.STARTS, "int64")):
        if name in dtypes and dtypes[name] != expected:
            raise DFlashError(
                f"{node} input {name} is {dtypes[name]}, expected {expected}",
                "export with onnx_nodes.custom_translation_table (it casts starts and sinks)",
            )
    options = onnx_nodes.TARGET_OPTIONS
    _check_option_dtypes(node, options, dtypes)
    group = _required(heads, "number of query heads") // _required(kv_heads, "number of KV heads")
    head_dim_k, head_dim_v = _required(head_dim_k, "key head dimension"), _required(head_dim_v, "value head dimension")
    # a dynamic token dimension (verify and prefill in one engine) gets the tile of the largest block
    config = launch.target_attention_config(head_dim_k, head_dim_v, constant(tokens) or launch.MAX_BLOCK, group, dtypes["q"])
    make_variant = aot.target_attention_split_variant if node == "DFlashTargetAttentionSplit" else aot.target_attention_variant
    variant = make_variant(head_dim_k, head_dim_v, dtypes["q"], dtypes["k_cache"], config.block_m, options.present_in(attributes))
    if node == "DFlashTargetAttention":
        return Launch(
            variant,
            launch.target_attention_grid(batch, tokens, kv_heads, group, config.block_m),
            launch.target_attention_scalars(tokens, capacity, kv_heads, group, attributes),
        )
    splits = int(attributes.get("kv_splits", 2))
    return Launch(
        variant,
        launch.target_attention_grid(batch, tokens, kv_heads, group, config.block_m, splits),
        launch.target_attention_split_scalars(tokens, capacity, kv_heads, group, attributes, splits),
    )


def _same_dtypes(node: str, dtypes: dict, names_: tuple, expected: str) -> None:
    for name in names_:
        if name in dtypes and dtypes[name] != expected:
            raise DFlashError(
                f"{node} input {name} is {dtypes[name]}, expected {expected}",
                "export with onnx_nodes.custom_translation_table, with the drafter's tensors in one dtype",
            )


def _plan_dflash2(node: str, shapes: dict, dtypes: dict, attributes: dict) -> Launch:
    """The DFlash V2 nodes (`dflash2_nodes`): sizes the kernels are built for (hidden size, conv taps
    and groups, top-k, codebook rank) must be fixed when the engine is built."""
    if node == "DFlash2GroupedConv":
        *lead, steps, hidden = shapes["x"]
        kernel_size, groups = (_required(d, what) for d, what in zip(shapes["delta"][-2:], ("conv kernel size", "number of conv groups")))
        hidden = _required(hidden, "hidden size")
        has_residual = bool(int(attributes.get("has_residual", 1)))
        _same_dtypes(node, dtypes, ("delta", "base"), dtypes["x"])
        _same_dtypes(node, dtypes, ("residual",), "float32")
        blocks = 1
        for size in lead:
            blocks = blocks * size
        variant = aot.dflash2_conv_variant(dtypes["x"], has_residual, dflash2_launch.conv_aligned(hidden), kernel_size, hidden // groups)
        return Launch(variant, dflash2_launch.conv_grid(blocks, hidden), dflash2_launch.conv_scalars(steps, hidden))
    top_k = int(attributes.get("top_k", 16))
    if node == "DFlash2TopKPartials":
        batch, steps, vocab = shapes["unary"]
        variant = aot.dflash2_topk_partials_variant(dtypes["unary"], dflash2_launch.select_vocab_divisible(constant(vocab)), top_k)
        return Launch(variant, dflash2_launch.topk_partials_grid(batch * steps, vocab), (vocab,))
    if node == "DFlash2TopKMerge":
        batch, steps, chunks = shapes["partial_values"][:3]
        return Launch(aot.dflash2_topk_merge_variant(top_k), dflash2_launch.topk_merge_grid(batch * steps), (chunks,))
    if node == "DFlash2CandidateSelect":
        batch, steps, k = shapes["cand"]
        rank = _required(shapes["z"][2], "selector rank")
        _same_dtypes(node, dtypes, ("predecessor", "successor"), dtypes["z"])
        variant = aot.dflash2_select_variant(dtypes["z"], _required(k, "selector top-k"), rank)
        return Launch(variant, dflash2_launch.candidate_select_grid(batch), (steps,))
    raise DFlashError(f"unknown DFlash plugin node {node!r}", f"use one of {', '.join(s.op_type for s in onnx_nodes.NODES)}")


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
    dtype_names = {getattr(trt, d.tensorrt): d.torch for d in dtype_table.TABLE if d.tensorrt}  # trt.fp8: "float8_e4m3fn"

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

    for spec in onnx_nodes.NODES:
        _register_node(trtp, spec, _output_descs(trt, trtp, spec.op_type), aot_result)

    _REGISTERED["config"] = (target.name, str(prebuilt))
    return [spec.plugin_id for spec in onnx_nodes.NODES]


def _register_node(trtp, spec: onnx_nodes.NodeSpec, outputs, aot_result) -> None:
    """`@trtp.register` and `@trtp.aot_impl` for one node, with the parameters TensorRT reads from the
    functions' signatures: the node's inputs (TensorDesc), then its attributes typed by their defaults."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    tensors = [inspect.Parameter(name, kind, annotation=trtp.TensorDesc) for name in spec.inputs]
    fields = [inspect.Parameter(name, kind, annotation=type(default)) for name, default in spec.attributes.items()]
    returns = trtp.TensorDesc if len(spec.outputs) == 1 else tuple[(trtp.TensorDesc,) * len(spec.outputs)]

    def describe(*args, **kwargs):
        bound = register_signature.bind(*args, **kwargs)
        descs = {name: bound.arguments[name] for name in spec.inputs}
        return outputs(descs, {name: bound.arguments[name] for name in spec.attributes})

    def aot_impl(*args, **kwargs):
        bound = aot_signature.bind(*args, **kwargs)
        descs = {name: bound.arguments[name] for name in spec.inputs}
        return aot_result(spec.op_type, descs, {name: bound.arguments[name] for name in spec.attributes})

    register_signature = inspect.Signature(tensors + fields, return_annotation=returns)
    aot_signature = inspect.Signature(tensors + fields + [inspect.Parameter("outputs", kind), inspect.Parameter("tactic", kind)])
    trtp.register(spec.plugin_id)(with_signature(describe, register_signature))
    trtp.aot_impl(spec.plugin_id)(with_signature(aot_impl, aot_signature))


def _output_descs(trt, trtp, node: str):
    """The output TensorDescs of `node` from its input descs and attributes (by name)."""

    def attention(inputs: dict, attributes: dict):
        return inputs["q"].like(), inputs["k_cache"].aliased(), inputs["v_cache"].aliased()

    def attention_split(inputs: dict, attributes: dict):
        b, block, heads, head_dim = inputs["q"].shape_expr
        kv_heads, kv_splits = inputs["k_cache"].shape_expr[2], attributes["kv_splits"]
        rows = block * (heads // kv_heads)
        partial_out = trtp.from_shape_expr((b, kv_heads, kv_splits, rows, head_dim), dtype=trt.float32)
        partial_lse = trtp.from_shape_expr((b, kv_heads, kv_splits, rows), dtype=trt.float32)
        return partial_out, partial_lse, inputs["k_cache"].aliased(), inputs["v_cache"].aliased()

    def merge(inputs: dict, attributes: dict):
        b, block, heads = inputs["like"].shape_expr[:3]  # the queries; the head dim is the partials' (a target's Dv)
        return trtp.from_shape_expr((b, block, heads, inputs["partial_out"].shape_expr[4]), dtype=inputs["like"].dtype)

    def target_attention(inputs: dict, attributes: dict):
        b, tokens, heads, _ = inputs["q"].shape_expr
        out = trtp.from_shape_expr((b, tokens, heads, inputs["v_cache"].shape_expr[3]), dtype=inputs["q"].dtype)  # q's dtype, v's head dim
        return out, inputs["k_cache"].aliased(), inputs["v_cache"].aliased()

    def target_attention_split(inputs: dict, attributes: dict):
        b, tokens, heads, _ = inputs["q"].shape_expr
        kv_heads, head_dim_v, kv_splits = inputs["v_cache"].shape_expr[2], inputs["v_cache"].shape_expr[3], attributes["kv_splits"]
        rows = tokens * (heads // kv_heads)
        partial_out = trtp.from_shape_expr((b, kv_heads, kv_splits, rows, head_dim_v), dtype=trt.float32)
        partial_lse = trtp.from_shape_expr((b, kv_heads, kv_splits, rows), dtype=trt.float32)
        return partial_out, partial_lse, inputs["k_cache"].aliased(), inputs["v_cache"].aliased()

    def verify_partials(inputs: dict, attributes: dict):
        b, block, vocab = inputs["target_logits"].shape_expr
        shape = (b, block, launch.verify_num_chunks(vocab))
        return trtp.from_shape_expr(shape, dtype=trt.float32), trtp.from_shape_expr(shape, dtype=trt.int32)

    def verify_positions(inputs: dict, attributes: dict):
        b, block, _ = inputs["target_logits"].shape_expr
        return trtp.from_shape_expr((b, block, 2), dtype=trt.int32)

    def verify_commit(inputs: dict, attributes: dict):
        return trtp.from_shape_expr((inputs["block_tokens"].shape_expr[0], 5), dtype=trt.int64)

    def dflash2_conv(inputs: dict, attributes: dict):
        dtype = trt.float32 if int(attributes["has_residual"]) else inputs["x"].dtype
        return trtp.from_shape_expr(tuple(inputs["x"].shape_expr), dtype=dtype)

    def dflash2_topk_partials(inputs: dict, attributes: dict):
        b, steps, vocab = inputs["unary"].shape_expr
        shape = (b, steps, dflash2_launch.select_num_chunks(vocab), attributes["top_k"])
        return trtp.from_shape_expr(shape, dtype=trt.float32), trtp.from_shape_expr(shape, dtype=trt.int32)

    def dflash2_topk_merge(inputs: dict, attributes: dict):
        b, steps = inputs["partial_values"].shape_expr[:2]
        shape = (b, steps, attributes["top_k"])
        return trtp.from_shape_expr(shape, dtype=trt.int64), trtp.from_shape_expr(shape, dtype=trt.float32)

    def dflash2_candidate_select(inputs: dict, attributes: dict):
        b, steps, k = inputs["cand"].shape_expr
        return trtp.from_shape_expr((b, steps), dtype=trt.int64), trtp.from_shape_expr((b, steps, k), dtype=trt.float32)

    return {
        "DFlashBlockAttention": attention,
        "DFlashBlockAttentionSplit": attention_split,
        "DFlashAttentionMerge": merge,
        "DFlashTargetAttention": target_attention,
        "DFlashTargetAttentionSplit": target_attention_split,
        "DFlashVerifyPartials": verify_partials,
        "DFlashVerifyPositions": verify_positions,
        "DFlashVerifyCommit": verify_commit,
        "DFlash2GroupedConv": dflash2_conv,
        "DFlash2TopKPartials": dflash2_topk_partials,
        "DFlash2TopKMerge": dflash2_topk_merge,
        "DFlash2CandidateSelect": dflash2_candidate_select,
    }[node]

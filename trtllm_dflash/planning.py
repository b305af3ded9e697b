"""Memory planning: will a model + drafter fit on N GPUs of a kind, at which precision, for how many users?

The budget per GPU is computed from published shapes (catalog/models.py) and datasheet memory
(catalog/gpus.py), with no torch import, so `dflash-trt plan` and `build --dry-run` answer in
well under a second. Every figure is an explicit formula (see the docstrings and docs/recipes.md);
the estimates (activations, CUDA graphs, runtime reserve) use named constants below.

Combinations that cannot work are refused with the reason and the nearest combination that
does: NVFP4 on Hopper, FP8 below SM 8.9, too few GPUs, or a model that does not fit at all.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from trtllm_dflash.catalog.families import choose_runtime
from trtllm_dflash.catalog.gpus import CPU, GPUSpec, gpus_supporting, resolve_gpu
from trtllm_dflash.catalog.models import ModelSpec, resolve_model
from trtllm_dflash.errors import PlanRefusedError, RecipeError

GIB = 1024**3
MIB = 1024**2

# Bytes per stored element. NVFP4: 4-bit values + one FP8 scale per 16 (4.5 bits);
# MXFP4: 4-bit values + one 8-bit power-of-two scale per 32 (4.25 bits).
BYTES_PER_ELEMENT = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "nvfp4": 4.5 / 8, "mxfp4": 4.25 / 8}
ACTIVATION_BYTES = 2  # activations run in BF16/FP16 on GPUs
LOGIT_BYTES = 4  # verification compares FP32 logits at every block position

# Estimates (not measurements): keep them named so the arithmetic in the docs and tests is explicit.
WORKSPACE_BYTES = 256 * MIB  # cuBLAS / attention kernel workspace
CUDA_GRAPH_BYTES = 16 * MIB  # per captured graph (batch size x draft length)
RUNTIME_RESERVE_BYTES = 1 * GIB  # CUDA context, kernels, allocator slack
NCCL_RESERVE_BYTES = GIB // 2  # communication buffers when the model spans several GPUs
DEFAULT_KV_FRACTION = 0.90  # share of the remaining memory given to KV caches (trt / torch runtimes)
DEFAULT_CONTEXT = 8192
DEFAULT_MAX_BATCH = 64
GPU_COUNTS = (1, 2, 4, 8)


@dataclasses.dataclass(frozen=True)
class Precision:
    weights: str  # dense linear layers of the target
    experts: str  # MoE expert matrices (= weights for dense models)
    kv_cache: str
    drafter: str


@dataclasses.dataclass(frozen=True)
class Layout:
    num_gpus: int
    tp: int
    ep: int
    attention_dp: bool = False


@dataclasses.dataclass(frozen=True)
class BuildStep:
    """One stage `dflash-trt build` runs; `needs` lists what must be present (doctor checks them)."""

    name: str
    description: str
    needs: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Refusal:
    kind: str  # "precision", "layout", "too-few-gpus", "does-not-fit"
    problem: str
    fix: str


@dataclasses.dataclass(frozen=True)
class MemoryBudget:
    """Bytes per GPU."""

    target_weights: int
    drafter_weights: int
    activations: int
    cuda_graphs: int
    runtime_reserve: int
    kv_cache: int  # what is left for KV caches (after the runtime's free-memory fraction)
    capacity: int  # the GPU's memory

    @property
    def fixed(self) -> int:
        return self.target_weights + self.drafter_weights + self.activations + self.cuda_graphs + self.runtime_reserve


@dataclasses.dataclass(frozen=True)
class Plan:
    model: str
    checkpoint: str
    drafter: str | None
    block_size: int
    gpu: str
    runtime: str
    precision: Precision
    layout: Layout
    context: int
    max_batch_size: int
    max_num_tokens: int
    budget: MemoryBudget
    kv_bytes_per_token: int  # target, full-attention layers, per GPU
    kv_bytes_per_sequence: int  # target + drafter at `context`, per GPU
    drafter_kv_bytes_per_sequence: int
    max_concurrency: int
    runtime_reason: str
    attention: str  # dense / sliding / sinks / hybrid-linear / mla
    linear_state_bytes_per_sequence: int  # Gated DeltaNet state incl. rollback copies (in kv_bytes_per_sequence); 0 if none
    recipe: str | None
    steps: tuple[BuildStep, ...]
    refusals: tuple[Refusal, ...]
    notes: tuple[str, ...]
    placeholder_shapes: bool = False

    @property
    def ok(self) -> bool:
        return not self.refusals

    def check(self) -> "Plan":
        """Raise PlanRefusedError (one line: reason; nearest working combination) if refused."""
        if self.refusals:
            first = self.refusals[0]
            raise PlanRefusedError(first.problem, first.fix)
        return self

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["ok"] = self.ok
        out["budget"]["fixed"] = self.budget.fixed
        return out


# ----------------------------------------------------------------------------------------------
# The budget
# ----------------------------------------------------------------------------------------------

def bytes_of(count: int | float, precision: str) -> int:
    return int(round(count * BYTES_PER_ELEMENT[precision]))


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
        + bytes_of(p.expert_linear, precision.experts) // layout.tp
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


def linear_state_bytes_per_sequence(model: ModelSpec, tp: int, block_size: int) -> int:
    """Per GPU, one sequence: the Gated DeltaNet state of every linear layer, which does not grow with context.

    Per layer: recurrent num_v_heads x k_dim x v_dim (FP32) + conv (kernel-1) x conv_dim (BF16), heads split
    over tp; times (1 + block_size): speculative rollback keeps one state copy per block position (as
    SGLang's extra_buffer does) so that the state after any accepted prefix can be restored.
    """
    layers = model.linear_layers
    if not layers:
        return 0
    recurrent, conv = model.linear_state_elements()
    split = max(1, min(tp, model.linear_num_value_heads or 1))
    one = bytes_of(recurrent, LINEAR_STATE_PRECISION) // split + bytes_of(conv, LINEAR_CONV_PRECISION) // split
    return layers * one * (1 + block_size)


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


# ----------------------------------------------------------------------------------------------
# Choosing defaults, checking, refusing
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Config:
    model: ModelSpec
    gpu: GPUSpec | None  # None: CPU
    runtime: str
    precision: Precision
    layout: Layout
    context: int
    max_batch: int
    max_num_tokens: int
    block_size: int
    draft_lengths: frozenset[int]
    kv_fraction: float
    recipe: Any = None
    runtime_reason: str = ""


def _best_weights(gpu: GPUSpec | None) -> str:
    if gpu is None:
        return "fp32"
    return "nvfp4" if gpu.supports_nvfp4 else "fp8" if gpu.supports_fp8 else "bf16"


def _precision_for(model: ModelSpec, gpu: GPUSpec | None, quant: str | None, kv: str | None) -> Precision:
    """--quant sets the quantized weights; gpt-oss keeps its non-expert layers in BF16 and --quant picks the experts."""
    if gpu is None:
        default_kv, drafter = "fp32", "fp32"
    else:
        default_kv, drafter = ("fp8" if gpu.supports_fp8 else "bf16"), "bf16"
    if model.native_expert_precision != "bf16":  # gpt-oss: MXFP4 experts as shipped
        if gpu is None:
            native = "fp32"
        elif gpu.supports_nvfp4:
            native = "nvfp4"
        else:
            native = model.native_expert_precision if gpu.supports(model.native_expert_precision) else "bf16"
        experts = quant or native
        weights = "fp32" if gpu is None else "bf16"
    else:
        weights = quant or _best_weights(gpu)
        experts = weights
    return Precision(weights, experts, kv or default_kv, drafter)


def _default_layout(model: ModelSpec, num_gpus: int) -> Layout:
    ep = num_gpus if model.is_moe and model.num_experts % num_gpus == 0 else 1
    return Layout(num_gpus, num_gpus, ep)


def _precision_refusals(cfg: _Config) -> list[Refusal]:
    if cfg.gpu is None:
        return []
    out = []
    p = cfg.precision
    checks = [("weights", p.weights), ("experts", p.experts), ("KV cache", p.kv_cache), ("drafter", p.drafter)]
    for what, precision in checks:
        if what == "experts" and not cfg.model.is_moe:
            continue
        if precision == "mxfp4" and cfg.model.native_expert_precision != "mxfp4":
            out.append(Refusal("precision", f"mxfp4 is the shipped format of gpt-oss experts, not a target for {cfg.model.name}",
                               "use --quant nvfp4 (Blackwell), fp8 (SM >= 8.9) or bf16"))
            continue
        if precision == "mxfp4" and what != "experts":
            out.append(Refusal("precision", f"mxfp4 applies to MoE experts only, not the {what}", "use bf16, fp8 or nvfp4"))
            continue
        if not cfg.gpu.supports(precision):
            gpus = ", ".join(g.name for g in gpus_supporting(precision))
            minimum = {"fp8": "8.9", "nvfp4": "10.0", "mxfp4": "9.0"}.get(precision, "?")
            out.append(Refusal(
                "precision",
                f"{precision} {what} need SM >= {minimum}, and {cfg.gpu.name} is SM {cfg.gpu.compute_capability_str}",
                f"GPUs that run {precision}: {gpus}",
            ))
    return out


def _layout_refusals(cfg: _Config) -> list[Refusal]:
    model, layout = cfg.model, cfg.layout
    out = []
    if cfg.gpu is None:
        if layout.num_gpus != 1:
            out.append(Refusal("layout", "the CPU (torch) runtime runs on one device", "drop --num-gpus"))
        return out
    if layout.num_gpus > cfg.gpu.max_gpus_per_node:
        out.append(Refusal("layout", f"{layout.num_gpus} GPUs exceed one {cfg.gpu.name} node ({cfg.gpu.max_gpus_per_node})",
                           f"use --num-gpus {cfg.gpu.max_gpus_per_node} or fewer (multi-node is not planned)"))
    if cfg.runtime in ("trt", "torch") and layout.num_gpus > 1:
        out.append(Refusal("layout", f"runtime {cfg.runtime} runs on one GPU, not {layout.num_gpus}",
                           "use --num-gpus 1, or --runtime trtllm (TensorRT-LLM) for tensor/expert parallelism"))
    if model.num_heads % (1 if layout.attention_dp else layout.tp):
        out.append(Refusal("layout", f"tp={layout.tp} does not divide {model.num_heads} attention heads",
                           "use a tp that divides the head count"))
    if model.is_moe and model.num_experts % layout.ep:
        out.append(Refusal("layout", f"ep={layout.ep} does not divide {model.num_experts} experts",
                           "use an ep that divides the expert count"))
    if not model.is_moe and layout.ep != 1:
        out.append(Refusal("layout", f"{model.name} has no experts; ep must be 1", "drop ep from the recipe"))
    return out


def _budget(cfg: _Config) -> tuple[MemoryBudget, int, int, int, int]:
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
        graphs = cuda_graph_bytes(cfg.max_batch, set(cfg.draft_lengths)) if _uses_cuda_graphs(cfg) else 0
        reserve = RUNTIME_RESERVE_BYTES + (NCCL_RESERVE_BYTES if layout.num_gpus > 1 else 0)
    fixed = weights + drafter + activations + graphs + reserve
    kv_budget = max(0, int((capacity - fixed) * cfg.kv_fraction))
    # Growth per token of context: the full-attention layers (sliding layers stop at their window).
    full_per_token = model.num_layers * model.mla_kv_per_token() if model.is_mla else sum(
        2 * kv_heads_per_gpu(model.attention(i).num_kv_heads, layout.tp) * model.attention(i).head_dim
        for i in range(model.num_layers) if not model.attention(i).window
    )
    target_seq = kv_bytes_per_sequence(model, cfg.context, cfg.precision.kv_cache, layout.tp)
    target_seq += linear_state_bytes_per_sequence(model, layout.tp, cfg.block_size)
    drafter_seq = drafter_kv_bytes_per_sequence(model, cfg.context, cfg.precision.kv_cache)
    budget = MemoryBudget(weights, drafter, activations, graphs, reserve, kv_budget, capacity)
    return budget, bytes_of(full_per_token, cfg.precision.kv_cache), target_seq, drafter_seq, kv_budget


def _uses_cuda_graphs(cfg: _Config) -> bool:
    if cfg.runtime == "trtllm":
        return cfg.recipe is None or cfg.recipe.trtllm is None or cfg.recipe.trtllm.cuda_graph is not None
    if cfg.runtime == "trt":
        return cfg.recipe is None or cfg.recipe.trt is None or cfg.recipe.trt.cuda_graphs
    return False


def _max_concurrency(cfg: _Config) -> tuple[MemoryBudget, int, int, int, int]:
    budget, per_token, target_seq, drafter_seq, kv_budget = _budget(cfg)
    per_seq = target_seq + drafter_seq
    concurrency = kv_budget // per_seq if per_seq and budget.fixed < budget.capacity else 0
    return budget, per_token, target_seq, drafter_seq, int(concurrency)


def _fits(cfg: _Config) -> bool:
    return not _precision_refusals(cfg) and not _layout_refusals(cfg) and _max_concurrency(cfg)[-1] >= 1


def _with(cfg: _Config, **changes: Any) -> _Config:
    return dataclasses.replace(cfg, **changes)


def _nearest(cfg: _Config) -> tuple[str, _Config] | None:
    """The closest combination that works: more GPUs first, then lower precisions, then both."""
    gpu = cfg.gpu
    if gpu is None:
        return None
    counts = [n for n in GPU_COUNTS if n <= gpu.max_gpus_per_node]
    more = [n for n in counts if n > cfg.layout.num_gpus]
    lower = {"bf16": ["fp8", "nvfp4"], "fp16": ["fp8", "nvfp4"], "fp8": ["nvfp4"], "nvfp4": [], "mxfp4": ["nvfp4"]}
    current = cfg.precision.experts if cfg.model.native_expert_precision != "bf16" else cfg.precision.weights
    quants = [q for q in lower.get(current, []) if gpu.supports(q)]
    candidates: list[tuple[str, _Config]] = []
    for n in more:
        runtime = "trtllm" if n > 1 else cfg.runtime
        candidates.append((f"--num-gpus {n}" + (" --runtime trtllm" if runtime != cfg.runtime else ""),
                           _with(cfg, layout=_default_layout(cfg.model, n), runtime=runtime)))
    for q in quants:
        candidates.append((f"--quant {q}", _with(cfg, precision=_precision_for(cfg.model, gpu, q, cfg.precision.kv_cache))))
    for q in quants:
        for n in more:
            candidates.append((f"--quant {q} --num-gpus {n}" + (" --runtime trtllm" if cfg.runtime != "trtllm" else ""), _with(
                cfg, precision=_precision_for(cfg.model, gpu, q, cfg.precision.kv_cache),
                layout=_default_layout(cfg.model, n), runtime="trtllm")))
    if cfg.precision.kv_cache != "fp8" and gpu.supports_fp8:
        candidates.append(("--kv-cache fp8", _with(cfg, precision=dataclasses.replace(cfg.precision, kv_cache="fp8"))))
    shorter = [c for c in (cfg.context // 2, cfg.context // 4, cfg.context // 8) if c >= 1024]
    for context in shorter:
        candidates.append((f"--context {context}", _with(cfg, context=context)))
    for label, candidate in candidates:
        if _fits(candidate):
            return label, candidate
    return None


def _precision_alternative(cfg: _Config) -> tuple[str, _Config] | None:
    """For a precision the GPU lacks: the closest precisions it has (weights, then KV cache), same GPU count first."""
    gpu = cfg.gpu
    if gpu is None:
        return None
    p = cfg.precision
    wanted = p.experts if cfg.model.native_expert_precision != "bf16" else p.weights
    fallback = {"nvfp4": ["fp8", "bf16"], "fp8": ["bf16"], "mxfp4": ["bf16"]}
    options = [wanted] if gpu.supports(wanted) else [q for q in fallback.get(wanted, ["bf16"]) if gpu.supports(q)]
    kv = p.kv_cache if gpu.supports(p.kv_cache) else ("fp8" if gpu.supports_fp8 else "bf16")
    for q in options:
        flags = (f"--quant {q}" if q != wanted else "") + (f" --kv-cache {kv}" if kv != p.kv_cache else "")
        candidate = _with(cfg, precision=dataclasses.replace(_precision_for(cfg.model, gpu, q, kv), drafter=p.drafter
                                                             if gpu.supports(p.drafter) else "bf16"))
        if _fits(candidate):
            return flags.strip(), candidate
        nearest = _nearest(candidate)
        if nearest:
            return f"{flags.strip()} {nearest[0]}".strip(), nearest[1]
    return None


def _steps(cfg: _Config) -> tuple[BuildStep, ...]:
    model, p = cfg.model, cfg.precision
    drafter = model.drafter.checkpoint if model.drafter else "(none)"
    steps = [BuildStep("checkpoints", f"resolve the target {model.checkpoint} and the drafter {drafter}; validate the pair",
                       ("torch", "transformers"))]
    if cfg.runtime == "torch":
        steps.append(BuildStep("repository", "write the Triton model repository (Python backend, torch runtime, decoupled)"))
        return tuple(steps)
    gpu = cfg.gpu
    arch = f"{gpu.sm_arch} (SM {gpu.compute_capability_str})"
    calibration = cfg.recipe.quantization.calibration if cfg.recipe is not None else None
    samples = f"{calibration.num_samples} samples of {calibration.dataset}" if calibration else "builtin calibration text"
    quantized = {p.weights, p.experts} - {"bf16", "fp16", "fp32", model.native_expert_precision}
    if cfg.runtime == "trtllm":
        if model.native_expert_precision == "mxfp4" and p.experts == "nvfp4" and p.weights == "bf16":
            steps.append(BuildStep("quantize", "convert the MXFP4 experts to NVFP4 with ModelOpt (bit-exact, no calibration)",
                                   ("modelopt",)))
        elif quantized:
            needs = ("modelopt", "torch", "nvfp4-gpu") if "nvfp4" in quantized else ("modelopt", "torch")
            steps.append(BuildStep("quantize", f"ModelOpt {'/'.join(sorted(quantized))} PTQ of the target ({samples}); "
                                   "export a Hugging Face checkpoint TensorRT-LLM loads", needs))
        steps.append(BuildStep("config", f"write and validate the TensorRT-LLM LLM-API options (DFlash speculative_config, "
                               f"tp {cfg.layout.tp} / ep {cfg.layout.ep}, KV {p.kv_cache}); model.yaml and trtllm-serve config"))
        steps.append(BuildStep("repository", "write the Triton repository (tensorrt_llm Python model, decoupled)"))
        return tuple(steps)
    flavour = cfg.recipe.trt_flavour() if cfg.recipe is not None else gpu.trt_flavour
    plugins = cfg.recipe is None or cfg.recipe.trt is None or cfg.recipe.trt.use_plugins
    if quantized:
        needs = ("modelopt", "torch", "nvfp4-gpu") if "nvfp4" in quantized else ("modelopt", "torch")
        steps.append(BuildStep("quantize", f"ModelOpt {'/'.join(sorted(quantized))} PTQ of the target ({samples}); "
                               f"KV cache {p.kv_cache}; drafter stays {p.drafter}", needs))
    steps.append(BuildStep("export", f"ONNX graphs: target (prefill + verify, taps {list(model.drafter.target_layer_ids) if model.drafter else []}) "
                           f"and drafter block forward ({'DFlash plugin nodes' if plugins else 'plugin-free'})",
                           ("torch", "onnx")))
    if plugins:
        steps.append(BuildStep("plugins", f"compile the DFlash Triton kernels ahead of time for {gpu.sm_arch}", ("triton",)))
    engine_needs = ("tensorrt-rtx",) if flavour == "tensorrt-rtx" else ("tensorrt", "cuda-gpu")
    steps.append(BuildStep("engines", f"{flavour} engines for {arch}: batch <= {cfg.max_batch}, tokens <= {cfg.max_num_tokens}, "
                           f"sequence <= {cfg.context}, block {cfg.block_size}", engine_needs))
    steps.append(BuildStep("repository", "write the Triton model repository (Python backend driving the engines, decoupled)"))
    return tuple(steps)


def _make_plan(cfg: _Config, refusals: list[Refusal], notes: list[str]) -> Plan:
    budget, per_token, target_seq, drafter_seq, concurrency = _max_concurrency(cfg)
    model = cfg.model
    return Plan(
        model=model.name,
        checkpoint=model.checkpoint,
        drafter=model.drafter.checkpoint if model.drafter else None,
        block_size=cfg.block_size,
        gpu=cfg.gpu.name if cfg.gpu else CPU,
        runtime=cfg.runtime,
        precision=cfg.precision,
        layout=cfg.layout,
        context=cfg.context,
        max_batch_size=cfg.max_batch,
        max_num_tokens=cfg.max_num_tokens,
        budget=budget,
        kv_bytes_per_token=per_token,
        kv_bytes_per_sequence=target_seq + drafter_seq,
        drafter_kv_bytes_per_sequence=drafter_seq,
        max_concurrency=concurrency,
        runtime_reason=cfg.runtime_reason,
        attention=model.attention_kind,
        linear_state_bytes_per_sequence=linear_state_bytes_per_sequence(model, cfg.layout.tp, cfg.block_size),
        recipe=cfg.recipe.name if cfg.recipe is not None else None,
        steps=_steps(cfg),
        refusals=tuple(refusals),
        notes=tuple(notes),
        placeholder_shapes=model.placeholder,
    )


def _describe_fit(cfg: _Config) -> str:
    budget, *_, concurrency = _max_concurrency(cfg)
    gpu = cfg.gpu
    where = f"{cfg.layout.num_gpus}x {gpu.name}" if gpu else "this CPU machine"
    p = cfg.precision
    weights = f"{p.weights} weights" if p.weights == p.experts else f"{p.weights} weights, {p.experts} experts"
    return f"{where}, {weights}, KV {p.kv_cache}: {concurrency} sequence(s) of {cfg.context} tokens"


def plan_deployment(
    model: str,
    gpu: str,
    *,
    num_gpus: int | None = None,
    quant: str | None = None,
    kv_cache: str | None = None,
    context: int | None = None,
    max_batch: int | None = None,
    runtime: str | None = None,
    recipe: Any = None,
    use_recipe: bool = True,
) -> Plan:
    """Plan `model` on `gpu` (catalog names or aliases; 'cpu' for the torch runtime).

    Values come from `recipe` (a Recipe), else from the shipped recipe for model x gpu when there
    is one (use_recipe), else from defaults; explicit arguments override either. Never raises
    for a combination that cannot work: the Plan's `refusals` say why, with the nearest
    combination that does (call `.check()` to raise instead).
    """
    spec = resolve_model(model)
    gpu_spec = None if gpu.strip().lower() == CPU else resolve_gpu(gpu)
    if recipe is None and use_recipe:
        from trtllm_dflash.recipes import find_recipe

        try:
            recipe = find_recipe(spec.name, gpu)
        except RecipeError:
            recipe = None
    if quant is not None:
        quant = quant.lower()
        if quant not in BYTES_PER_ELEMENT:
            from trtllm_dflash.errors import UnknownNameError

            raise UnknownNameError(f"unknown precision {quant!r}", f"use one of: {', '.join(BYTES_PER_ELEMENT)}")
    if kv_cache is not None and kv_cache.lower() not in ("fp32", "bf16", "fp16", "fp8"):
        from trtllm_dflash.errors import UnknownNameError

        raise UnknownNameError(f"unknown KV cache precision {kv_cache!r}", "use bf16, fp16 or fp8")
    if runtime is not None and runtime not in ("trt", "trtllm", "torch"):
        from trtllm_dflash.errors import UnknownNameError

        raise UnknownNameError(f"unknown runtime {runtime!r}", "use trt, trtllm or torch")
    if runtime is not None and runtime != "torch" and gpu_spec is None:
        raise PlanRefusedError(f"runtime {runtime} needs a GPU; on cpu only the torch runtime runs", "use --runtime torch or name a GPU")
    if num_gpus is not None and num_gpus < 1:
        raise PlanRefusedError(f"--num-gpus must be >= 1, got {num_gpus}", "pass a positive GPU count")
    if context is not None and context < 1:
        raise PlanRefusedError(f"--context must be >= 1, got {context}", "pass a positive token count")

    notes: list[str] = []
    overridden = any(v is not None for v in (num_gpus, quant, kv_cache, context, max_batch, runtime))
    if recipe is not None:
        r = recipe
        if resolve_model(r.model.name).name != spec.name or r.gpu != (gpu_spec.name if gpu_spec else CPU):
            raise RecipeError(f"recipe {r.name} is for {r.model.name} on {r.gpu}, not {spec.name} on {gpu}",
                              "drop --model/--gpu, or pass the recipe written for them")
        precision = Precision(r.quantization.weights, r.quantization.experts, r.quantization.kv_cache, r.quantization.drafter)
        if quant is not None or kv_cache is not None:
            precision = _precision_for(spec, gpu_spec, quant or (r.quantization.experts if spec.native_expert_precision != "bf16"
                                                                  else r.quantization.weights), kv_cache or precision.kv_cache)
            precision = dataclasses.replace(precision, drafter=r.quantization.drafter)
        layout = Layout(r.parallelism.num_gpus, r.parallelism.tp, r.parallelism.ep, r.parallelism.attention_dp)
        if num_gpus is not None and num_gpus != layout.num_gpus:
            layout = _default_layout(spec, num_gpus)
        runtime = runtime or r.runtime
        block = r.drafter.block_size
        schedule = r.drafter.draft_len_schedule or {1: r.max_draft_len}
        draft_lengths = frozenset(schedule.values())
        kv_fraction = r.trtllm.kv_cache_free_gpu_memory_fraction if r.trtllm else DEFAULT_KV_FRACTION
        cfg = _Config(spec, gpu_spec, runtime, precision, layout, context or r.limits.max_seq_len,
                      max_batch or r.limits.max_batch_size, r.limits.tokens_per_step, block, draft_lengths, kv_fraction, r)
        notes.append(f"values from recipe {r.name}" + (" (some overridden on the command line)" if overridden else ""))
    else:
        precision = _precision_for(spec, gpu_spec, quant, kv_cache.lower() if kv_cache else None)
        block = spec.drafter.block_size if spec.drafter else 2
        if runtime is None:
            runtime = choose_runtime(spec.name, spec.family, None, num_gpus or 1, gpu_spec is not None).runtime
        batch = max_batch or DEFAULT_MAX_BATCH
        ctx = context or min(DEFAULT_CONTEXT, spec.max_position_embeddings)
        base = _Config(spec, gpu_spec, runtime, precision, _default_layout(spec, num_gpus or 1), ctx, batch,
                       min(ctx, DEFAULT_CONTEXT), block, frozenset({block - 1}),
                       DEFAULT_KV_FRACTION if runtime != "trtllm" else 0.85)
        cfg = base
        if num_gpus is None and gpu_spec is not None and not _fits(base):
            # Smallest GPU count that fits at this precision.
            for n in GPU_COUNTS:
                if n <= gpu_spec.max_gpus_per_node:
                    multi = "trtllm" if n > 1 and runtime != "torch" else runtime
                    candidate = _with(base, layout=_default_layout(spec, n), runtime=multi)
                    if _fits(candidate):
                        cfg = candidate
                        break
        notes.append(f"no shipped recipe for {spec.name} on {gpu_spec.name if gpu_spec else CPU}: defaults chosen")

    if spec.placeholder:
        notes.append("the demo checkpoint is not built yet: shapes are a placeholder")
    if cfg.context > spec.max_position_embeddings:
        notes.append(f"context {cfg.context} exceeds {spec.name}'s {spec.max_position_embeddings} positions")

    try:
        choice = choose_runtime(spec.name, spec.family, cfg.runtime, cfg.layout.num_gpus, cfg.gpu is not None)
    except PlanRefusedError as exc:
        cfg = _with(cfg, runtime_reason=f"refused: {exc.problem}")
        return _make_plan(cfg, [Refusal("runtime", exc.problem, exc.fix or "")], notes)
    cfg = _with(cfg, runtime_reason=choice.reason)
    if choice.note:
        notes.append(choice.note)

    refusals = _precision_refusals(cfg)
    if refusals:
        alternative = _precision_alternative(cfg)
        if alternative:
            label, candidate = alternative
            first = refusals[0]
            refusals[0] = Refusal(first.kind, first.problem, f"nearest that works: {label} ({_describe_fit(candidate)}); {first.fix}")
        return _make_plan(cfg, refusals, notes)
    refusals = _layout_refusals(cfg)
    if refusals:
        return _make_plan(cfg, refusals, notes)
    budget, _, target_seq, drafter_seq, concurrency = _max_concurrency(cfg)
    if concurrency < 1:
        need = budget.fixed + target_seq + drafter_seq
        where = f"{cfg.layout.num_gpus}x {cfg.gpu.name}" if cfg.gpu else "this machine"
        problem = (f"{spec.name} does not fit on {where}: needs {need / GIB:.1f} GiB per device "
                   f"(weights {budget.target_weights / GIB:.1f} GiB + drafter, activations, one sequence of "
                   f"{cfg.context} tokens) but has {budget.capacity / GIB:.1f} GiB")
        nearest = _nearest(cfg)
        if nearest:
            label, candidate = nearest
            kind = "too-few-gpus" if candidate.layout.num_gpus > cfg.layout.num_gpus else "does-not-fit"
            refusals = [Refusal(kind, problem, f"nearest that works: {label} ({_describe_fit(candidate)})")]
        else:
            fix = ("no GPU count or precision on this GPU fits; use a GPU with more memory" if cfg.gpu else
                   "use a machine with more memory, a smaller --context, or a GPU")
            refusals = [Refusal("does-not-fit", problem, fix)]
        return _make_plan(cfg, refusals, notes)
    if cfg.recipe is not None and concurrency < cfg.max_batch:
        notes.append(f"KV cache holds {concurrency} sequences of {cfg.context} tokens, fewer than max_batch_size "
                     f"{cfg.max_batch}: the scheduler will queue the rest (or shorten --context)")
    return _make_plan(cfg, [], notes)

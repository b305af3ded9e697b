"""Which precisions a GPU runs, the defaults per GPU, and the refusals for those it cannot run."""

from __future__ import annotations

from trtllm_dflash.catalog.gpus import GPUSpec, gpus_supporting
from trtllm_dflash.catalog.models import ModelSpec
from trtllm_dflash.planning.candidate import Candidate
from trtllm_dflash.planning.records import Refusal
from trtllm_dflash.recipes.precision import Precision


def best_weights(gpu: GPUSpec | None) -> str:
    if gpu is None:
        return "fp32"
    return "nvfp4" if gpu.supports_nvfp4 else "fp8" if gpu.supports_fp8 else "bf16"


def precision_for(model: ModelSpec, gpu: GPUSpec | None, quant: str | None, kv: str | None) -> Precision:
    """--quant sets the quantized weights; gpt-oss keeps its non-expert layers in BF16 and --quant picks the experts."""
    if gpu is None:
        default_kv, drafter = "fp32", "fp32"
    else:
        default_kv, drafter = ("fp8" if gpu.supports_fp8 else "bf16"), "bf16"
    if model.native_expert_precision != "bf16":  # gpt-oss: MXFP4 experts as shipped
        # TensorRT-LLM runs the published MXFP4 experts on Hopper and Blackwell (docs/build.md), so
        # that is the default; NVFP4 experts (a ModelOpt conversion + calibration on a GPU) are opt-in.
        if gpu is None:
            native = "fp32"
        else:
            native = model.native_expert_precision if gpu.supports(model.native_expert_precision) else "bf16"
        experts = quant or native
        weights = "fp32" if gpu is None else "bf16"
    else:
        weights = quant or best_weights(gpu)
        experts = weights
    return Precision(weights, experts, kv or default_kv, drafter, model.native_expert_precision)


def precision_refusals(cfg: Candidate) -> list[Refusal]:
    if cfg.gpu is None:
        return []
    out = []
    p = cfg.precision
    checks = [("weights", p.weights), ("experts", p.moe_experts), ("KV cache", p.kv_cache), ("drafter", p.drafter)]
    for what, precision in checks:
        if what == "experts" and not cfg.model.is_moe:
            continue
        if precision == "mxfp4" and cfg.model.native_expert_precision != "mxfp4":
            out.append(
                Refusal(
                    "precision",
                    f"mxfp4 is the shipped format of gpt-oss experts, not a target for {cfg.model.name}",
                    "use --quant nvfp4 (Blackwell), fp8 (SM >= 8.9) or bf16",
                )
            )
            continue
        if precision == "mxfp4" and what != "experts":
            out.append(Refusal("precision", f"mxfp4 applies to MoE experts only, not the {what}", "use bf16, fp8 or nvfp4"))
            continue
        if not cfg.gpu.supports(precision):
            gpus = ", ".join(g.name for g in gpus_supporting(precision))
            minimum = {"fp8": "8.9", "nvfp4": "10.0", "mxfp4": "9.0"}.get(precision, "?")
            out.append(
                Refusal(
                    "precision",
                    f"{precision} {what} need SM >= {minimum}, and {cfg.gpu.name} is SM {cfg.gpu.compute_capability_str}",
                    f"GPUs that run {precision}: {gpus}",
                )
            )
    return out

"""The nearest combination that works, named in a refusal: more GPUs, lower precision, shorter context."""

from __future__ import annotations

import dataclasses

from trtllm_dflash.backends import multi_gpu_backend
from trtllm_dflash.planning.candidate import Candidate, with_changes
from trtllm_dflash.planning.gpu_precision import precision_for, precision_refusals
from trtllm_dflash.planning.layout import default_layout, layout_refusals
from trtllm_dflash.planning.memory import GPU_COUNTS, max_concurrency


def fits(cfg: Candidate) -> bool:
    return not precision_refusals(cfg) and not layout_refusals(cfg) and max_concurrency(cfg)[-1] >= 1


def nearest_that_fits(cfg: Candidate) -> tuple[str, Candidate] | None:
    """The closest combination that works: more GPUs first, then lower precisions, then both."""
    gpu = cfg.gpu
    if gpu is None:
        return None
    counts = [n for n in GPU_COUNTS if n <= gpu.max_gpus_per_node]
    more = [n for n in counts if n > cfg.layout.num_gpus]
    lower = {"bf16": ["fp8", "nvfp4"], "fp16": ["fp8", "nvfp4"], "fp8": ["nvfp4"], "nvfp4": [], "mxfp4": ["nvfp4"]}
    current = cfg.precision.moe_experts if cfg.model.native_expert_precision != "bf16" else cfg.precision.weights
    quants = [q for q in lower.get(current, []) if gpu.supports(q)]
    candidates: list[tuple[str, Candidate]] = []
    multi = multi_gpu_backend()  # every count in `more` is above one GPU
    switch = f" --backend {multi}" if cfg.backend != multi else ""
    for n in more:
        candidates.append((f"--num-gpus {n}{switch}", with_changes(cfg, layout=default_layout(cfg.model, n), backend=multi)))
    for q in quants:
        candidates.append((f"--quant {q}", with_changes(cfg, precision=precision_for(cfg.model, gpu, q, cfg.precision.kv_cache))))
    for q in quants:
        for n in more:
            candidates.append(
                (
                    f"--quant {q} --num-gpus {n}{switch}",
                    with_changes(
                        cfg,
                        precision=precision_for(cfg.model, gpu, q, cfg.precision.kv_cache),
                        layout=default_layout(cfg.model, n),
                        backend=multi,
                    ),
                )
            )
    if cfg.precision.kv_cache != "fp8" and gpu.supports_fp8:
        candidates.append(("--kv-cache fp8", with_changes(cfg, precision=dataclasses.replace(cfg.precision, kv_cache="fp8"))))
    shorter = [c for c in (cfg.context // 2, cfg.context // 4, cfg.context // 8) if c >= 1024]
    for context in shorter:
        candidates.append((f"--context {context}", with_changes(cfg, context=context)))
    for label, candidate in candidates:
        if fits(candidate):
            return label, candidate
    return None


def precision_alternative(cfg: Candidate) -> tuple[str, Candidate] | None:
    """For a precision the GPU lacks: the closest precisions it has (weights, then KV cache), same GPU count first."""
    gpu = cfg.gpu
    if gpu is None:
        return None
    p = cfg.precision
    wanted = p.moe_experts if cfg.model.native_expert_precision != "bf16" else p.weights
    fallback = {"nvfp4": ["fp8", "bf16"], "fp8": ["bf16"], "mxfp4": ["bf16"]}
    options = [wanted] if gpu.supports(wanted) else [q for q in fallback.get(wanted, ["bf16"]) if gpu.supports(q)]
    kv = p.kv_cache if gpu.supports(p.kv_cache) else ("fp8" if gpu.supports_fp8 else "bf16")
    for q in options:
        flags = (f"--quant {q}" if q != wanted else "") + (f" --kv-cache {kv}" if kv != p.kv_cache else "")
        candidate = with_changes(
            cfg,
            precision=dataclasses.replace(precision_for(cfg.model, gpu, q, kv), drafter=p.drafter if gpu.supports(p.drafter) else "bf16"),
        )
        if fits(candidate):
            return flags.strip(), candidate
        nearest = nearest_that_fits(candidate)
        if nearest:
            return f"{flags.strip()} {nearest[0]}".strip(), nearest[1]
    return None


def describe_fit(cfg: Candidate) -> str:
    budget, *_, concurrency = max_concurrency(cfg)
    gpu = cfg.gpu
    where = f"{cfg.layout.num_gpus}x {gpu.name}" if gpu else "this CPU machine"
    p = cfg.precision
    weights = f"{p.weights} weights" if p.weights == p.moe_experts else f"{p.weights} weights, {p.moe_experts} experts"
    return f"{where}, {weights}, KV {p.kv_cache}: {concurrency} sequence(s) of {cfg.context} tokens"

"""`plan_deployment`: a model on N GPUs of a kind, with its budget, concurrency and refusals."""

from __future__ import annotations

import dataclasses
from typing import Any

from trtllm_dflash.backends import BACKEND_NAMES, get_backend, multi_gpu_backend
from trtllm_dflash.backends.choice import SUGGESTION_ORDER, choose_backend
from trtllm_dflash.catalog.families import family_spec
from trtllm_dflash.catalog.gpus import CPU, resolve_gpu
from trtllm_dflash.catalog.models import resolve_model, with_local_drafter
from trtllm_dflash.contracts import dtypes
from trtllm_dflash.drafters import kind_of
from trtllm_dflash.errors import PlanRefusedError, RecipeError
from trtllm_dflash.planning.alternatives import describe_fit, fits, nearest_that_fits, precision_alternative
from trtllm_dflash.planning.candidate import Candidate, with_changes
from trtllm_dflash.planning.gpu_precision import precision_for, precision_refusals
from trtllm_dflash.planning.layout import default_layout, layout_refusals
from trtllm_dflash.planning.memory import (
    DEFAULT_CONTEXT,
    DEFAULT_KV_FRACTION,
    DEFAULT_MAX_BATCH,
    GIB,
    GPU_COUNTS,
    MIB,
    linear_state_bytes_per_sequence,
    max_concurrency,
    prefix_cache_tokens,
)
from trtllm_dflash.planning.records import Layout, Plan, Refusal
from trtllm_dflash.planning.steps import build_steps
from trtllm_dflash.recipes.precision import Precision


def make_plan(cfg: Candidate, refusals: list[Refusal], notes: list[str]) -> Plan:
    budget, per_token, target_seq, drafter_seq, concurrency = max_concurrency(cfg)
    model = cfg.model
    return Plan(
        model=model.name,
        checkpoint=model.checkpoint,
        drafter=model.drafter.checkpoint if model.drafter else None,
        block_size=cfg.block_size,
        gpu=cfg.gpu.name if cfg.gpu else CPU,
        backend=cfg.backend,
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
        backend_reason=cfg.backend_reason,
        attention=model.attention_kind,
        linear_state_bytes_per_sequence=linear_state_bytes_per_sequence(model, cfg.layout.tp, cfg.block_size, cfg.prefix_cache_bytes > 0),
        prefix_cache_tokens=prefix_cache_tokens(model, cfg.prefix_cache_bytes, cfg.precision.kv_cache, cfg.layout.tp),
        recipe=cfg.recipe.name if cfg.recipe is not None else None,
        steps=build_steps(cfg),
        refusals=tuple(refusals),
        notes=tuple(notes),
        placeholder_shapes=model.placeholder,
    )


def plan_deployment(
    model: str,
    gpu: str,
    *,
    num_gpus: int | None = None,
    quant: str | None = None,
    kv_cache: str | None = None,
    context: int | None = None,
    max_batch: int | None = None,
    backend: str | None = None,
    recipe: Any = None,
    use_recipe: bool = True,
    prefix_cache_mib: int = 0,
    drafter: str | None = None,
) -> Plan:
    """Plan `model` on `gpu` (catalog names or aliases; 'cpu' for the torch runtime).

    Values come from `recipe` (a Recipe), else from the shipped recipe for model x gpu when there
    is one (use_recipe), else from defaults; explicit arguments override either. Never raises
    for a combination that cannot work: the Plan's `refusals` say why, with the nearest
    combination that does (call `.check()` to raise instead). `prefix_cache_mib`: the served
    model's prefix cache, taken from the device before the KV caches. `drafter`: a local drafter
    directory planned instead of the catalog's (its block size, taps and memory from its config.json).
    """
    spec = with_local_drafter(resolve_model(model), drafter)
    gpu_spec = None if gpu.strip().lower() == CPU else resolve_gpu(gpu)
    if recipe is None and use_recipe:
        from trtllm_dflash.recipes import find_recipe

        try:
            recipe = find_recipe(spec.name, gpu)
        except RecipeError:
            recipe = None
    if quant is not None:
        quant = quant.lower()
        if quant not in dtypes.PRECISIONS:
            from trtllm_dflash.errors import UnknownNameError

            raise UnknownNameError(f"unknown precision {quant!r}", f"use one of: {', '.join(dtypes.PRECISIONS)}")
    if kv_cache is not None and kv_cache.lower() not in ("fp32", "bf16", "fp16", "fp8"):
        from trtllm_dflash.errors import UnknownNameError

        raise UnknownNameError(f"unknown KV cache precision {kv_cache!r}", "use bf16, fp16 or fp8")
    if backend is not None and backend not in BACKEND_NAMES:
        from trtllm_dflash.errors import UnknownNameError

        raise UnknownNameError(f"unknown backend {backend!r}", "use trt, trtllm or torch")
    if backend is not None and not get_backend(backend).runs_on_cpu and gpu_spec is None:
        raise PlanRefusedError(f"backend {backend} needs a GPU; on cpu only the torch backend runs", "use --backend torch or name a GPU")
    if num_gpus is not None and num_gpus < 1:
        raise PlanRefusedError(f"--num-gpus must be >= 1, got {num_gpus}", "pass a positive GPU count")
    if context is not None and context < 1:
        raise PlanRefusedError(f"--context must be >= 1, got {context}", "pass a positive token count")

    asked = backend  # a backend named on the command line (not chosen by default)
    notes: list[str] = []
    overridden = any(v is not None for v in (num_gpus, quant, kv_cache, context, max_batch, backend))
    if recipe is not None:
        r = recipe
        if resolve_model(r.model.name).name != spec.name or r.gpu != (gpu_spec.name if gpu_spec else CPU):
            raise RecipeError(
                f"recipe {r.name} is for {r.model.name} on {r.gpu}, not {spec.name} on {gpu}",
                "drop --model/--gpu, or pass the recipe written for them",
            )
        precision = Precision.from_quantization(r.quantization, spec.native_expert_precision)
        if quant is not None or kv_cache is not None:
            recipe_quant = precision.moe_experts if spec.native_expert_precision != "bf16" else precision.weights
            precision = precision_for(spec, gpu_spec, quant or recipe_quant, kv_cache or precision.kv_cache)
            precision = dataclasses.replace(precision, drafter=r.quantization.drafter)
        layout = Layout(r.parallelism.num_gpus, r.parallelism.tp, r.parallelism.ep, r.parallelism.attention_dp)
        if num_gpus is not None and num_gpus != layout.num_gpus:
            layout = default_layout(spec, num_gpus)
        backend = backend or r.backend
        block = r.drafter.block_size
        schedule = r.drafter.draft_len_schedule or {1: r.max_draft_len}
        draft_lengths = frozenset(schedule.values())
        kv_fraction = r.trtllm.kv_cache_free_gpu_memory_fraction if r.trtllm else DEFAULT_KV_FRACTION
        cfg = Candidate(
            spec,
            gpu_spec,
            backend,
            precision,
            layout,
            context or r.limits.max_seq_len,
            max_batch or r.limits.max_batch_size,
            r.limits.tokens_per_step,
            block,
            draft_lengths,
            kv_fraction,
            r,
        )
        notes.append(f"values from recipe {r.name}" + (" (some overridden on the command line)" if overridden else ""))
    else:
        precision = precision_for(spec, gpu_spec, quant, kv_cache.lower() if kv_cache else None)
        block = spec.drafter.block_size if spec.drafter else 2
        if backend is None:
            backend = choose_backend(spec.name, spec.family, None, num_gpus or 1, gpu_spec is not None).backend
        batch = max_batch or DEFAULT_MAX_BATCH
        ctx = context or min(DEFAULT_CONTEXT, spec.max_position_embeddings)
        base = Candidate(
            spec,
            gpu_spec,
            backend,
            precision,
            default_layout(spec, num_gpus or 1),
            ctx,
            batch,
            min(ctx, DEFAULT_CONTEXT),
            block,
            frozenset({block - 1}),
            get_backend(backend).default_kv_fraction or DEFAULT_KV_FRACTION,
        )
        base = with_changes(base, prefix_cache_bytes=prefix_cache_mib * MIB)
        cfg = base
        if num_gpus is None and gpu_spec is not None and not fits(base):
            # Smallest GPU count that fits at this precision.
            for n in GPU_COUNTS:
                if n <= gpu_spec.max_gpus_per_node:
                    multi = multi_gpu_backend() if n > 1 and get_backend(backend).needs_build else backend
                    candidate = with_changes(base, layout=default_layout(spec, n), backend=multi)
                    if fits(candidate):
                        cfg = candidate
                        break
        notes.append(f"no shipped recipe for {spec.name} on {gpu_spec.name if gpu_spec else CPU}: defaults chosen")

    cfg = with_changes(cfg, prefix_cache_bytes=prefix_cache_mib * MIB)
    drafter_note = kind_of(spec.drafter).plan_note(spec.drafter) if spec.drafter is not None else None
    if drafter_note is not None:
        notes.append(drafter_note)
    if spec.placeholder:
        notes.append("the demo checkpoint is not built yet: shapes are a placeholder")
    if cfg.context > spec.max_position_embeddings:
        notes.append(f"context {cfg.context} exceeds {spec.name}'s {spec.max_position_embeddings} positions")

    if asked is None and cfg.recipe is None:
        cfg = with_changes(cfg, backend=drafter_capable_backend(cfg))
    try:
        choice = choose_backend(spec.name, spec.family, cfg.backend, cfg.layout.num_gpus, cfg.gpu is not None)
    except PlanRefusedError as exc:
        cfg = with_changes(cfg, backend_reason=f"refused: {exc.problem}")
        return make_plan(cfg, [Refusal("backend", exc.problem, exc.fix or "")], notes)
    cfg = with_changes(cfg, backend_reason=choice.reason)
    if choice.note:
        notes.append(choice.note)
    drafter_refusal = get_backend(cfg.backend).drafter_refusal(spec.drafter.kind, spec.drafter.checkpoint) if spec.drafter else None
    if drafter_refusal is not None:
        return make_plan(cfg, [Refusal("backend", *drafter_refusal)], notes)

    refusals = precision_refusals(cfg)
    if refusals:
        alternative = precision_alternative(cfg)
        if alternative:
            label, candidate = alternative
            first = refusals[0]
            refusals[0] = Refusal(first.kind, first.problem, f"nearest that works: {label} ({describe_fit(candidate)}); {first.fix}")
        return make_plan(cfg, refusals, notes)
    refusals = layout_refusals(cfg)
    if refusals:
        return make_plan(cfg, refusals, notes)
    budget, _, target_seq, drafter_seq, concurrency = max_concurrency(cfg)
    if concurrency < 1:
        need = budget.fixed + target_seq + drafter_seq
        where = f"{cfg.layout.num_gpus}x {cfg.gpu.name}" if cfg.gpu else "this machine"
        problem = (
            f"{spec.name} does not fit on {where}: needs {need / GIB:.1f} GiB per device "
            f"(weights {budget.target_weights / GIB:.1f} GiB + drafter, activations, one sequence of "
            f"{cfg.context} tokens) but has {budget.capacity / GIB:.1f} GiB"
        )
        nearest = nearest_that_fits(cfg)
        if nearest:
            label, candidate = nearest
            kind = "too-few-gpus" if candidate.layout.num_gpus > cfg.layout.num_gpus else "does-not-fit"
            refusals = [Refusal(kind, problem, f"nearest that works: {label} ({describe_fit(candidate)})")]
        else:
            fix = (
                "no GPU count or precision on this GPU fits; use a GPU with more memory"
                if cfg.gpu
                else "use a machine with more memory, a smaller --context, or a GPU"
            )
            refusals = [Refusal("does-not-fit", problem, fix)]
        return make_plan(cfg, refusals, notes)
    if cfg.recipe is not None and concurrency < cfg.max_batch:
        notes.append(
            f"KV cache holds {concurrency} sequences of {cfg.context} tokens, fewer than max_batch_size "
            f"{cfg.max_batch}: the scheduler will queue the rest (or shorten --context)"
        )
    return make_plan(cfg, [], notes)


def drafter_capable_backend(cfg: Candidate) -> str:
    """The default backend, or where it cannot decode the drafter's kind the first one that does and serves the family."""
    drafter = cfg.model.drafter
    if drafter is None or get_backend(cfg.backend).drafter_refusal(drafter.kind, drafter.checkpoint) is None:
        return cfg.backend
    family = family_spec(cfg.model.family)
    for name in SUGGESTION_ORDER:
        backend = get_backend(name)
        if backend.drafter_refusal(drafter.kind, drafter.checkpoint) is None and (family is None or backend.support(family).ok):
            return name
    return cfg.backend

"""Which backend deploys a target: the one asked for when it serves the family, else a refusal
naming the backend that does; with none asked for, the family's preferred one (or the
multi-GPU one for several GPUs). Decided at plan time, not at load time.
"""

from __future__ import annotations

import dataclasses

from trtllm_dflash.backends import BACKENDS, multi_gpu_backend
from trtllm_dflash.catalog.families import family_spec
from trtllm_dflash.errors import PlanRefusedError

DEFAULT_BACKEND = "trt"  # one GPU, a family the catalog does not know: this toolkit's engines
SUGGESTION_ORDER = ("trtllm", "trt", "torch")  # the order a refusal names the backends that work


@dataclasses.dataclass(frozen=True)
class BackendChoice:
    backend: str
    reason: str
    note: str | None = None  # for 'unverified' support


def choose_backend(model_name: str, model_type: str, requested: str | None, num_gpus: int = 1, on_gpu: bool = True) -> BackendChoice:
    """The backend for a target (the requested one when it can serve it), with the reason.

    Raises PlanRefusedError naming the backend that works when the requested one cannot.
    """
    family = family_spec(model_type)
    if not on_gpu:
        cpu = next(name for name, backend in BACKENDS.items() if backend.runs_on_cpu)
        if requested not in (None, cpu):
            raise PlanRefusedError(
                f"backend {requested} needs a GPU; on cpu only the {cpu} backend runs", f"use --backend {cpu} or name a GPU"
            )
        return BackendChoice(cpu, f"cpu: only the {cpu} backend runs without a GPU")
    if family is None:
        backend = requested or (multi_gpu_backend() if num_gpus > 1 else DEFAULT_BACKEND)
        return BackendChoice(
            backend,
            f"{model_type} is not in the family catalog: {'requested' if requested else 'default'} backend, unchecked",
            note=f"family {model_type} is not in the catalog; the backend choice is not checked",
        )
    kind = f"{model_type} ({family.attention} attention{', MoE' if family.moe else ''})"
    if requested is not None:
        support = BACKENDS[requested].support(family)
        if not support.ok:
            working = [name for name in SUGGESTION_ORDER if name != requested and BACKENDS[name].support(family).ok]
            fix = f"use backend: {working[0]}" + (f" (or {', '.join(working[1:])})" if len(working) > 1 else "")
            raise PlanRefusedError(support.reason.format(name=model_name), fix)
        note = f"backend {requested} for {model_type} is unverified: {support.reason}" if support.status == "unverified" else None
        return BackendChoice(requested, f"{kind}: {support.reason}", note)
    multi = multi_gpu_backend()
    backend = multi if num_gpus > 1 and BACKENDS[multi].support(family).ok else family.preferred
    support = BACKENDS[backend].support(family)
    why = "several GPUs need tensor/expert parallelism" if num_gpus > 1 and backend != family.preferred else support.reason
    return BackendChoice(
        backend,
        f"{kind}: {why}",
        f"backend {backend} for {model_type} is unverified: {support.reason}" if support.status == "unverified" else None,
    )

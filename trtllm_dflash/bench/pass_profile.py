"""Where a pass's device time goes: its kernels by kind, from torch's profiler (issue 39).

Why: the step benchmark says how far each pass is from its floor, not why. A pass is GEMMs over
the weights (the floor), attention, the small elementwise kernels between them (norms, RoPE, the
activation), copies, and the gaps between kernels. Their sum per pass, beside the pass's in-graph
time, says which to work on: GEMMs far from the copy bandwidth (a better skinny GEMM), many small
kernels (fusion), or gaps (launches not in a graph).

The passes are profiled eagerly: a kernel takes the same time launched from a graph or from
Python, so the kernel times are the graph's, and (in-graph time - kernel time) is what the graph
still spends between kernels. On a CPU (`--tiny`) the profiler sees aten ops instead of kernels,
and the same table comes out (its numbers mean nothing there).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable

import torch

PROFILED_CALLS = 3
# kinds of kernels (and of aten ops on a CPU), by name, first match wins
KINDS: tuple[tuple[str, str], ...] = (
    ("attention", r"attention|flash|fmha|merge_partials|sdpa|softmax"),
    ("GEMM", r"gemm|gemv|cutlass|xmma|nvjet|cublas|splitk|aten::mm|aten::addmm|aten::bmm|aten::linear|matmul"),
    ("norm/rope/act", r"rms|rope|silu|norm|gelu|act_and_mul|aten::mul|aten::add|aten::rsqrt|aten::pow|aten::mean|aten::neg"),
    ("copy/fill", r"memcpy|memset|copy|fill|aten::cat|index|scatter|gather|aten::zero|aten::clone|aten::to\b|contiguous"),
)
OTHER = "other"


def kind_of(name: str) -> str:
    """The kind of a kernel (or aten op) by its name."""
    lowered = name.lower()
    return next((kind for kind, pattern in KINDS if re.search(pattern, lowered)), OTHER)


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str
    launches: float  # per pass call
    ms: float  # device time per pass call


@dataclasses.dataclass(frozen=True)
class PassProfile:
    """One pass's kernels, per call of the pass, beside its in-graph time."""

    name: str
    graph_ms: float
    kernels: tuple[Kernel, ...]
    weight_bytes: int = 0  # the weights its GEMMs must read (0: not counted)

    @property
    def kernel_ms(self) -> float:
        return sum(k.ms for k in self.kernels)

    @property
    def launches(self) -> float:
        return sum(k.launches for k in self.kernels)

    def by_kind(self) -> dict[str, tuple[float, float]]:
        """kind -> (launches, ms) per pass call, every kind present (0 where none ran)."""
        out = {kind: (0.0, 0.0) for kind, _ in KINDS} | {OTHER: (0.0, 0.0)}
        for k in self.kernels:
            launches, ms = out[kind_of(k.name)]
            out[kind_of(k.name)] = (launches + k.launches, ms + k.ms)
        return out


def profile_pass(name: str, fn: Callable[[], object], device: torch.device, graph_ms: float, weight_bytes: int = 0) -> PassProfile:
    """Profile PROFILED_CALLS eager calls of `fn` (after one warm-up): each kernel's launches and
    device time per call (aten ops' own CPU time off CUDA)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    fn()
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as prof:
        for _ in range(PROFILED_CALLS):
            fn()
        if cuda:
            torch.cuda.synchronize()
    kernels = []
    for event in prof.key_averages():
        on_device = getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA
        if cuda != on_device:
            continue
        us = getattr(event, "self_device_time_total", None) if cuda else event.self_cpu_time_total
        if us is None:  # torch before the device_* names
            us = event.self_cuda_time_total
        if us > 0:
            kernels.append(Kernel(event.key, event.count / PROFILED_CALLS, us / 1e3 / PROFILED_CALLS))
    kernels.sort(key=lambda k: -k.ms)
    return PassProfile(name, graph_ms, tuple(kernels), weight_bytes)


def markdown(profiles: list[PassProfile], bandwidth: float, batch: int, context: int, top: int = 6) -> str:
    """The per-kind table of every pass, then each pass's heaviest kernels."""
    kinds = [kind for kind, _ in KINDS] + [OTHER]
    lines = [
        f"Where each pass's device time goes (batch {batch}, context {context}; eager passes under torch's profiler, "
        f"per call; ms (launches)). Gaps = in-graph time - kernel time. GEMM GB/s = the weights the pass must read / "
        f"its GEMM time (copy bandwidth {bandwidth / 1e9:.0f} GB/s):",
        "",
        "| pass | in graph | kernels | " + " | ".join(kinds) + " | gaps | GEMM GB/s |",
        "|---|---:|---:|" + "---:|" * len(kinds) + "---:|---:|",
    ]
    for p in profiles:
        by_kind = p.by_kind()
        gemm_ms = by_kind["GEMM"][1]
        rate = f"{p.weight_bytes / (gemm_ms / 1e3) / 1e9:.0f}" if p.weight_bytes and gemm_ms > 0 else "-"
        cells = " | ".join(f"{ms:.3f} ({launches:.0f})" for launches, ms in (by_kind[k] for k in kinds))
        lines.append(
            f"| {p.name} | {p.graph_ms:.3f} | {p.kernel_ms:.3f} ({p.launches:.0f}) | {cells} | {p.graph_ms - p.kernel_ms:.3f} | {rate} |"
        )
    for p in profiles:
        lines += ["", f"Heaviest kernels of the {p.name} (ms per call, launches, kind):", ""]
        for k in p.kernels[:top]:
            lines.append(f"- {k.ms:.3f} ms, {k.launches:.0f}x, {kind_of(k.name)}: `{k.name[:110]}`")
    return "\n".join(lines) + "\n"

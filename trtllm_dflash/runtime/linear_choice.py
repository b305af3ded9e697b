"""Which kernel runs the decode passes' projections: cuBLAS or the skinny kernels, by measurement.

Why: at batch 1 a decode pass is its weights streamed once through the GPU (15 GB for Qwen3-8B's
target), so the projections' share of the bandwidth is most of the step's speed. Whether cuBLAS
streams a 1- or 16-row product at that bandwidth, or the skinny kernels (ops/kernels/
skinny_linear.py) do better, depends on the GPU and the shape, and only timing it there says.

- "torch": `F.linear` (cuBLAS on a GPU) everywhere: the default;
- "skinny": the skinny kernels wherever they cover the call (at most MAX_ROWS rows) and the
  kernels run (CUDA, or Triton's interpreter when TRITON_INTERPRET=1 asks), else F.linear;
- "measure": per (rows, weight shape) of the model's projections, the skinny kernels checked
  against F.linear on the model's own weight (refused past TOLERANCE, or where they fail to
  compile or launch), F.linear and the skinny kernels at a few K split counts
  (`skinny_launch.split_candidates`: how many programs share a weight's columns is what a GPU's
  wave count decides) timed from a CUDA graph with L2 flushed (runtime/kernel_choice.py), the
  fastest kept. Calls of rows or shapes not measured run F.linear. Off CUDA the skinny kernels
  are not a contender (Triton's interpreter).

Each candidate is timed as a pass runs it: after another kernel. One call alone after a flush
times a launch with nothing ahead of it, which is where a dependent launch gains nothing; so a
candidate's time is a chain of CHAIN calls on as many copies of the weight (each streamed from
HBM, as a pass's layers are), divided by CHAIN. Where the device has dependent launches
(ops/kernels/dependent_launch.py) the choice is measured for each launch kind, and a call takes
the one measured for the kind its context asks for: the skinny kernels ask L2 for their weight's
first tiles before they wait for the kernel ahead, which only a dependent launch lets overlap.

The MLP's down projection runs through `LinearChoices.gated` (modeling/fused_ops.py
`silu_mul_linear`): where its pick is the skinny kernels, they take the fused gate/up projection
and form silu(gate) * up as they load it, so the activation's kernel is not launched. "measure"
times that form against the activation kernel followed by F.linear (a `gated` Choice); where
the pick is F.linear the activation runs first, then the plain call.

A choice changes only accumulation order (float32 either way), as any kernel change does; the
runtime's fused pass is already held to a tolerance on a GPU (modeling/fused_target.py).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.modeling import fused_ops
from trtllm_dflash.ops import custom_ops
from trtllm_dflash.ops.kernels import dependent_launch, skinny_launch
from trtllm_dflash.runtime.attention_choice import relative_error
from trtllm_dflash.runtime.kernel_choice import refusal, time_call

CHOICES = ("torch", "skinny", "measure")
# relative L2 error against F.linear in float32 that still counts as the same projection
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}
CHAIN = 4  # calls per timed chain, each on its own copy of the weight


@dataclasses.dataclass(frozen=True)
class Choice:
    """What runs `rows` rows through a weight of `shape` ([N, K]), and the times that said so."""

    rows: int
    shape: tuple[int, int]
    chosen: str
    torch_ms: float
    skinny_ms: float | None  # at its fastest K split count, `splits`
    refused: str = ""
    splits: int = 0
    gated: bool = False  # of silu(gate) * up: torch_ms is the activation kernel's and F.linear's
    dependent: bool = False  # measured with the kernels that support it as dependent launches

    def line(self) -> str:
        skinny = f"skinny {self.skinny_ms:.4f} ms ({self.splits} K splits)" if self.skinny_ms is not None else f"skinny: {self.refused}"
        gated = ", gated" if self.gated else ""
        launches = ", dependent launches" if self.dependent else ""
        return (
            f"rows {self.rows} x {self.shape[0]}x{self.shape[1]}{gated}{launches}: {self.chosen} (torch {self.torch_ms:.4f} ms; {skinny})"
        )


@dataclasses.dataclass
class LinearChoices:
    """The kernel of each projection call: one for all (`fixed`), or the measured `choices` by
    (the smallest measured row count holding the call's rows, weight shape, the launch kind the
    call's context asks for, else the ordinary one), else F.linear."""

    fixed: str | None = "torch"
    choices: tuple[Choice, ...] = ()

    def __post_init__(self) -> None:
        self._by_key = {(c.rows, c.shape, c.gated, c.dependent): c for c in self.choices}
        self._rows = sorted({c.rows for c in self.choices})

    def _measured(self, rows: int, shape: tuple[int, int], gated: bool = False) -> Choice | None:
        bucket = next((r for r in self._rows if r >= rows), None)
        key = (bucket, tuple(shape), gated)
        dependent = self._by_key.get((*key, True)) if dependent_launch.requested() else None
        return dependent or self._by_key.get((*key, False))

    def pick(self, rows: int, shape: tuple[int, int], gated: bool = False) -> str:
        if self.fixed is not None:
            return self.fixed
        measured = self._measured(rows, shape, gated)
        return measured.chosen if measured is not None else "torch"

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """`F.linear(x, weight, bias)` by the kernel picked for its rows and weight shape (the skinny
        kernels at the measured K split count, or the launch's default)."""
        out = self._skinny(x, weight, bias, gated=False)
        return out if out is not None else F.linear(x, weight, bias)

    def gated(self, gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor | None:
        """`F.linear(silu(gate) * up, weight, bias)` of a fused gate/up projection `[..., 2K]` in one
        skinny launch where this projection's pick is the skinny kernels (the activation formed as
        the kernel loads it); None where it is not: the caller runs the activation and `self`."""
        return self._skinny(gate_up, weight, bias, gated=True)

    def _skinny(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gated: bool) -> torch.Tensor | None:
        """The skinny kernels' result where the pick for x's rows and the weight's shape is theirs,
        the kernels run on x's device and cover the call; None otherwise."""
        if self.fixed == "torch":
            return None
        rows, shape = x.numel() // max(x.shape[-1], 1), tuple(weight.shape)
        if (
            self.pick(rows, shape, gated) == "skinny"  # the dictionary lookup first: most calls of a measured choice stay on F.linear
            and custom_ops.kernels_enabled(x.device)
            and skinny_launch.unsupported_reason(x, weight, bias, gated=gated) is None
        ):
            measured = self._measured(rows, shape, gated)
            return skinny_launch.skinny_linear(
                x, weight, bias, splits=measured.splits or None if measured is not None else None, gated=gated
            )
        return None

    def describe(self) -> str:
        if self.fixed is not None:
            return f"decode-pass projections: {self.fixed}"
        return "decode-pass projections, by measurement:\n" + "\n".join("  " + c.line() for c in self.choices)


def measure_one(rows: int, weight: torch.Tensor, bias: torch.Tensor | None = None, gated: bool = False, dependent: bool = False) -> Choice:
    """F.linear and the skinny kernels at each of their K split candidates, each split count checked
    against F.linear on `weight` (float32 reference) before it is timed (`timed_in_chain`).
    `gated`: of silu(gate) * up from a fused gate/up projection, the activation kernel then
    F.linear against the skinny kernels' gated form. `dependent`: launched, and timed, as
    dependent launches."""
    shape = tuple(weight.shape)
    generator = torch.Generator(weight.device).manual_seed(rows)
    x = torch.randn(rows, shape[1] * (2 if gated else 1), dtype=weight.dtype, device=weight.device, generator=generator)
    copies = chain_copies(weight)  # made once: every candidate is timed on the same copies
    torch_ms = timed_in_chain(lambda w: F.linear(fused_ops.silu_mul(x) if gated else x, w, bias), copies, dependent)
    refused = skinny_launch.unsupported_reason(x, weight, bias, gated=gated)
    if refused is None and weight.device.type != "cuda":
        refused = "needs CUDA (off it the kernels run in Triton's interpreter)"
    if refused is not None:
        return Choice(rows, shape, "torch", torch_ms, None, refused, gated=gated, dependent=dependent)
    want = F.linear((fused_ops.silu_mul(x) if gated else x).float(), weight.float(), None if bias is None else bias.float())
    tolerance = TOLERANCE.get(weight.dtype, TOLERANCE[torch.float32])
    sms = torch.cuda.get_device_properties(weight.device).multi_processor_count
    timed, problems = {}, []
    for splits in skinny_launch.split_candidates(rows, shape[0], shape[1], sms):
        skinny = lambda w, splits=splits: skinny_launch.skinny_linear(x, w, bias, splits=splits, gated=gated)  # noqa: E731
        try:
            with dependent_launch.dependent_launches(dependent):
                error = relative_error(skinny(weight), want)
        except Exception as exc:  # noqa: BLE001 - a kernel that does not compile or launch here is refused, not run
            problems.append(f"{splits} K splits failed: {refusal(exc)}")
            continue
        if not error <= tolerance:
            problems.append(f"{splits} K splits differ from F.linear by {error:.1e} (tolerance {tolerance:.0e})")
            continue
        ms = timed_in_chain(skinny, copies, dependent)
        if math.isnan(ms):
            problems.append(f"{splits} K splits cannot be captured in a CUDA graph")
        else:
            timed[splits] = ms
    if problems:  # any refused split count is a kernel fault to report, not a slower option
        return Choice(rows, shape, "torch", torch_ms, None, "; ".join(problems), gated=gated, dependent=dependent)
    splits = min(timed, key=timed.get)
    chosen = "skinny" if timed[splits] < torch_ms else "torch"
    return Choice(rows, shape, chosen, torch_ms, timed[splits], splits=splits, gated=gated, dependent=dependent)


def chain_copies(weight: torch.Tensor) -> list[torch.Tensor]:
    """`weight` and CHAIN - 1 copies of it: a timed chain's calls each stream their own."""
    return [weight] + [weight.clone() for _ in range(CHAIN - 1)]


def timed_in_chain(call: Callable[[torch.Tensor], object], copies: list[torch.Tensor], dependent: bool = False) -> float:
    """Milliseconds per call of `call(w)` in a chain of one call per weight in `copies`
    (`chain_copies`; runtime/kernel_choice.py's `time_call`), launched inside
    `dependent_launches(dependent)`: each call after another kernel, as in a pass."""

    def chain() -> list:
        with dependent_launch.dependent_launches(dependent):
            return [call(w) for w in copies]

    return time_call(chain, copies[0].device) / len(copies)


def measure(
    weights: Iterable[tuple[torch.Tensor, torch.Tensor | None]],
    rows: Iterable[int],
    say: Callable[[str], None] = lambda line: None,
    gated: Iterable[tuple[torch.Tensor, torch.Tensor | None]] = (),
    launch_kinds: Sequence[bool] = (False,),
) -> LinearChoices:
    """The measured choice for every row count up to the skinny kernels' MAX_ROWS and every distinct
    weight shape in `weights` ((weight, bias) of the model's projections), and in `gated` (the MLP
    down projections, run on silu(gate) * up: `LinearChoices.gated`), for each launch kind in
    `launch_kinds` (False: ordinary launches; True: dependent launches)."""
    distinct: dict[tuple[tuple[int, int], bool], tuple[torch.Tensor, torch.Tensor | None]] = {}
    for is_gated, pairs in ((False, weights), (True, gated)):
        for weight, bias in pairs:
            distinct.setdefault((tuple(weight.shape), is_gated), (weight.detach(), None if bias is None else bias.detach()))
    choices = []
    for dependent in launch_kinds:
        for count in sorted({r for r in rows if 1 <= r <= skinny_launch.MAX_ROWS}):
            for (_, is_gated), (weight, bias) in distinct.items():
                choices.append(measure_one(count, weight.contiguous(), bias, gated=is_gated, dependent=dependent))
                say(choices[-1].line())
    return LinearChoices(fixed=None, choices=tuple(choices))


def launch_kinds(device: torch.device) -> tuple[bool, ...]:
    """The launch kinds a runtime on `device` can run its passes with, each measured: a runtime's
    kind can change between captures (the step benchmark times both), and the choice with it."""
    return (False, True) if dependent_launch.supported(device) else (False,)


def fixed(name: str) -> LinearChoices:
    if name not in CHOICES or name == "measure":
        raise DFlashError(f"unknown linear choice {name!r}", f"use one of {', '.join(CHOICES)}")
    return LinearChoices(fixed=name)

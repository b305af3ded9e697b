"""The step benchmark's shapes and results, and how they are written (bench/gpu_step.py measures).

What a row holds (each part's time beside its floor, and how it was timed), the markdown tables
`bench_gpu_step.py --out` rewrites after every row, the one-line summary `selftest --gpu` prints,
and the JSON beside the table. Apart from the measurement so that either can grow without the
other: the tables change with every new column a GPU window asks for.
"""

from __future__ import annotations

import dataclasses
import math

from trtllm_dflash.bench import pass_profile
from trtllm_dflash.runtime import verify_choice

TAUS = (3.5, 5.0, 6.5)
VERIFY_MODES = ("greedy", "temperature", "top-k+top-p")
# the verifications `dependent_launch="both"` times again with the other launch kind (the DFlash step's, and the
# one the issue bounds); the third would cost the window its kernels' compiles and add no column
DEPENDENT_VERIFY_MODES = ("greedy", "top-k+top-p")


@dataclasses.dataclass(frozen=True)
class StepShape:
    """A Qwen3 target and its DFlash drafter, by the sizes that set a step's cost."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    draft_layers: int
    block: int
    target_layer_ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Ceilings:
    """What this device reaches: copy bandwidth (bytes read + written per second) and bf16 GEMM FLOP/s."""

    bandwidth: float
    flops: float


@dataclasses.dataclass
class Timed:
    """One part of a step: its time, its floor, and how it was timed ("graph", "eager" or "host"; "failed":
    NaN, the part did not run)."""

    ms: float
    floor_ms: float
    how: str

    @property
    def of_floor(self) -> float:
        return self.floor_ms / self.ms if not self.ms <= 0 else 0.0  # NaN (a failed part) stays NaN


@dataclasses.dataclass
class StepRow:
    """Every measurement at one batch x context."""

    batch: int
    context: int
    parts: dict[str, Timed] = dataclasses.field(default_factory=dict)
    loop_ar_ms: float | None = None  # the decoding loop's wall-clock AR step
    loop_dflash_ms: float | None = None  # ... and DFlash step (random drafter: tau about 1)
    loop_async_ms: float | None = None  # ... and DFlash step with async scheduling
    profiles: list[pass_profile.PassProfile] = dataclasses.field(default_factory=list)  # --profile: kernels by kind

    @property
    def dflash(self) -> Timed:
        """The DFlash step the GPU runs: draft pass + 16-token verify pass + greedy verification."""
        return self.dflash_of("")

    def dflash_of(self, passes: str) -> Timed:
        """The DFlash step with the draft and verify passes of the parts named with suffix `passes`
        ("": the runtime's launches; ", other launches": `dependent_launch="both"`'s others)."""
        parts = [self.parts[k] for k in (f"draft{passes}", f"verify pass{passes}", f"verify greedy{passes}")]
        how = "failed" if any(p.how == "failed" for p in parts) else "sum"
        return Timed(sum(p.ms for p in parts), sum(p.floor_ms for p in parts), how)

    def tokens_per_second(self, tau: float, passes: str = "") -> float:
        """Projected at acceptance length `tau`, from the DFlash step of `passes` (`dflash_of`)."""
        return self.batch * tau / (self.dflash_of(passes).ms / 1e3)

    @property
    def ar_tokens_per_second(self) -> float:
        return self.batch / (self.parts["ar"].ms / 1e3)


# the verify pass with half its rows a CUDA graph's padding rows (part name -> whether they start at the
# capacity): at the last slots of their cache rows (before 2026-11-29: the op read the whole row for
# them) or at the capacity (since: nothing)
PADDING_STARTS = {"verify pass, half padding at the last slots": False, "verify pass, half padding at the capacity": True}


@dataclasses.dataclass
class StepBenchmark:
    """A run: its rows, and the model, device, ceilings and kernel choices they were measured with."""

    shape: StepShape
    device: str
    ceilings: Ceilings
    attention: str  # the target's attention and pass (fused or transformers')
    rows: list[StepRow]
    choices: str = ""  # the runtime's kernel choices: target attention in decode passes, verification of sampled steps


# issue 39's bound on the projected tokens/s at tau 6.5 (batch 1, 1k context), by the GPU's name
TOKENS_PER_SECOND_BOUNDS = {"H100": 900.0, "H200": 1300.0}
BOUNDS_CONTEXT = 1024


@dataclasses.dataclass(frozen=True)
class Bound:
    """One of issue 39's GPU bounds ("What must be shown") against what a run measured."""

    name: str
    value: float  # NaN where a part it needs failed
    limit: float
    at_most: bool  # met when value <= limit (else when value >= limit)

    @property
    def met(self) -> bool:
        return self.value <= self.limit if self.at_most else self.value >= self.limit


def issue_bounds(result: StepBenchmark, launches: str = "") -> list[Bound]:
    """Issue 39's bounds at 1k context, from the rows at batch 1 and 32 that the run has, with the
    parts named with suffix `launches` ("": the runtime's; ", other launches": `dependent_launch="both"`'s)."""
    rows = {r.batch: r for r in result.rows if r.context == BOUNDS_CONTEXT}
    bounds = []
    if 1 in rows:
        parts, step = rows[1].parts, rows[1].dflash_of(launches)
        gpu = next((name for name in TOKENS_PER_SECOND_BOUNDS if name in result.device), None)
        if gpu is not None:
            tokens_per_second = rows[1].tokens_per_second(6.5, launches)
            bounds.append(Bound(f"tok/s at tau 6.5, batch 1 ({gpu})", tokens_per_second, TOKENS_PER_SECOND_BOUNDS[gpu], False))
        bounds += [
            Bound("DFlash step / AR step, batch 1", step.ms / parts[f"ar{launches}"].ms, 1.35, True),
            Bound("AR step, % of its floor, batch 1", 100 * parts[f"ar{launches}"].of_floor, 75.0, False),
            Bound("top-k+top-p verification, ms, batch 1", parts[f"verify top-k+top-p{launches}"].ms, 0.1, True),
        ]
    if 32 in rows:
        parts, step = rows[32].parts, rows[32].dflash_of(launches)
        bounds += [
            Bound("top-k+top-p verification, ms, batch 32", parts[f"verify top-k+top-p{launches}"].ms, 0.5, True),
            Bound("DFlash step, % of its floor, batch 32", 100 * step.of_floor, 60.0, False),
        ]
    return bounds


# ------------------------------------------------------------------------------ report


def summary_line(row: StepRow) -> str:
    p = row.parts
    return (
        f"AR {p['ar'].ms:.2f} ms ({p['ar'].of_floor:.0%} of floor), DFlash {row.dflash.ms:.2f} ms "
        f"({row.dflash.of_floor:.0%}), verify top-k+top-p {p['verify top-k+top-p'].ms:.3f} ms"
        + "".join(
            f" ({form} {p[f'verify top-k+top-p {form}'].ms:.3f} ms)"
            for form in verify_choice.KERNEL_FORMS
            if f"verify top-k+top-p {form}" in p
        )
        + ", "
        f"{row.tokens_per_second(6.5):.0f} tok/s at tau 6.5"
    )


def _cell(t: Timed) -> str:
    if t.how == "failed":  # PassTimer said why in the run's log
        return "failed"
    mark = "" if t.how in ("graph", "sum") else f" ({t.how})"
    return f"{t.ms:.3f} ({t.of_floor:.0%}){mark}"


def markdown(result: StepBenchmark) -> str:
    """The step table (each time with its % of floor), then the verification table."""
    c = result.ceilings
    lines = [
        f"{result.shape.name}-shaped, random weights, on {result.device}; target attention: {result.attention}. "
        f"Measured ceilings: copy {c.bandwidth / 1e9:.0f} GB/s, bf16 GEMM {c.flops / 1e12:.0f} TFLOP/s. "
        "Times in ms, median of graph replays, (% of floor).",
        "",
        "| batch | context | AR step | verify pass (16) | draft pass | DFlash step | DFlash / AR | AR tok/s | "
        + " | ".join(f"tok/s at tau {t}" for t in TAUS)
        + " | loop AR step | loop DFlash step | loop DFlash step, async |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(TAUS) + "---:|---:|---:|",
    ]
    for r in result.rows:
        p = r.parts
        loop = lambda v: f"{v:.2f}" if v is not None else "-"  # noqa: E731
        lines.append(
            f"| {r.batch} | {r.context} | {_cell(p['ar'])} | {_cell(p['verify pass'])} | {_cell(p['draft'])} | "
            f"{_cell(r.dflash)} | {r.dflash.ms / p['ar'].ms:.2f} | {r.ar_tokens_per_second:.0f} | "
            + " | ".join(f"{r.tokens_per_second(t):.0f}" for t in TAUS)
            + f" | {loop(r.loop_ar_ms)} | {loop(r.loop_dflash_ms)} | {loop(r.loop_async_ms)} |"
        )
    # "spread": every pass over the vocabulary split into chunks (verify_spread.py); "shortlist": two reads
    # of the logits for top-k rows (verify_shortlist.py); timed on a GPU only
    columns = [f"verify {m}" for m in VERIFY_MODES]
    for form in verify_choice.KERNEL_FORMS:
        columns += [f"verify {m} {form}" for m in VERIFY_MODES if any(f"verify {m} {form}" in r.parts for r in result.rows)]
    for suffix in ("", " shortlist"):
        columns += [
            f"draft sampling {m}{suffix}" for m in VERIFY_MODES if any(f"draft sampling {m}{suffix}" in r.parts for r in result.rows)
        ]
    lines += [
        "",
        "Verification of a 16-token block (ms, % of its floor: the logits read once, plus q when sampled), and the "
        "drafter's sampling of its 15 positions (the draft logits read, q written):",
        "",
        "| batch | context | " + " | ".join(c.removeprefix("verify ") for c in columns) + " |",
        "|---:|---:|" + "---:|" * len(columns),
    ]
    for r in result.rows:
        lines.append(f"| {r.batch} | {r.context} | " + " | ".join(_cell(r.parts[c]) if c in r.parts else "-" for c in columns) + " |")
    padded = [r for r in result.rows if all(part in r.parts for part in PADDING_STARTS)]
    if padded:
        lines += [
            "",
            "The verify pass with half its rows a CUDA graph's padding rows (ms, % of the full batch's floor): "
            "starting at the last slots of their cache rows, the op reads each whole row; at the capacity, nothing:",
            "",
            "| batch | context | verify pass, all rows live | "
            + " | ".join(p.removeprefix("verify pass, ") for p in PADDING_STARTS)
            + " |",
            "|---:|---:|---:|" + "---:|" * len(PADDING_STARTS),
        ]
        for r in padded:
            cells = " | ".join(_cell(r.parts[p]) for p in PADDING_STARTS)
            lines.append(f"| {r.batch} | {r.context} | {_cell(r.parts['verify pass'])} | {cells} |")
    lines += [
        "",
        "DFlash step = draft pass + verify pass + greedy verification, each from its own graph. The loop "
        "columns are the wall-clock steps of `Decoder` with `cuda_graphs=True` (random drafter, tau about 1), "
        "host syncs and eager parts included; async: `async_scheduling=True`, each step launched before "
        "the one before is read.",
    ]
    lines += _dependent_table(result.rows)
    lines += _bounds_table(result)
    if result.choices:
        lines += ["", "```", result.choices, "```"]
    for r in result.rows:
        if r.profiles:
            lines += ["", pass_profile.markdown(r.profiles, c.bandwidth, r.batch, r.context).rstrip("\n")]
    return "\n".join(lines) + "\n"


def _dependent_table(rows: list[StepRow]) -> list[str]:
    """The table of `dependent_launch="both"`: each pass with ordinary and dependent launches."""
    rows = [r for r in rows if "ar, other launches" in r.parts]
    if not rows:
        return []
    parts = ("ar", "verify pass", "draft", *(f"verify {mode}" for mode in DEPENDENT_VERIFY_MODES))
    lines = ["", "Ordinary launches -> programmatic dependent launches (ms, each pass from its own graph):", ""]
    columns = ["AR step", "verify pass (16)", "draft pass", *(f"{mode} verification" for mode in DEPENDENT_VERIFY_MODES), "DFlash step"]
    lines += ["| batch | context | " + " | ".join(columns) + " |", "|---:|---:|" + "---:|" * len(columns)]
    for r in rows:
        cells = [f"{_cell(r.parts[part])} -> {_cell(r.parts[f'{part}, other launches'])}" for part in parts]
        step = f"{r.dflash.ms:.3f} -> {r.dflash_of(', other launches').ms:.3f}"
        lines.append(f"| {r.batch} | {r.context} | " + " | ".join(cells) + f" | {step} |")
    return lines


def _bounds_table(result: StepBenchmark) -> list[str]:
    """Issue 39's bounds, met or not, as run and (`dependent_launch="both"`) with dependent launches."""
    ran = issue_bounds(result)
    if not ran:
        return []
    both = all("ar, other launches" in r.parts for r in result.rows)
    kinds = [("ordinary launches", ran), ("dependent launches", issue_bounds(result, ", other launches"))] if both else [("as run", ran)]
    number = lambda v: f"{v:.0f}" if v >= 100 else f"{v:.3g}"  # noqa: E731
    value = lambda b: "failed" if math.isnan(b.value) else f"{number(b.value)} ({'met' if b.met else 'not met'})"  # noqa: E731
    lines = ["", f'Issue 39\'s bounds at {BOUNDS_CONTEXT} context ("What must be shown"):', ""]
    lines += ["| bound | limit | " + " | ".join(name for name, _ in kinds) + " |", "|---|---:|" + "---:|" * len(kinds)]
    for i, bound in enumerate(ran):
        limit = f"{'<=' if bound.at_most else '>='} {bound.limit:g}"
        lines.append(f"| {bound.name} | {limit} | " + " | ".join(value(bounds[i]) for _, bounds in kinds) + " |")
    return lines


def result_json(result: StepBenchmark) -> dict:
    return {
        "shape": dataclasses.asdict(result.shape),
        "device": result.device,
        "attention": result.attention,
        "kernel_choices": result.choices,
        "ceilings": dataclasses.asdict(result.ceilings),
        "rows": [
            {
                "batch": r.batch,
                "context": r.context,
                "loop_ar_ms": r.loop_ar_ms,
                "loop_dflash_ms": r.loop_dflash_ms,
                "loop_async_ms": r.loop_async_ms,
                "parts": {k: dataclasses.asdict(v) for k, v in {**r.parts, "dflash step": r.dflash}.items()},
                "profiles": [dataclasses.asdict(p) for p in r.profiles],
            }
            for r in result.rows
        ],
    }

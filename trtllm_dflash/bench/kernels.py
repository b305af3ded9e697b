"""GPU benchmark of the DFlash plugin kernels against the bandwidth floor and torch SDPA.

Why: these kernels are memory-bound, so the honest yardstick is the time that their unavoidable
traffic takes at the bandwidth this GPU really reaches (bytes that must be read or written /
device-to-device copy bandwidth measured in the same run). For block attention the practical
yardstick is also torch's scaled_dot_product_attention on the same operands. Goals (reported, not
asserted): >= 70% of the floor, and faster than SDPA at every benchmarked shape.

Times are medians of `triton.testing.do_bench`, which flushes the L2 cache before every run, so
inputs come from HBM, as in a decoding step. Used by `dflash-trt selftest --gpu` and
benchmarks/bench_kernels.py.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

FLOOR_GOAL = 0.70  # fraction of the bandwidth floor the kernels should reach
VERIFY_MODES = ("greedy", "temperature", "top-k+top-p")


@dataclasses.dataclass(frozen=True)
class AttentionShape:
    """One benchmarked block-attention call: what it stands for, and its sizes."""

    label: str
    batch: int
    context: int  # committed context positions in the cache at this step
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    block: int = 16
    new_rows: int = 4  # context rows appended this step (accepted drafts + 1)
    dtype: str = "bfloat16"


# The benchmarked block-attention shapes. Add a shape by adding an entry (a target model's
# attention is one more label with its heads / head_dim). Default: the Qwen3-8B DFlash drafter.
ATTENTION_SHAPES: list[AttentionShape] = [
    AttentionShape("qwen3-8b drafter", batch=1, context=1024),
    AttentionShape("qwen3-8b drafter", batch=8, context=1024),
    AttentionShape("qwen3-8b drafter", batch=32, context=1024),
    AttentionShape("qwen3-8b drafter", batch=1, context=8192),
    AttentionShape("qwen3-8b drafter", batch=8, context=8192),
    AttentionShape("qwen3-8b drafter", batch=32, context=8192),
    AttentionShape("qwen3-8b drafter", batch=1, context=32768),
    AttentionShape("qwen3-8b drafter", batch=8, context=32768),
    AttentionShape("qwen3-8b drafter", batch=32, context=32768),
]
# `--quick`: the shapes of the first two contexts and batches
QUICK_ATTENTION_SHAPES: list[AttentionShape] = [s for s in ATTENTION_SHAPES if s.context <= 8192 and s.batch <= 8]


@dataclasses.dataclass(frozen=True)
class VerifyShape:
    """One benchmarked verification call (both verify kernels)."""

    batch: int
    mode: str  # one of VERIFY_MODES
    logits_dtype: str = "float32"
    block: int = 16
    vocab: int = 151936


VERIFY_SHAPES: list[VerifyShape] = [
    VerifyShape(batch, mode, dtype) for dtype in ("float32", "bfloat16") for mode in VERIFY_MODES for batch in (1, 8, 32)
]
QUICK_VERIFY_SHAPES: list[VerifyShape] = [s for s in VERIFY_SHAPES if s.logits_dtype == "bfloat16" and s.batch <= 8]


class _VersusFloor:
    """The floor goal of a result with `ours_ms` and `floor_ms`."""

    ours_ms: float
    floor_ms: float

    @property
    def floor_fraction(self) -> float:
        """floor / ours: 1.0 would move the unavoidable bytes at copy bandwidth."""
        return self.floor_ms / self.ours_ms


class _VersusFloorAndSdpa(_VersusFloor):
    """Both goals, for attention results that also timed torch SDPA (`sdpa_ms`)."""

    sdpa_ms: float

    @property
    def sdpa_ratio(self) -> float:
        """SDPA time / ours: above 1 means ours is faster."""
        return self.sdpa_ms / self.ours_ms


@dataclasses.dataclass
class AttentionResult(_VersusFloorAndSdpa):
    shape: AttentionShape
    kv_splits: int
    ours_ms: float
    floor_ms: float
    sdpa_ms: float


@dataclasses.dataclass
class VerifyResult(_VersusFloor):
    shape: VerifyShape
    ours_ms: float
    floor_ms: float
    equal_to_reference: bool


@dataclasses.dataclass
class TargetAttentionResult(_VersusFloorAndSdpa):
    """The target's causal attention over its in-place cache (`attention_traffic.TARGET_ATTENTION_BENCH_SHAPES`)
    against the fastest SDPA backend that computes the same step (`sdpa_baseline`)."""

    shape: object  # attention_traffic.TargetAttentionShape
    ours_ms: float  # the launch as shipped: KV splits picked from the shape
    floor_ms: float
    sdpa_ms: float  # the fastest SDPA candidate
    kv_splits: int = 1
    unsplit_ms: float | None = None  # the same kernel with one split (None: not timed)
    sdpa_backend: str = ""  # the fastest candidate's name, e.g. "FLASH_ATTENTION (gqa, lower-right mask)"
    sdpa_timings: list = dataclasses.field(default_factory=list)  # sdpa_baseline.SdpaTiming per candidate
    bytes_moved: int = 0


@dataclasses.dataclass
class KernelBenchmark:
    bandwidth: float  # bytes/s, device-to-device copy (read + write)
    attention: list[AttentionResult]
    verify: list[VerifyResult]
    target: list[TargetAttentionResult] = dataclasses.field(default_factory=list)
    timing: str = "launched"  # "launched": do_bench of the Python call; "in-graph": replays of a captured graph

    @property
    def all_equal_to_reference(self) -> bool:
        return all(r.equal_to_reference for r in self.verify)


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Bytes per second of a device-to-device copy (read + write both count)."""
    from triton.testing import do_bench

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=10, rep=100, return_mode="median")
    src = dst = None  # frees the memory (the timed closure holds the names, so no `del`)
    torch.cuda.empty_cache()
    return 2 * nbytes / (ms * 1e-3)


def _median_ms(fn: Callable[[], object]) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=10, rep=50, return_mode="median")


def graph_median_ms(fn: Callable[[], object]) -> float:
    """Median time of `fn` replayed from a CUDA graph captured around it: the kernels as a captured
    decoding step runs them, without the Python launcher's time (do_bench of `fn` itself includes
    it, and at small shapes it is most of what is timed). L2 flushed before each replay, as
    do_bench does; NaN where the capture fails. The runtime's kernel choices time the same way."""
    from trtllm_dflash.runtime.kernel_choice import time_call

    return time_call(fn, torch.device("cuda"))


def bench_attention(
    shape: AttentionShape, bandwidth: float, timer: Callable[[Callable[[], object]], float] = _median_ms
) -> AttentionResult:
    """Our block attention vs SDPA on one shape (outputs checked equal first)."""
    from trtllm_dflash.ops.kernels import attention_traffic, launch

    s = shape
    dtype = getattr(torch, s.dtype)
    size = torch.tensor([], dtype=dtype).element_size()
    capacity = s.context + s.block
    k_cache = torch.randn(s.batch, capacity, s.kv_heads, s.head_dim, dtype=dtype, device="cuda")
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(s.batch, s.block, s.heads, s.head_dim, dtype=dtype, device="cuda")
    k_block, v_block = (torch.randn(s.batch, s.block, s.kv_heads, s.head_dim, dtype=dtype, device="cuda") for _ in range(2))
    k_new, v_new = (torch.randn(s.batch, s.new_rows, s.kv_heads, s.head_dim, dtype=dtype, device="cuda") for _ in range(2))
    counts = torch.full((s.batch,), s.new_rows, dtype=torch.int64, device="cuda")
    lens = torch.full((s.batch,), s.context - s.new_rows, dtype=torch.int64, device="cuda")  # the step ends at `context`
    scale = s.head_dim**-0.5

    def ours():
        return launch.block_attention(q, k_block, v_block, k_new, v_new, counts, k_cache, v_cache, lens, scale, 0)

    ours()  # appends the new rows, so the cache holds this step's context for torch too
    # the same attention with torch: [b, heads, tokens, D] operands prepared outside the timing
    keys = torch.cat([k_cache[:, : s.context], k_block], dim=1).transpose(1, 2).contiguous()
    values = torch.cat([v_cache[:, : s.context], v_block], dim=1).transpose(1, 2).contiguous()
    queries = q.transpose(1, 2).contiguous()

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(queries, keys, values, scale=scale, enable_gqa=True)

    torch.testing.assert_close(ours().float(), sdpa().transpose(1, 2).float(), atol=3e-2, rtol=3e-2)
    # bytes that must move: context K/V read, block K/V + queries read, outputs + appended rows written
    floor_bytes = attention_traffic.block_attention_bytes(s.batch, s.block, s.heads, s.kv_heads, s.head_dim, s.context, s.new_rows, size)
    ms_ours, ms_sdpa = timer(ours), timer(sdpa)
    group = s.heads // s.kv_heads
    m_tiles = launch.attention_config(s.head_dim, s.block, group).m_tiles(s.block, group)
    splits = launch.default_kv_splits(s.batch, s.kv_heads, m_tiles, capacity, q.device)
    k_cache = v_cache = keys = values = None  # frees the memory (closures hold the names)
    torch.cuda.empty_cache()
    return AttentionResult(s, splits, ms_ours, floor_bytes / bandwidth * 1e3, ms_sdpa)


def bench_target_attention(
    shape,
    bandwidth: float,
    timer: Callable[[Callable[[], object]], float] | None = None,
    device: torch.device | None = None,
    kv_splits: int | None = None,
) -> TargetAttentionResult:
    """Our target attention (block written in place, causal over the row), with the shape's KV split and
    with one split, vs the fastest SDPA backend on the same step. `timer` and `device` default to
    do_bench on CUDA; the tests pass a CPU timer (the kernel then runs in Triton's interpreter)."""
    from trtllm_dflash.bench import sdpa_baseline
    from trtllm_dflash.ops.kernels import attention_traffic, launch

    s = shape
    device = device or torch.device("cuda")
    timer = timer or _median_ms
    inputs = attention_traffic.target_attention_bench_inputs(s, device)
    scale = s.head_dim_k**-0.5
    group = s.heads // s.kv_heads
    m_tiles = launch.target_attention_config(s.head_dim_k, s.head_dim_v, s.tokens, group).m_tiles(s.tokens, group)
    capacity = inputs["k_cache"].shape[1]
    splits = kv_splits or launch.default_target_kv_splits(s.batch, s.kv_heads, m_tiles, s.tokens, capacity, device)

    def ours(count=splits):
        return launch.target_attention(**inputs, sinks=None, scale=scale, window=s.window, kv_splits=count)

    got = ours()  # writes the block, so the cache holds this step's keys for torch too
    torch.testing.assert_close(ours(1).float(), got.float(), atol=3e-2, rtol=3e-2)
    operands = sdpa_baseline.verify_operands(inputs["q"], inputs["k_cache"], inputs["v_cache"], s.context, scale, s.window)
    timings = sdpa_baseline.time_candidates(operands, got, timer)
    best = sdpa_baseline.fastest(timings)
    floor_bytes = s.bytes_moved()
    ms_ours = timer(ours)
    ms_unsplit = timer(lambda: ours(1)) if splits > 1 else ms_ours
    inputs = operands = None  # frees the memory (closures hold the names)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return TargetAttentionResult(
        s, ms_ours, floor_bytes / bandwidth * 1e3, best.ms, splits, ms_unsplit, best.candidate.name, timings, floor_bytes
    )


def bench_verify(shape: VerifyShape, bandwidth: float, timer: Callable[[Callable[[], object]], float] = _median_ms) -> VerifyResult:
    """Both verification kernels on one shape, checked equal to the torch reference."""
    from trtllm_dflash.ops import reference
    from trtllm_dflash.ops.kernels import launch

    s = shape
    batch, block, vocab = s.batch, s.block, s.vocab
    logits = (torch.randn(batch, block, vocab, device="cuda") * 3).to(getattr(torch, s.logits_dtype))
    tokens = torch.randint(0, vocab, (batch, block), device="cuda")
    temperature = torch.full((batch,), 0.0 if s.mode == "greedy" else 0.8, device="cuda")
    top_k = torch.full((batch,), 50 if s.mode == "top-k+top-p" else 0, device="cuda")
    top_p = torch.full((batch,), 0.9 if s.mode == "top-k+top-p" else 1.0, device="cuda")
    seed, start = torch.arange(batch, device="cuda"), torch.zeros(batch, dtype=torch.int64, device="cuda")
    draft = None
    if s.mode != "greedy":
        draft = torch.softmax(torch.randn(batch, block - 1, vocab, device="cuda"), -1)

    def ours():
        return launch.verify_block(logits, tokens, draft, temperature, top_k, top_p, seed, start)

    got = ours()
    args = (logits, tokens, draft, temperature, top_k, top_p, seed, start)
    expected = reference.verify_block_packed(*(x.cpu() if torch.is_tensor(x) else x for x in args))
    agrees = bool(torch.equal(got.cpu(), expected))
    floor_bytes = logits.numel() * logits.element_size() + (draft.numel() * 4 if draft is not None else 0)
    return VerifyResult(s, timer(ours), floor_bytes / bandwidth * 1e3, agrees)


def run_kernel_benchmark(
    attention_shapes: list[AttentionShape] = ATTENTION_SHAPES,
    verify_shapes: list[VerifyShape] = VERIFY_SHAPES,
    progress: Callable[[str], None] | None = None,
    target_shapes: list | None = None,
    in_graph: bool = False,
) -> KernelBenchmark:
    """Measure the copy bandwidth, then every shape (needs CUDA and triton). `in_graph`: time each
    kernel and SDPA candidate replayed from a CUDA graph (`graph_median_ms`), not as launched from Python."""
    from trtllm_dflash.extras import require

    require("triton", purpose="the DFlash plugin kernels")
    say = progress or (lambda text: None)
    timer = graph_median_ms if in_graph else _median_ms
    say("copy bandwidth")
    bandwidth = copy_bandwidth()
    attention = []
    for shape in attention_shapes:
        say(f"attention {shape.label} context {shape.context} batch {shape.batch}")
        attention.append(bench_attention(shape, bandwidth, timer))
    verify = []
    for shape in verify_shapes:
        say(f"verify {shape.logits_dtype} {shape.mode} batch {shape.batch}")
        verify.append(bench_verify(shape, bandwidth, timer))
    from trtllm_dflash.ops.kernels import attention_traffic

    target = []
    for shape in attention_traffic.TARGET_ATTENTION_BENCH_SHAPES if target_shapes is None else target_shapes:
        say(f"target attention {shape.name}")
        target.append(bench_target_attention(shape, bandwidth, timer=timer))
    return KernelBenchmark(bandwidth, attention, verify, target, "in-graph" if in_graph else "launched")


def target_table(results: list[TargetAttentionResult]) -> str:
    """Markdown: target attention with the shape's KV split and with one, against the floor and the
    fastest SDPA backend (named), then the SDPA candidates that refused a shape."""
    lines = [
        "Target attention (bf16; the block written into the cache in place, causal over each row's own length; "
        "SDPA: the fastest backend that computes the same step, `trtllm_dflash.bench.sdpa_baseline`):",
        "",
        "| shape | heads / KV / head_dim | tokens | context | batch | KV splits | ours (ms) | ours, 1 split (ms) | MB moved | "
        "floor (ms) | % of floor | best SDPA backend | SDPA (ms) | SDPA / ours |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in results:
        s = r.shape
        unsplit = f"{r.unsplit_ms:.4f}" if r.unsplit_ms is not None else "-"
        lines.append(
            f"| {s.name} | {s.heads} / {s.kv_heads} / {s.head_dim_k} | {s.tokens} | {s.context} | {s.batch} | {r.kv_splits} | "
            f"{r.ours_ms:.4f} | {unsplit} | {(r.bytes_moved or s.bytes_moved()) / 1e6:.1f} | {r.floor_ms:.4f} | {r.floor_fraction:.0%} | "
            f"{r.sdpa_backend or '-'} | {r.sdpa_ms:.4f} | {r.sdpa_ratio:.2f}x |"
        )
    refused = sorted({(t.candidate.name, t.refused) for r in results for t in r.sdpa_timings if t.ms is None})
    if refused:
        lines += ["", "SDPA candidates that did not run (on at least one shape):", ""]
        lines += [f"- {name}: {why}" for name, why in refused]
    return "\n".join(lines)


def result_json(result: KernelBenchmark) -> dict:
    """The whole benchmark as plain data (for a JSON file beside the markdown)."""
    return dataclasses.asdict(result)


def goal_lines(result: KernelBenchmark) -> list[str]:
    """The goals, met or missed, with the shapes that miss them (reported, not enforced)."""
    lines = []
    slow = [r for r in result.attention if r.floor_fraction < FLOOR_GOAL]
    slow_verify = [r for r in result.verify if r.floor_fraction < FLOOR_GOAL]
    slow_target = [r for r in result.target if r.floor_fraction < FLOOR_GOAL]
    behind_sdpa = [r for r in result.attention if r.sdpa_ratio <= 1.0]
    target_behind = [r for r in result.target if r.sdpa_ratio <= 1.0]
    goal = f">= {FLOOR_GOAL:.0%} of the bandwidth floor"
    total = len(result.attention) + len(result.verify) + len(result.target)
    met = total - len(slow) - len(slow_verify) - len(slow_target)
    misses = [f"attention {_attention_name(r.shape)} ({r.floor_fraction:.0%})" for r in slow]
    misses += [f"verify {r.shape.logits_dtype} {r.shape.mode} batch {r.shape.batch} ({r.floor_fraction:.0%})" for r in slow_verify]
    misses += [f"target attention {r.shape.name} ({r.floor_fraction:.0%})" for r in slow_target]
    lines.append(
        f"{goal}: {'met' if not misses else 'MISSED'} at {met} of {total} shapes" + (f"; missed: {', '.join(misses)}" if misses else "")
    )
    compared = len(result.attention) + len(result.target)
    faster = compared - len(behind_sdpa) - len(target_behind)
    missed_sdpa = [f"{_attention_name(r.shape)} ({r.sdpa_ratio:.2f}x)" for r in behind_sdpa]
    missed_sdpa += [f"target {r.shape.name} ({r.sdpa_ratio:.2f}x)" for r in target_behind]
    lines.append(
        f"attention faster than torch SDPA: {'met' if not missed_sdpa else 'MISSED'} at {faster} of {compared} shapes"
        + (f"; missed: {', '.join(missed_sdpa)}" if missed_sdpa else "")
    )
    return lines


def _attention_name(shape: AttentionShape) -> str:
    return f"{shape.label} context {shape.context} batch {shape.batch}"


def summary_line(result: KernelBenchmark) -> str:
    """One line for the console: ranges, goals, reference agreement."""
    parts = [f"copy {result.bandwidth / 1e9:.0f} GB/s"]
    if result.attention:
        floors = [r.floor_fraction for r in result.attention]
        ratios = [r.sdpa_ratio for r in result.attention]
        parts.append(
            f"attention {len(floors)} shapes at {min(floors):.0%}-{max(floors):.0%} of floor, "
            f"SDPA/ours {min(ratios):.2f}-{max(ratios):.2f}x"
        )
    if result.verify:
        floors = [r.floor_fraction for r in result.verify]
        equal = sum(r.equal_to_reference for r in result.verify)
        parts.append(
            f"verify {len(floors)} shapes at {min(floors):.0%}-{max(floors):.0%} of floor, {equal}/{len(floors)} equal to reference"
        )
    return "; ".join(parts)


TIMING_NOTES = {
    "launched": "Times: triton's do_bench of each Python call (the launcher's host time included).",
    "in-graph": "Times: replays of a CUDA graph captured around each call (the kernels alone, as a captured step runs them).",
}


def kernel_tables(result: KernelBenchmark) -> str:
    """Markdown: the attention and verification tables and the goal lines."""
    lines = [
        f"Measured copy bandwidth: {result.bandwidth / 1e9:.0f} GB/s (device-to-device, read + write). "
        "Floor = bytes that must move / that bandwidth; % of floor = floor / ours. " + TIMING_NOTES[result.timing],
        "",
        "Block attention (bf16 unless noted; `new` = context rows appended in the step):",
        "",
        "| shape | heads / KV / head_dim | block | new | context | batch | KV splits "
        "| ours (ms) | floor (ms) | % of floor | torch SDPA (ms) | SDPA / ours |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result.attention:
        s = r.shape
        label = s.label if s.dtype == "bfloat16" else f"{s.label} ({s.dtype})"
        lines.append(
            f"| {label} | {s.heads} / {s.kv_heads} / {s.head_dim} | {s.block} | {s.new_rows} | {s.context} | {s.batch} | "
            f"{r.kv_splits} | {r.ours_ms:.4f} | {r.floor_ms:.4f} | {r.floor_fraction:.0%} | {r.sdpa_ms:.4f} | {r.sdpa_ratio:.2f}x |"
        )
    lines += [
        "",
        "Block verification (both kernels); floor = logits (+ draft probabilities) read once:",
        "",
        "| logits | rows | block | vocab | batch | ours (ms) | floor (ms) | % of floor | equal to reference |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in result.verify:
        s = r.shape
        lines.append(
            f"| {s.logits_dtype} | {s.mode} | {s.block} | {s.vocab} | {s.batch} | {r.ours_ms:.4f} | {r.floor_ms:.4f} | "
            f"{r.floor_fraction:.0%} | {'yes' if r.equal_to_reference else 'NO'} |"
        )
    if result.target:
        lines += ["", target_table(result.target)]
    lines += ["", "Goals (reported, not enforced):", ""] + [f"- {line}" for line in goal_lines(result)]
    return "\n".join(lines) + "\n"

"""Which kernel runs the target's attention in the decode passes: chosen by measurement (issue 39 item 4).

Why: the verify pass (a block of T = 16 tokens) and the AR pass (T = 1) attend once per layer, a
few microseconds each at small batch, times 36 layers. Which kernel does that fastest depends on
the GPU, the batch and the context, and only timing it there says. The candidates all compute
`reference_attention.target_attention` (the block written at each row's positions, then causal attention
over the row's own slots) on the caches in place, with no host read:

- "dflash": our `dflash::target_attention` op (Triton kernels; the torch reference off CUDA);
- "flash": torch's built-in FlashAttention-2 with per-row lengths (`ops.flash`), after writing the
  block; CUDA, float16/bfloat16, no attention sinks;
- "sdpa": `F.scaled_dot_product_attention` with a per-row boolean mask, after writing the block;
  any device (on CUDA it reads the pass's span bucket, so a CUDA graph can record it), no sinks.

Each is told the pass's `span` (the most slots a row reads, runtime/cuda_graphs.py): SDPA on CUDA
reads that many slots, rounded up to the span bucket so an eager pass computes what its graph
does (the capacity without a span); the op and flash read each row's own length. Flash and SDPA
take where each row writes from a `BlockPlace` the pass makes once for all its layers. A row
whose block starts at or past the capacity (a graph's padding row) reads nothing (flash: its
first T slots) and writes nothing (flash and SDPA: only its row's last slot, which nothing reads
before a request writes it); its output is discarded.

`measure` checks every candidate against the float32 reference on random inputs (per-row lengths,
every sliding window the model has, a padding row; the written caches compared), refuses
any that differs by more than `TOLERANCE`, times the rest at a few context lengths in caches of the
runtime's capacity at those contexts' span buckets (replayed from a CUDA graph with the L2 cache
flushed before each replay on a GPU, as a decoding step meets them; eagerly on a CPU), and keeps
the fastest per (tokens, batch bucket).
Other decode calls (a draft-length schedule's shorter blocks, batches past the buckets) run
"dflash", and so does every prefill, whatever the choice: a prefill's padded rows may run past the
capacity, which only the op's write drops.

A choice changes only rounding (each candidate within TOLERANCE of the reference), as any kernel
change does; greedy output stays the target's own up to near-ties. It is fixed once measured: a
runtime does not change kernels between steps.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch
import torch.nn.functional as F

from trtllm_dflash import ops
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.ops import flash, reference_attention
from trtllm_dflash.runtime.cuda_graphs import span_bucket
from trtllm_dflash.runtime.kernel_choice import bucketed, refusal, time_call

CANDIDATES = ("dflash", "flash", "sdpa")
CHOICES = (*CANDIDATES, "measure")
# relative L2 error against the float32 reference that still counts as the same attention: float32
# arithmetic, or one bf16/fp16 rounding of the output plus accumulation-order noise (METHOD: bf16
# operands land between 1e-3 and 1e-2)
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}
MEASURE_CONTEXTS = (256, 1024, 4096)  # context lengths each candidate is timed at (summed), up to the capacity
CHECK_CONTEXT = 2048  # longest context checked against the reference (long enough for the op's KV splits)

# (q, k, v, k_cache, v_cache, starts, sinks, scale, window, span=None, memo=None) -> [b, T, Hq, Dv]
Attend = Callable[..., torch.Tensor]


def relative_error(candidate: torch.Tensor, reference: torch.Tensor) -> float:
    """||candidate - reference|| / ||reference|| in float64 (inf where either is not finite)."""
    a, b = candidate.detach().double(), reference.detach().double()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@dataclasses.dataclass
class BlockPlace:
    """Where the rows of one decode pass write their blocks and how far they read: the same in every
    layer, so a pass computes it once (`memo`) and each layer's attention is its own kernels only.

    A graph's padding row (its block starting at or past the capacity) writes all its tokens into
    its row's last slot, which nothing reads before a request writes it (the padding rule of
    runtime/cuda_graphs.py), reads its first T slots only (flash) and gets zeros from SDPA."""

    rows: torch.Tensor  # [b, T]
    slots: torch.Tensor  # [b, T]
    live: torch.Tensor  # [b, 1, 1, 1]: not a padding row
    used: torch.Tensor  # [b] int32: the slots flash reads per row (the block's end; T for a padding row)
    masks: dict = dataclasses.field(default_factory=dict)  # SDPA's, by (span, window)

    @classmethod
    def of(cls, starts: torch.Tensor, tokens: int, capacity: int, memo: dict | None = None) -> "BlockPlace":
        key = (starts.data_ptr(), starts.shape[0], tokens, capacity)
        if memo is not None and key in memo:
            return memo[key]
        starts = starts.to(torch.int64)
        live = starts < capacity
        slots = (starts.view(-1, 1) + torch.arange(tokens, device=starts.device)).clamp_max(capacity - 1)
        rows = torch.arange(starts.shape[0], device=starts.device).view(-1, 1).expand(-1, tokens)
        used = torch.where(live, starts + tokens, tokens).to(torch.int32)
        place = cls(rows, slots, live.view(-1, 1, 1, 1), used)
        if memo is not None:
            memo[key] = place
        return place

    def visible(self, starts: torch.Tensor, span: int, window: int) -> torch.Tensor:
        """`[b, 1, T, span]`: SDPA's mask (causal, windowed, nothing for a padding row)."""
        if (span, window) not in self.masks:
            tokens = self.slots.shape[1]
            positions = starts.view(-1, 1, 1).to(torch.int64) + torch.arange(tokens, device=starts.device).view(1, -1, 1)
            slots = torch.arange(span, device=starts.device).view(1, 1, -1)
            visible = (slots <= positions) & self.live.view(-1, 1, 1)
            if window > 0:
                visible = visible & (slots > positions - window)
            self.masks[(span, window)] = visible.unsqueeze(1)
        return self.masks[(span, window)]


def write_block(k_cache: torch.Tensor, v_cache: torch.Tensor, place: BlockPlace, k: torch.Tensor, v: torch.Tensor) -> None:
    """Write `k/v [b, T, Hkv, D]` where `place` says, with no host read (a CUDA graph records it).
    Decode passes only: each row's block lies inside the capacity (the decoding loop's span rule),
    or is a graph's padding row's."""
    k_cache.index_put_((place.rows, place.slots), k.to(k_cache.dtype))
    v_cache.index_put_((place.rows, place.slots), v.to(v_cache.dtype))


def _dflash(q, k, v, k_cache, v_cache, starts, sinks, scale, window=0, span=None, memo=None) -> torch.Tensor:
    return ops.target_attention(q, k, v, k_cache, v_cache, starts, sinks, scale, window)


def _flash(q, k, v, k_cache, v_cache, starts, sinks, scale, window=0, span=None, memo=None) -> torch.Tensor:
    place = BlockPlace.of(starts, q.shape[1], k_cache.shape[1], memo)
    write_block(k_cache, v_cache, place, k, v)
    return flash.attend(q, k_cache, v_cache, place.used, scale, window)  # a padding row's output: any finite values


def _sdpa(q, k, v, k_cache, v_cache, starts, sinks, scale, window=0, span=None, memo=None) -> torch.Tensor:
    batch, tokens, heads = q.shape[:3]
    capacity = k_cache.shape[1]
    place = BlockPlace.of(starts, tokens, capacity, memo)
    write_block(k_cache, v_cache, place, k, v)
    # on a CPU only the live slots (a host read); on CUDA the span bucket, masked (graph-safe)
    if q.device.type != "cuda":
        span = min(int(torch.where(place.live.view(-1), starts, 0).max()) + tokens, capacity)
    else:
        span = span_bucket(span, capacity) if span is not None else capacity
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        k_cache[:, :span].transpose(1, 2),
        v_cache[:, :span].transpose(1, 2),
        attn_mask=place.visible(starts, span, window),
        scale=scale,
        enable_gqa=heads != k_cache.shape[2],
    )
    return out.transpose(1, 2)  # a padding row's: NaN or zeros, a softmax over nothing


RUNNERS: dict[str, Attend] = {"dflash": _dflash, "flash": _flash, "sdpa": _sdpa}


def unavailable_reason(name: str, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, sinks: torch.Tensor | None) -> str | None:
    """Why candidate `name` cannot run this call (None: it can)."""
    if name == "flash":
        return flash.unavailable_reason(q, k_cache, v_cache, sinks)
    if name == "sdpa" and sinks is not None:
        return "SDPA has no attention sinks"
    return None


@dataclasses.dataclass(frozen=True)
class LayerShape:
    """What the candidates are checked and timed on: one attention layer of the target."""

    heads: int
    kv_heads: int
    head_dim: int
    value_dim: int
    windows: tuple[int, ...] = (0,)  # every sliding window of the model's layers (0: full attention)
    sinks: bool = False  # gpt-oss's per-head sink logits

    @property
    def scale(self) -> float:
        return self.head_dim**-0.5


@dataclasses.dataclass(frozen=True)
class Timing:
    """A candidate at one (tokens, batch): its time summed over the contexts, or why it did not count."""

    candidate: str
    ms: float | None
    refused: str = ""


@dataclasses.dataclass(frozen=True)
class Choice:
    """The candidate kept for decode calls of `tokens` tokens in batches of up to `batch` rows."""

    tokens: int
    batch: int
    chosen: str
    timings: tuple[Timing, ...]
    contexts: tuple[int, ...]

    def line(self) -> str:
        parts = [f"{t.candidate} {t.ms:.4f} ms" if t.ms is not None else f"{t.candidate}: {t.refused}" for t in self.timings]
        return f"T={self.tokens} b<={self.batch}: {self.chosen} ({'; '.join(parts)})"


@dataclasses.dataclass
class AttentionChoices:
    """The kernel each decode call of the target's attention runs: one for all (`fixed`), or the
    measured `choices` by (tokens, smallest batch bucket holding the call's rows), else "dflash"."""

    fixed: str | None = "dflash"
    choices: tuple[Choice, ...] = ()

    def pick(self, tokens: int, batch: int) -> str:
        if self.fixed is not None:
            return self.fixed
        return bucketed(self.choices, tokens, batch, "dflash")

    def attend(self, q, k, v, k_cache, v_cache, starts, sinks, scale, window=0, span=None, memo=None) -> torch.Tensor:
        """`ops.target_attention`'s call, run by the kernel picked for q's (batch, tokens); `span` and
        `memo` (a dict per pass, for its BlockPlace): the pass's (see the module docstring)."""
        run = RUNNERS[self.pick(q.shape[1], q.shape[0])]
        return run(q, k, v, k_cache, v_cache, starts, sinks, scale, window, span=span, memo=memo)

    def describe(self) -> str:
        if self.fixed is not None:
            return f"target attention in decode passes: {self.fixed}"
        return "target attention in decode passes, by measurement:\n" + "\n".join("  " + c.line() for c in self.choices)


def _inputs(shape: LayerShape, batch: int, tokens: int, capacity: int, dtype: torch.dtype, generator: torch.Generator):
    """Random q/k/v and caches (never zeros: METHOD), and the sinks when the model has them."""
    device = generator.device
    make = lambda *size, dtype=dtype: torch.randn(*size, dtype=dtype, device=device, generator=generator)  # noqa: E731
    q = make(batch, tokens, shape.heads, shape.head_dim)
    k, v = make(batch, tokens, shape.kv_heads, shape.head_dim), make(batch, tokens, shape.kv_heads, shape.value_dim)
    k_cache, v_cache = make(batch, capacity, shape.kv_heads, shape.head_dim), make(batch, capacity, shape.kv_heads, shape.value_dim)
    sinks = make(shape.heads, dtype=torch.float32) if shape.sinks else None
    return q, k, v, k_cache, v_cache, sinks


def check(name: str, shape: LayerShape, batch: int, tokens: int, capacity: int, dtype: torch.dtype, device: torch.device) -> str | None:
    """Why candidate `name` is not the reference's attention here (None: it is, within TOLERANCE, with
    the caches written exactly), on random inputs with random per-row lengths and each window,
    called as a decode pass calls it. The last of several rows is a graph's padding row (at the
    capacity): its output is not compared (a pass discards it), and its row's last slot may change
    (BlockPlace); nothing else of its row may."""
    generator = torch.Generator(device=device).manual_seed(0)
    q, k, v, k_cache, v_cache, sinks = _inputs(shape, batch, tokens, capacity, dtype, generator)
    reason = unavailable_reason(name, q, k_cache, v_cache, sinks)
    if reason is not None:
        return reason
    starts = torch.randint(0, capacity - tokens + 1, (batch,), device=device, generator=generator)  # a length per row
    if batch > 1:
        starts[-1] = capacity
    live = starts < capacity
    span, memo = int(starts[live].max()) + tokens, {}
    for window in shape.windows:
        up = lambda t: t.to(torch.float32, copy=True)  # noqa: E731 - the reference writes its caches: copies
        want = reference_attention.target_attention(up(q), up(k), up(v), up(k_cache), up(v_cache), starts, sinks, shape.scale, window)
        expected_k, expected_v = k_cache.clone(), v_cache.clone()
        reference_attention.write_block(expected_k, expected_v, starts, k, v)
        got_k, got_v = k_cache.clone(), v_cache.clone()
        try:
            got = RUNNERS[name](q, k, v, got_k, got_v, starts, sinks, shape.scale, window, span=span, memo=memo)
        except Exception as error:  # noqa: BLE001 - the library refused the inputs, or a kernel did not compile or launch here
            return refusal(error)
        for cache, expected in ((got_k, expected_k), (got_v, expected_v)):
            expected[~live, -1] = cache[~live, -1]
        error = relative_error(got[live], want[live])
        tolerance = TOLERANCE.get(dtype, TOLERANCE[torch.float32])  # float64 models: float32's bound
        if not error <= tolerance:
            return f"differs from the reference by {error:.1e} (window {window}; tolerance {tolerance:.0e})"
        if not (torch.equal(got_k, expected_k) and torch.equal(got_v, expected_v)):
            return f"writes the caches differently from the reference (window {window})"
    return None


def measure_one(
    shapes: list[LayerShape], tokens: int, batch: int, capacity: int, dtype: torch.dtype, device: torch.device, candidates=CANDIDATES
) -> Choice:
    """Every candidate checked on every layer shape, the exact ones timed on the first shape at
    MEASURE_CONTEXTS (up to the capacity), the fastest kept.

    Timed on caches of the runtime's `capacity`, each context with the span a decode pass gives it
    (the context and the block), as the decode passes meet them: the op sizes its KV splits for the
    capacity (`launch.default_target_kv_splits`), and SDPA on CUDA reads the span's bucket."""
    contexts = tuple(sorted({min(c, capacity - tokens) for c in MEASURE_CONTEXTS if capacity - tokens > 0})) or (0,)
    check_capacity = min(max(contexts), CHECK_CONTEXT) + tokens
    generator = torch.Generator(device=device).manual_seed(1)
    shape = shapes[0]
    timings = []
    inputs = None  # one layer's caches at the capacity, shared by the candidates
    for name in candidates:
        refused = next((r for s in shapes if (r := check(name, s, batch, tokens, check_capacity, dtype, device)) is not None), None)
        if refused is not None:
            timings.append(Timing(name, None, refused))
            continue
        inputs = inputs or _inputs(shape, batch, tokens, max(capacity, tokens), dtype, generator)
        q, k, v, k_cache, v_cache, sinks = inputs
        total = 0.0
        for context in contexts:
            starts = torch.full((batch,), context, dtype=torch.int64, device=device)
            run, memo = RUNNERS[name], {}  # the pass's BlockPlace, made once as a pass makes it for all its layers
            total += time_call(
                lambda: run(q, k, v, k_cache, v_cache, starts, sinks, shape.scale, 0, span=context + tokens, memo=memo), device
            )
        timings.append(Timing(name, total) if not math.isnan(total) else Timing(name, None, "cannot be captured in a CUDA graph"))
    timed = [t for t in timings if t.ms is not None]
    chosen = min(timed, key=lambda t: t.ms).candidate if timed else "dflash"
    return Choice(tokens, batch, chosen, tuple(timings), contexts)


def measure(
    shapes: list[LayerShape],
    tokens: tuple[int, ...],
    batches: tuple[int, ...],
    capacity: int,
    dtype: torch.dtype,
    device: torch.device,
    say: Callable[[str], None] = lambda line: None,
) -> AttentionChoices:
    """The measured choice for every (tokens, batch bucket); `shapes`: the model's distinct layer shapes."""
    choices = []
    for count in tokens:
        for batch in batches:
            choices.append(measure_one(shapes, count, batch, capacity, dtype, device))
            say(choices[-1].line())
    return AttentionChoices(fixed=None, choices=tuple(choices))


def fixed(name: str, shapes: list[LayerShape], capacity: int, dtype: torch.dtype, device: torch.device) -> AttentionChoices:
    """`name` for every decode call, after checking it computes the reference's attention on every
    layer shape of the model (one line naming the problem otherwise)."""
    if name not in CANDIDATES:
        raise DFlashError(f"unknown attention choice {name!r}", f"use one of {', '.join(CHOICES)}")
    for shape in shapes if name != "dflash" else ():
        for tokens in (1, 4):
            reason = check(name, shape, 2, tokens, max(min(capacity, 64 + tokens), tokens), dtype, device)
            if reason is not None:
                raise DFlashError(
                    f"attention choice {name!r} cannot run this target: {reason}", "use attention_choice='dflash' (or 'measure')"
                )
    return AttentionChoices(fixed=name)

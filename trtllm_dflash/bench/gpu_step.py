"""The full-depth decoding step on a GPU, beside its floor (issue 39).

Why: the speed DFlash exists for is on Hopper and Blackwell, and a step timed on a 2-layer model
says little about a 36-layer one. This builds random weights at Qwen3-8B's exact shape (36
layers, hidden 4096, 32/8 heads, head_dim 128, FFN 12288, vocab 151,936, bf16) and a 5-layer
z-lab-shaped drafter that shares the target's embedding and LM head (block 16), then times each
part of a step at batch x context:

- from CUDA graphs (captured here around the runtime's own eager passes, replays timed with
  device events, median): the AR step (a 1-token target pass and its greedy verification), the
  16-token target verify pass, the draft pass, the verification kernels (greedy, temperature,
  top-k + top-p), and their sum, the DFlash step the GPU must run;
- through the decoding loop (`Decoder` on the runtime with `cuda_graphs=True`, as users run it):
  the wall time of an AR and a DFlash step, host syncs and eager parts included, and of a DFlash
  step with async scheduling (the host a step behind). The gap to the in-graph sum is what the
  host adds; the async column says how much of it overlapping hides.

Each GPU time sits beside its floor: max(bytes that must move / measured copy bandwidth, FLOPs /
measured bf16 GEMM rate), both ceilings measured in the same run. Projected tokens/s =
batch x tau / DFlash step (tau 3.5, 5, 6.5), and batch / AR step.

`--tiny` runs the same code on a 2-layer hidden-64 model, on CPU too (times from the host clock,
no graphs): it keeps the code path from rotting in CI, its numbers mean nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import statistics
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

from trtllm_dflash.bench import loop_timing, pass_profile
from trtllm_dflash.bench.step_results import (
    DEPENDENT_VERIFY_MODES,
    PADDING_STARTS,
    VERIFY_MODES,
    Ceilings,
    StepBenchmark,
    StepRow,
    StepShape,
    Timed,
    markdown,
    result_json,
    summary_line,
)
from trtllm_dflash.modeling.drafter import DFlashDrafter
from trtllm_dflash.runtime import verify_choice
from trtllm_dflash.runtime.base import SamplingTensors, draft_positions, sample_drafts
from trtllm_dflash.runtime.torch_runtime import TorchRuntime
from trtllm_dflash.testing.qwen3_8b_shaped import make_qwen3_8b_shaped_drafter, make_qwen3_8b_shaped_target

Say = Callable[[str], None]

QWEN3_8B = StepShape("Qwen3-8B", 36, 4096, 32, 8, 128, 12288, 151936, 5, 16, (1, 9, 17, 25, 33))
TINY = StepShape("tiny", 2, 64, 4, 2, 16, 128, 512, 1, 16, (0, 1))


# ------------------------------------------------------------------------------ models


def make_models(shape: StepShape, device: torch.device, dtype: torch.dtype) -> tuple[torch.nn.Module, DFlashDrafter]:
    """Random weights at `shape`, initialised on `device` in `dtype` (nothing downloaded or written)."""
    sizes = dict(
        hidden_size=shape.hidden,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        intermediate_size=shape.ffn,
    )
    target = make_qwen3_8b_shaped_target(shape.layers, shape.vocab, device, dtype, **sizes)
    drafter = make_qwen3_8b_shaped_drafter(
        target.config, shape.draft_layers, shape.block, device, dtype, target_layer_ids=shape.target_layer_ids
    )
    return target, drafter


def _bytes(modules: Iterable[torch.nn.Module]) -> int:
    return sum(p.numel() * p.element_size() for m in modules for p in m.parameters())


def _params(modules: Iterable[torch.nn.Module]) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())


# ------------------------------------------------------------------------------ floors


@dataclasses.dataclass(frozen=True)
class Floors:
    """Bytes and FLOPs each pass must move and compute, from the models' real parameter counts."""

    shape: StepShape
    target_weight_bytes: int  # decoder layers + final norm + LM head (the embedding is gathered, not read)
    target_params: int
    draft_weight_bytes: int  # the drafter's own layers + the shared LM head, read again
    draft_params: int
    element: int  # bytes per cache / logit element

    def kv_bytes(self, layers: int, batch: int, context: int) -> int:
        return layers * 2 * self.shape.kv_heads * self.shape.head_dim * self.element * batch * context

    def target_pass(self, batch: int, context: int, tokens: int) -> tuple[float, float]:
        s = self.shape
        moved = self.target_weight_bytes + self.kv_bytes(s.layers, batch, context) + batch * tokens * s.vocab * self.element
        attention = 4 * batch * tokens * context * s.heads * s.head_dim * s.layers
        return moved, 2 * self.target_params * batch * tokens + attention

    def draft_pass(self, batch: int, context: int) -> tuple[float, float]:
        s = self.shape
        moved = self.draft_weight_bytes + self.kv_bytes(s.draft_layers, batch, context) + batch * (s.block - 1) * s.vocab * self.element
        attention = 4 * batch * s.block * context * s.heads * s.head_dim * s.draft_layers
        return moved, 2 * self.draft_params * batch * s.block + attention

    def verification(self, batch: int, mode: str) -> tuple[float, float]:
        s = self.shape
        moved = batch * s.block * s.vocab * self.element  # the target's logits, read once
        if mode != "greedy":
            moved += batch * (s.block - 1) * s.vocab * 4  # the drafter's float32 q
        return moved, 0.0

    def draft_sampling(self, batch: int) -> tuple[float, float]:
        s = self.shape
        return batch * (s.block - 1) * s.vocab * (self.element + 4), 0.0  # the draft logits read, q written in float32


def floor_ms(moved_and_flops: tuple[float, float], ceilings: Ceilings) -> float:
    moved, flops = moved_and_flops
    return max(moved / ceilings.bandwidth, flops / ceilings.flops) * 1e3


def measure_ceilings(device: torch.device) -> Ceilings:
    """Copy bandwidth (1 GiB device-to-device, bytes read + written) and the bf16 GEMM rate (8192^3)."""
    if device.type != "cuda":
        return Ceilings(bandwidth=1e10, flops=1e11)  # --tiny on CPU: nominal, the numbers mean nothing
    from trtllm_dflash.bench.kernels import copy_bandwidth

    bandwidth = copy_bandwidth()
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    ms = _event_ms(lambda: a @ b, repeats=20)
    return Ceilings(bandwidth=bandwidth, flops=2 * 8192**3 / (ms / 1e3))


# ------------------------------------------------------------------------------ timers


def _event_ms(fn: Callable[[], object], repeats: int = 20) -> float:
    """Median device time of `fn` (CUDA events around each call), after 3 warm-up calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return statistics.median(times)


class PassTimer:
    """Times a pass from a CUDA graph captured around it (its eager form where capture fails, said
    so in the table); on CPU, from the host clock. Each graph gets its own memory pool, freed with
    the graph once it is timed (a pool shared by graphs that are freed while another's outputs
    live trips torch's allocator). A pass that fails outright (a kernel that does not compile or
    launch on this GPU) is said, marked "failed" in the table, and the rest of the run goes on: a
    GPU window keeps every other measurement."""

    def __init__(self, device: torch.device, repeats: int, say: Say) -> None:
        self.device, self.repeats, self.say = device, repeats, say

    def __call__(self, name: str, fn: Callable[[], object]) -> tuple[float, str]:
        try:
            return self._time(name, fn)
        except Exception as exc:  # noqa: BLE001 - said and marked; the row's other parts are still measured
            self.say(f"  {name}: failed ({_first_line(exc)})")
            return math.nan, "failed"

    def _time(self, name: str, fn: Callable[[], object]) -> tuple[float, str]:
        if self.device.type != "cuda":
            fn()
            started = time.perf_counter()
            for _ in range(self.repeats):
                fn()
            return (time.perf_counter() - started) / self.repeats * 1e3, "host"
        from trtllm_dflash.runtime import cuda_graphs

        try:
            replay, outputs = cuda_graphs.capture(fn, torch.cuda.graph_pool_handle())
        except Exception as exc:  # noqa: BLE001 - an uncapturable pass is timed eagerly and said so
            self.say(f"  {name}: capture failed ({_first_line(exc)}); timed eagerly")
            torch.cuda.synchronize()
            return _event_ms(fn, self.repeats), "eager"
        ms = _event_ms(replay, self.repeats)
        del replay, outputs
        torch.cuda.synchronize()
        return ms, "graph"


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:120]}"


# ------------------------------------------------------------------------------ the measurement


def _fill_caches(runtime: TorchRuntime) -> None:
    """Random K/V in every cache slot: attention is never timed on zeros."""
    for cache in (runtime.target_cache, runtime.draft_cache):
        for layer in cache.layers:
            if layer.keys is not None:
                layer.keys.normal_()
                layer.values.normal_()


def _sampling(batch: int, mode: str, device: torch.device) -> SamplingTensors:
    temperature = 0.0 if mode == "greedy" else 0.8
    top_k, top_p = (50, 0.9) if mode == "top-k+top-p" else (0, 1.0)
    full = lambda value, dtype: torch.full((batch,), value, dtype=dtype, device=device)  # noqa: E731
    return SamplingTensors(
        full(temperature, torch.float32),
        full(top_k, torch.long),
        full(top_p, torch.float32),
        torch.arange(batch, dtype=torch.long, device=device) + 17,
        # the host's copies, as the decoding loop keeps them: sampling branches (and the runtime's
        # verify choice) without reading the device
        greedy=(temperature <= 0,) * batch,
        top_ks=(top_k,) * batch,
        top_ps=(top_p,) * batch,
    )


def measure_row(
    runtime: TorchRuntime,
    floors: Floors,
    ceilings: Ceilings,
    timer: PassTimer,
    batch: int,
    context: int,
    profile: bool = False,
    compare_dependent: bool = False,
) -> StepRow:
    """The in-graph parts of a step at `batch` rows whose committed context is `context` tokens;
    `profile`: the AR, verify and draft passes' kernels by kind too (bench/pass_profile.py);
    `compare_dependent`: the three passes and two verifications again with the runtime's other `dependent_launch`."""
    s, device = floors.shape, runtime.device
    graphs = runtime.cuda_graphs
    target_forward = graphs._eager_target if graphs is not None else runtime.target_forward
    draft_forward = graphs._eager_draft if graphs is not None else runtime.draft_forward
    rows = slice(0, batch)
    g = torch.Generator(device="cpu").manual_seed(batch * 7919 + context)
    tokens = torch.randint(0, s.vocab, (batch, s.block), generator=g).to(device)
    starts = torch.full((batch,), context, dtype=torch.long, device=device)
    greedy = _sampling(batch, "greedy", device)
    row = StepRow(batch, context)

    def ar() -> object:
        out = target_forward(rows, tokens[:, :1], starts, context + 1)
        return runtime.verify(out.logits, tokens[:, :1], None, greedy, starts)

    ms, how = timer("ar", ar)
    row.parts["ar"] = Timed(ms, floor_ms(floors.target_pass(batch, context, 1), ceilings), how)

    span = context + s.block

    def verify_pass() -> object:
        return target_forward(rows, tokens, starts, span)

    ms, how = timer("verify pass", verify_pass)
    row.parts["verify pass"] = Timed(ms, floor_ms(floors.target_pass(batch, context, s.block), ceilings), how)
    if batch > 1:  # half the rows a graph's padding rows (a bucket holding fewer live requests), where they start
        for part, at_capacity in PADDING_STARTS.items():
            padded = starts.clone()
            padded[batch // 2 :] = runtime.capacity - (0 if at_capacity else s.block)
            ms, how = timer(part, lambda: target_forward(rows, tokens, padded, span))
            row.parts[part] = Timed(ms, floor_ms(floors.target_pass(batch, context, s.block), ceilings), how)

    features = torch.randn(batch, s.block, len(s.target_layer_ids) * s.hidden, generator=g).to(device, runtime.dtype)
    block = torch.full((batch, s.block), runtime.drafter_config.mask_token_id, dtype=torch.long, device=device)
    block[:, 0] = tokens[:, 0]
    # a full block of new context rows: the most a step injects (a step after tau accepted tokens injects tau)
    new_counts = torch.full((batch,), s.block, dtype=torch.long, device=device)
    cache_lens = starts - new_counts

    def draft_pass() -> object:
        return draft_forward(rows, block, features, new_counts, cache_lens)

    ms, how = timer("draft", draft_pass)
    row.parts["draft"] = Timed(ms, floor_ms(floors.draft_pass(batch, context), ceilings), how)
    if compare_dependent:  # the same passes, each graph captured with the other launch kind
        with _other_launches(runtime):
            for part, fn in (("ar", ar), ("verify pass", verify_pass), ("draft", draft_pass)):
                ms, how = timer(f"{part}, other launches", fn)
                row.parts[f"{part}, other launches"] = Timed(ms, row.parts[part].floor_ms, how)
    if profile:
        passes = (
            ("AR pass", ar, floors.target_weight_bytes),
            ("verify pass", verify_pass, floors.target_weight_bytes),
            ("draft pass", draft_pass, floors.draft_weight_bytes),
        )
        for (name, fn, weights), part in zip(passes, ("ar", "verify pass", "draft")):
            if row.parts[part].how != "failed":  # a failed pass has nothing to profile
                row.profiles.append(pass_profile.profile_pass(name, fn, device, row.parts[part].ms, weights))

    # verification on logits and drafts of the real shapes, random values (a random drafter's q)
    logits = torch.randn(batch, s.block, s.vocab, generator=g).to(device, runtime.dtype) * 4
    draft_logits = torch.randn(batch, s.block - 1, s.vocab, generator=g).to(device, runtime.dtype) * 4
    for mode in VERIFY_MODES:
        sampling = _sampling(batch, mode, device)
        probs = None
        if mode != "greedy":
            positions = draft_positions(starts, s.block - 1)
            proposal = sample_drafts(draft_logits, sampling, positions)
            block[:, 1:], probs = proposal.tokens, proposal.probs
            # the drafter's own sampling of its 15 positions: the torch ops of reference.sample_tokens, and
            # (on a GPU) the shortlist kernels, which --verify-choice shortlist also draws drafts with
            ms, how = timer(f"draft sampling {mode}", lambda: sample_drafts(draft_logits, sampling, positions))
            row.parts[f"draft sampling {mode}"] = Timed(ms, floor_ms(floors.draft_sampling(batch), ceilings), how)
            if device.type == "cuda":
                ms, how = timer(
                    f"draft sampling {mode} shortlist", lambda: verify_choice.sample_drafts_by_shortlist(draft_logits, sampling, positions)
                )
                row.parts[f"draft sampling {mode} shortlist"] = Timed(ms, floor_ms(floors.draft_sampling(batch), ceilings), how)
        ms, how = timer(f"verify {mode}", lambda: runtime.verify(logits, block, probs, sampling, starts))
        row.parts[f"verify {mode}"] = Timed(ms, floor_ms(floors.verification(batch, mode), ceilings), how)
        if compare_dependent and mode in DEPENDENT_VERIFY_MODES:  # its kernels as the other launch kind (3 to 16 short ones)
            with _other_launches(runtime):
                ms, how = timer(f"verify {mode}, other launches", lambda: runtime.verify(logits, block, probs, sampling, starts))
            row.parts[f"verify {mode}, other launches"] = Timed(ms, row.parts[f"verify {mode}"].floor_ms, how)
        if device.type == "cuda":  # the same decisions by the other kernel forms (issue 39 item 5, runtime/verify_choice.py)
            sampled = (sampling.temperature, sampling.top_k, sampling.top_p, sampling.seed, starts)
            for form in verify_choice.KERNEL_FORMS:
                verification = verify_choice.packed_verification(form)
                ms, how = timer(f"verify {mode} {form}", lambda: verification(logits, block, probs, *sampled))
                row.parts[f"verify {mode} {form}"] = Timed(ms, floor_ms(floors.verification(batch, mode), ceilings), how)
    return row


@contextlib.contextmanager
def _other_launches(runtime: TorchRuntime) -> Iterator[None]:
    """The runtime's passes with the other launch kind (ordinary or dependent) while inside."""
    runtime.dependent_launch = not runtime.dependent_launch
    try:
        yield
    finally:
        runtime.dependent_launch = not runtime.dependent_launch


def run(
    shape: StepShape = QWEN3_8B,
    batches: tuple[int, ...] = (1, 8, 32),
    contexts: tuple[int, ...] = (1024, 4096),
    loop_contexts: tuple[int, ...] = (1024,),
    loop_steps: int = 12,
    repeats: int = 20,
    device: str | None = None,
    out: Path | None = None,
    say: Say = print,
    fused: bool = True,
    attention_choice: str = "dflash",
    profile: bool = False,
    verify_choice: str = "positions",
    linear_choice: str = "torch",
    dependent_launch: str = "off",
) -> StepBenchmark:
    """Build the models, then measure every batch x context; `out` (markdown) is rewritten after each
    row. `fused=False` keeps the target on transformers' forward (the path before issue 39).
    `attention_choice`: the runtime's kernel for the target's attention in decode passes ("measure":
    timed per batch bucket when the runtime allocates; the table then lists every candidate's time).
    `profile`: at the first context, each batch's passes' kernels by kind (bench/pass_profile.py).
    `verify_choice`: the runtime's verification of sampled steps ("measure": timed per batch bucket).
    `linear_choice`: the runtime's kernels for the decode passes' projections (runtime/linear_choice.py).
    `dependent_launch`: "off", "on" (the runtime's `dependent_launch`), or "both": off, and each row's
    AR, verify and draft passes timed again with their kernels as dependent launches."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    say(f"building {shape.name}-shaped target ({shape.layers} layers) and {shape.draft_layers}-layer drafter on {dev}")
    started = time.perf_counter()
    target, drafter = make_models(shape, dev, dtype)
    say(f"built in {time.perf_counter() - started:.1f} s; measuring copy bandwidth and GEMM rate")
    ceilings = measure_ceilings(dev)
    lm_head = target.get_output_embeddings()
    element = torch.finfo(dtype).bits // 8
    floors = Floors(
        shape,
        target_weight_bytes=_bytes([target.model.layers, target.model.norm, lm_head]),
        target_params=_params([target.model.layers, target.model.norm, lm_head]),
        draft_weight_bytes=_bytes([drafter, lm_head]),
        draft_params=_params([drafter, lm_head]),
        element=element,
    )
    runtime = TorchRuntime(
        target,
        drafter,
        attention="dflash",
        cuda_graphs=dev.type == "cuda",
        fused=fused,
        attention_choice=attention_choice,
        verify_choice=verify_choice,
        linear_choice=linear_choice,
        dependent_launch=dependent_launch == "on",
    )
    if "measure" in (attention_choice, verify_choice, linear_choice):
        say("measuring the kernel candidates (runtime/attention_choice.py, verify_choice.py, linear_choice.py)")
    runtime.allocate(max(batches), max(contexts) + 4 * shape.block)
    passes = f"{runtime.attention}, {'fused' if runtime.fused is not None else 'transformers'} target pass"
    choices = "\n".join(c.describe() for c in (runtime.attention_choices, runtime.verify_choices, runtime.linear_choices))
    say(f"target attention: {passes}\n{choices}")
    _fill_caches(runtime)
    timer = PassTimer(dev, repeats, say)
    result = StepBenchmark(shape, torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", ceilings, passes, [], choices)
    for context in contexts:
        for batch in batches:
            say(f"batch {batch}, context {context}: in-graph passes")
            first = context == contexts[0]
            row = measure_row(runtime, floors, ceilings, timer, batch, context, profile and first, dependent_launch == "both")
            result.rows.append(row)
            if out is not None:
                out.write_text(markdown(result))
            say("  " + summary_line(row))
    for context in loop_contexts:
        for batch in batches:
            say(f"batch {batch}, context {context}: the decoding loop's steps")
            try:
                ar_ms, dflash_ms, async_ms = loop_timing.measure_loop(runtime, shape.vocab, shape.block, batch, context, loop_steps)
            except Exception as exc:  # noqa: BLE001 - as PassTimer: said, its columns left empty, the run goes on
                say(f"  loop: failed ({_first_line(exc)})")
                continue
            row = next(r for r in result.rows if r.batch == batch and r.context == context)
            row.loop_ar_ms, row.loop_dflash_ms, row.loop_async_ms = ar_ms, dflash_ms, async_ms
            if out is not None:
                out.write_text(markdown(result))
            say(f"  loop: AR {ar_ms:.2f} ms, DFlash {dflash_ms:.2f} ms, DFlash with async scheduling {async_ms:.2f} ms")
    if out is not None:
        out.with_suffix(".json").write_text(json.dumps(result_json(result), indent=1))
    return result

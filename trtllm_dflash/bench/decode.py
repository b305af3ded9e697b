"""Torch-runtime decode speed: DFlash vs autoregressive, with CUDA graphs off and on.

Why: the torch runtime is the reference and runs wherever no engine is built. On a GPU its
small-batch steps are launch-bound, and this measures what replaying the draft and verify passes
from CUDA graphs buys, and what a DFlash step costs against an autoregressive one at the same
width. Every variant decodes the same prompts, greedy, with no stop tokens (all requests run
their full length), after a warm-up pass that captures the graphs and compiles the kernels; the
time is the median of the timed passes. With graphs on, the tokens are compared with graphs off.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable, Sequence

import torch

from trtllm_dflash.contracts.defaults import DEFAULT_NEW_TOKENS
from trtllm_dflash.decoding import Decoder, Request, SamplingParams
from trtllm_dflash.modeling.drafter import DFlashDrafter
from trtllm_dflash.runtime.torch_runtime import TorchRuntime


@dataclasses.dataclass
class DecodeResult:
    """One variant (batch x AR/DFlash x graphs) decoding the whole prompt set."""

    model: str
    batch: int
    speculative: bool
    cuda_graphs: bool
    prompts: int
    tokens: int  # generated in one pass over the prompts
    seconds: float  # median wall time of one pass
    tau: float  # tokens committed per verify step (1 for autoregressive decoding)
    outputs: list[list[int]] = dataclasses.field(default_factory=list, repr=False)
    same_as_eager: bool | None = None  # graphs on (or the hf-attention run): the same tokens as graphs off
    attention: str = ""  # the torch runtime's target attention: dflash (the engines' op) or hf
    variant: str = ""  # "" for the main grid; "hf attention" for the comparison run beside it

    @property
    def mode(self) -> str:
        mode = "DFlash" if self.speculative else "AR"
        return f"{mode} ({self.variant})" if self.variant else mode

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _one_pass(decoder: Decoder, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> tuple[float, list]:
    requests = [Request(list(p), SamplingParams(max_new_tokens=max_new_tokens)) for p in prompts]
    _synchronize(decoder.device)
    started = time.perf_counter()
    results = decoder.generate(requests)
    _synchronize(decoder.device)
    return time.perf_counter() - started, results


def measure_variant(
    model: str,
    target: torch.nn.Module,
    drafter: DFlashDrafter | None,
    prompts: Sequence[Sequence[int]],
    batch: int,
    cuda_graphs: bool,
    max_new_tokens: int,
    repeats: int,
    attention: str = "auto",
) -> DecodeResult:
    """Warm up, then time `repeats` passes of one variant over the prompts."""
    runtime = TorchRuntime(target, drafter, attention=attention, cuda_graphs=cuda_graphs)
    try:
        max_context = max(len(p) for p in prompts) + max_new_tokens + 1
        decoder = Decoder(runtime, max_batch=batch, max_context=max_context)
        _one_pass(decoder, prompts, max_new_tokens)  # warm-up: graph captures, kernel compiles, allocator
        times, results = [], []
        for _ in range(max(repeats, 1)):
            seconds, results = _one_pass(decoder, prompts, max_new_tokens)
            times.append(seconds)
    finally:
        if runtime.taps is not None:
            runtime.taps.remove()  # the model outlives this runtime: leave no hooks on it
    steps = [n for r in results for n in r.acceptance_lengths]
    return DecodeResult(
        model=model,
        batch=batch,
        speculative=drafter is not None,
        cuda_graphs=cuda_graphs,
        prompts=len(prompts),
        tokens=sum(len(r.token_ids) for r in results),
        seconds=statistics.median(times),
        tau=sum(steps) / len(steps) if steps else 0.0,
        outputs=[r.token_ids for r in results],
        attention=runtime.attention,
    )


def measure_decode(
    model: str,
    target: torch.nn.Module,
    drafter: DFlashDrafter,
    prompts: Sequence[Sequence[int]],
    batches: Sequence[int] = (1, 8),
    max_new_tokens: int = DEFAULT_NEW_TOKENS,
    repeats: int = 3,
    progress: Callable[[str], None] | None = None,
) -> list[DecodeResult]:
    """AR and DFlash, graphs off and on, at each batch size (requests beyond it join as rows free)."""
    say = progress or (lambda text: None)
    results = []
    for batch in batches:
        for speculative in (False, True):
            eager = None
            for graphs in (False, True):
                say(f"{model}: batch {batch}, {'DFlash' if speculative else 'AR'}, CUDA graphs {'on' if graphs else 'off'}")
                result = measure_variant(model, target, drafter if speculative else None, prompts, batch, graphs, max_new_tokens, repeats)
                if graphs and eager is not None:
                    result.same_as_eager = result.outputs == eager.outputs
                if not graphs:
                    eager = result
                results.append(result)
            if speculative and eager is not None and eager.attention == "dflash":
                # the same step on the model's own attention (SDPA over the whole cache span): what the op buys
                say(f"{model}: batch {batch}, DFlash with transformers' attention, CUDA graphs off")
                hf = measure_variant(model, target, drafter, prompts, batch, False, max_new_tokens, repeats, attention="hf")
                hf.variant, hf.same_as_eager = "hf attention", hf.outputs == eager.outputs
                results.append(hf)
    return results


def _find(results: list[DecodeResult], batch: int, speculative: bool, graphs: bool) -> DecodeResult | None:
    return next((r for r in results if (r.batch, r.speculative, r.cuda_graphs, r.variant) == (batch, speculative, graphs, "")), None)


def _ratio(a: DecodeResult | None, b: DecodeResult | None) -> str:
    if a is None or b is None or b.tokens_per_second <= 0:
        return "-"
    return f"{a.tokens_per_second / b.tokens_per_second:.2f}x"


def decode_table(results: list[DecodeResult]) -> str:
    """Markdown: tokens/s, tau, DFlash vs AR and graphs vs eager, per batch and variant."""
    lines = [
        "| batch | mode | target attention | CUDA graphs | tokens | tok/s | tau | vs AR (same graphs setting) | graphs vs eager "
        "| same tokens as eager |",
        "|---:|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        ar = _find(results, r.batch, False, r.cuda_graphs)
        eager = _find(results, r.batch, r.speculative, False)
        same = "-" if r.same_as_eager is None else ("yes" if r.same_as_eager else "NO")
        lines.append(
            f"| {r.batch} | {r.mode} | {r.attention or '-'} | {'on' if r.cuda_graphs else 'off'} | {r.tokens} | "
            f"{r.tokens_per_second:.1f} | {r.tau:.2f} | {_ratio(r, ar)} | {_ratio(r, eager) if r.cuda_graphs else '-'} | {same} |"
        )
    return "\n".join(lines) + "\n"


def decode_summary(results: list[DecodeResult]) -> str:
    """One line per batch: DFlash/AR with graphs, and what graphs buy each mode."""
    parts = []
    for batch in sorted({r.batch for r in results}):
        ar_off, ar_on = _find(results, batch, False, False), _find(results, batch, False, True)
        df_off, df_on = _find(results, batch, True, False), _find(results, batch, True, True)
        tau = df_on.tau if df_on else (df_off.tau if df_off else 0.0)
        parts.append(
            f"batch {batch}: DFlash/AR {_ratio(df_on, ar_on)} with graphs ({_ratio(df_off, ar_off)} without), "
            f"graphs AR {_ratio(ar_on, ar_off)}, DFlash {_ratio(df_on, df_off)}, tau {tau:.2f}"
        )
    return "; ".join(parts)

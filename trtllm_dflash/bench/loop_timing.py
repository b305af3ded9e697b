"""The decoding loop's wall-clock steps on a runtime (the step benchmark's loop columns).

In-graph pass times say what the GPU does; a user's step also pays the host's scheduling, the
sampling branches and the reads of each step's result. These time `Decoder` steps as users run
them, autoregressive and DFlash on the same runtime, and DFlash with async scheduling (each step
launched before the one before is read).
"""

from __future__ import annotations

import statistics
import time

import torch

from trtllm_dflash.decoding import Decoder, Request, SamplingParams
from trtllm_dflash.runtime.torch_runtime import TorchRuntime


def measure_loop(runtime: TorchRuntime, vocab: int, block: int, batch: int, context: int, steps: int) -> tuple[float, float, float]:
    """Median wall-clock steps of the decoding loop (greedy, prompts of `context` tokens): AR, DFlash,
    and DFlash with async scheduling (each step launched before the one before is read)."""
    g = torch.Generator().manual_seed(context + batch)
    prompts = [torch.randint(0, vocab, (context,), generator=g).tolist() for _ in range(batch)]
    medians = []
    for speculative, overlap in ((False, False), (True, False), (True, True)):
        saved = runtime.drafter_config
        if not speculative:
            runtime.drafter_config = None  # the loop decodes autoregressively on the same runtime
        try:
            max_context = context + steps + 2 * block
            decoder = Decoder(runtime, max_batch=batch, max_context=max_context, prefill_chunk=0, async_scheduling=overlap)
            params = SamplingParams(max_new_tokens=steps, ignore_eos=True)
            decoder.generate([Request(p, params) for p in prompts])  # captures the graphs
            periods = step_periods(decoder, [Request(p, params) for p in prompts])
        finally:
            runtime.drafter_config = saved
        medians.append(statistics.median(periods) * 1e3)
    return medians[0], medians[1], medians[2]


def step_periods(decoder: Decoder, requests: list[Request]) -> list[float]:
    """Seconds between the ends of consecutive `step` calls while every request decodes: what a step
    costs the loop, the host's work and waits included (the prefill's call is not counted)."""
    for request in requests:
        decoder.submit(request)
    decoder.step()  # the prefill and the first step
    periods, last = [], time.perf_counter()
    while decoder.has_work:
        decoder.step()
        now = time.perf_counter()
        if len(decoder.live) == len(requests):
            periods.append(now - last)
        last = now
    return periods or [float("nan")]

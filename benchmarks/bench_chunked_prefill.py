"""Inter-token latency of short streams while long prompts join: chunked prefill against whole prompts.

Why: admitting a long prompt whole makes the step it joins in as slow as its whole prefill, so
every live stream stalls for it (issue 32). With `prefill_chunk` the prompt joins over several
steps and each step prefills at most that many tokens.

What runs (one process, the Decoder directly, CPU or `--device cuda`): a random Qwen3-architecture target (6 layers,
hidden 192, the issue's shape) with a random 2-layer drafter, block 8; 4 short streams (128-token
prompts, refilled as they finish) decode continuously; every `--long-every` steps a long prompt
(3,000 tokens, 8 new tokens, or `--long-new-tokens`) joins. Conditions, interleaved round by round so the other
processes on the machine load each alike: no long prompts, whole prompts (prefill_chunk 0), and
each chunk size. Reported per condition: the gap between consecutive token events of the short
streams (p50 / p90 / p99 / max, ms), the short requests' mean inter-token latency as aiperf
computes it (p90 over requests), and the long prompts' time to first token (mean, ms).

    .venv/bin/python benchmarks/bench_chunked_prefill.py --rounds 3 --steps 90 --long-every 45
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from trtllm_dflash.checkpoints import load_drafter, load_target
from trtllm_dflash.decoding import Decoder, Request, SamplingParams
from trtllm_dflash.runtime.torch_runtime import TorchRuntime
from trtllm_dflash.testing.tiny import make_tiny_drafter, make_tiny_target


def _run(
    runtime: TorchRuntime,
    chunk: int | None,
    steps: int,
    long_every: int,
    long_len: int,
    long_new: int,
    seed: int,
    share: float | None = None,
) -> tuple[list[float], list[float], list[float]]:
    """Short-stream event gaps, short requests' mean inter-token latency (aiperf's: (last - first
    token) / (tokens - 1)) and long-prompt TTFTs, in s, of one condition (chunk None: no long prompts)."""
    generator = torch.Generator().manual_seed(seed)
    vocab = runtime.vocab_size
    decoder = Decoder(runtime, max_batch=6, max_context=long_len + 200, prefill_chunk=chunk or 0, prefill_share=share)
    short = lambda: Request(torch.randint(3, vocab, (128,), generator=generator).tolist(), SamplingParams(max_new_tokens=64))  # noqa: E731
    shorts = {decoder.submit(short()) for _ in range(4)}
    last: dict = {}
    first: dict = {}
    gaps, itls, ttfts = [], [], []
    for step in range(steps):
        if chunk is not None and step % long_every == long_every // 2:
            decoder.submit(
                Request(torch.randint(3, vocab, (long_len,), generator=generator).tolist(), SamplingParams(max_new_tokens=long_new))
            )
        events = decoder.step()
        now = time.perf_counter()
        for event in events:
            if event.request_id in shorts:
                if event.request_id in last and event.new_token_ids:
                    gaps.append(now - last[event.request_id])
                last[event.request_id] = now
                first.setdefault(event.request_id, now)
                if event.finished:
                    if len(event.result.token_ids) > 1:
                        itls.append((now - first[event.request_id]) / (len(event.result.token_ids) - 1))
                    shorts.discard(event.request_id)
                    shorts.add(decoder.submit(short()))
            elif event.request_id not in last:  # a long prompt's first token
                last[event.request_id] = now
                ttfts.append(event.result.time_to_first_token)
    return gaps, itls, ttfts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=90, help="decoding steps per condition and round")
    parser.add_argument("--long-every", type=int, default=45, help="a long prompt joins every this many steps")
    parser.add_argument("--long-len", type=int, default=3000)
    parser.add_argument(
        "--long-new-tokens", type=int, default=8, help="tokens a long prompt generates (1: it never decodes, which isolates its prefill)"
    )
    parser.add_argument("--chunks", default="512", help="chunk sizes to compare with whole prompts")
    parser.add_argument(
        "--shares", default="", help="prefill shares (runtime/step_schedule.py) to compare, each with the first --chunks size as its cap"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the model runs eagerly, float32)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp())
    target_dir = make_tiny_target(root / "target", "qwen3", seed=1, num_layers=6, hidden_size=192, vocab_size=1024)
    drafter_dir = make_tiny_drafter(root / "drafter", target_dir, seed=2, block_size=8, target_layer_ids=(1, 4))
    target = load_target(target_dir, device=args.device, dtype=torch.float32)
    runtime = TorchRuntime(target.model, load_drafter(drafter_dir, target))
    conditions: list[tuple[str, int | None, float | None]] = [("no long prompts", None, None), ("whole (prefill_chunk 0)", 0, None)]
    conditions += [(f"prefill_chunk {c}", int(c), None) for c in args.chunks.split(",")]
    cap = int(args.chunks.split(",")[0])
    conditions += [(f"prefill_chunk {cap}, prefill_share {s}", cap, float(s)) for s in args.shares.split(",") if s]
    _run(runtime, 0, 20, 10, args.long_len, args.long_new_tokens, seed=99)  # warm-up
    gaps: dict[str, list[float]] = {name: [] for name, *_ in conditions}
    itls: dict[str, list[float]] = {name: [] for name, *_ in conditions}
    ttfts: dict[str, list[float]] = {name: [] for name, *_ in conditions}
    for round_ in range(args.rounds):
        for name, chunk, share in conditions:
            g, i, t = _run(runtime, chunk, args.steps, args.long_every, args.long_len, args.long_new_tokens, seed=round_, share=share)
            gaps[name] += g
            itls[name] += i
            ttfts[name] += t
    ms = lambda values, q: 1000 * statistics.quantiles(values, n=100)[q - 1]  # noqa: E731
    base_p90, base_p99 = ms(gaps["no long prompts"], 90), ms(gaps["no long prompts"], 99)
    print(
        f"torch {torch.__version__}, {args.device}, {args.threads} threads, {args.rounds} rounds x {args.steps} steps, "
        f"a {args.long_len}-token prompt ({args.long_new_tokens} new tokens) every {args.long_every} steps"
    )
    print(
        "| condition | gap p50 ms | gap p90 ms | gap p99 ms | gap max ms | p90 / no long | p99 / no long "
        "| short requests' mean ITL p90 ms | long TTFT mean ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, *_ in conditions:
        g = gaps[name]
        itl = f"{ms(itls[name], 90):.1f}" if len(itls[name]) > 1 else "-"
        ttft = f"{1000 * statistics.mean(ttfts[name]):.0f}" if ttfts[name] else "-"
        print(
            f"| {name} | {ms(g, 50):.1f} | {ms(g, 90):.1f} | {ms(g, 99):.1f} | {1000 * max(g):.0f} | {ms(g, 90) / base_p90:.2f}x "
            f"| {ms(g, 99) / base_p99:.2f}x | {itl} | {ttft} |"
        )


if __name__ == "__main__":
    main()

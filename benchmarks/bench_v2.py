"""DFlash V1 vs V2 on the demo pair, in one run: autoregressive, V1 and V2 decoding side by side.

Why: a V2 drafter (grouped dynamic convs + candidate selector) is only worth its extra weights
if it commits more tokens per verify step than the V1 drafter it was trained from, at a speed that
still pays. Every mode decodes the same held-out prompts in the torch runtime, greedy, batch 1,
no stop tokens, in interleaved rounds (median wall time per mode); DFlash outputs are checked
token for token against the autoregressive ones.

Beside the speed, the drafters' teacher-forced quality on held-out data: the sequences are the
prompts plus the target's own greedy continuations, every continuation position is an anchor,
and each block position is scored against the target's token (base top-1 for V1 and V2; for V2
also candidate_recall, the share of positions whose target token is among the selector's top-k
candidates, and the selector's top-1 with the true previous token).

    python benchmarks/bench_v2.py --drafter-v2 trtllm_dflash/demo/drafter_v2 --json benchmarks/results/demo-v2-cpu.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
from pathlib import Path

import torch


def decode_rounds(pipes: dict, prompts: list[str], max_new_tokens: int, rounds: int) -> dict:
    """Per mode: median seconds of one pass over the prompts, tokens, tau and the outputs."""
    for pipe in pipes.values():  # warm-up: first-call allocations and caches
        pipe.generate(prompts[:2], max_new_tokens=8, stop_token_ids=(), max_batch=1)
    seconds: dict[str, list[float]] = {name: [] for name in pipes}
    outputs: dict[str, list] = {}
    for _ in range(rounds):
        for name, pipe in pipes.items():
            started = time.perf_counter()
            outputs[name] = pipe.generate(prompts, max_new_tokens=max_new_tokens, stop_token_ids=(), max_batch=1)
            seconds[name].append(time.perf_counter() - started)
    reference = [o.token_ids for o in outputs["AR"]]
    results = {}
    for name, outs in outputs.items():
        tokens = sum(len(o.token_ids) for o in outs)
        lengths = [a for o in outs for a in o.acceptance_lengths]
        median = statistics.median(seconds[name])
        results[name] = {
            "tokens": tokens,
            "seconds": round(median, 3),
            "seconds_per_round": [round(s, 3) for s in seconds[name]],
            "tokens_per_second": round(tokens / median, 1),
            "tau": round(sum(lengths) / len(lengths), 3) if name != "AR" else 1.0,
            "identical_to_ar": sum(o.token_ids == r for o, r in zip(outs, reference)),
        }
    ar = results["AR"]["tokens_per_second"]
    for row in results.values():
        row["speedup"] = round(row["tokens_per_second"] / ar, 3)
    return results, reference


@torch.no_grad()
def held_out_quality(pipe, drafter, prompt_ids: list[list[int]], continuations: list[list[int]]) -> dict:
    """Teacher-forced per-position agreement with the target on prompt + target continuation."""
    from trtllm_dflash.modeling.taps import HiddenTaps
    from trtllm_dflash.training.objective import dflash_loss, make_block_batch

    model = pipe.runtime.model
    decoder = model.get_decoder()
    taps = HiddenTaps(decoder.layers, drafter.config.target_layer_ids)
    block = drafter.config.block_size
    sums: dict[str, float] = {}
    positions = 0
    try:
        for prompt, continuation in zip(prompt_ids, continuations):
            ids = torch.tensor([prompt + continuation])
            loss_mask = torch.zeros_like(ids)
            loss_mask[0, len(prompt) :] = 1
            decoder(input_ids=ids, use_cache=False)
            features = taps.features()
            # every position from the last prompt token on anchors a block (it predicts the continuation)
            anchors = torch.arange(len(prompt) - 1, ids.shape[1] - 1).unsqueeze(0)
            batch = make_block_batch(ids, anchors, loss_mask, block, drafter.config.mask_token_id)
            _, metrics = dflash_loss(drafter, model.get_input_embeddings(), model.get_output_embeddings(), features, batch)
            count = int((batch.labels >= 0).sum())
            positions += count
            for key in ("accuracy", "candidate_recall", "selector_accuracy"):
                if key in metrics:
                    sums[key] = sums.get(key, 0.0) + metrics[key] * count
    finally:
        taps.remove()
    return {"positions": positions, **{key: round(value / positions, 4) for key, value in sums.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafter-v2", required=True, help="The V2 drafter directory (trained for the demo target).")
    parser.add_argument("--num-prompts", type=int, default=48)
    parser.add_argument("-n", "--max-new-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from trtllm_dflash.api import DFlashPipeline
    from trtllm_dflash.bench.prompts import load_prompt_set
    from trtllm_dflash.cli.common import quiet_libraries

    quiet_libraries()
    if args.threads:
        torch.set_num_threads(args.threads)
    prompts = load_prompt_set("stdlib", args.num_prompts)
    pipes = {
        "AR": DFlashPipeline.load("demo"),
        "V1": DFlashPipeline.load("demo", "demo"),
        "V2": DFlashPipeline.load("demo", args.drafter_v2),
    }
    started = datetime.datetime.now(datetime.timezone.utc)
    decode, reference = decode_rounds(pipes, prompts, args.max_new_tokens, args.rounds)
    prompt_ids = [pipes["AR"].encode(p) for p in prompts]
    quality = {name: held_out_quality(pipes[name], pipes[name].runtime.drafter, prompt_ids, reference) for name in ("V1", "V2")}
    v2_config = pipes["V2"].runtime.drafter.config
    report = {
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()} CPU, {torch.get_num_threads()} torch threads, no GPU",
        "torch": torch.__version__,
        "prompts": {
            "set": "stdlib (held-out demo prompts)",
            "count": len(prompts),
            "max_new_tokens": args.max_new_tokens,
            "temperature": 0.0,
            "batch": 1,
            "rounds": args.rounds,
        },
        "v2": {"selector_rank": v2_config.selector_rank, "selector_top_k": v2_config.selector_top_k, "block_size": v2_config.block_size},
        "decode": decode,
        "held_out_quality": quality,
    }
    print(f"{'mode':<4} {'tok/s':>8} {'speedup':>8} {'tau':>6} {'identical':>10}")
    for name, row in decode.items():
        print(
            f"{name:<4} {row['tokens_per_second']:>8.1f} {row['speedup']:>7.2f}x "
            f"{row['tau']:>6.2f} {row['identical_to_ar']:>5}/{len(prompts)}"
        )
    print(json.dumps(quality))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()

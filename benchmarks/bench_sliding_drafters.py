"""How much a sliding draft layer's reading changes acceptance (issue 29), on the demo pair.

The demo drafter with its first layer made `sliding_attention` (window W) drafts, in one run:
- `sliding`: as published (z-lab's non-causal layer, symmetric window |q - k| <= W - 1), what every
  runtime now does (tests/test_sliding_drafters.py checks it step for step against a reference);
- `sliding, causal (old)`: the same weights read the way this toolkit did before (causal inside the
  block), which keeps the output exact and changes only the acceptance;
- `wide`: sliding with a window of 4096, wider than every context, which must equal `full`;
- `full`: the drafter as shipped (every layer full attention).
Prints mean acceptance length (tau) per reading and on how many prompts each reading's acceptance
sequence differs from `sliding`'s and from `full`'s; every reading's tokens must equal the target's
greedy output (checked).

    python benchmarks/bench_sliding_drafters.py [--prompts 12] [--new-tokens 96] [--window 32] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import time
from pathlib import Path

import torch

from trtllm_dflash.checkpoints import load_drafter, load_target
from trtllm_dflash.contracts.draft_window import DraftWindow
from trtllm_dflash.decoding import Decoder, Request
from trtllm_dflash.demo import DEMO_DIR
from trtllm_dflash.runtime.torch_runtime import TorchRuntime
from trtllm_dflash.sampling_params import SamplingParams


def prompts(count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(DEMO_DIR / "target")
    texts = [json.loads(line)["prompt"] for line in (DEMO_DIR / "heldout_prompts.jsonl").read_text().splitlines()]
    ids = sorted((tokenizer(text)["input_ids"] for text in texts), key=len, reverse=True)
    return ids[:count]  # the longest held-out prompts


def reading(target, window: int, causal: bool, layers: int = 1):
    """The demo drafter with its first `layers` layers windowed (0: as shipped)."""
    drafter = load_drafter(DEMO_DIR / "drafter", target)
    config = drafter.config
    if layers:
        types = ("sliding_attention",) * layers + ("full_attention",) * (config.num_hidden_layers - layers)
        drafter.config = dataclasses.replace(config, layer_types=types, sliding_window=window)
        for layer in drafter.layers[:layers]:
            layer.self_attn.attention = DraftWindow(window, causal)
    return drafter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(2)
    target = load_target(DEMO_DIR / "target", dtype=torch.float32)
    batch = prompts(args.prompts)
    readings = {
        "sliding": reading(target, args.window, causal=False),
        "sliding, causal (old)": reading(target, args.window, causal=True),
        "wide (window 4096)": reading(target, 4096, causal=False),
        "full": reading(target, 0, False, layers=0),
    }

    def decode(runtime):
        decoder = Decoder(runtime, max_batch=len(batch), max_context=256)
        return decoder.generate([Request(list(p), SamplingParams(max_new_tokens=args.new_tokens)) for p in batch])

    plain = decode(TorchRuntime(target.model))  # autoregressive: the output every reading must give
    results, rows = {}, []
    for name, drafter in readings.items():
        start = time.perf_counter()
        out = decode(TorchRuntime(target.model, drafter))
        results[name] = out
        assert [r.token_ids for r in out] == [r.token_ids for r in plain], f"{name}: output differs from the target's"
        steps = [len(r.acceptance_lengths) for r in out]
        tokens = [sum(r.acceptance_lengths) for r in out]
        rows.append({"reading": name, "tau": sum(tokens) / sum(steps), "seconds": time.perf_counter() - start})

    def differing(name: str, other: str) -> int:
        return sum(a.acceptance_lengths != b.acceptance_lengths for a, b in zip(results[name], results[other]))

    for row in rows:
        row["prompts_differing_from_sliding"] = differing(row["reading"], "sliding")
        row["prompts_differing_from_full"] = differing(row["reading"], "full")
    print(
        f"demo pair, first draft layer sliding (window {args.window}), {len(batch)} prompts of "
        f"{min(map(len, batch))}-{max(map(len, batch))} tokens, {args.new_tokens} new tokens, greedy, float32"
    )
    print(f"{'reading':<24} {'tau':>6} {'differs from sliding':>22} {'differs from full':>19}")
    for row in rows:
        print(
            f"{row['reading']:<24} {row['tau']:6.3f} {row['prompts_differing_from_sliding']:>16} of {len(batch)}"
            f" {row['prompts_differing_from_full']:>13} of {len(batch)}"
        )
    print("every reading's output equals the target's greedy output")
    if args.json:
        args.json.write_text(
            json.dumps({"machine": platform.platform(), "args": vars(args) | {"json": str(args.json)}, "rows": rows}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()

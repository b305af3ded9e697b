"""NVFP4 PTQ (ModelOpt) of the demo target and of a Qwen3-8B-shaped 2-layer model, against BF16.

Prints the relative logit error and the greedy (argmax) agreement per model; needs a CUDA GPU
(on Hopper ModelOpt emulates NVFP4, on Blackwell the numerics are the same). RESULTS.md quotes
its output with the GPU, driver and versions:

    python benchmarks/bench_nvfp4_accuracy.py --json benchmarks/results/nvfp4-accuracy.json
"""

from __future__ import annotations

import argparse
import json
import sys

from trtllm_dflash.builder.nvfp4_accuracy import demo_target_accuracy, qwen3_8b_shaped_accuracy
from trtllm_dflash.errors import DFlashError


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", nargs="?", const="-", help="print JSON (or write it to this file)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    try:
        results = [demo_target_accuracy(), qwen3_8b_shaped_accuracy(seed=args.seed)]
    except DFlashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    if args.json:
        text = json.dumps(results, indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as handle:
                handle.write(text + "\n")
    for r in results:
        print(
            f"{r['model']}: relative logit error {r['relative_logit_error']:.4f}, greedy agreement "
            f"{100 * r['greedy_agreement']:.1f}% of {r['positions']} positions ({r['gpu']}, SM {r['compute_capability']}"
            f"{', NVFP4 emulated' if r['emulated'] else ''})",
            file=sys.stderr if args.json == "-" else sys.stdout,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

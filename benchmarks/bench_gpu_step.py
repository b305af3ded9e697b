"""The full-depth decoding step on a GPU against its floor (issue 39): a thin command line over
`trtllm_dflash.bench.gpu_step`, where what is measured and why is documented.

    python benchmarks/bench_gpu_step.py --out $OUT/step.md      # Qwen3-8B shape, batch 1/8/32 x context 1k/4k
    python benchmarks/bench_gpu_step.py --tiny                  # a 2-layer hidden-64 model, CPU too (CI)
    python benchmarks/bench_gpu_step.py --attention-choice measure   # the target's attention kernel timed and chosen per batch
    python benchmarks/bench_gpu_step.py --profile               # and where each pass's time goes, kernels by kind
    python benchmarks/bench_gpu_step.py --batches 1 --contexts 1024 --markdown benchmarks/RESULTS.md

The table is rewritten to --out after every row, so a run stopped at its time limit keeps what it measured.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
from pathlib import Path

import torch

from trtllm_dflash.bench import gpu_step


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a 2-layer hidden-64 model (runs on CPU; the numbers mean nothing)")
    parser.add_argument("--batches", type=_ints, default=None, help="comma-separated (default 1,8,32; --tiny 1,2)")
    parser.add_argument("--contexts", type=_ints, default=None, help="comma-separated (default 1024,4096; --tiny 32)")
    parser.add_argument(
        "--loop-contexts",
        type=_ints,
        default=None,
        help="contexts at which the decoding loop's steps are timed too (default the first context; '' for none)",
    )
    parser.add_argument("--loop-steps", type=int, default=12, help="decoding steps per loop measurement")
    parser.add_argument("--repeats", type=int, default=20, help="timed replays per pass")
    parser.add_argument("--no-fused", action="store_true", help="the target on transformers' forward (the path before issue 39)")
    parser.add_argument(
        "--attention-choice",
        default="dflash",
        choices=("dflash", "flash", "sdpa", "measure"),
        help="kernel of the target's attention in decode passes (measure: timed per batch bucket, the fastest exact one)",
    )
    parser.add_argument(
        "--verify-choice",
        default="positions",
        choices=("positions", "spread", "shortlist", "measure"),
        help="kernels verifying the runtime's sampled steps (measure: timed per batch bucket; the verify columns time every form anyway)",
    )
    parser.add_argument(
        "--linear-choice",
        default="torch",
        choices=("torch", "skinny", "measure"),
        help="kernels of the decode passes' projections (measure: cuBLAS and the skinny kernels timed per rows and weight shape)",
    )
    parser.add_argument(
        "--dependent-launch",
        default="off",
        choices=("off", "on", "both"),
        help="a decoding step's Triton kernels as programmatic dependent launches (Hopper on; both: each pass and the "
        "greedy and top-k+top-p verification timed either way)",
    )
    parser.add_argument("--profile", action="store_true", help="at the first context: each pass's kernels by kind (torch's profiler)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda where available)")
    parser.add_argument("--out", type=Path, default=None, help="markdown table, rewritten after every row (and a .json beside it)")
    parser.add_argument("--markdown", type=Path, default=None, help="append a dated section with the table to this file")
    args = parser.parse_args(argv)

    shape = gpu_step.TINY if args.tiny else gpu_step.QWEN3_8B
    batches = args.batches or ((1, 2) if args.tiny else (1, 8, 32))
    contexts = args.contexts or ((32,) if args.tiny else (1024, 4096))
    loop_contexts = contexts[:1] if args.loop_contexts is None else args.loop_contexts
    if args.device is None and not args.tiny and not torch.cuda.is_available():
        print(
            "bench_gpu_step: no CUDA device here; the full-depth benchmark needs one (use --tiny to run the code path on CPU)",
            file=sys.stderr,
        )
        return 2
    result = gpu_step.run(
        shape,
        batches,
        contexts,
        loop_contexts,
        args.loop_steps,
        args.repeats,
        args.device,
        args.out,
        say=lambda text: print(text, flush=True),
        fused=not args.no_fused,
        attention_choice=args.attention_choice,
        profile=args.profile,
        verify_choice=args.verify_choice,
        linear_choice=args.linear_choice,
        dependent_launch=args.dependent_launch,
    )
    table = gpu_step.markdown(result)
    print(table)
    if args.markdown is not None:
        versions = f"torch {torch.__version__}" + (f" (CUDA {torch.version.cuda})" if torch.version.cuda else "")
        header = (
            f"\n## Full-depth step on {result.device}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC\n\n"
            f"Command: `python benchmarks/bench_gpu_step.py {' '.join(argv if argv is not None else sys.argv[1:])}`; "
            f"{versions}, Python {platform.python_version()}.\n\n"
        )
        with args.markdown.open("a") as f:
            f.write(header + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

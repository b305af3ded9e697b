"""GPU benchmark of the DFlash plugin kernels (not a test: it needs an NVIDIA GPU and measures time).

A thin command line over `trtllm_dflash.bench.kernels` (what is measured and why is documented
there; `dflash-trt selftest --gpu` runs the same benchmark). By default it runs that module's
shape lists (`ATTENTION_SHAPES`, `VERIFY_SHAPES`: the Qwen3-8B DFlash drafter, contexts 1k/8k/32k,
batch 1/8/32); any shape option replaces them with the grid the options describe.

    python benchmarks/bench_kernels.py                 # prints a markdown report
    python benchmarks/bench_kernels.py --quick         # a smaller set of shapes
    python benchmarks/bench_kernels.py --markdown out.md
    python benchmarks/bench_kernels.py --target-only --json target.json   # target attention only

Target attention is timed with the KV split the shape gets and with one split, against the bandwidth
floor and the fastest torch SDPA backend for the step (`trtllm_dflash.bench.sdpa_baseline`: flash,
memory-efficient, cuDNN and math, each fed the layout and mask it accepts; the table names the winner).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys

import torch

from trtllm_dflash.bench import kernels as bench


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def shapes_from_args(args) -> tuple[list[bench.AttentionShape], list[bench.VerifyShape]]:
    """The module's shape lists, or the grid that the shape options describe."""
    attention = bench.QUICK_ATTENTION_SHAPES if args.quick else bench.ATTENTION_SHAPES
    verify = bench.QUICK_VERIFY_SHAPES if args.quick else bench.VERIFY_SHAPES
    options = ("dtype", "heads", "kv_heads", "head_dim", "block", "new_rows", "contexts", "batches", "vocab")
    if all(getattr(args, name) is None for name in options):
        return attention, verify
    base = bench.AttentionShape("custom", batch=1, context=1024)
    sizes = dict(
        heads=args.heads or base.heads,
        kv_heads=args.kv_heads or base.kv_heads,
        head_dim=args.head_dim or base.head_dim,
        block=args.block or base.block,
        new_rows=args.new_rows or base.new_rows,
        dtype=args.dtype or base.dtype,
    )
    contexts = args.contexts or sorted({s.context for s in attention})
    batches = args.batches or sorted({s.batch for s in attention})
    attention = [bench.AttentionShape("custom", batch=b, context=c, **sizes) for c in contexts for b in batches]
    verify = [
        bench.VerifyShape(b, mode, dtype, block=sizes["block"], vocab=args.vocab or bench.VerifyShape(1, "greedy").vocab)
        for dtype in ("float32", "bfloat16")
        for mode in bench.VERIFY_MODES
        for b in batches
    ]
    return attention, verify


def target_only_tables(result: bench.KernelBenchmark) -> str:
    """The bandwidth line, the target-attention table and its goals (what --target-only measured)."""
    goals = [f"- {line}" for line in bench.goal_lines(result)]
    return "\n".join(
        [
            f"Measured copy bandwidth: {result.bandwidth / 1e9:.0f} GB/s (device-to-device, read + write). "
            + bench.TIMING_NOTES[result.timing],
            "",
            bench.target_table(result.target),
            "",
            "Goals (reported, not enforced):",
            "",
            *goals,
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the smaller shape lists (QUICK_*_SHAPES)")
    parser.add_argument("--dtype", default=None, choices=["bfloat16", "float16"])
    parser.add_argument("--heads", type=int, default=None)
    parser.add_argument("--kv-heads", type=int, default=None)
    parser.add_argument("--head-dim", type=int, default=None)
    parser.add_argument("--block", type=int, default=None)
    parser.add_argument("--new-rows", type=int, default=None, help="context rows appended per step (accepted + 1)")
    parser.add_argument("--contexts", type=_ints, default=None, help="e.g. 1024,8192,32768")
    parser.add_argument("--batches", type=_ints, default=None, help="e.g. 1,8,32")
    parser.add_argument("--vocab", type=int, default=None)
    parser.add_argument(
        "--target-only", action="store_true", help="only target attention (attention_traffic.TARGET_ATTENTION_BENCH_SHAPES)"
    )
    parser.add_argument(
        "--in-graph",
        action="store_true",
        help="time each kernel and SDPA candidate from a captured CUDA graph (the launcher's time left out)",
    )
    parser.add_argument("--markdown", help="also append the report to this file")
    parser.add_argument("--json", help="also write the results (every SDPA candidate's time or refusal included) to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("error: this benchmark needs an NVIDIA GPU with a CUDA build of torch; run it on a GPU machine", file=sys.stderr)
        sys.exit(2)
    from trtllm_dflash.ops import kernels

    if not kernels.triton_available():
        print("error: triton is not installed; pip install 'trtllm-dflash[kernels]'", file=sys.stderr)
        sys.exit(2)
    import triton

    attention, verify = ([], []) if args.target_only else shapes_from_args(args)
    result = bench.run_kernel_benchmark(
        attention, verify, progress=lambda text: print(f"  {text}", file=sys.stderr), in_graph=args.in_graph
    )
    props = torch.cuda.get_device_properties(0)
    text = "\n".join(
        [
            f"### Plugin kernels on {props.name} ({props.multi_processor_count} SMs), {datetime.date.today().isoformat()}",
            "",
            f"Command: `python {' '.join(sys.argv)}`  ",
            f"torch {torch.__version__}, triton {triton.__version__}, CUDA {torch.version.cuda}, {platform.node()}",
            "",
            bench.kernel_tables(result) if not args.target_only else target_only_tables(result),
        ]
    )
    print(text)
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write("\n" + text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": props.name, "sms": props.multi_processor_count, **bench.result_json(result)}, f, indent=1, default=str)


if __name__ == "__main__":
    main()

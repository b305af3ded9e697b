"""Sampled verification and draft sampling on a CPU: this checkout's `ops/reference.py` against a
git revision's, side by side in one process, timed alternately, outputs compared (drafts, q bit for bit, verification).

The torch runtime samples through the reference on a CPU: the drafter's proposals
(`reference.sample_tokens`, every draft position) and the target's verification
(`reference.verify_block_packed`). Usage:

    python benchmarks/bench_sampling_cpu.py --before HEAD~1 [--vocab 151936] [--batch 1 8] [--threads 1]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from trtllm_dflash import ops
from trtllm_dflash.ops import reference, rng

SETTINGS = {  # name: (temperature, top_k, top_p)
    "greedy": (0.0, 0, 1.0),
    "temperature 1": (1.0, 0, 1.0),
    "temperature 0.7, top-k 50, top-p 0.9": (0.7, 50, 0.9),
    "Qwen3's: temperature 0.6, top-k 20, top-p 0.95": (0.6, 20, 0.95),
}


def _module_at(revision: str, path: str, name: str):
    """The file `path` as it was at `revision`, imported as module `name` (None where it did not exist)."""
    shown = subprocess.run(["git", "show", f"{revision}:{path}"], capture_output=True, text=True)
    if shown.returncode != 0:
        return None
    file = Path(tempfile.mkdtemp()) / f"{name}.py"
    file.write_text(shown.stdout)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def reference_at(revision: str):
    """`trtllm_dflash/ops/reference.py` as it was at `revision`, importing that revision's
    `sampling_support.py` (where it had one) rather than this checkout's."""
    support = _module_at(revision, "trtllm_dflash/ops/sampling_support.py", "sampling_support_before")
    current = ops.sampling_support
    ops.sampling_support = support or current  # what `from trtllm_dflash.ops import sampling_support` finds
    try:
        module = _module_at(revision, "trtllm_dflash/ops/reference.py", "reference_before")
    finally:
        ops.sampling_support = current
    if module is None:
        raise SystemExit(f"{revision} has no trtllm_dflash/ops/reference.py")
    return module


def step_inputs(batch: int, block: int, vocab: int, setting: tuple[float, int, float], seed: int):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(batch, block, vocab, generator=g) * 4).to(torch.bfloat16).float()  # bf16 logits, as models emit
    draft_logits = logits[:, 1:] + torch.randn(batch, block - 1, vocab, generator=g)
    temperature, top_k, top_p = (torch.full((batch,), value) for value in setting)
    return logits, draft_logits, temperature, top_k.long(), top_p, torch.arange(batch) * 7 + seed, torch.arange(batch) * 11


def one_step(module, inputs) -> tuple[torch.Tensor, ...]:
    """The drafter's samples at every draft position, their q, then the target's verification of them."""
    logits, draft_logits, temperature, top_k, top_p, seed, start = inputs
    positions = start.view(-1, 1) + torch.arange(1, logits.shape[1])
    drafts, q = module.sample_tokens(draft_logits, temperature, top_k, top_p, seed, positions, rng.STREAM_DRAFT)
    tokens = torch.cat([torch.zeros(logits.shape[0], 1, dtype=torch.long), drafts], dim=1)  # anchor 0, then the drafts
    verified = module.verify_block_packed(
        logits, tokens, q if bool((temperature > 0).any()) else None, temperature, top_k, top_p, seed, start
    )
    return drafts, q, verified


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision whose reference.py is 'before'")
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="alternations; the median of each side is reported")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    before = reference_at(args.before)
    print(f"vocab {args.vocab}, block {args.block}, {args.threads} thread(s), before = {args.before}, median of {args.rounds}")
    print("| batch | sampling | before (ms) | after (ms) | before / after | outputs equal |")
    print("|---:|---|---:|---:|---:|---|")
    for batch in args.batch:
        for name, setting in SETTINGS.items():
            inputs = step_inputs(batch, args.block, args.vocab, setting, seed=batch)
            times: dict[str, list[float]] = {"before": [], "after": []}
            outputs = {}
            for _ in range(args.rounds):
                for side, module in (("before", before), ("after", reference)):
                    started = time.perf_counter()
                    outputs[side] = one_step(module, inputs)
                    times[side].append((time.perf_counter() - started) * 1e3)
            equal = all(torch.equal(a, b) for a, b in zip(outputs["before"], outputs["after"]))
            b, a = statistics.median(times["before"]), statistics.median(times["after"])
            print(f"| {batch} | {name} | {b:.1f} | {a:.1f} | {b / a:.1f}x | {'yes' if equal else 'NO'} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a decoding step's time goes on this CPU: the runtime's passes, and the host around them (issue 38).

The demo pair on the torch runtime (float32, one thread), the 8 held-out stdlib prompts, greedy,
64 new tokens each, all in flight at batch 8 (or --batch). The runtime is wrapped so every pass
(`propose`, `target_verify`, `commit`) is timed; a step's host overhead is its wall time minus
the time inside passes: the scheduling, the bookkeeping and the per-row Python of the loop. Also
a cProfile summary of the Python functions with the most own time outside torch's calls.

    python benchmarks/bench_step_overhead.py                       # this checkout
    python benchmarks/bench_step_overhead.py --baseline /tmp/base  # and another checkout, interleaved

Each (checkout, repeat) runs in its own process; medians over --repeats.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

MARK = "STEP_OVERHEAD_RESULT "
PASSES = ("propose", "target_verify", "commit")


class TimedRuntime:
    """A runtime whose passes add their wall time to `inside` (everything else is delegated)."""

    def __init__(self, runtime) -> None:
        self.runtime, self.inside = runtime, 0.0
        for name in PASSES:
            setattr(self, name, self._timed(getattr(runtime, name)))

    def __getattr__(self, name):
        return getattr(self.runtime, name)

    def _timed(self, method):
        def run(*args, **kwargs):
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.inside += time.perf_counter() - started

        return run


def measure(batch: int, new_tokens: int, async_scheduling: bool = False) -> dict:
    import torch
    from transformers import AutoTokenizer

    from trtllm_dflash import demo
    from trtllm_dflash.bench.prompts import load_prompt_set
    from trtllm_dflash.checkpoints import load_drafter, load_target
    from trtllm_dflash.decoding import Decoder, Request, SamplingParams
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    torch.set_num_threads(1)
    target_dir = str(demo.target_dir())
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in load_prompt_set("stdlib", 8)]
    target = load_target(target_dir, dtype=torch.float32)
    runtime = TimedRuntime(TorchRuntime(target.model, load_drafter(str(demo.drafter_dir()), target=target)))
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)

    def run(profiler: cProfile.Profile | None = None) -> tuple[float, int, float]:
        extra = {"async_scheduling": True} if async_scheduling else {}  # a baseline checkout may not know it
        decoder = Decoder(runtime, max_batch=batch, max_context=max(map(len, prompts)) + new_tokens + 32, **extra)
        for prompt in prompts:
            decoder.submit(Request(list(prompt), params))
        runtime.inside, wall = 0.0, 0.0
        while decoder.has_work:
            started = time.perf_counter()
            if profiler is not None:
                profiler.enable()
            decoder.step()
            if profiler is not None:
                profiler.disable()
            wall += time.perf_counter() - started
        # speculative steps (with async scheduling the last call only reads the last step)
        return wall, len(decoder.stats), runtime.inside

    run()  # warm-up
    wall, steps, inside = run()
    profiler = cProfile.Profile()
    run(profiler)
    own = [
        (stat[2], f"{Path(path).name}:{line}({name})")
        for (path, line, name), stat in pstats.Stats(profiler).stats.items()
        if "trtllm_dflash" in path
    ]
    top = [[label, seconds / steps * 1e3] for seconds, label in sorted(own, reverse=True)[:8]]
    return {
        "steps": steps,
        "step_ms": wall / steps * 1e3,
        "passes_ms": inside / steps * 1e3,
        "host_ms": (wall - inside) / steps * 1e3,
        "top_own_ms": top,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout of this repository, measured interleaved")
    parser.add_argument("--async-scheduling", action="store_true", help="also this checkout with Decoder(async_scheduling=True)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        if args.tree is not None:  # import trtllm_dflash from that checkout, not this venv's editable install
            sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("__editable__")]
            sys.path.insert(0, str(args.tree.resolve()))
        print(MARK + json.dumps(measure(args.batch, args.new_tokens, args.async_scheduling)), flush=True)
        return

    trees = {"this checkout": (None, [])}
    trees |= {"this checkout, async scheduling": (None, ["--async-scheduling"])} if args.async_scheduling else {}
    trees |= {f"baseline ({args.baseline})": (args.baseline, [])} if args.baseline else {}
    results: dict[str, list[dict]] = {name: [] for name in trees}
    for repeat in range(args.repeats):
        for name, (tree, flags) in trees.items() if repeat % 2 == 0 else reversed(trees.items()):
            command = [sys.executable, __file__, "--worker", "--batch", str(args.batch), "--new-tokens", str(args.new_tokens), *flags]
            done = subprocess.run(
                command + (["--tree", str(tree)] if tree else []),
                capture_output=True,
                text=True,
                env={"OMP_NUM_THREADS": "1", **__import__("os").environ},
            )
            lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
            if done.returncode != 0 or not lines:
                raise SystemExit(f"bench_step_overhead: {name} failed: {done.stderr.strip().splitlines()[-1:]}")
            results[name].append(json.loads(lines[-1][len(MARK) :]))
    print(f"batch {args.batch}, {args.new_tokens} new tokens x 8 prompts, greedy, 1 thread, medians of {args.repeats} per checkout\n")
    print("| checkout | steps | ms per step | in the runtime's passes | host around them |")
    print("|---|---:|---:|---:|---:|")
    for name, runs in results.items():
        median = lambda key: statistics.median(r[key] for r in runs)  # noqa: E731
        print(f"| {name} | {runs[0]['steps']} | {median('step_ms'):.2f} | {median('passes_ms'):.2f} | {median('host_ms'):.2f} |")
    for name, runs in results.items():
        print(f"\n{name}: the project's functions with the most own time (cProfile, ms per step, one run):")
        for label, ms in runs[0]["top_own_ms"]:
            print(f"  {ms:7.3f}  {label}")


if __name__ == "__main__":
    main()

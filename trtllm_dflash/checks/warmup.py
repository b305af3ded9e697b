"""Warm Triton's compile cache before the GPU check times its tests.

Why: with a cold cache the first GPU test of each kernel variant compiles it (about 80 variants
for tests/test_plugin_gpu.py), so the tests' times measured the compiler and the test step ran
into its limit. This step launches each kernel variant those tests launch once, at the tests'
own shapes and dtypes (Triton specializes a compiled kernel on dtypes, constexprs, integer
arguments equal to 1 or divisible by 16 and pointer alignment, so the same shapes hit the same
cache entries), in parallel worker processes that write Triton's on-disk cache. The test
subprocess then loads the compiled kernels from disk.

The grids below are tests/test_plugin_gpu.py's parametrizations; tests/test_selftest.py checks
that they stay equal. A launch that raises (a variant that does not fit the GPU) is listed and
the warm-up goes on: the GPU tests report that failure themselves.

A worker is `python -m trtllm_dflash.checks.warmup INDEX COUNT`: it runs cases INDEX,
INDEX + COUNT, ... and logs each to $DFLASH_SELFTEST_PROGRESS (progress.py's format).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from trtllm_dflash.checks import runs
from trtllm_dflash.checks.progress import write_event

WARMUP_TIMEOUT_S = 300
MAX_WORKERS = 8
DTYPES = ("bfloat16", "float16", "float32")
# tests/test_plugin_gpu.py: test_block_attention_on_gpu (batch 3, block 16, capacity 3000, 8 new context rows)
BLOCK_ATTENTION_HEADS = ((32, 8, 128), (16, 16, 64), (8, 1, 256))
BLOCK_ATTENTION_SPLITS_WINDOWS = ((1, 0), (None, 0), (7, 0), (1, 40))
# test_target_attention_on_gpu (batch 4, capacity 3000): heads, kv_heads, key_dim, value_dim, tokens
TARGET_ATTENTION_SHAPES = ((32, 8, 128, 128, 16), (64, 8, 64, 64, 16), (16, 16, 128, 64, 1), (32, 16, 256, 256, 7), (32, 8, 128, 128, 300))
TARGET_ATTENTION_WINDOWS_SINKS = ((0, False), (0, True), (128, True), (1000, False))
CAPACITY = 3000


@dataclasses.dataclass(frozen=True)
class WarmupCase:
    """One kernel launch of the GPU tests: the op and its test parameters."""

    op: str  # block_attention, target_attention or verify
    params: tuple

    @property
    def name(self) -> str:
        return f"{self.op}[{'-'.join(str(p) for p in self.params)}]"


def warmup_cases() -> list[WarmupCase]:
    """Every kernel launch configuration of tests/test_plugin_gpu.py, once."""
    cases = [
        WarmupCase("block_attention", (dtype, *heads, *splits_window))
        for dtype, heads, splits_window in itertools.product(DTYPES, BLOCK_ATTENTION_HEADS, BLOCK_ATTENTION_SPLITS_WINDOWS)
    ]
    cases += [
        WarmupCase("target_attention", (dtype, *shape, *window_sinks))
        for dtype, shape, window_sinks in itertools.product(DTYPES, TARGET_ATTENTION_SHAPES, TARGET_ATTENTION_WINDOWS_SINKS)
    ]
    return cases + [WarmupCase("verify", ("float32", 8, 16, 151936))]


def launch_case(case: WarmupCase, device: str = "cuda") -> None:
    """Launch the case's kernels once on random inputs of the test's shapes (values do not matter)."""
    import torch

    from trtllm_dflash import ops
    from trtllm_dflash.ops.kernels import launch

    g = torch.Generator(device=device).manual_seed(0)

    def rand(*size, dtype=torch.float32):
        return torch.randn(*size, generator=g, device=device).to(dtype)

    def ints(high, *size):
        return torch.randint(0, high, size, generator=g, device=device)

    if case.op == "block_attention":
        dtype_name, heads, kv_heads, head_dim, kv_splits, window = case.params
        dtype, batch, block, new = getattr(torch, dtype_name), 3, 16, 8
        launch.block_attention(
            q=rand(batch, block, heads, head_dim, dtype=dtype),
            k_block=rand(batch, block, kv_heads, head_dim, dtype=dtype),
            v_block=rand(batch, block, kv_heads, head_dim, dtype=dtype),
            k_ctx_new=rand(batch, new, kv_heads, head_dim, dtype=dtype),
            v_ctx_new=rand(batch, new, kv_heads, head_dim, dtype=dtype),
            new_counts=ints(new + 1, batch),
            k_cache=rand(batch, CAPACITY, kv_heads, head_dim, dtype=dtype),
            v_cache=rand(batch, CAPACITY, kv_heads, head_dim, dtype=dtype),
            cache_lens=ints(CAPACITY - new, batch),
            scale=head_dim**-0.5,
            window=window,
            kv_splits=kv_splits,
        )
    elif case.op == "target_attention":
        dtype_name, heads, kv_heads, key_dim, value_dim, tokens, window, with_sinks = case.params
        dtype, batch = getattr(torch, dtype_name), 4
        starts = ints(CAPACITY - tokens, batch)
        starts[0], starts[-1] = 0, CAPACITY - tokens // 2
        launch.target_attention(
            q=rand(batch, tokens, heads, key_dim, dtype=dtype),
            k_new=rand(batch, tokens, kv_heads, key_dim, dtype=dtype),
            v_new=rand(batch, tokens, kv_heads, value_dim, dtype=dtype),
            k_cache=rand(batch, CAPACITY, kv_heads, key_dim, dtype=dtype),
            v_cache=rand(batch, CAPACITY, kv_heads, value_dim, dtype=dtype),
            starts=starts,
            sinks=rand(heads) if with_sinks else None,
            scale=key_dim**-0.5,
            window=window,
        )
    elif case.op == "verify":
        _, batch, block, vocab = case.params
        logits = rand(batch, block, vocab)
        ops.verify_block_packed(
            logits,
            ints(vocab, batch, block),
            torch.softmax(rand(batch, block - 1, vocab), dim=-1),
            torch.tensor([0.0, 1.0, 0.7, 1.0, 0.0, 0.9, 1.2, 0.6], device=device),
            torch.tensor([0, 0, 50, 0, 0, 20, 0, 1000], device=device),
            torch.tensor([1.0, 1.0, 1.0, 0.9, 1.0, 0.8, 0.95, 1.0], device=device),
            torch.arange(batch, device=device) * 31 + 7,
            torch.arange(batch, device=device) * 100,
        )
    else:
        raise ValueError(f"unknown warm-up op {case.op!r}")
    if device == "cuda":
        torch.cuda.synchronize()


def run_worker(cases: Sequence[WarmupCase], launch: Callable[[WarmupCase], None]) -> None:
    """Launch each case, logging its start and its outcome; a case that raises does not stop the rest."""
    write_event({"event": "collected", "count": len(cases)})
    for case in cases:
        write_event({"event": "start", "test": case.name})
        started = time.perf_counter()
        outcome, error = "passed", ""
        try:
            launch(case)
        except Exception as exc:  # noqa: BLE001 - recorded; the GPU tests report the kernel's failure
            outcome, error = "failed", f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
        write_event({"event": "finish", "test": case.name, "outcome": outcome, "seconds": time.perf_counter() - started, "error": error})


def worker_count() -> int:
    """Parallel compiles: the compiler is single-threaded per kernel; leave cores for the rest."""
    return max(1, min(MAX_WORKERS, (os.cpu_count() or 2) // 2))


def run_warmup(
    cwd: Path, say: Callable[[str], None] | None = None, limit_s: float = WARMUP_TIMEOUT_S, workers: int | None = None
) -> runs.LimitedRun:
    """All warm-up cases over `workers` subprocesses, stopped at `limit_s`."""
    workers = workers or worker_count()
    commands = [[sys.executable, "-m", "trtllm_dflash.checks.warmup", str(i), str(workers)] for i in range(workers)]

    def finished(record: runs.TestRecord) -> None:
        if say is not None and record.outcome != "passed":
            say(f"warm-up {record.outcome} {record.test}: {record.error}")

    return runs.run_with_progress(commands, cwd, limit_s, finished)


def warmup_report(run: runs.LimitedRun, workers: int) -> tuple[str, str, bool]:
    """(summary, markdown, passed): passed unless a worker crashed or the limit stopped them."""
    progress = run.progress
    raised = [r for r in progress.finished if r.outcome != "passed"]
    summary = f"{len(progress.finished)} kernel launches of tests/test_plugin_gpu.py in {workers} processes, {run.seconds:.0f} s"
    if run.timed_out:
        summary = runs.stopped_text(run, "the warm-up")
    crashed = [code for code in run.returncodes if code not in (0, None)]
    if crashed:
        summary += f"; {len(crashed)} worker(s) exited with status {crashed[0]}: " + " | ".join(run.output.strip().splitlines()[-2:])
    if raised:
        summary += f"; {len(raised)} raised (the GPU tests report them): " + "; ".join(f"{r.test} {r.error[:100]}" for r in raised[:3])
    slowest = runs.slowest(progress.finished, 5)
    markdown = f"{summary}.\n"
    if slowest:
        markdown += "\nThe slowest launches (compile included):\n\n" + runs.records_table(slowest)
    if raised:
        markdown += "\nLaunches that raised:\n\n" + runs.records_table(raised)
    return summary, markdown, not run.timed_out and not crashed


def main(argv: list[str]) -> int:
    index, count = int(argv[0]), int(argv[1])
    run_worker(warmup_cases()[index::count], launch_case)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The bench measurement: autoregressive vs DFlash, interleaved, in one run.

Machines are noisy (and ours are shared), so every comparison is made side by side: for each
prompt the autoregressive run and the DFlash runs at every block size are executed back to
back, in an order that rotates from prompt to prompt, and speedups are ratios of totals over
the same prompts. Reported:
- tokens/s of both modes, the speedup, and whether the outputs are identical (lossless check);
- tau (tokens committed per verify step): mean and histogram;
- time per step: autoregressive step vs draft step + verify step, and the tau-ideal speedup
  `tau * t_AR / (t_draft + t_verify)` next to the measured one (the gap is prefill and loop
  overhead outside the steps);
- a block-size sweep (tau and speedup per block size);
- a concurrency sweep: throughput vs per-user tokens/s for both modes (the Pareto curve).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Callable, Sequence

from trtllm_dflash.bench.systems import BenchSystem, SystemRun
from trtllm_dflash.contracts.defaults import DEFAULT_NEW_TOKENS
from trtllm_dflash.errors import DFlashError

Progress = Callable[[str, int, int], None]  # (phase, done, total)


@dataclasses.dataclass
class BenchConfig:
    max_new_tokens: int = DEFAULT_NEW_TOKENS
    block_size: int | None = None  # headline block size; default: the drafter's
    block_sizes: Sequence[int] | None = None  # sweep; default: powers of two up to the drafter's
    concurrency: Sequence[int] = (1, 2, 4, 8)
    repeats: int = 1  # passes over the prompt set in the main comparison
    warmup: bool = True


def default_block_sizes(trained: int) -> list[int]:
    sizes, size = [], 2
    while size < trained:
        sizes.append(size)
        size *= 2
    return sizes + [trained]


def _mode_key(block_size: int | None) -> str:
    return "ar" if block_size is None else f"dflash@{block_size}"


def _step_means(runs: list[SystemRun]) -> dict:
    steps = [s for run in runs for s in run.steps]
    if not steps:
        return {"steps": 0, "draft_ms": None, "verify_ms": None}
    return {
        "steps": len(steps),
        "draft_ms": 1e3 * sum(s.draft_seconds for s in steps) / len(steps),
        "verify_ms": 1e3 * sum(s.verify_seconds for s in steps) / len(steps),
    }


def _histogram(lengths: list[int], block_size: int) -> dict[str, int]:
    counts = {str(k): 0 for k in range(1, block_size + 1)}
    for value in lengths:
        counts[str(value)] = counts.get(str(value), 0) + 1
    return counts


def run_bench(backend: BenchSystem, prompts: list[str], config: BenchConfig, progress: Progress | None = None) -> dict:
    """Measure everything listed in the module docstring; returns a JSON-ready report."""
    trained = backend.block_size
    main_block = int(config.block_size or trained)
    if main_block < 2:
        raise DFlashError(f"block size must be >= 2, got {main_block}", "use the drafter's block size")
    if backend.fixed_block_size and (main_block != trained or (config.block_sizes and set(config.block_sizes) != {trained})):
        raise DFlashError(
            f"{backend.name} decodes at block size {trained} only",
            "drop --block-size/--block-sizes (a server's block size is set when its repository is written)",
        )
    sweep = [trained] if backend.fixed_block_size else sorted(set(config.block_sizes or default_block_sizes(trained)) | {main_block})
    if min(sweep) < 2:
        raise DFlashError(f"block sizes must be >= 2, got {sweep}", "drop the sizes below 2")
    concurrency = sorted(set(int(c) for c in config.concurrency))
    if not concurrency or min(concurrency) < 1:
        raise DFlashError(f"concurrency levels must be >= 1, got {list(config.concurrency)}", "e.g. --concurrency 1,2,4")
    if config.max_new_tokens < 1:
        raise DFlashError(f"--max-new-tokens must be >= 1, got {config.max_new_tokens}", "pass a positive number")
    if not prompts or any(not p.strip() for p in prompts):
        raise DFlashError("empty prompt set or empty prompt", "pass non-empty prompts")
    encoded = list(prompts)
    n = config.max_new_tokens

    if config.warmup:
        short = [encoded[0]]
        backend.run(short, False, 1, 1, min(n, 8))
        for size in sweep:
            backend.run(short, True, size, 1, min(n, 8))

    # ---- main comparison and block-size sweep, one prompt at a time, rotating order
    modes: list[int | None] = [None, *sweep]
    per_mode: dict[str, list[SystemRun]] = {_mode_key(m): [] for m in modes}
    total = config.repeats * len(encoded)
    for index in range(total):
        ids = encoded[index % len(encoded)]
        shift = index % len(modes)
        for mode in modes[shift:] + modes[:shift]:
            per_mode[_mode_key(mode)].append(backend.run([ids], mode is not None, mode or 1, 1, n))
        if progress:
            progress("prompts", index + 1, total)

    ar_runs = per_mode["ar"]
    ar_tokens = sum(r.generated_tokens for r in ar_runs)
    ar_seconds = sum(r.seconds for r in ar_runs)
    ar_steps = _step_means(ar_runs)
    ar_step_ms = ar_steps["verify_ms"]  # None where the backend cannot see steps (a server)
    ar_tps = ar_tokens / ar_seconds if ar_seconds > 0 else 0.0

    sizes_report = []
    for size in sweep:
        runs = per_mode[_mode_key(size)]
        tokens = sum(r.generated_tokens for r in runs)
        seconds = sum(r.seconds for r in runs)
        lengths = [a for r in runs for res in r.results for a in res.acceptance_lengths]
        steps = _step_means(runs)
        tau = statistics.fmean(lengths) if lengths else 0.0
        step_ms = None if steps["draft_ms"] is None or ar_step_ms is None else steps["draft_ms"] + steps["verify_ms"]
        mismatched = sum(1 for a, d in zip(ar_runs, runs) if a.results[0].token_ids != d.results[0].token_ids)
        tps = tokens / seconds if seconds > 0 else 0.0
        sizes_report.append(
            {
                "block_size": size,
                "tokens_per_second": tps,
                "speedup": tps / ar_tps if ar_tps > 0 else 0.0,
                "tau": tau,
                "tau_histogram": _histogram(lengths, max([size, *lengths])),
                "draft_ms": steps["draft_ms"],
                "verify_ms": steps["verify_ms"],
                "steps": steps["steps"],
                "tau_ideal_speedup": tau * ar_step_ms / step_ms if step_ms else None,
                "lossless": mismatched == 0,
                "mismatched_prompts": mismatched,
                "generated_tokens": tokens,
                "seconds": seconds,
            }
        )
    main = next(r for r in sizes_report if r["block_size"] == main_block)

    # ---- concurrency sweep: the same requests at each level, modes alternating
    sweep_requests = [encoded[i % len(encoded)] for i in range(max(len(encoded), max(concurrency)))]
    conc_report = []
    for level_index, level in enumerate(concurrency):
        order = [False, True] if level_index % 2 == 0 else [True, False]
        row: dict = {"concurrency": level, "requests": len(sweep_requests)}
        outputs = {}
        for speculative in order:
            run = backend.run(sweep_requests, speculative, main_block, level, n)
            key = "dflash" if speculative else "ar"
            outputs[key] = [r.token_ids for r in run.results]
            decode_rates = [
                (len(r.token_ids) - 1) / (r.elapsed - r.time_to_first_token)
                for r in run.results
                if len(r.token_ids) > 1 and r.elapsed > r.time_to_first_token
            ]
            row[key] = {
                "throughput": run.generated_tokens / run.seconds if run.seconds > 0 else 0.0,
                "per_user_tokens_per_second": statistics.fmean(decode_rates) if decode_rates else 0.0,
                "seconds": run.seconds,
            }
            if speculative:
                lengths = [a for r in run.results for a in r.acceptance_lengths]
                row[key]["tau"] = statistics.fmean(lengths) if lengths else 0.0
        row["speedup"] = row["dflash"]["throughput"] / row["ar"]["throughput"] if row["ar"]["throughput"] > 0 else 0.0
        row["identical_outputs"] = sum(a == d for a, d in zip(outputs["ar"], outputs["dflash"]))
        conc_report.append(row)
        if progress:
            progress("concurrency", level_index + 1, len(concurrency))

    return {
        "system": backend.describe(),
        "settings": {
            "prompts": len(prompts),
            "repeats": config.repeats,
            "max_new_tokens": n,
            "temperature": 0.0,
            "block_size": main_block,
            "block_sizes": sweep,
            "concurrency": concurrency,
        },
        "summary": {
            "ar_tokens_per_second": ar_tps,
            "dflash_tokens_per_second": main["tokens_per_second"],
            "speedup": main["speedup"],
            "tau": main["tau"],
            "tau_histogram": main["tau_histogram"],
            "ar_step_ms": ar_step_ms,
            "draft_ms": main["draft_ms"],
            "verify_ms": main["verify_ms"],
            "tau_ideal_speedup": main["tau_ideal_speedup"],
            "lossless": all(r["lossless"] for r in sizes_report),
            "mismatched_prompts": main["mismatched_prompts"],
            "generated_tokens": ar_tokens,
        },
        "block_sizes": sizes_report,
        "concurrency": conc_report,
    }

"""Serving benchmark: DFlash vs autoregressive through a real tritonserver, side by side.

Drives the `dflash` and `ar` models of one repository (the same target, with and without the
drafter) at several concurrencies, interleaved in ONE run, and reports throughput (generated
tokens/s over all users) and per-user tokens/s, the speedup of DFlash over AR for both, time to
first token and mean acceptance length (tau). Greedy outputs of both models are compared
(lossless: they must be equal).

    python benchmarks/bench_serving.py --model demo                      # writes a repository, starts a server
    python benchmarks/bench_serving.py --repo REPO                       # serves an existing repository
    python benchmarks/bench_serving.py --url http://host:8000 --grpc-url host:8001   # a running server
"""

from __future__ import annotations

import argparse
import json
import platform
import queue
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table


def run_level(client, prompts: list[str], concurrency: int, requests: int, max_new_tokens: int, protocol: str) -> dict:
    """`requests` requests through `concurrency` users (each sends its next request when its last one ends)."""
    jobs: queue.Queue = queue.Queue()
    for i in range(requests):
        jobs.put(prompts[i % len(prompts)])
    results, errors = [], []
    lock = threading.Lock()

    def user() -> None:
        while True:
            try:
                prompt = jobs.get_nowait()
            except queue.Empty:
                return
            try:
                completion = client.complete(prompt, protocol=protocol, max_new_tokens=max_new_tokens)
            except Exception as exc:  # noqa: BLE001
                with lock:
                    errors.append(str(exc))
                continue
            with lock:
                results.append((prompt, completion))

    started = time.perf_counter()
    threads = [threading.Thread(target=user) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    if errors:
        raise SystemExit(f"{len(errors)} request(s) failed, e.g. {errors[0]}")
    return {"wall": wall, "results": results}


def summarise(runs: list[dict]) -> dict:
    """Totals over the rounds of one model at one concurrency (ratios of sums, not means of ratios)."""
    results = [item for run in runs for item in run["results"]]
    tokens = sum(len(c.token_ids) for _, c in results)
    taus = [c.mean_acceptance_length for _, c in results if c.acceptance_lengths]
    return {
        "requests": len(results),
        "wall_s": sum(run["wall"] for run in runs),
        "tokens": tokens,
        "throughput": tokens / sum(run["wall"] for run in runs),
        "per_user": tokens / sum(c.latency for _, c in results),  # tokens/s a user sees while waiting
        "ttft_ms": 1000 * statistics.median(c.client_time_to_first_token for _, c in results),
        "tau": statistics.mean(taus) if taus else 1.0,
        "outputs": {prompt: c.token_ids for prompt, c in results},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", default="demo", help="'demo' or a target directory (with --drafter): a repository is written")
    source.add_argument("--repo", type=Path, help="serve this repository (it must hold 'dflash' and 'ar')")
    source.add_argument("--url", help="use a running server's HTTP endpoint")
    parser.add_argument("--drafter", help="drafter directory when --model is a directory")
    parser.add_argument("--grpc-url", help="gRPC endpoint of a running server (with --url)")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated concurrency levels")
    parser.add_argument("--requests", type=int, default=0, help="requests per round, level and model (default: max(4 x concurrency, 16))")
    parser.add_argument("--rounds", type=int, default=3, help="AR / DFlash alternations per level (noise on shared machines)")
    parser.add_argument("--prompts", default="stdlib", help="prompt set of `dflash-trt bench` (code, math, chat, stdlib) or a JSONL file")
    parser.add_argument("--num-prompts", type=int, default=None, help="use only the first N prompts of the set")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per served model (0 = torch's default)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    from trtllm_dflash.bench.prompts import load_prompt_set
    from trtllm_dflash.serving.client import DFlashClient
    from trtllm_dflash.serving.server import TritonServer, free_port

    prompts = load_prompt_set(args.prompts, args.num_prompts)

    console = Console(highlight=False, width=max(Console().width, 150))
    server = None
    if args.url:
        http, grpc = args.url, args.grpc_url
    else:
        repo = args.repo
        if repo is None:
            from typer.testing import CliRunner

            from trtllm_dflash.cli.app import app

            repo = Path(tempfile.mkdtemp(prefix="bench-serving-")) / "repo"
            model = ["--model", args.model] + (["--drafter", args.drafter] if args.drafter else [])
            result = CliRunner().invoke(
                app, ["repo", *model, "--out", str(repo), "--max-batch", str(max(levels)), "--threads", str(args.threads)]
            )
            if result.exit_code != 0:
                raise SystemExit(f"dflash-trt repo failed: {result.exception or result.output}")
        console.print(f"starting tritonserver on {repo} ...")
        server = TritonServer(repo, free_port(), free_port(), free_port(), host="127.0.0.1")
        server.start()
        http, grpc = server.endpoints.http, server.endpoints.grpc
    try:
        clients = {name: DFlashClient(http, model=name, grpc_url=grpc, timeout=1800) for name in ("dflash", "ar")}
        for client in clients.values():  # warm up both models (first-call allocations)
            client.complete(prompts[0], protocol=args.protocol, max_new_tokens=8)
        sample = clients["dflash"].generate(prompts[0], max_new_tokens=args.max_tokens)
        console.print(f"[bold]{prompts[0]}[/]{sample.text}")
        console.print(
            f"[dim]one request to dflash: {sample.num_output_tokens} tokens, tau {sample.mean_acceptance_length:.2f}, "
            f"TTFT {1000 * sample.time_to_first_token:.0f} ms[/]"
        )
        rows = []
        for level in levels:
            requests = args.requests or max(4 * level, 16)
            runs: dict[str, list] = {"dflash": [], "ar": []}
            console.print(
                f"  concurrency {level:>3}: {args.rounds} rounds x (AR, DFlash) x {requests} requests x {args.max_tokens} tokens ..."
            )
            for round_ in range(args.rounds):  # interleaved, alternating which goes first
                for name in ("ar", "dflash") if round_ % 2 == 0 else ("dflash", "ar"):
                    runs[name].append(run_level(clients[name], prompts, level, requests, args.max_tokens, args.protocol))
            measured = {name: summarise(model_runs) for name, model_runs in runs.items()}
            lossless = all(measured["dflash"]["outputs"][p] == measured["ar"]["outputs"][p] for p in measured["ar"]["outputs"])
            rows.append(
                {
                    "concurrency": level,
                    "requests": requests,
                    "lossless": lossless,
                    **{f"{name}_{k}": v for name, m in measured.items() for k, v in m.items() if k != "outputs"},
                }
            )
    finally:
        if server is not None:
            server.stop()

    title = (
        f"DFlash vs autoregressive through tritonserver ({args.protocol}, prompts: {args.prompts}, {args.max_tokens} tokens per request)"
    )
    table = Table(title=title)
    for column in (
        "concurrency",
        "AR tok/s",
        "DFlash tok/s",
        "speedup",
        "AR tok/s/user",
        "DFlash tok/s/user",
        "speedup/user",
        "tau",
        "TTFT AR/DFlash ms",
        "lossless",
    ):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            str(row["concurrency"]),
            f"{row['ar_throughput']:.1f}",
            f"{row['dflash_throughput']:.1f}",
            f"{row['dflash_throughput'] / row['ar_throughput']:.2f}x",
            f"{row['ar_per_user']:.1f}",
            f"{row['dflash_per_user']:.1f}",
            f"{row['dflash_per_user'] / row['ar_per_user']:.2f}x",
            f"{row['dflash_tau']:.2f}",
            f"{row['ar_ttft_ms']:.0f} / {row['dflash_ttft_ms']:.0f}",
            "yes" if row["lossless"] else "NO",
        )
    console.print(table)
    console.print(f"[dim]{platform.node()} {platform.machine()}, Python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d')}[/]")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()

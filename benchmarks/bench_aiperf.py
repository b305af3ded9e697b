"""NVIDIA's aiperf against `dflash-trt serve ... --openai-port`: the three traffic cases of issue 32.

1. prefix: 64-token prompts alone, then behind one shared 1,400-token prefix (aiperf's
   --num-prefix-prompts 1 --prefix-prompt-length 1400): TTFT p50 of each and their ratio.
2. long prompts: 4 streams of 128 tokens (concurrency 4), inter-token latency p90 alone, then while
   3,000-token prompts join at ~0.7/s (Poisson arrivals sent by this script during aiperf's
   profiling phase only, each a different slice of Python's standard library so no prefix is
   shared; their own time to first token is reported too).
3. throughput: a plain run at concurrency 8; output tokens/s, requests/s, and aiperf's speculative
   decoding figures when it printed its "Spec Decode" section (from the server's
   metrics.speculative_decoding, serving/openai/spec_stats.py).

Every run is `aiperf profile` on the completions endpoint, streaming, with ignore_eos so each
request generates exactly its length; the numbers come from aiperf's JSON export
(profile_export_aiperf.json: one object per metric tag with avg/p50/p90/... in its unit). The
table printed at the end (markdown) names the command, the machine and the date.

aiperf comes with the `bench` extra (`pip install 'trtllm-dflash[bench]'`); its dependencies pin
older versions of some of ours (huggingface-hub < 2, rich, pillow), so an own virtual
environment is cleaner: `python -m venv /opt/aiperf && /opt/aiperf/bin/pip install aiperf==0.13.0`,
then `--aiperf /opt/aiperf/bin/aiperf`.

    dflash-trt repo --model demo --out repo --max-context 4096 --max-tokens 512 --max-batch 8
    dflash-trt serve repo --openai-port 9000 &
    python benchmarks/bench_aiperf.py --url http://127.0.0.1:9000 --tokenizer demo
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

import httpx

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.extras import install_hint

EXPORT = "profile_export_aiperf.json"
RECORDS = "profile_export.jsonl"  # one line per request
PROFILING_STARTED, PROFILING_DONE = "Phase profiling (profiling) started", "All credits completed"  # aiperf 0.13's log


def find_aiperf(explicit: str | None) -> str:
    """The aiperf executable: --aiperf, else the one beside this Python, else on PATH."""
    if explicit:
        if not (Path(explicit).is_file() and os.access(explicit, os.X_OK)):
            raise DFlashError(
                f"--aiperf {explicit} is not an executable file", "pass the path of the `aiperf` command (e.g. /opt/aiperf/bin/aiperf)"
            )
        return explicit
    beside = Path(sys.executable).parent / "aiperf"
    found = str(beside) if beside.is_file() else shutil.which("aiperf")
    if found is None:
        raise DFlashError(
            "aiperf (NVIDIA's benchmark client) is not installed",
            f"{install_hint('bench')}, or pass --aiperf /path/to/aiperf from its own venv",
        )
    return found


def aiperf_version(aiperf: str) -> str:
    out = subprocess.run([aiperf, "--version"], capture_output=True, text=True, timeout=120)
    return (out.stdout or out.stderr).strip().splitlines()[-1] if (out.stdout or out.stderr).strip() else "unknown"


class Bench:
    """One served model, one aiperf, one artifact folder: each case is one or two `aiperf profile` runs."""

    def __init__(self, args: argparse.Namespace, aiperf: str, out: Path) -> None:
        self.args, self.aiperf, self.out = args, aiperf, out
        self.console: dict[str, str] = {}

    def profile(self, name: str, *options: str, during: "Joiner | None" = None) -> dict:
        """Run `aiperf profile` and return its JSON export (metric tag -> stats).

        `during` runs only while aiperf's profiling phase does (not its start-up or warm-up, which
        would otherwise queue behind it): started and stopped on aiperf 0.13's own log lines.
        """
        artifacts = self.out / name
        command = [
            self.aiperf,
            "profile",
            "--url",
            self.args.url,
            "--endpoint-type",
            "completions",
            "--streaming",
            "--model",
            self.args.model,
            "--tokenizer",
            self.args.tokenizer,
            "--random-seed",
            "0",
            "--extra-inputs",
            "ignore_eos:true",
            "--ui",
            "none",
            "--no-server-metrics",
            "--warmup-request-count",
            str(self.args.warmup),
            "--artifact-dir",
            str(artifacts),
            *options,
        ]
        print(f"$ {shlex.join(command)}", flush=True)
        lines = []
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as run:
            try:
                for line in run.stdout:
                    lines.append(line)
                    if during is not None and PROFILING_STARTED in line and not during.is_alive():
                        during.start()
                    elif during is not None and PROFILING_DONE in line:
                        during.stop.set()
                returncode = run.wait(timeout=self.args.timeout)
            finally:
                if run.poll() is None:
                    run.terminate()
        self.console[name] = "".join(lines)
        (self.out / f"{name}.log").write_text(self.console[name])
        export = next(artifacts.rglob(EXPORT), None)
        if returncode != 0 or export is None:
            tail = "\n".join(self.console[name].splitlines()[-15:])
            raise DFlashError(
                f"aiperf run {name!r} failed (exit {returncode}); its output ends:\n{tail}",
                f"see {self.out / (name + '.log')}; is the server up at {self.args.url}?",
            )
        if during is not None and during.ident is None:  # never started
            raise DFlashError(
                f"aiperf's log of {name!r} never said '{PROFILING_STARTED}': the long prompts were not sent",
                "this script reads aiperf 0.13's log lines; check the aiperf version",
            )
        return json.loads(export.read_text())


def stat(export: dict, tag: str, key: str) -> float:
    """One statistic of one metric from aiperf's export (NaN when the run did not report it)."""
    value = export.get(tag, {})
    value = value.get(key) if isinstance(value, dict) else None
    return float(value) if value is not None else float("nan")


def ttfts_in_send_order(artifacts: Path) -> list[float]:
    """Every profiled request's TTFT (ms), in the order aiperf sent them, from its per-request
    export (empty where absent).

    At concurrency N a run opens with N requests at once (one prefill of all their prompts), and
    with equal output lengths they finish, and their successors arrive, in waves: the first N
    values are the opening burst, a quarter of a 32-request run. Pooled over rounds, the values
    also give a TTFT p50 that one noisy round moves less than the median of the rounds' p50s."""
    export = next(artifacts.rglob(RECORDS), None)
    records = []
    for line in export.read_text().splitlines() if export is not None else []:
        record = json.loads(line)
        meta, ttft = record.get("metadata", {}), record.get("metrics", {}).get("time_to_first_token", {}).get("value")
        if meta.get("benchmark_phase") == "profiling" and ttft is not None:
            records.append((meta["request_start_ns"], float(ttft)))
    return [ttft for _, ttft in sorted(records)]


def p50(values: list[float]) -> float:
    """The median, NaN for no values."""
    return statistics.median(values) if values else float("nan")


def long_prompts(tokenizer, length: int, count: int) -> list[str]:
    """`count` prompts of exactly `length` tokens, each cut from a different standard-library file
    (distinct from their first token: a prefix cache must not make them cheap)."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"), key=lambda p: p.name)
    random.Random(0).shuffle(files)
    prompts = []
    for path in files:
        ids = tokenizer(path.read_text(errors="replace"), add_special_tokens=False)["input_ids"]
        if len(ids) >= length:
            prompts.append(tokenizer.decode(ids[:length]))
        if len(prompts) == count:
            return prompts
    raise DFlashError(f"fewer than {count} standard-library files hold {length} tokens", "lower --long-tokens")


class Joiner(threading.Thread):
    """Long prompts arriving at `rate` per second (exponential gaps) while a run goes on; records each one's TTFT."""

    def __init__(self, url: str, model: str, prompts: list[str], rate: float, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.model, self.prompts, self.rate, self.max_tokens = url, model, prompts, rate, max_tokens
        self.stop = threading.Event()
        self.ttfts: list[float] = []
        self.errors: list[str] = []
        self._threads: list[threading.Thread] = []

    def _one(self, prompt: str) -> None:
        body = {"model": self.model, "prompt": prompt, "max_tokens": self.max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
        sent = time.perf_counter()
        try:
            with httpx.stream("POST", f"{self.url}/v1/completions", json=body, timeout=600) as answer:
                first = True
                for line in answer.iter_lines():  # read to the end: the request runs its whole length
                    if first and line.startswith("data: {") and '"text": ""' not in line:
                        self.ttfts.append(time.perf_counter() - sent)
                        first = False
                if answer.status_code != 200:
                    self.errors.append(f"HTTP {answer.status_code}")
        except httpx.HTTPError as exc:
            self.errors.append(repr(exc))

    def run(self) -> None:
        gaps = random.Random(1)
        for prompt in self.prompts:
            if self.stop.wait(gaps.expovariate(self.rate)):
                break
            thread = threading.Thread(target=self._one, args=(prompt,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def finish(self) -> None:
        self.stop.set()
        if self.is_alive():
            self.join()
        for thread in self._threads:
            thread.join(600)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        model = next(
            line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")
        )
        cpu = model
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores visible, {platform.system()} {platform.release()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the OpenAI front end of `dflash-trt serve ... --openai-port` (http://host:port)")
    parser.add_argument("--model", default="dflash", help="served model name")
    parser.add_argument("--tokenizer", default="demo", help="the served target's tokenizer (a directory; 'demo' for the shipped pair)")
    parser.add_argument("--aiperf", help="the aiperf executable (default: beside this Python, else on PATH)")
    parser.add_argument("--out", type=Path, help="artifact folder (default: a new temporary one)")
    parser.add_argument("--cases", default="prefix,long,throughput", help="comma-separated subset of prefix,long,throughput")
    parser.add_argument("--requests", type=int, default=16, help="requests per aiperf run (case 1 and 3)")
    parser.add_argument("--stream-requests", type=int, default=24, help="requests per run of the 4 streams (case 2)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up requests per aiperf run")
    parser.add_argument("--prefix-tokens", type=int, default=1400)
    parser.add_argument("--long-tokens", type=int, default=3000)
    parser.add_argument("--long-rate", type=float, default=0.7, help="long prompts per second joining in case 2")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one aiperf run may take")
    args = parser.parse_args(argv)

    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(cases) - {"prefix", "long", "throughput"})
    try:
        if unknown:
            raise DFlashError(f"--cases names unknown cases: {', '.join(unknown)}", "choose from prefix,long,throughput")
        aiperf = find_aiperf(args.aiperf)
        if args.tokenizer == "demo":
            from trtllm_dflash.checkpoints import resolve_checkpoint

            args.tokenizer = str(resolve_checkpoint("demo", "target"))
        try:
            card = httpx.get(f"{args.url}/v1/models/{args.model}", timeout=30).json()
        except httpx.HTTPError as exc:
            raise DFlashError(
                f"nothing answers at {args.url} ({exc!r})",
                "start `dflash-trt serve REPO --openai-port PORT` and pass --url http://host:PORT",
            ) from None
        if "error" in card:
            raise DFlashError(
                f"{args.url} does not serve {args.model!r}: {card['error'].get('message')}", "pass --model with a served model name"
            )
        out = args.out or Path(tempfile.mkdtemp(prefix="bench-aiperf-"))
        out.mkdir(parents=True, exist_ok=True)
        rows = run_cases(Bench(args, aiperf, out), cases, card)
    except DFlashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    print()
    print(
        f"command: `python {shlex.join(['benchmarks/bench_aiperf.py', *(argv if argv is not None else sys.argv[1:])])}`, "
        f"{aiperf_version(aiperf)}  "
    )
    print(f"machine: {machine()}  ")
    print(
        f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
        f"model {args.model!r}: {json.dumps(card.get('dflash', {}))}; "
        f"artifacts in {out}"
    )
    print()
    print("| case | run | metric | value |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


def run_cases(bench: Bench, cases: list[str], card: dict) -> list[tuple[str, str, str, str]]:
    args, rows = bench.args, []
    if "prefix" in cases:
        common = ("--isl", "64", "--osl", "16", "--concurrency", "1", "--request-count", str(args.requests))
        alone = bench.profile("prefix-none", *common)
        shared = bench.profile("prefix-shared", *common, "--num-prefix-prompts", "1", "--prefix-prompt-length", str(args.prefix_tokens))
        a, b = stat(alone, "time_to_first_token", "p50"), stat(shared, "time_to_first_token", "p50")
        rows += [
            ("1 prefix", "64-token prompts alone", "TTFT p50", f"{a:.1f} ms"),
            ("1 prefix", f"behind one shared {args.prefix_tokens}-token prefix", "TTFT p50", f"{b:.1f} ms"),
            ("1 prefix", "ratio (goal <= 2x)", "shared / alone", f"{b / a:.2f}x"),
        ]
    if "long" in cases:
        common = ("--isl", "64", "--osl", "128", "--concurrency", "4", "--request-count", str(args.stream_requests))
        alone = bench.profile("streams-alone", *common)
        from transformers import AutoTokenizer

        prompts = long_prompts(AutoTokenizer.from_pretrained(args.tokenizer), args.long_tokens, 64)
        joiner = Joiner(args.url, args.model, prompts[1:], args.long_rate, max_tokens=8)
        joiner._one(prompts[0])  # one long prompt on an idle server: what each costs (load <= 1 needs it < 1 / rate)
        single = joiner.ttfts.pop() if joiner.ttfts else float("nan")
        try:
            joined = bench.profile("streams-joined", *common, during=joiner)
        finally:
            joiner.finish()
        if joiner.errors:
            raise DFlashError(
                f"{len(joiner.errors)} long prompts failed, first: {joiner.errors[0]}",
                "check the server's --max-context (prompt + 8 tokens)",
            )
        a, b = stat(alone, "inter_token_latency", "p90"), stat(joined, "inter_token_latency", "p90")
        waits = sorted(joiner.ttfts)
        rows += [
            ("2 long prompts", "4 streams x 128 tokens alone", "ITL p90", f"{a:.1f} ms"),
            (
                "2 long prompts",
                f"same, {args.long_tokens}-token prompts joining at ~{args.long_rate}/s ({len(waits)} joined)",
                "ITL p90",
                f"{b:.1f} ms",
            ),
            ("2 long prompts", "ratio (goal <= 1.5x)", "joined / alone", f"{b / a:.2f}x"),
            # what a scheduler could trade for the ITL: the streams' own first tokens and throughput
            (
                "2 long prompts",
                "the streams alone / joined",
                "TTFT p50",
                f"{stat(alone, 'time_to_first_token', 'p50'):.0f} / {stat(joined, 'time_to_first_token', 'p50'):.0f} ms",
            ),
            (
                "2 long prompts",
                "the streams alone / joined",
                "output tokens/s",
                f"{stat(alone, 'output_token_throughput', 'avg'):.1f} / {stat(joined, 'output_token_throughput', 'avg'):.1f}",
            ),
        ]
        rows.append(("2 long prompts", f"one {args.long_tokens}-token prompt on the idle server", "TTFT", f"{single:.2f} s"))
        if waits:
            rows.append(
                ("2 long prompts", "the joining long prompts", "TTFT p50 / max", f"{waits[len(waits) // 2]:.2f} s / {waits[-1]:.2f} s")
            )
    if "throughput" in cases:
        run = bench.profile("throughput", "--isl", "128", "--osl", "128", "--concurrency", "8", "--request-count", str(2 * args.requests))
        rows += [
            ("3 throughput", "128 in / 128 out, concurrency 8", "output tokens/s", f"{stat(run, 'output_token_throughput', 'avg'):.1f}"),
            ("3 throughput", "", "requests/s", f"{stat(run, 'request_throughput', 'avg'):.2f}"),
            (
                "3 throughput",
                "",
                "TTFT p50 / ITL p50",
                f"{stat(run, 'time_to_first_token', 'p50'):.1f} / {stat(run, 'inter_token_latency', 'p50'):.1f} ms",
            ),
        ]
        printed = "Spec Decode" in bench.console["throughput"]
        tau = stat(run, "spec_decode_acceptance_length", "avg")
        rate = stat(run, "spec_decode_draft_acceptance_rate", "avg")
        rows.append(
            (
                "3 throughput",
                "aiperf's Spec Decode section " + ("printed" if printed else "NOT printed"),
                "acceptance length / draft acceptance rate",
                f"{tau:.2f} / {rate:.1f} %",
            )
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())

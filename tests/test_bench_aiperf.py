"""benchmarks/bench_aiperf.py without aiperf (it is no test dependency): a missing aiperf, a bad
--aiperf and a server that is not there are each one line naming the fix; aiperf's JSON export
is read by metric tag. (The script itself was run against `dflash-trt serve`: benchmarks/RESULTS.md.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_aiperf", ROOT / "benchmarks" / "bench_aiperf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_missing_aiperf_names_the_bench_extra(bench, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bench.shutil, "which", lambda name: None)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # no aiperf beside it
    assert bench.main(["--url", "http://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "aiperf" in err and "pip install 'trtllm-dflash[bench]'" in err and "--aiperf" in err


def test_bad_aiperf_path_and_absent_server_are_one_line_each(bench, tmp_path, capsys):
    assert bench.main(["--url", "http://127.0.0.1:1", "--aiperf", str(tmp_path / "nope")]) == 2
    assert "is not an executable file" in capsys.readouterr().err
    fake = tmp_path / "aiperf"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    assert bench.main(["--url", "http://127.0.0.1:1", "--aiperf", str(fake)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nothing answers at http://127.0.0.1:1" in err and "--openai-port" in err
    assert bench.main(["--url", "http://127.0.0.1:1", "--aiperf", str(fake), "--cases", "prefix,nope"]) == 2
    assert "unknown cases: nope" in capsys.readouterr().err


def test_reads_aiperf_export_by_tag(bench):
    export = {"time_to_first_token": {"unit": "ms", "avg": 50.0, "p50": 46.5, "p90": 60.0}, "request_count": {"avg": 16}}
    assert bench.stat(export, "time_to_first_token", "p50") == 46.5
    assert bench.stat(export, "inter_token_latency", "p90") != bench.stat(export, "inter_token_latency", "p90")  # NaN: not reported


def test_splits_ttft_into_the_opening_burst_and_the_rest_by_send_time(bench, tmp_path):
    """aiperf 0.13's per-request export (one JSON line per request, warm-up lines too), in an
    order other than the send order: read back in send order, warm-up left out."""
    import json

    def line(phase, start_ns, ttft):
        metadata = {"benchmark_phase": phase, "request_start_ns": start_ns, "credit_issued_ns": start_ns - 1}
        return json.dumps({"metadata": metadata, "metrics": {"time_to_first_token": {"value": ttft, "unit": "ms"}}})

    sent = [(10, 50.0), (11, 52.0), (12, 54.0), (20, 30.0), (21, 31.0), (22, 33.0), (23, 35.0)]  # (start, TTFT)
    lines = [line("warmup", 1, 900.0)] + [line("profiling", start, ttft) for start, ttft in reversed(sent)]
    (tmp_path / "run" / "x").mkdir(parents=True)
    (tmp_path / "run" / "x" / "profile_export.jsonl").write_text("\n".join(lines) + "\n")
    ttfts = bench.ttfts_in_send_order(tmp_path / "run")
    assert ttfts == [ttft for _, ttft in sent]
    assert (bench.p50(ttfts[:3]), bench.p50(ttfts[3:])) == (52.0, 32.0)
    assert bench.ttfts_in_send_order(tmp_path / "absent") == []
    assert bench.p50([]) != bench.p50([])  # NaN: nothing measured

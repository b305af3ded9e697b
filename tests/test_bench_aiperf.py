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

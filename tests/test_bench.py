"""`dflash-trt bench`: runs on the demo pair, writes sane JSON and real PNGs, and catches lossy output."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from trtllm_dflash.bench.measure import BenchConfig, default_block_sizes, run_bench
from trtllm_dflash.bench.prompts import SET_NAMES, load_prompt_set
from trtllm_dflash.bench.systems import PairSystem, SystemRun, open_system
from trtllm_dflash.cli.app import app
from trtllm_dflash.errors import DFlashError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_bench_demo_writes_report_and_plots(tmp_path):
    out = tmp_path / "bench"
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "--model",
            "demo",
            "--prompts",
            "stdlib",
            "--num-prompts",
            "2",
            "-n",
            "24",
            "--block-sizes",
            "4,8",
            "--concurrency",
            "1,3",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "bench.json").read_text())
    s = report["summary"]
    assert s["lossless"] is True and s["mismatched_prompts"] == 0
    assert report["settings"]["block_size"] == 8  # the demo drafter's block size
    assert 1.0 <= s["tau"] <= 8
    steps = report["block_sizes"][-1]["steps"]
    assert sum(s["tau_histogram"].values()) == steps > 0
    assert sorted(int(k) for k in s["tau_histogram"]) == list(range(1, 9))
    assert s["ar_tokens_per_second"] > 0 and s["dflash_tokens_per_second"] > 0
    assert s["speedup"] == pytest.approx(s["dflash_tokens_per_second"] / s["ar_tokens_per_second"])
    assert s["tau_ideal_speedup"] == pytest.approx(s["tau"] * s["ar_step_ms"] / (s["draft_ms"] + s["verify_ms"]))
    assert [r["block_size"] for r in report["block_sizes"]] == [4, 8]
    assert all(1.0 <= r["tau"] <= r["block_size"] for r in report["block_sizes"])
    assert s["generated_tokens"] == 2 * 24
    assert [r["concurrency"] for r in report["concurrency"]] == [1, 3]
    for row in report["concurrency"]:
        assert row["requests"] == 3 and row["identical_outputs"] == 3
        assert row["ar"]["throughput"] > 0 and row["dflash"]["per_user_tokens_per_second"] > 0
    for name in ("pareto.png", "tau_histogram.png", "block_sweep.png", "step_times.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, name
    assert "speedup" in result.output and "lossless" in result.output


class CorruptingBackend(PairSystem):
    """A pair whose DFlash mode changes one token: the bench must report it as not lossless."""

    def run(self, prompts, speculative, block_size, concurrency, max_new_tokens) -> SystemRun:
        run = super().run(prompts, speculative, block_size, concurrency, max_new_tokens)
        if speculative:
            for result in run.results:
                result.token_ids[-1] = (result.token_ids[-1] + 1) % 50
        return run


def test_bench_detects_lossy_decoding(tiny_qwen3_with_tokenizer):
    target, drafter = tiny_qwen3_with_tokenizer
    backend = CorruptingBackend(target, drafter)
    report = run_bench(backend, ["abc", "hello"], BenchConfig(max_new_tokens=6, block_sizes=[4], concurrency=[2], warmup=False))
    assert report["summary"]["lossless"] is False
    assert report["summary"]["mismatched_prompts"] == 2
    assert report["concurrency"][0]["identical_outputs"] == 0


@pytest.fixture(scope="module")
def tiny_qwen3_with_tokenizer(tmp_path_factory):
    from trtllm_dflash.testing.tiny import make_tiny_drafter, make_tiny_target

    target = make_tiny_target(tmp_path_factory.mktemp("bench-target"), "qwen3", seed=4, tokenizer=True)
    drafter = make_tiny_drafter(tmp_path_factory.mktemp("bench-drafter"), target, seed=4, block_size=4, mask_token_id=2)
    return target, drafter


def test_backend_choice_errors(tmp_path):
    with pytest.raises(DFlashError, match="holds no exported graphs"):
        open_system(build=tmp_path)
    from trtllm_dflash.serving.server import free_port

    with pytest.raises(DFlashError, match="'dflash' is not ready on the server"):
        open_system(url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(DFlashError, match="exactly one"):
        open_system(model="demo", url="http://localhost:8000")
    with pytest.raises(DFlashError, match="without --drafter"):
        open_system(target=str(tmp_path))


def test_prompt_sets(tmp_path):
    for name in SET_NAMES:
        prompts = load_prompt_set(name)
        assert len(prompts) >= 8 and all(p.strip() for p in prompts)
    assert load_prompt_set("code", 3) == load_prompt_set("code")[:3]
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "one"}\n\n{"prompt": "two"}\n')
    assert load_prompt_set(str(path)) == ["one", "two"]
    path.write_text('{"prompt": "one"}\n{"text": "two"}\n')
    with pytest.raises(DFlashError, match=r"p.jsonl:2"):
        load_prompt_set(str(path))
    with pytest.raises(DFlashError, match="neither a built-in set nor a file"):
        load_prompt_set("nosuchset")


def test_default_block_sizes():
    assert default_block_sizes(16) == [2, 4, 8, 16]
    assert default_block_sizes(10) == [2, 4, 8, 10]


def test_bench_against_a_real_server(tmp_path, demo_triton):
    """The same bench through a real tritonserver serving the demo pair and its AR baseline (the
    session's, tests/conftest.py)."""
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "--url",
            demo_triton.endpoints.http,
            "--prompts",
            "stdlib",
            "--num-prompts",
            "2",
            "-n",
            "16",
            "--concurrency",
            "1,2",
            "--out",
            str(tmp_path / "bench"),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert report["system"]["backend"] == "triton"
    s = report["summary"]
    assert s["lossless"] is True and 1.0 <= s["tau"] <= report["settings"]["block_size"]
    assert s["ar_step_ms"] is None and s["tau_ideal_speedup"] is None  # not visible from a client
    assert all(row["identical_outputs"] == row["requests"] for row in report["concurrency"])

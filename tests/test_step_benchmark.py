"""`benchmarks/bench_gpu_step.py --tiny`: the full-depth GPU step benchmark's code path on CPU, so it
cannot rot between GPU windows (its numbers mean nothing here)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from trtllm_dflash.bench import gpu_step

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gpu_step.py"


def test_the_tiny_mode_writes_every_row_and_part(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_gpu_step", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "step.md"
    assert (
        script.main(
            ["--tiny", "--device", "cpu", "--batches", "1,2", "--contexts", "24", "--repeats", "2", "--loop-steps", "8", "--out", str(out)]
        )
        == 0
    )
    table = out.read_text()
    assert "| 1 | 24 |" in table and "| 2 | 24 |" in table
    result = json.loads(out.with_suffix(".json").read_text())
    assert [(r["batch"], r["context"]) for r in result["rows"]] == [(1, 24), (2, 24)]
    for row in result["rows"]:
        assert set(row["parts"]) == {"ar", "verify pass", "draft", "dflash step"} | {f"verify {m}" for m in gpu_step.VERIFY_MODES}
        assert all(part["ms"] > 0 and part["floor_ms"] > 0 for part in row["parts"].values())
        assert row["loop_ar_ms"] > 0 and row["loop_dflash_ms"] > 0 and row["loop_async_ms"] > 0


def test_the_floors_count_qwen3_8b_as_the_issue_does():
    """15.14 GB of target weights per step (36 layers + LM head, bf16) and the K/V a 1k context reads."""
    from trtllm_dflash.bench.gpu_step import QWEN3_8B, Floors

    layer = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 12288 + 2 * 4096 + 2 * 128  # q,k,v,o, MLP, norms
    params = 36 * layer + 4096 + 151936 * 4096
    floors = Floors(QWEN3_8B, target_weight_bytes=2 * params, target_params=params, draft_weight_bytes=0, draft_params=0, element=2)
    moved, flops = floors.target_pass(batch=1, context=1024, tokens=1)
    assert abs(2 * params / 1e9 - 15.14) < 0.02
    assert moved - 2 * params == 36 * 2 * 8 * 128 * 2 * 1024 + 151936 * 2
    assert flops > 2 * params

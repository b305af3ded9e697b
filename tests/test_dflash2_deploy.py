"""DFlash V2 drafters through the catalog, the planner, explain-bytes and the trtllm backend (no torch)."""

from __future__ import annotations

import dataclasses

import pytest

from trtllm_dflash.builder import traffic
from trtllm_dflash.catalog.models import MODELS
from trtllm_dflash.planning import plan_deployment

# Published safetensors payloads (81 tensors each) and the size of a header naming those 81 tensors.
PAYLOADS = {"qwen3.8-27b": 3_848_817_896, "muse-glimmer-30b": 5_544_328_424}
HEADER_BYTES = 8_936


@pytest.mark.parametrize("name, block, hidden", [("qwen3.8-27b", 8, 5120), ("muse-glimmer-30b", 16, 6656)])
def test_v2_catalog_entries_reproduce_the_published_payloads(name, block, hidden):
    drafter = MODELS[name].drafter
    assert drafter.kind == "dflash2" and drafter.num_layers == 5 and len(drafter.target_layer_ids) == 5
    assert (drafter.block_size, drafter.hidden_size, drafter.selector_rank, drafter.selector_top_k) == (block, hidden, 256, 16)
    # per layer 2 x (kernel_projection [2*K*G, H] + base_kernel [2, K, H]); selector [R, H] + 2 x [V, R]
    groups = hidden // 16
    assert drafter.conv_params() == 5 * 2 * (2 * 2 * groups * hidden + 2 * 2 * hidden)
    assert drafter.codebook_params() == 2 * drafter.vocab_size * 256
    assert PAYLOADS[name] - drafter.num_params() * 2 == HEADER_BYTES  # BF16, exact up to the header


@pytest.mark.parametrize("name", ["qwen3.8-27b", "muse-glimmer-30b"])
def test_v2_pairs_plan_with_their_extra_weights_and_a_v2_backend(name):
    plan = plan_deployment(name, "h100")
    drafter = MODELS[name].drafter
    assert not plan.refusals and plan.max_concurrency > 0
    assert plan.budget.drafter_weights == drafter.num_params() * 2
    assert any("DFlash V2 drafter" in note for note in plan.notes)


def test_trtllm_backend_plans_a_v2_drafter():
    # TensorRT-LLM runs DFlash V2 drafters (VANILLA / FA4 drafter attention): tests/test_trtllm_v2_drafters.py
    plan = plan_deployment("qwen3.8-27b", "h100", backend="trtllm")
    assert "backend" not in [r.kind for r in plan.refusals]


def test_explain_bytes_adds_v2_reads_and_gathers_codebook_rows_only():
    spec = MODELS["qwen3.8-27b"]
    step = traffic.Step(batch=4, context=1024, capacity=4096, block=8)
    v2 = traffic.explain_model(traffic.ModelShape.from_catalog(spec), step)
    v1_drafter = dataclasses.replace(spec.drafter, conv_kernel_size=0, selector_rank=0, selector_top_k=0)
    v1 = traffic.explain_model(traffic.ModelShape.from_catalog(dataclasses.replace(spec, drafter=v1_drafter)), step)
    drafted = 4 * 7
    expected = {
        "convolutions": spec.drafter.conv_params() * 2,
        "hidden_projection": 256 * 5120 * 2,
        "codebook rows": drafted * 17 * 256 * 2,  # P[prev] + 16 x S[c_k], never the [V, R] tables
        "candidates": 2 * drafted * 16 * 12,
    }
    for variant in ("native", "plugin"):
        extra = [item for item in v2[variant].items if item.what.startswith("V2 ")]
        assert len(extra) == 4
        for item, (label, size) in zip(extra, expected.items()):
            assert label in item.what and item.read + item.written == size
        assert v2[variant].total - v1[variant].total == sum(expected.values())


def test_explain_bytes_prints_a_v2_line(run_main):
    code, out, err = run_main("explain-bytes", "--model", "muse-glimmer-30b", "--batch", "2")
    assert code == 0, err
    assert "DFlash V2 drafter" in out and "codebook rows" in out


def test_plan_runs_trtllm_for_a_v2_pair(run_main):
    code, out, err = run_main("plan", "--model", "qwen3.8-27b", "--gpu", "h100", "--backend", "trtllm")
    assert code == 0, err

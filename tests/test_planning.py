"""Memory plans checked against budgets computed by hand from published shapes, and refusals.

Shapes (see trtllm_dflash/catalog/models.py for sources):
  Qwen3-8B      36 layers, hidden 4096, 32 q / 8 KV heads x 128, MLP 12288, vocab 151936, untied
  Llama-3.1-8B  32 layers, hidden 4096, 32 q / 8 KV heads x 128, MLP 14336, vocab 128256, untied
  gpt-oss-120b  36 layers, hidden 2880, 64 q / 8 KV heads x 64, 128 experts (top-4, inner 2880),
                sliding window 128 on even layers, vocab 201088, untied
  drafters      Qwen3-8B / Llama: 5 layers, 4096, FFN 12288, 32/8 x 128 (5 taps)
                gpt-oss-120b: 8 layers, 2880, FFN 7680, 64/8 x 64 (5 taps)
Estimates used by the planner (named constants): workspace 256 MiB, 16 MiB per CUDA graph,
1 GiB runtime reserve (+0.5 GiB NCCL on several GPUs), 90% of the rest to KV (trt runtime) or
the recipe's free_gpu_memory_fraction (trtllm).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trtllm_dflash.catalog.models import MODELS
from trtllm_dflash.errors import PlanRefusedError, UnknownNameError
from trtllm_dflash.planning import cuda_graph_batch_sizes, kv_bytes_per_sequence, plan_deployment

MIB, GIB = 1024**2, 1024**3


def test_qwen3_8b_fp8_on_one_h100():
    plan = plan_deployment("qwen3-8b", "h100")  # the shipped recipe: FP8 weights + KV, context 16384, batch 64
    assert (plan.backend, plan.precision.weights, plan.precision.kv_cache, plan.context) == ("trt", "fp8", "fp8", 16384)
    b = plan.budget
    # Linear layers per decoder layer: q 4096*4096 + k,v 2*4096*1024 + o 4096*4096 + MLP 3*4096*12288
    linear = 36 * (4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 3 * 4096 * 12288)
    assert linear == 6_945_767_424  # FP8: 1 byte each
    embed_and_head = 2 * 151936 * 4096  # BF16
    norms = 4096 + 36 * (2 * 4096 + 2 * 128)  # layer norms + q/k norms + final norm, BF16
    assert b.target_weights == linear * 1 + (embed_and_head + norms) * 2 == 9_435_703_296
    drafter = (
        5 * (4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 3 * 4096 * 12288 + 2 * 4096 + 2 * 128) + 5 * 4096 * 4096 + 2 * 4096
    )  # + fc (5 taps) + hidden_norm + norm
    assert b.drafter_weights == drafter * 2 == 2_097_252_864
    tokens = max(8192, 64 * 16)  # a prefill chunk vs. a verify step of 64 sequences x block 16
    act = (4 * tokens * 4096 + tokens * (32 * 128 + 2 * 8 * 128) + tokens * 2 * 12288 + tokens * 5 * 4096) * 2
    logits = 64 * 16 * 151936 * 4
    assert b.activations == act + logits + 256 * MIB == 1_998_061_568
    assert cuda_graph_batch_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert b.cuda_graphs == 11 * 3 * 16 * MIB  # 11 batch sizes x draft lengths {15, 7, 0}
    assert b.runtime_reserve == GIB
    fixed = 9_435_703_296 + 2_097_252_864 + 1_998_061_568 + 33 * 16 * MIB + GIB
    assert b.kv_cache == int((80e9 - fixed) * 0.90)
    per_token = 36 * 2 * 8 * 128 * 1  # K+V, 8 KV heads x 128, FP8
    assert plan.kv_bytes_per_token == per_token == 73_728
    per_sequence = per_token * 16384 + 5 * 2 * 8 * 128 * 16384  # target + drafter context K/V
    assert plan.kv_bytes_per_sequence == per_sequence == 1_375_731_712
    assert plan.max_concurrency == int((80e9 - fixed) * 0.90) // per_sequence == 42
    assert any("42 sequences" in note for note in plan.notes)  # fewer than max_batch_size 64


def test_llama_3_1_8b_fp8_on_one_h100():
    plan = plan_deployment("llama-3.1-8b-instruct", "h100")  # recipe: FP8, block 10, schedule {1: 9, 8: 5, 32: 0}
    b = plan.budget
    linear = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
    bf16 = 2 * 128256 * 4096 + 4096 + 32 * 2 * 4096  # embedding, LM head, norms (no q/k norm in Llama)
    assert b.target_weights == linear + 2 * bf16 == 9_081_200_640
    assert b.drafter_weights == 2_097_252_864  # same drafter shape as Qwen3-8B's
    tokens = 8192
    act = (4 * tokens * 4096 + tokens * 6144 + tokens * 2 * 14336 + tokens * 5 * 4096) * 2
    assert b.activations == act + 64 * 10 * 128256 * 4 + 256 * MIB == 1_771_175_936
    fixed = 9_081_200_640 + 2_097_252_864 + 1_771_175_936 + 11 * 3 * 16 * MIB + GIB
    per_sequence = (32 + 5) * 2 * 8 * 128 * 16384  # target + drafter layers, FP8 KV
    assert plan.kv_bytes_per_sequence == per_sequence
    assert plan.max_concurrency == int((80e9 - fixed) * 0.90) // per_sequence == 47


def test_gpt_oss_120b_on_8_b300_tp8_ep8():
    plan = plan_deployment("gpt-oss-120b", "b300")  # recipe: 8 GPUs, TP8/EP8, MXFP4 experts as published, BF16 rest, FP8 KV
    assert (plan.layout.num_gpus, plan.layout.tp, plan.layout.ep) == (8, 8, 8)
    assert (plan.precision.weights, plan.precision.moe_experts) == ("bf16", "mxfp4")
    b = plan.budget
    attention = 36 * (2880 * 4096 + 2 * 2880 * 512 + 4096 * 2880)  # q, k, v, o
    experts = 36 * 128 * (2880 * 5760 + 2880 * 2880)  # gate_up + down per expert
    embed_and_head = 2 * 201088 * 2880
    small = 2880 + 36 * (2 * 2880 + (4096 + 2 * 512 + 2880) + 64 + (2880 * 128 + 128) + 128 * (2 * 2880 + 2880))
    #        final norm, per layer: norms, attention biases, sinks, router (+bias), expert biases (BF16, on every GPU)
    per_gpu = attention * 2 // 8 + int(experts * 4.25 / 8) // 8 + embed_and_head * 2 // 8 + small * 2
    assert b.target_weights == per_gpu == 8_249_883_264
    drafter = 8 * (2880 * 4096 * 2 + 2 * 2880 * 512 + 3 * 2880 * 7680 + 2 * 2880 + 2 * 64) + 5 * 2880 * 2880 + 2 * 2880
    assert b.drafter_weights == drafter * 2 == 1_569_406_208  # BF16, whole on every GPU
    tokens = max(16384, 512 * 10)
    act = (4 * tokens * 2880 + tokens * (64 * 64 // 8 + 2 * 1 * 64) + tokens * 4 * 2 * 2880 // 8 + tokens * 5 * 2880) * 2
    assert b.activations == act + 512 * 10 * (201088 // 8) * 4 + 256 * MIB
    graphs = len([1, 2, 4] + [8 * i for i in range(1, 17)] + [256, 512]) * 4  # x draft lengths {9, 6, 3, 0}
    assert b.cuda_graphs == graphs * 16 * MIB == 84 * 16 * MIB
    assert b.runtime_reserve == GIB + GIB // 2  # + NCCL on 8 GPUs
    # KV per GPU: 1 of the 8 KV heads; 18 full layers grow with the context, 18 sliding layers stop at 128 tokens.
    target_seq = 18 * 2 * 1 * 64 * 16384 + 18 * 2 * 1 * 64 * 128
    drafter_seq = 8 * 2 * 8 * 64 * 16384
    assert plan.kv_bytes_per_token == 18 * 2 * 64 == 2304
    assert plan.kv_bytes_per_sequence == target_seq + drafter_seq == 172_261_376
    fixed = b.target_weights + b.drafter_weights + b.activations + b.cuda_graphs + b.runtime_reserve
    assert plan.max_concurrency == int((288e9 - fixed) * 0.85) // (target_seq + drafter_seq) == 1349


def test_gpt_oss_120b_mxfp4_weights_on_one_gpu_match_the_checkpoint():
    plan = plan_deployment("gpt-oss-120b", "h200")  # recipe: MXFP4 experts, 1 GPU
    # 4.25 bits per expert weight + BF16 for the rest = the published 60.8 GiB checkpoint
    assert plan.budget.target_weights / GIB == pytest.approx(60.8, abs=0.05)


def test_sliding_window_layers_stop_growing_at_their_window():
    spec = MODELS["gpt-oss-120b"]
    short, long = kv_bytes_per_sequence(spec, 100, "bf16", 1), kv_bytes_per_sequence(spec, 10_000, "bf16", 1)
    assert short == 36 * 2 * 8 * 64 * 100 * 2
    assert long == (18 * 10_000 + 18 * 128) * 2 * 8 * 64 * 2
    gemma = MODELS["gemma-4-31b-it"]  # 50 sliding layers (16 x 256, window 1024) + 10 global (4 x 512)
    assert kv_bytes_per_sequence(gemma, 4096, "fp8", 1) == 50 * 2 * 16 * 256 * 1024 + 10 * 2 * 4 * 512 * 4096


def test_every_recipe_plans_without_refusal():
    from trtllm_dflash.recipes import list_recipes

    for recipe in list_recipes():
        plan = plan_deployment(recipe.model.name, recipe.gpu, recipe=recipe)
        assert plan.ok and plan.max_concurrency >= 1, (recipe.name, plan.refusals)
        assert [s.name for s in plan.steps][0] == "checkpoints" and plan.steps[-1].name == "repository"


def test_build_steps_follow_the_runtime():
    trt = [s.name for s in plan_deployment("qwen3-8b", "b200").steps]
    assert trt == ["checkpoints", "quantize", "export", "plugins", "engines", "repository"]
    rtx = plan_deployment("demo", "rtx-pro-6000")
    assert [s.name for s in rtx.steps] == ["checkpoints", "export", "engines", "repository"]  # plugin-free, no PTQ
    assert rtx.steps[2].needs == ("tensorrt-rtx",)
    big = plan_deployment("gpt-oss-120b", "b300")
    assert [s.name for s in big.steps] == ["checkpoints", "config", "repository"]  # MXFP4 experts as published
    nvfp4 = plan_deployment("gpt-oss-120b", "b300", quant="nvfp4")  # opt-in: converted on a GPU
    assert [s.name for s in nvfp4.steps] == ["checkpoints", "quantize", "config", "repository"]
    assert "MXFP4 experts to NVFP4" in nvfp4.steps[1].description


# ----- refusals -----


def test_nvfp4_on_hopper_is_refused_with_fp8_as_the_nearest():
    plan = plan_deployment("qwen3-8b", "h100", quant="nvfp4")
    assert not plan.ok and plan.refusals[0].kind == "precision"
    assert "SM >= 10.0" in plan.refusals[0].problem and "h100 is SM 9.0" in plan.refusals[0].problem
    assert "nearest that works: --quant fp8" in plan.refusals[0].fix and "b200, b300" in plan.refusals[0].fix
    with pytest.raises(PlanRefusedError, match="nvfp4 weights need SM >= 10.0"):
        plan.check()


def test_fp8_below_sm89_is_refused():
    plan = plan_deployment("llama-3.1-8b", "a100", quant="fp8")
    assert plan.refusals[0].kind == "precision" and "SM >= 8.9" in plan.refusals[0].problem
    assert "--quant bf16" in plan.refusals[0].fix and "--kv-cache bf16" not in plan.refusals[0].fix


def test_too_few_gpus_names_the_gpu_count_that_works():
    # BF16 gpt-oss-120b is 116.83e9 x 2 = 233.7 GB: 1 or 2 H100s (80 GB) cannot hold it, 4 can (58 GB each).
    plan = plan_deployment("gpt-oss-120b", "h100", quant="bf16", num_gpus=1)
    assert plan.refusals[0].kind == "too-few-gpus"
    assert "does not fit on 1x h100" in plan.refusals[0].problem
    assert plan.refusals[0].fix.startswith("nearest that works: --num-gpus 4 (")
    assert plan_deployment("gpt-oss-120b", "h100", quant="bf16", num_gpus=4).ok
    assert not plan_deployment("gpt-oss-120b", "h100", quant="bf16", num_gpus=2).ok
    # Without --num-gpus the planner picks the fewest that fit.
    assert plan_deployment("gpt-oss-120b", "h100", quant="bf16").layout.num_gpus == 4


def test_layout_refusals():
    assert plan_deployment("qwen3-8b", "b300", num_gpus=16).refusals[0].problem == "16 GPUs exceed one b300 node (8)"
    single = plan_deployment("qwen3-8b", "b300", num_gpus=2)  # the recipe's runtime is trt
    assert "backend trt runs on one GPU" in single.refusals[0].problem and "--backend trtllm" in single.refusals[0].fix
    assert plan_deployment("qwen3-8b", "b300", num_gpus=2, backend="trtllm").ok


def test_nothing_fits_says_so(monkeypatch):
    import trtllm_dflash.planning.memory as planning

    monkeypatch.setattr(planning, "host_memory_bytes", lambda: 24 * GIB)
    plan = plan_deployment("gpt-oss-120b", "cpu")  # FP32 on CPU: 467 GB of weights
    assert plan.refusals[0].kind == "does-not-fit" and "more memory" in plan.refusals[0].fix


def test_bad_names_and_values():
    with pytest.raises(UnknownNameError, match="unknown GPU"):
        plan_deployment("qwen3-8b", "h1000")
    with pytest.raises(UnknownNameError, match="unknown model"):
        plan_deployment("qwen9", "h100")
    with pytest.raises(UnknownNameError, match="unknown precision"):
        plan_deployment("qwen3-8b", "h100", quant="int3")
    with pytest.raises(PlanRefusedError, match="--num-gpus must be >= 1"):
        plan_deployment("qwen3-8b", "h100", num_gpus=0)


# ----- CLI and speed -----


def test_cli_plan_prints_budget_and_steps(run_main):
    code, out, err = run_main("plan", "--model", "gpt-oss-120b", "--gpu", "b300")
    assert code == 0 and err == ""
    assert "8x b300" in out and "max concurrency" in out and "1349 sequences" in out and "repository" in out


def test_cli_plan_json_and_refusal_exit_code(run_main):
    code, out, err = run_main("plan", "-m", "qwen3-8b", "-g", "h100", "-q", "nvfp4", "--json")
    assert code == 2
    payload = json.loads(out)
    assert payload["ok"] is False and payload["refusals"][0]["kind"] == "precision"
    assert err.startswith("error: nvfp4 weights need SM >= 10.0") and len(err.strip().splitlines()) == 1


def test_planning_needs_no_torch():
    """`dflash-trt plan` and `build --dry-run` must stay fast on CPU: the CLI and planner never import torch."""
    code = (
        "import sys; from trtllm_dflash.cli.app import app; from trtllm_dflash.planning import plan_deployment;"
        "plan_deployment('gpt-oss-120b', 'b300'); import trtllm_dflash.checks.doctor as d; d.collect();"
        "bad = [m for m in ('torch', 'transformers', 'tensorrt_rtx_bindings') if m in sys.modules]; print(bad)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"

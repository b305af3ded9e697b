"""NVFP4 PTQ through ModelOpt on a CUDA GPU (an H100 runs ModelOpt's NVFP4 emulation): the demo
target and a Qwen3-8B-shaped 2-layer model against BF16, and the exported checkpoint's layout.
Skipped without CUDA (tests/test_nvfp4.py checks the refusals there)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: ModelOpt computes NVFP4 scales with CUDA kernels")
pytest.importorskip("modelopt", reason="needs nvidia-modelopt (pip install 'trtllm-dflash[quant]')")

from trtllm_dflash.demo import DEMO_DIR  # noqa: E402


def test_demo_target_nvfp4_stays_close_to_bf16():
    from trtllm_dflash.builder.nvfp4_accuracy import demo_target_accuracy

    result = demo_target_accuracy()
    assert result["quantized_linears"] > 0
    assert result["relative_logit_error"] < 0.25, result
    assert result["greedy_agreement"] > 0.7, result


def test_qwen3_8b_shaped_nvfp4_stays_close_to_bf16():
    from trtllm_dflash.builder.nvfp4_accuracy import qwen3_8b_shaped_accuracy

    result = qwen3_8b_shaped_accuracy()
    assert result["quantized_linears"] == 2 * 7  # q, k, v, o, gate, up, down per layer; lm_head stays BF16
    assert result["relative_logit_error"] < 0.25, result
    assert result["greedy_agreement"] > 0.7, result


def test_demo_target_exports_the_layout_tensorrt_llm_loads(tmp_path):
    from trtllm_dflash.builder.quantize import quantize_target
    from trtllm_dflash.recipes.precision import Precision
    from trtllm_dflash.recipes.schema import CalibrationSection

    summary = quantize_target(
        DEMO_DIR / "target", tmp_path / "target", Precision("nvfp4", kv_cache="fp8"), CalibrationSection(num_samples=8, max_seq_len=64)
    )
    layout = summary["layout"]
    assert layout["quant_algo"] == "NVFP4" and layout["kv_cache_quant_algo"] == "FP8"
    tensors = layout["tensors"]
    assert tensors.get("weight:U8", 0) == summary["quantized_weights"] > 0
    for name in ("weight_scale:F8_E4M3", "weight_scale_2:F32", "input_scale:F32"):
        assert tensors.get(name) == tensors["weight:U8"], (name, tensors)


def test_drafter_nvfp4_keeps_fc_in_bf16(tmp_path):
    import json

    from safetensors import safe_open

    from trtllm_dflash.builder.quantize_drafter import quantize_drafter
    from trtllm_dflash.recipes.schema import CalibrationSection

    summary = quantize_drafter(
        DEMO_DIR / "drafter", DEMO_DIR / "target", tmp_path / "drafter", CalibrationSection(num_samples=4, max_seq_len=64)
    )
    assert summary["quantized_linears"] > 0
    with safe_open(tmp_path / "drafter" / "model.safetensors", framework="pt") as handle:
        assert handle.get_tensor("fc.weight").dtype == torch.bfloat16
        assert "fc.weight_scale" not in handle.keys()
        assert handle.get_tensor("layers.0.self_attn.q_proj.weight").dtype == torch.uint8
        assert handle.get_tensor("layers.0.self_attn.q_proj.weight_scale").dtype == torch.float8_e4m3fn
    quant = json.loads((tmp_path / "drafter" / "hf_quant_config.json").read_text())["quantization"]
    assert quant["quant_algo"] == "NVFP4" and "fc" in quant["exclude_modules"]

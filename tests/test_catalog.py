"""GPU and model catalogs: names, datasheet facts, and parameter counts against published totals."""

from __future__ import annotations

import pytest

from trtllm_dflash.catalog.gpus import GPUS, detect_local_gpus, gpus_supporting, match_nvml_name, resolve_gpu
from trtllm_dflash.catalog.models import MODELS, SLIDING, resolve_model
from trtllm_dflash.errors import UnknownNameError

GIB = 1024**3


@pytest.mark.parametrize(
    "alias, name, cc, arch, flavour",
    [
        ("H100", "h100", (9, 0), "sm_90a", "tensorrt"),
        ("h200-sxm", "h200", (9, 0), "sm_90a", "tensorrt"),
        ("b200", "b200", (10, 0), "sm_100a", "tensorrt"),
        ("B300", "b300", (10, 3), "sm_103a", "tensorrt"),
        ("blackwell-ultra", "b300", (10, 3), "sm_103a", "tensorrt"),
        ("gb200", "gb200", (10, 0), "sm_100a", "tensorrt"),
        ("gb300", "gb300", (10, 3), "sm_103a", "tensorrt"),
        ("rtx-pro-6000", "rtx-pro-6000", (12, 0), "sm_120", "tensorrt-rtx"),
        ("RTX_PRO_6000_Blackwell", "rtx-pro-6000", (12, 0), "sm_120", "tensorrt-rtx"),
    ],
)
def test_gpu_aliases_resolve_to_datasheet_entries(alias, name, cc, arch, flavour):
    gpu = resolve_gpu(alias)
    assert (gpu.name, gpu.compute_capability, gpu.sm_arch, gpu.trt_flavour) == (name, cc, arch, flavour)


def test_gpu_memory_and_precision_support():
    # PLATFORM.md: H100 80 GB, H200 141 GB, B200 ~180 GB, B300 288 GB.
    assert [GPUS[n].memory_gb for n in ("h100", "h200", "b200", "b300")] == [80, 141, 180, 288]
    assert GPUS["rtx-pro-6000"].memory_gb == 96 and GPUS["rtx-pro-6000"].nvlink_gbs is None
    assert not GPUS["h100"].supports("nvfp4") and GPUS["h100"].supports("fp8")
    assert not GPUS["a100"].supports("fp8")  # SM 8.0 < 8.9
    assert GPUS["b300"].supports("nvfp4") and GPUS["rtx-pro-6000"].supports("nvfp4")
    assert {g.name for g in gpus_supporting("nvfp4")} == {"b200", "b300", "gb200", "gb300", "rtx-pro-6000"}


def test_unknown_gpu_names_the_known_ones():
    with pytest.raises(UnknownNameError, match="h100, h200, b200, b300"):
        resolve_gpu("h1000")


def test_nvml_names_map_to_catalog_entries():
    assert match_nvml_name("NVIDIA H100 80GB HBM3").name == "h100"
    assert match_nvml_name("NVIDIA GB200").name == "gb200"  # not b200
    assert match_nvml_name("NVIDIA B300 SXM6 AC").name == "b300"
    assert match_nvml_name("NVIDIA RTX PRO 6000 Blackwell Server Edition").name == "rtx-pro-6000"
    assert match_nvml_name("NVIDIA GeForce GTX 1080") is None


def test_local_detection_reports_a_reason_instead_of_failing():
    found = detect_local_gpus()
    if found.gpus:  # a GPU machine
        assert found.driver_version and found.reason is None
    else:
        assert found.reason  # e.g. "NVML is not available (...)"


def test_gpt_oss_120b_counts_reproduce_openai_model_card():
    spec = MODELS["gpt-oss-120b"]
    p = spec.params()
    # OpenAI: MLP 114.71B, attention 0.96B, embed + unembed 1.16B, total 116.83B.
    assert p.total == pytest.approx(116.83e9, rel=1e-4)
    assert p.embedding + p.lm_head == 2 * 201088 * 2880  # 1.158B, untied
    # Expert matrices: 36 layers x 128 experts x (2880 x 5760 gate_up + 2880 x 2880 down)
    assert p.expert_linear == 36 * 128 * (2880 * 5760 + 2880 * 2880) == 114_661_785_600
    # Checkpoint: experts MXFP4 (4 bits + one 8-bit scale per 32 = 4.25 bits), the rest BF16 -> 60.8 GiB
    size = p.expert_linear * 4.25 / 8 + (p.total - p.expert_linear) * 2
    assert size / GIB == pytest.approx(60.8, abs=0.05)
    assert spec.layer_type(0) == SLIDING and spec.layer_type(1) != SLIDING and spec.sliding_window == 128


@pytest.mark.parametrize(
    "name, published, tolerance",
    [
        ("gpt-oss-20b", 20.91e9, 2e-3),
        ("qwen3-8b", 8.2e9, 2e-3),
        ("llama-3.1-8b-instruct", 8.03e9, 1e-3),
        ("gemma-4-31b-it", 30.7e9, 1e-3),
        ("qwen3-coder-30b-a3b", 30.5e9, 2e-3),
    ],
)
def test_dense_and_moe_counts_match_model_cards(name, published, tolerance):
    assert MODELS[name].params().total == pytest.approx(published, rel=tolerance)


def test_gemma4_global_layers_have_their_own_kv_shape():
    spec = MODELS["gemma-4-31b-it"]
    assert [spec.layer_type(i) for i in range(6)] == [SLIDING] * 5 + ["full_attention"]
    assert spec.attention(0).num_kv_heads == 16 and spec.attention(0).head_dim == 256 and spec.attention(0).window == 1024
    assert spec.attention(5).num_kv_heads == 4 and spec.attention(5).head_dim == 512 and spec.attention(5).window == 0


@pytest.mark.parametrize(
    "name, layers, block, size_gib",
    [
        ("qwen3-8b", 5, 16, 1.95),
        ("llama-3.1-8b-instruct", 5, 10, 1.95),
        ("gpt-oss-120b", 8, 10, 1.46),
        ("qwen3-coder-30b-a3b", 8, 16, 0.88),
        ("gemma-4-31b-it", 5, 16, 2.86),
    ],
)
def test_drafter_shapes_match_published_file_sizes(name, layers, block, size_gib):
    drafter = MODELS[name].drafter
    assert (drafter.num_layers, drafter.block_size) == (layers, block)
    assert drafter.hidden_size == MODELS[name].hidden_size  # drafters share the target's hidden size
    assert drafter.num_params() * 2 / GIB == pytest.approx(size_gib, abs=0.01)  # BF16 safetensors


def test_drafter_checkpoint_names_as_published():
    assert MODELS["qwen3-8b"].drafter.checkpoint == "z-lab/Qwen3-8B-DFlash-b16"
    assert MODELS["gpt-oss-120b"].drafter.checkpoint == "z-lab/gpt-oss-120b-DFlash"
    assert MODELS["qwen3-coder-30b-a3b"].drafter.checkpoint == "z-lab/Qwen3-Coder-30B-A3B-DFlash"
    assert MODELS["llama-3.1-8b-instruct"].drafter.checkpoint == "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat"


def test_models_resolve_by_alias_hf_id_and_directory(tiny_qwen3):
    assert resolve_model("Qwen/Qwen3-8B").name == "qwen3-8b"
    assert resolve_model("openai/gpt-oss-120b").name == "gpt-oss-120b"
    local = resolve_model(tiny_qwen3)
    import json

    config = json.loads((tiny_qwen3 / "config.json").read_text())
    assert (local.num_layers, local.hidden_size, local.vocab_size) == (
        config["num_hidden_layers"],
        config["hidden_size"],
        config["vocab_size"],
    )
    with pytest.raises(UnknownNameError, match="qwen3-8b"):
        resolve_model("no-such-model")


def test_demo_entry_reads_the_shipped_config_or_says_it_is_a_placeholder():
    from trtllm_dflash.demo import DEMO_DIR

    demo = resolve_model("demo")
    assert demo.placeholder == (not (DEMO_DIR / "target" / "config.json").is_file())

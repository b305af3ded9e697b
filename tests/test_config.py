"""DrafterConfig: every field of DFLASH.md, dflash_config precedence, defaults."""

from __future__ import annotations

import pytest

from trtllm_dflash.config import DrafterConfig, default_target_layer_ids
from trtllm_dflash.contracts.draft_window import DraftWindow
from trtllm_dflash.errors import CheckpointError

QWEN3_8B_B16 = {
    "architectures": ["DFlashDraftModel"],
    "block_size": 16,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
    "num_target_layers": 36,
    "num_hidden_layers": 5,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rope_theta": 1000000,
    "rms_norm_eps": 1e-6,
    "vocab_size": 151936,
    "attention_bias": False,
    "layer_types": ["full_attention"] * 5,
    "model_type": "qwen3",
}


def test_reads_the_published_qwen3_8b_config():
    config = DrafterConfig.from_dict(QWEN3_8B_B16)
    assert config.block_size == 16
    assert config.mask_token_id == 151669
    assert config.target_layer_ids == (1, 9, 17, 25, 33)
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (4096, 12288, 5)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (32, 8, 128)
    assert config.rope_theta == 1e6 and config.rms_norm_eps == 1e-6 and config.vocab_size == 151936
    assert config.num_target_layers == 36 and not config.attention_bias
    assert {config.attention_of(i) for i in range(5)} == {DraftWindow(0)}
    assert config.input_embedding_scale is None and config.output_multiplier is None


def test_dflash_config_overrides_top_level():
    raw = dict(QWEN3_8B_B16, block_size=10, mask_token_id=5)
    raw["dflash_config"] = dict(raw["dflash_config"], block_size=16)
    config = DrafterConfig.from_dict(raw)
    assert config.block_size == 16  # dflash_config wins
    assert config.mask_token_id == 151669


def test_block_size_only_in_dflash_config():
    raw = {k: v for k, v in QWEN3_8B_B16.items() if k != "block_size"}
    raw["dflash_config"] = dict(raw["dflash_config"], block_size=8)
    assert DrafterConfig.from_dict(raw).block_size == 8


def test_default_layer_ids_match_z_lab():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-8B
    assert default_target_layer_ids(32, 5) == [1, 8, 15, 22, 29]  # Llama-3.1-8B: 1 + k*28/4
    assert default_target_layer_ids(24, 1) == [12]
    raw = dict(QWEN3_8B_B16, dflash_config={"mask_token_id": 1})
    assert DrafterConfig.from_dict(raw).target_layer_ids == (1, 9, 17, 25, 33)


def test_sliding_layers_and_optional_scalings():
    raw = dict(
        QWEN3_8B_B16,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention", "full_attention"],
        sliding_window=256,
        input_embedding_scale=64.0,
        output_multiplier=0.5,
        final_logit_softcapping=30.0,
    )
    config = DrafterConfig.from_dict(raw)
    assert [config.attention_of(i).window for i in range(5)] == [256, 0, 256, 0, 0]
    assert not any(config.attention_of(i).causal for i in range(5))  # sliding layers are not causal
    assert (config.input_embedding_scale, config.output_multiplier, config.final_logit_softcapping) == (64.0, 0.5, 30.0)


def test_round_trip_through_to_dict():
    config = DrafterConfig.from_dict(dict(QWEN3_8B_B16, sliding_window=128, output_multiplier=2.0))
    assert DrafterConfig.from_dict(config.to_dict()) == config


def test_missing_required_field_names_it():
    raw = {k: v for k, v in QWEN3_8B_B16.items() if k != "hidden_size"}
    with pytest.raises(CheckpointError, match="hidden_size"):
        DrafterConfig.from_dict(raw)
    with pytest.raises(CheckpointError, match="block_size"):
        DrafterConfig.from_dict({k: v for k, v in QWEN3_8B_B16.items() if k != "block_size"})


def test_mask_token_id_is_optional_at_parse_time():
    """load_drafter resolves it from the target's tokenizer (tests/test_drafter_formats.py)."""
    config = DrafterConfig.from_dict(dict(QWEN3_8B_B16, dflash_config={}))
    assert config.mask_token_id is None
    assert "mask_token_id" not in config.to_dict()["dflash_config"]


def test_wrong_type_is_reported():
    with pytest.raises(CheckpointError, match="wrong type"):
        DrafterConfig.from_dict(dict(QWEN3_8B_B16, num_hidden_layers="five"))

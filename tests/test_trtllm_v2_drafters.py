"""Drafters on the trtllm backend: DFlash V2 (drafter attention VANILLA / FA4, never TRTLLM), sliding layers
run as their reference defines them through a config overlay, and drafter_support's answers.

trtllm_block_attention re-states TensorRT-LLM's DFlashForCausalLM._get_attention_mask_args + use_swa;
the first test holds it to the cases TensorRT-LLM's own test_dflash2_semantics.py (@10e95278, PR #19159)
asserts, so a wrong re-statement fails here.
"""

from __future__ import annotations

import json

import pytest
import yaml

from trtllm_dflash.backends.trtllm import options as trtllm
from trtllm_dflash.backends.trtllm.drafters import (
    DrafterNote,
    drafter_overlay,
    drafter_support,
    reference_block_attention,
    trtllm_block_attention,
)
from trtllm_dflash.backends.trtllm.options import llm_api_options
from trtllm_dflash.backends.trtllm.repository import write_trtllm_repository
from trtllm_dflash.config import DrafterConfig
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.recipes import find_recipe

BASE = {
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 512,
    "num_target_layers": 8,
    "block_size": 8,
}


def _config(**fields) -> dict:
    return {**BASE, **fields}


def test_restatement_matches_tensorrt_llms_own_cases():
    released_v2 = _config(
        architectures=["DFlash2DraftModel"],
        is_causal=False,
        num_hidden_layers=5,
        layer_types=["sliding_attention"] * 5,
        sliding_window=2048,
        use_sliding_window=True,
        dflash_config={"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 4},
    )
    assert [trtllm_block_attention(released_v2, i) for i in range(5)] == [(False, (2047, 2047))] * 5
    mixed = dict(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"], sliding_window=512, use_sliding_window=True)
    v1 = _config(is_causal=False, **mixed)  # is_causal is ignored for V1: the sliding layer runs causally
    assert [trtllm_block_attention(v1, i) for i in range(2)] == [(True, (511, 0)), (False, (-1, -1))]
    v2 = dict(architectures=["DFlash2DraftModel"], **mixed)
    assert [trtllm_block_attention(_config(**v2), i) for i in range(2)] == [(True, (511, 0)), (False, (-1, -1))]
    assert [trtllm_block_attention(_config(is_causal=False, **v2), i) for i in range(2)] == [(False, (511, 511)), (False, (-1, -1))]
    assert [trtllm_block_attention(_config(is_causal=True, **v2), i) for i in range(2)] == [(True, (511, 0)), (True, (-1, -1))]
    # use_swa windows every layer without layer_types, only the sliding ones with them (dspark_layer_window_size)
    swa = _config(num_hidden_layers=2, dflash_config={"use_swa": True, "swa_window_size": 4})
    assert [trtllm_block_attention(swa, i) for i in range(2)] == [(False, (3, 3))] * 2
    typed = _config(num_hidden_layers=2, layer_types=["full_attention"] * 2, dflash_config={"use_swa": True, "swa_window_size": 4})
    assert trtllm_block_attention(typed, 0) == (False, (-1, -1))


def _zlab_sliding(window: int = 32) -> dict:
    return _config(
        architectures=["DFlashDraftModel"],
        num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=window,
        dflash_config={"mask_token_id": 5, "target_layer_ids": [1, 5]},
    )


def test_a_zlab_sliding_drafter_gets_an_overlay_that_runs_it_non_causally():
    raw = _zlab_sliding()
    reference = [reference_block_attention(raw, i) for i in range(2)]
    assert reference == [(False, (31, 31)), (False, (-1, -1))]
    assert trtllm_block_attention(raw, 0) == (True, (31, 0))  # as published, TensorRT-LLM runs it causally
    overlay = drafter_overlay(raw)
    assert overlay["use_sliding_window"] is False
    assert overlay["dflash_config"]["use_swa"] is True and overlay["dflash_config"]["swa_window_size"] == 32
    assert [trtllm_block_attention(overlay, i) for i in range(2)] == reference
    # use_swa alone (the fix the DFlash docs suggest) keeps the layer causal: the overlay needs both keys
    swa_only = json.loads(json.dumps(raw))
    swa_only["dflash_config"].update(use_swa=True, swa_window_size=32)
    assert trtllm_block_attention(swa_only, 0) == (True, (31, 31))
    assert drafter_overlay(_config(num_hidden_layers=2, dflash_config={"mask_token_id": 5})) is None  # nothing to change


def _v2_config() -> DrafterConfig:
    return DrafterConfig.from_dict(
        _config(
            architectures=["DFlash2DraftModel"],
            num_hidden_layers=2,
            layer_types=["sliding_attention"] * 2,
            sliding_window=16,
            dflash_config={
                "mask_token_id": 5,
                "target_layer_ids": [1, 5],
                "block_size": 8,
                "conv_kernel_size": 2,
                "conv_group_size": 16,
                "selector_rank": 8,
                "selector_top_k": 4,
            },
        )
    )


def test_drafter_support_answers():
    v2 = _v2_config()
    assert drafter_support(v2) is None and drafter_support(v2, "FA4") is None
    refused = drafter_support(v2, "TRTLLM")
    assert refused is not None and not isinstance(refused, DrafterNote)
    assert "TRTLLM drafter attention refuses" in refused[0] and "VANILLA" in refused[1]
    v1 = DrafterConfig.from_dict(_zlab_sliding())
    assert drafter_support(v1) is None  # through the overlay
    note = drafter_support(v1, "TRTLLM")
    assert isinstance(note, DrafterNote) and "causally" in note[0] and "VANILLA" in note[1]
    plain = DrafterConfig.from_dict(_config(num_hidden_layers=2, dflash_config={"mask_token_id": 5, "target_layer_ids": [1, 5]}))
    assert drafter_support(plain, "TRTLLM") is None
    # ModelOpt `causal: true`: TensorRT-LLM has no causal full layer for V1 drafters
    causal = DrafterConfig.from_dict(
        _config(num_hidden_layers=2, dflash_config={"mask_token_id": 5, "target_layer_ids": [1, 5], "causal": True})
    )
    if causal.causal:
        assert isinstance(drafter_support(causal), DrafterNote)


def _write_drafter(path, config: DrafterConfig) -> None:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config.to_dict()))
    (path / "model.safetensors").write_bytes(b"weights")


def test_a_v2_drafter_is_configured_with_vanilla_attention_and_an_overlay(tmp_path):
    drafter = tmp_path / "drafter"
    _write_drafter(drafter, _v2_config())
    recipe = find_recipe("gpt-oss-120b", "b300")
    options, notes = llm_api_options(recipe, drafter, tmp_path / "repo" / "drafter")
    spec = options["speculative_config"]
    assert spec["attention_backend"] == "VANILLA" and spec["speculative_model"] == str((tmp_path / "repo" / "drafter").resolve())
    assert any("overlay" in note for note in notes)
    repo, _ = write_trtllm_repository(tmp_path / "repo", recipe, drafter_dir=drafter)
    written = json.loads((repo / "drafter" / "config.json").read_text())
    assert written["is_causal"] is False  # our own to_dict puts it under dflash_config, where TensorRT-LLM does not read it
    assert all(trtllm_block_attention(written, i) == (False, (15, 15)) for i in range(2))
    assert (repo / "drafter" / "model.safetensors").resolve() == (drafter / "model.safetensors").resolve()
    model_yaml = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert model_yaml["speculative_config"]["speculative_model"] == str(repo / "drafter")


def test_trtllm_drafter_attention_is_refused_for_a_v2_drafter_in_one_line(run_main, tmp_path):
    drafter = tmp_path / "drafter"
    _write_drafter(drafter, _v2_config())
    from trtllm_dflash.recipes import recipes_dir

    data = yaml.safe_load((recipes_dir() / "gpt-oss-120b/b300.yaml").read_text())
    data["trtllm"]["attention_backend"] = "TRTLLM"
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text(yaml.safe_dump(data))
    code, _, err = run_main("repo", "--recipe", str(recipe_file), "--drafter", str(drafter), "--out", str(tmp_path / "repo"))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert "TRTLLM drafter attention refuses" in lines[0] and "VANILLA" in lines[0]


def test_no_backend_refusal_of_v2_drafters():
    from trtllm_dflash.backends import get_backend

    assert get_backend("trtllm").drafter_refusal("dflash2", "z-lab/Qwen3.8-27B-DFlash2") is None
    with pytest.raises(DFlashError, match="TRTLLM drafter attention"):
        trtllm._check_catalog_drafter(type("C", (), {"kind": "dflash2", "layer_types": ("sliding_attention",)})(), "TRTLLM", "x", [])

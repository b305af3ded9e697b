"""Loading and validating target/drafter pairs: every validation error names problem and fix."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from trtllm_dflash.checkpoints import load_drafter, load_target, validate_pair
from trtllm_dflash.errors import CheckpointError, CompatibilityError
from trtllm_dflash.testing.tiny import make_tiny_drafter


@pytest.fixture
def pair(tmp_path, tiny_qwen3):
    """A writable copy of a matching drafter for the tiny Qwen3 target."""
    drafter = make_tiny_drafter(tmp_path / "drafter", tiny_qwen3, block_size=8)
    return tiny_qwen3, drafter


def _edit_config(drafter_dir, **changes):
    path = drafter_dir / "config.json"
    raw = json.loads(path.read_text())
    for key, value in changes.items():
        if key in raw.get("dflash_config", {}):
            raw["dflash_config"][key] = value
        else:
            raw[key] = value
    path.write_text(json.dumps(raw))


def test_loads_a_matching_pair(pair):
    target_dir, drafter_dir = pair
    target = load_target(target_dir)
    drafter = load_drafter(drafter_dir, target=target)
    assert drafter.config.block_size == 8
    assert next(drafter.parameters()).dtype == next(target.model.parameters()).dtype
    reloaded = load_file(str(drafter_dir / "model.safetensors"))
    assert torch.equal(drafter.fc.weight, reloaded["fc.weight"])


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"hidden_size": 32}, "hidden_size 32 != target hidden_size 64"),
        ({"vocab_size": 1000}, "vocab_size 1000 != target vocab_size 128"),
        ({"target_layer_ids": [0, 4]}, r"outside \[0, 4\): \[4\]"),
        ({"target_layer_ids": [-1, 2]}, r"outside \[0, 4\)"),
        ({"mask_token_id": 128}, r"mask_token_id 128 is outside the target vocabulary \[0, 128\)"),
        ({"block_size": 1}, "block_size is 1"),
        ({"num_target_layers": 36}, "36-layer target, this target has 4 layers"),
    ],
)
def test_incompatible_pairs_are_refused_with_the_fix(pair, changes, message):
    target_dir, drafter_dir = pair
    _edit_config(drafter_dir, **changes)
    target = load_target(target_dir)
    with pytest.raises(CompatibilityError, match=message) as info:
        load_drafter(drafter_dir, target=target)
    assert info.value.fix  # every refusal says how to fix it


def test_missing_tensor(pair):
    target_dir, drafter_dir = pair
    state = load_file(str(drafter_dir / "model.safetensors"))
    del state["layers.1.mlp.down_proj.weight"]
    save_file(state, str(drafter_dir / "model.safetensors"))
    with pytest.raises(CheckpointError, match="missing 1 tensor.*layers.1.mlp.down_proj.weight"):
        load_drafter(drafter_dir, target=load_target(target_dir))


def test_unexpected_tensor(pair):
    target_dir, drafter_dir = pair
    state = load_file(str(drafter_dir / "model.safetensors"))
    state["layers.0.self_attn.sinks"] = torch.zeros(4)  # a drafter's own lm_head/embed_tokens are known
    save_file(state, str(drafter_dir / "model.safetensors"))
    with pytest.raises(CheckpointError, match="unexpected tensor.*layers.0.self_attn.sinks"):
        load_drafter(drafter_dir, target=load_target(target_dir))


def test_tensor_shape_mismatch(pair):
    target_dir, drafter_dir = pair
    state = load_file(str(drafter_dir / "model.safetensors"))
    state["fc.weight"] = torch.zeros(64, 64)
    save_file(state, str(drafter_dir / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"fc.weight has shape \(64, 64\)"):
        load_drafter(drafter_dir, target=load_target(target_dir))


def test_corrupted_safetensors_is_named(pair):
    target_dir, drafter_dir = pair
    weights = drafter_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="model.safetensors is not a valid safetensors file"):
        load_drafter(drafter_dir, target=load_target(target_dir))


def test_pickled_weights_are_never_loaded(tmp_path, tiny_qwen3):
    target_copy = tmp_path / "target"
    shutil.copytree(tiny_qwen3, target_copy)
    (target_copy / "model.safetensors").rename(target_copy / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="only pickled weights.*safetensors"):
        load_target(target_copy)


def test_missing_directories(tmp_path, tiny_qwen3):
    with pytest.raises(CheckpointError, match="target directory .* does not exist"):
        load_target(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="drafter directory .* does not exist"):
        load_drafter(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no config.json"):
        load_drafter(tmp_path / "empty")


def test_target_without_tokenizer_only_fails_when_one_is_needed(tiny_qwen3):
    assert load_target(tiny_qwen3).tokenizer is None
    with pytest.raises(CheckpointError, match="has no tokenizer"):
        load_target(tiny_qwen3, require_tokenizer=True)


def test_validate_pair_accepts_sliding_layers_only_with_a_window(tiny_qwen3):
    from transformers import AutoConfig

    from trtllm_dflash.testing.tiny import tiny_drafter_config

    target_config = AutoConfig.from_pretrained(tiny_qwen3)
    ok = tiny_drafter_config(target_config, layer_types=("sliding_attention", "full_attention"), sliding_window=4)
    validate_pair(target_config, ok)
    bad = tiny_drafter_config(target_config, layer_types=("sliding_attention", "full_attention"))
    with pytest.raises(CompatibilityError, match="no sliding_window"):
        validate_pair(target_config, bad)


def test_a_checked_pair_parses_the_drafter_config_once_and_still_checks_a_looked_up_mask_token(tmp_path, monkeypatch):
    """What a build's export and validate stages do (builder/pipeline.py CheckpointPair): the drafter's
    config.json parsed once, validate_pair not run again, but a mask token looked up in this
    target's tokenizer is still checked against the target's vocabulary."""
    from trtllm_dflash.checkpoints import drafters, read_drafter_checkpoint
    from trtllm_dflash.testing.tiny import make_tiny_target

    target_dir = make_tiny_target(tmp_path / "target", "qwen3", seed=4, tokenizer=True)
    drafter_dir = make_tiny_drafter(tmp_path / "drafter", target_dir, seed=4)
    raw = json.loads((drafter_dir / "config.json").read_text())
    del raw["dflash_config"]["mask_token_id"]
    raw["dflash_config"]["mask_token"] = "~"  # id 97 in the tiny tokenizer
    (drafter_dir / "config.json").write_text(json.dumps(raw))
    checkpoint = read_drafter_checkpoint(drafter_dir)
    checked = []
    monkeypatch.setattr(drafters, "validate_pair", lambda *args: checked.append(args))
    monkeypatch.setattr(drafters, "read_drafter_json", lambda path: pytest.fail(f"{path}/config.json parsed again"))
    assert load_drafter(checkpoint, load_target(target_dir), pair_checked=True).config.mask_token_id == 97
    assert checked == []
    small = make_tiny_target(tmp_path / "small", "qwen3", seed=4, tokenizer=True, vocab_size=96)
    with pytest.raises(CompatibilityError, match=r"mask_token_id 97 is outside the target vocabulary \[0, 96\)"):
        load_drafter(checkpoint, load_target(small), pair_checked=True)

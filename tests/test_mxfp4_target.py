"""gpt-oss targets in the published MXFP4 layout: our loader reads the experts exactly as transformers'
own MXFP4 dequantization does, decodes speculatively without loss, and refuses a malformed checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from trtllm_dflash import DFlashPipeline
from trtllm_dflash.checkpoints import load_target
from trtllm_dflash.errors import CheckpointError
from trtllm_dflash.testing.tiny import GPT_OSS_MXFP4_CONFIG, make_tiny_drafter, make_tiny_mxfp4_target, make_tiny_target

NEW_TOKENS = 16
PROMPTS = ([5, 17, 9, 30], [60, 73, 66, 88, 95, 61, 84, 79, 57], [3])


@pytest.fixture(scope="module")
def mxfp4_target(tmp_path_factory):
    return make_tiny_mxfp4_target(tmp_path_factory.mktemp("mxfp4") / "target", seed=1, tokenizer=True)


def transformers_dequantized(path, dtype):
    """transformers' own reading of the checkpoint: its Mxfp4 quantizer, dequantizing (CPU, no kernels)."""
    from transformers import AutoModelForCausalLM, Mxfp4Config

    model = AutoModelForCausalLM.from_pretrained(
        path, quantization_config=Mxfp4Config(dequantize=True), dtype=dtype, attn_implementation="eager", local_files_only=True
    )
    return model.eval()


def greedy(model, prompt: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


def test_checkpoint_is_in_the_published_layout(mxfp4_target):
    config = json.loads((mxfp4_target / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "mxfp4"
    assert "model.layers.*.mlp.router" in config["quantization_config"]["modules_to_not_convert"]
    state = load_file(str(mxfp4_target / "model.safetensors"))
    experts, hidden, inner = config["num_local_experts"], config["hidden_size"], config["intermediate_size"]
    assert state["model.layers.0.mlp.experts.gate_up_proj_blocks"].shape == (experts, 2 * inner, hidden // 32, 16)
    assert state["model.layers.0.mlp.experts.gate_up_proj_scales"].shape == (experts, 2 * inner, hidden // 32)
    assert state["model.layers.0.mlp.experts.down_proj_blocks"].shape == (experts, hidden, inner // 32, 16)
    assert state["model.layers.0.mlp.experts.down_proj_scales"].dtype == torch.uint8
    assert "model.layers.0.mlp.experts.gate_up_proj" not in state
    assert state["model.layers.0.mlp.experts.gate_up_proj_bias"].dtype == torch.bfloat16
    assert state["model.layers.0.self_attn.q_proj.weight"].dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_loader_weights_equal_transformers_mxfp4_dequantization(mxfp4_target, dtype):
    ours = load_target(mxfp4_target, dtype=dtype).model.state_dict()
    theirs = transformers_dequantized(mxfp4_target, dtype).state_dict()
    assert set(ours) == set(theirs)
    assert "model.layers.3.mlp.experts.down_proj" in ours
    for name, tensor in theirs.items():
        assert ours[name].dtype == tensor.dtype and torch.equal(ours[name], tensor), name
    assert ours["model.layers.0.mlp.experts.gate_up_proj"].abs().sum() > 0


def test_loader_greedy_tokens_equal_transformers_mxfp4_dequantization(mxfp4_target):
    ours = load_target(mxfp4_target, dtype=torch.float32).model
    theirs = transformers_dequantized(mxfp4_target, torch.float32)
    for prompt in PROMPTS:
        tokens = greedy(ours, prompt)
        assert tokens == greedy(theirs, prompt)
        assert len(set(tokens)) > 1  # not a degenerate repetition


def test_speculative_decoding_equals_target_greedy(mxfp4_target, tmp_path):
    drafter = make_tiny_drafter(tmp_path / "drafter", mxfp4_target, seed=3, block_size=10, target_layer_ids=(1, 3), mask_token_id=2)
    pipe = DFlashPipeline.load(mxfp4_target, drafter, dtype=torch.float64)
    reference = load_target(mxfp4_target, dtype=torch.float64).model
    outputs = pipe.generate([list(p) for p in PROMPTS], max_new_tokens=NEW_TOKENS, stop_token_ids=())
    for prompt, out in zip(PROMPTS, outputs):
        assert out.token_ids == greedy(reference, prompt)
        assert len(out.token_ids) == 1 + sum(out.acceptance_lengths)


def _rewrite(source, dest, edit):
    dest.mkdir()
    for file in source.iterdir():
        (dest / file.name).write_bytes(file.read_bytes())
    state = load_file(str(source / "model.safetensors"))
    edit(state)
    save_file(state, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: s.pop("model.layers.2.mlp.experts.down_proj_scales"), "has no model.layers.2.mlp.experts.down_proj_scales"),
        (
            lambda s: s.update({"model.layers.1.mlp.experts.gate_up_proj_blocks": torch.zeros(4, 128, 2, 8, dtype=torch.uint8)}),
            r"gate_up_proj_blocks is U8 \[4, 128, 2, 8\], config.json implies U8 \[4, 128, 2, 16\]",
        ),
        (
            lambda s: s.update({"model.layers.0.mlp.experts.down_proj_scales": torch.zeros(4, 64, 2, dtype=torch.float32)}),
            r"down_proj_scales is F32",
        ),
    ],
    ids=["missing-scales", "wrong-shape", "wrong-dtype"],
)
def test_malformed_mxfp4_checkpoint_is_refused_in_one_line(mxfp4_target, tmp_path, edit, message):
    broken = _rewrite(mxfp4_target, tmp_path / "broken", edit)
    with pytest.raises(CheckpointError, match=message) as info:
        load_target(broken)
    assert "\n" not in str(info.value)


def test_unquantized_experts_under_an_mxfp4_config_are_refused(tmp_path):
    path = make_tiny_target(tmp_path / "bf16", "gpt_oss")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": GPT_OSS_MXFP4_CONFIG}))
    with pytest.raises(CheckpointError, match="stores model.layers.0.mlp.experts.gate_up_proj unquantized"):
        load_target(path)


def test_mxfp4_sizes_must_be_whole_blocks(tmp_path):
    path = make_tiny_mxfp4_target(tmp_path / "target")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "intermediate_size": 48}))
    with pytest.raises(CheckpointError, match="intermediate_size 48 is not a multiple of 32"):
        load_target(path)

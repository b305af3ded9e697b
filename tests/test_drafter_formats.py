"""Drafter checkpoints as other tools write them: each layout is written on the fly (config.json +
safetensors), loaded, its DrafterConfig checked, and decoded losslessly against the target.

The conversions start from the trained cycle pair (a drafter that proposes the target's own
tokens), so a wrong mapping (an off-by-one tap, a lost weight) shows up as different acceptance
lengths, not only as a crash.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from trtllm_dflash import DFlashPipeline
from trtllm_dflash.checkpoints import load_drafter, load_target, save_drafter
from trtllm_dflash.config import DrafterConfig
from trtllm_dflash.contracts.draft_window import DraftWindow
from trtllm_dflash.errors import CheckpointError, CompatibilityError
from trtllm_dflash.modeling.drafter import DFlashDrafter
from trtllm_dflash.testing.tiny import make_tiny_drafter, make_tiny_target, tiny_drafter_config

NEW_TOKENS = 24


def _generate(target_dir, drafter_dir, prompts, **load_kwargs):
    pipe = DFlashPipeline.load(target_dir, drafter_dir, dtype=torch.float64, **load_kwargs)
    return pipe.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=())


def _assert_lossless(target_dir, drafter_dir, prompts) -> list:
    """Speculative output == autoregressive output; returns the speculative results."""
    spec = _generate(target_dir, drafter_dir, prompts)
    plain = _generate(target_dir, None, prompts)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    return spec


def _copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


def _config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def _write(path: Path, config: dict, state: dict | None = None, name: str = "model.safetensors") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    if state is not None:
        for old in path.glob("*.safetensors"):
            old.unlink()
        save_file({k: v.contiguous() for k, v in state.items()}, str(path / name))
    return path


@pytest.fixture(scope="module")
def reference_run(trained_pair):
    """The z-lab layout's results, which every conversion must reproduce exactly."""
    target_dir, drafter_dir, prompts = trained_pair
    spec = _assert_lossless(target_dir, drafter_dir, prompts)
    assert max(max(o.acceptance_lengths) for o in spec) > 4  # the drafter really drafts
    return [o.acceptance_lengths for o in spec]


# ----------------------------------------------------------------------------- Speculators


def _to_speculators(zlab_dir: Path, target_dir: Path, dest: Path, prefix: str = "") -> Path:
    """Speculators' DFlash layout (DFlashSpeculatorConfig + converter): shapes under
    transformer_layer_config, aux ids = z-lab id + 1, the verifier's embedding/LM head copied in."""
    z = _config(zlab_dir)
    layer = {k: v for k, v in z.items() if k not in ("architectures", "block_size", "dflash_config", "num_target_layers")}
    layer["architectures"] = ["Qwen3ForCausalLM"]
    config = {
        "speculators_model_type": "dflash",
        "architectures": ["DFlashSpeculator"],
        "transformer_layer_config": layer,
        "draft_vocab_size": z["vocab_size"],
        "block_size": z["block_size"],
        "aux_hidden_state_layer_ids": [i + 1 for i in z["dflash_config"]["target_layer_ids"]],
        "mask_token_id": z["dflash_config"]["mask_token_id"],
        "sliding_window_non_causal": False,
        "sample_from_anchor": False,
        "speculators_config": {
            "algorithm": "dflash",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": z["block_size"] - 1}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": str(target_dir), "architectures": ["Qwen3ForCausalLM"]},
        },
    }
    state = load_file(str(zlab_dir / "model.safetensors"))
    target = load_file(str(next(target_dir.glob("*.safetensors"))))
    state = {prefix + k: v for k, v in state.items()}
    state["embed_tokens.weight"] = target["model.embed_tokens.weight"].clone()
    state["lm_head.weight"] = target.get("lm_head.weight", target["model.embed_tokens.weight"]).clone()
    return _write(dest, config, state)


@pytest.mark.parametrize("prefix", ["", "model."])
def test_speculators_layout_matches_the_z_lab_one(tmp_path, trained_pair, reference_run, prefix):
    target_dir, zlab_dir, prompts = trained_pair
    spec_dir = _to_speculators(zlab_dir, target_dir, tmp_path / "speculators", prefix)
    config = DrafterConfig.from_dir(spec_dir)
    zlab = DrafterConfig.from_dir(zlab_dir)
    assert config.target_layer_ids == zlab.target_layer_ids  # aux ids - 1
    assert (config.block_size, config.mask_token_id, config.hidden_size) == (zlab.block_size, zlab.mask_token_id, zlab.hidden_size)
    assert config.num_target_layers is None  # Speculators does not record it
    spec = _assert_lossless(target_dir, spec_dir, prompts)
    assert [o.acceptance_lengths for o in spec] == reference_run


@pytest.mark.parametrize(
    "change,message",
    [
        ({"draft_vocab_size": 64}, "reduced vocabulary"),
        ({"sample_from_anchor": True}, "sample_from_anchor"),
        ({"aux_hidden_state_layer_ids": [0, 2]}, "embedding output"),
        ({"speculators_config": {"algorithm": "eagle3"}, "speculators_model_type": "eagle3"}, "eagle3"),
    ],
)
def test_speculators_variants_we_cannot_run_are_refused(tmp_path, trained_pair, change, message):
    target_dir, zlab_dir, _ = trained_pair
    spec_dir = _to_speculators(zlab_dir, target_dir, tmp_path / "speculators")
    _write(spec_dir, {**_config(spec_dir), **change})
    with pytest.raises(CheckpointError, match=message) as info:
        DrafterConfig.from_dir(spec_dir)
    assert info.value.fix


# ----------------------------------------------------------------------------- ModelOpt


def _to_modelopt(zlab_dir: Path, dest: Path, **dflash_options) -> Path:
    """ModelOpt's DFlashExporter: the z-lab layout plus export fields (torch_dtype, tie flag, ...)."""
    config = _config(zlab_dir)
    config.update({"initializer_range": 0.02, "attention_dropout": 0.0, "tie_word_embeddings": False, "torch_dtype": "float32"})
    config["dflash_config"].update(dflash_options)
    return _write(_copy(zlab_dir, dest), config)


def test_modelopt_export_matches_the_z_lab_one(tmp_path, trained_pair, reference_run):
    target_dir, zlab_dir, prompts = trained_pair
    modelopt_dir = _to_modelopt(zlab_dir, tmp_path / "modelopt")
    assert DrafterConfig.from_dir(modelopt_dir) == DrafterConfig.from_dir(zlab_dir)
    spec = _assert_lossless(target_dir, modelopt_dir, prompts)
    assert [o.acceptance_lengths for o in spec] == reference_run


def test_modelopt_causal_export_runs_causal_block_attention(tmp_path, trained_pair):
    target_dir, zlab_dir, prompts = trained_pair
    modelopt_dir = _to_modelopt(zlab_dir, tmp_path / "modelopt", causal=True)
    config = DrafterConfig.from_dir(modelopt_dir)
    assert config.attention_of(0) == DraftWindow(0, causal=True)
    _assert_lossless(target_dir, modelopt_dir, prompts)


def test_modelopt_fp8_export_is_dequantized(tmp_path, trained_pair):
    """FP8 weights with per-tensor scales (hf_quant_config.json quant_algo FP8) load as
    weight x scale; input/KV scales are dropped (the drafter runs in the model dtype)."""
    target_dir, zlab_dir, prompts = trained_pair
    modelopt_dir = _to_modelopt(zlab_dir, tmp_path / "modelopt-fp8")
    state = load_file(str(zlab_dir / "model.safetensors"))
    quantized, expected = {}, {}
    for name, tensor in state.items():
        if name.endswith("proj.weight"):
            scale = tensor.abs().max().float() / 448.0
            fp8 = (tensor.float() / scale).to(torch.float8_e4m3fn)
            quantized[name] = fp8
            quantized[name.removesuffix(".weight") + ".weight_scale"] = scale
            quantized[name.removesuffix(".weight") + ".input_scale"] = torch.tensor(1.0)
            expected[name] = fp8.float() * scale
        else:
            quantized[name] = expected[name] = tensor
    quant = {"producer": {"name": "modelopt", "version": "0.40"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None}}
    _write(modelopt_dir, {**_config(modelopt_dir), "quantization_config": quant}, quantized)
    (modelopt_dir / "hf_quant_config.json").write_text(json.dumps(quant))
    drafter = load_drafter(modelopt_dir, dtype=torch.float32)
    for name, tensor in expected.items():
        torch.testing.assert_close(drafter.state_dict()[name], tensor.float(), rtol=0, atol=0)
    _assert_lossless(target_dir, modelopt_dir, prompts)


@pytest.mark.parametrize(
    "options,quant,message",
    [
        ({"use_swa": True, "swa_window_size": 0}, None, "swa_window_size is 0"),
        ({"projector_type": "domino"}, None, "'domino' head"),
        ({"shift_label": True}, None, "DSpark heads"),
        ({"attention_sink_bias": True}, None, "attention sinks"),
        ({"projector_type": "dspark", "markov_rank": 8}, None, "dspark"),
        ({}, "W4A8_AWQ", "quantized with W4A8_AWQ"),  # FP8 and NVFP4 load: tests/test_drafter_quantized.py
    ],
)
def test_modelopt_options_we_cannot_run_are_refused(tmp_path, trained_pair, options, quant, message):
    target_dir, zlab_dir, _ = trained_pair
    modelopt_dir = _to_modelopt(zlab_dir, tmp_path / "modelopt", **options)
    if quant:
        (modelopt_dir / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": quant}}))
    with pytest.raises(CheckpointError, match=message) as info:
        load_drafter(modelopt_dir, target=load_target(target_dir))
    assert info.value.fix


# ----------------------------------------------------------------------------- z-lab variants


def test_a_v2_config_over_v1_weights_names_the_missing_v2_tensors(tmp_path, tiny_qwen3, tiny_qwen3_drafter):
    drafter_dir = _copy(tiny_qwen3_drafter, tmp_path / "dflash2")
    config = _config(drafter_dir)
    config["architectures"] = ["DFlash2DraftModel"]
    config["dflash_config"].update({"conv_kernel_size": 2, "selector_top_k": 16})
    _write(drafter_dir, config)
    with pytest.raises(CheckpointError, match="is missing .* tensor.*(_conv|candidate_selector)") as info:
        load_drafter(drafter_dir, target=load_target(tiny_qwen3))
    assert "\n" not in str(info.value)


def test_speculators_dflash2_is_refused_naming_the_supported_layout(tmp_path, tiny_qwen3, tiny_qwen3_drafter):
    drafter_dir = _copy(tiny_qwen3_drafter, tmp_path / "speculators-dflash2")
    config = _config(drafter_dir)
    config["speculators_config"] = {"algorithm": "dflash2"}
    _write(drafter_dir, config)
    with pytest.raises(CheckpointError, match="Speculators 'dflash2'.*DFlash2DraftModel layout") as info:
        load_drafter(drafter_dir, target=load_target(tiny_qwen3))
    assert "\n" not in str(info.value)


def test_sliding_window_size_from_config_and_from_the_api(tmp_path, trained_pair):
    """The bounded draft history stays lossless; the API value overrides the checkpoint's."""
    target_dir, zlab_dir, prompts = trained_pair
    bounded_dir = _copy(zlab_dir, tmp_path / "bounded")
    config = _config(bounded_dir)
    config["dflash_config"]["sliding_window_size"] = 6
    _write(bounded_dir, config)
    assert DrafterConfig.from_dir(bounded_dir).sliding_window_size == 6
    _assert_lossless(target_dir, bounded_dir, prompts)
    assert load_drafter(bounded_dir, sliding_window_size=3).config.history == 3
    with pytest.raises(CompatibilityError, match="sliding_window_size"):
        load_drafter(bounded_dir, sliding_window_size=0)


# ----------------------------------------------------------------------------- mask token


def _without_mask_id(drafter_dir: Path) -> Path:
    config = _config(drafter_dir)
    del config["dflash_config"]["mask_token_id"]
    return _write(drafter_dir, config)


def test_mask_token_comes_from_the_target_tokenizer(tmp_path):
    target_dir = make_tiny_target(tmp_path / "target", "qwen3", seed=6, tokenizer=True)  # <mask> is id 2
    drafter_dir = _without_mask_id(make_tiny_drafter(tmp_path / "drafter", target_dir, seed=6))
    drafter = load_drafter(drafter_dir, target=load_target(target_dir))
    assert drafter.config.mask_token_id == 2
    _assert_lossless(target_dir, drafter_dir, [[40, 41, 42, 43], [50, 51]])


def test_mask_token_named_MASK_in_the_vocabulary(tmp_path):
    from transformers import AutoTokenizer

    target_dir = make_tiny_target(tmp_path / "target", "qwen3", seed=7, tokenizer=True)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    tokenizer.mask_token = None
    tokenizer.add_tokens(["<|MASK|>"], special_tokens=True)
    tokenizer.save_pretrained(target_dir)
    mask_id = tokenizer.convert_tokens_to_ids("<|MASK|>")
    drafter_dir = _without_mask_id(make_tiny_drafter(tmp_path / "drafter", target_dir, seed=7))
    assert load_drafter(drafter_dir, target=load_target(target_dir)).config.mask_token_id == mask_id == 100
    config = _config(drafter_dir)  # a config that names its mask token (SGLang reads `mask_token`)
    config["dflash_config"]["mask_token"] = "~"
    _write(drafter_dir, config)
    assert load_drafter(drafter_dir, target=load_target(target_dir)).config.mask_token_id == 97  # "~" is id 97
    config["dflash_config"]["mask_token"] = "<|unknown|>"
    _write(drafter_dir, config)
    with pytest.raises(CheckpointError, match=re.escape("names mask token '<|unknown|>'")):
        load_drafter(drafter_dir, target=load_target(target_dir))


def test_no_mask_token_anywhere_names_the_fix(tmp_path, tiny_qwen3):
    drafter_dir = _without_mask_id(make_tiny_drafter(tmp_path / "drafter", tiny_qwen3, seed=8))
    with pytest.raises(CheckpointError, match="no mask_token_id.*set dflash_config.mask_token_id"):
        load_drafter(drafter_dir, target=load_target(tiny_qwen3))  # a target without a tokenizer
    with pytest.raises(CheckpointError, match="no mask_token_id"):
        load_drafter(drafter_dir)


# ----------------------------------------------------------------------------- shapes


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"hidden_size": 32, "intermediate_size": 64, "head_dim": 8}, "hidden_size 32 != target hidden_size 64"),
        ({"num_target_layers": 6}, "6-layer target, this target has 4 layers"),
    ],
)
def test_drafter_for_another_target_is_refused(tmp_path, tiny_qwen3, overrides, message):
    from transformers import AutoConfig

    config = tiny_drafter_config(AutoConfig.from_pretrained(tiny_qwen3), **overrides)
    drafter_dir = save_drafter(DFlashDrafter(config), tmp_path / "drafter")
    with pytest.raises(CompatibilityError, match=message) as info:
        load_drafter(drafter_dir, target=load_target(tiny_qwen3))
    assert info.value.fix


# ----------------------------------------------------------------------------- own LM head


def test_own_lm_head_and_embedding_are_used_and_round_trip(tmp_path, tiny_qwen3):
    drafter_dir = make_tiny_drafter(tmp_path / "drafter", tiny_qwen3, seed=9)
    state = load_file(str(drafter_dir / "model.safetensors"))
    generator = torch.Generator().manual_seed(9)
    state["lm_head.weight"] = torch.randn(128, 64, generator=generator)
    state["embed_tokens.weight"] = torch.randn(128, 64, generator=generator)
    save_file(state, str(drafter_dir / "model.safetensors"))

    target = load_target(tiny_qwen3, dtype=torch.float64)
    drafter = load_drafter(drafter_dir, target=target)
    torch.testing.assert_close(drafter.lm_head.weight, state["lm_head.weight"].double())
    hidden = torch.randn(1, 3, 64, dtype=torch.float64)
    target_head = target.model.get_output_embeddings()
    torch.testing.assert_close(drafter.logits(hidden, target_head), hidden @ state["lm_head.weight"].double().T)
    tokens = torch.tensor([[4, 5]])
    torch.testing.assert_close(drafter.embed(tokens, target.model.get_input_embeddings()), state["embed_tokens.weight"].double()[tokens])

    # the runtime's draft logits come from the drafter's head, never silently from the target's
    pipe = DFlashPipeline.load(tiny_qwen3, drafter_dir, dtype=torch.float64)
    runtime = pipe.runtime
    runtime.allocate(1, 64)
    out = runtime.target_forward(slice(0, 1), torch.tensor([[5, 9, 11]]), torch.tensor([0]), 3)
    block = torch.tensor([[7] + [drafter.config.mask_token_id] * 7])
    logits = runtime.draft_forward(slice(0, 1), block, out.features, torch.tensor([3]), torch.tensor([0]))
    runtime.allocate(1, 64)
    with torch.inference_mode():  # the runtime's features are inference tensors
        own = runtime.drafter
        hidden = own.step(own.embed(block, None), out.features, torch.tensor([3]), torch.tensor([0]), runtime.draft_cache.rows(slice(0, 1)))
    torch.testing.assert_close(logits, hidden[:, 1:] @ state["lm_head.weight"].double().T)

    saved = save_drafter(drafter, tmp_path / "saved")
    assert {"lm_head.weight", "embed_tokens.weight"} <= set(load_file(str(saved / "model.safetensors")))
    reloaded = load_drafter(saved, target=target)
    torch.testing.assert_close(reloaded.lm_head.weight, drafter.lm_head.weight)
    _assert_lossless(tiny_qwen3, drafter_dir, [[5, 9, 11, 3], [60, 61, 62]])


def test_own_lm_head_of_another_vocabulary_is_refused(tmp_path, tiny_qwen3):
    drafter_dir = make_tiny_drafter(tmp_path / "drafter", tiny_qwen3, seed=10)
    state = load_file(str(drafter_dir / "model.safetensors"))
    state["lm_head.weight"] = torch.zeros(96, 64)
    save_file(state, str(drafter_dir / "model.safetensors"))
    with pytest.raises(CompatibilityError, match="own lm_head has 96 rows"):
        load_drafter(drafter_dir, target=load_target(tiny_qwen3))

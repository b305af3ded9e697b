"""Recipes: every shipped file validates; bad files fail with file, key and line; the CLI lists/shows/validates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trtllm_dflash.catalog.gpus import resolve_gpu
from trtllm_dflash.catalog.models import resolve_model
from trtllm_dflash.errors import RecipeError
from trtllm_dflash.recipes import find_recipe, list_recipes, load_recipe, recipes_dir, resolve_recipe

SHIPPED = sorted(recipes_dir().glob("*/*.yaml"))
GOOD = recipes_dir() / "qwen3-8b" / "h100.yaml"


def test_the_announced_deployments_are_shipped():
    names = {r.name for r in list_recipes()}
    required = {
        "gpt-oss-120b/b300",
        "gpt-oss-120b/b200",
        "gpt-oss-120b/h200",
        "qwen3-8b/h100",
        "qwen3-8b/h200",
        "qwen3-8b/b200",
        "qwen3-8b/b300",
        "llama-3.1-8b-instruct/h100",
        "gemma-4-31b-it/b300",
        "qwen3-coder-30b-a3b/b200",
        "demo/cpu",
        "demo/rtx-pro-6000",
    }
    assert required <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_shipped_recipe_validates_and_agrees_with_the_catalogs(path):
    recipe = load_recipe(path)
    assert recipe.path == path and recipe.name == f"{path.parent.name}/{path.stem}"
    spec = recipe.model_spec()
    assert spec.name == recipe.model.name
    if spec.drafter is not None and not spec.placeholder:
        # The recipe's drafter is the published one, with its trained block size.
        assert recipe.drafter.checkpoint == spec.drafter.checkpoint
        assert recipe.drafter.block_size == spec.drafter.block_size
        if recipe.drafter.target_layer_ids is not None:
            assert tuple(recipe.drafter.target_layer_ids) == spec.drafter.target_layer_ids
    gpu = recipe.gpu_spec()
    if gpu is not None:
        for precision in (recipe.quantization.weights, recipe.quantization.experts, recipe.quantization.kv_cache):
            assert gpu.supports(precision)
    assert 0 <= recipe.max_draft_len <= recipe.drafter.block_size - 1


def test_specific_announced_settings():
    big = find_recipe("openai/gpt-oss-120b", "B300")
    assert (big.backend, big.parallelism.num_gpus, big.parallelism.tp, big.parallelism.ep) == ("trtllm", 8, 8, 8)
    assert (big.quantization.weights, big.quantization.experts, big.trtllm.moe_backend) == ("bf16", "mxfp4", "TRTLLM")
    assert find_recipe("gpt-oss-120b", "h200").quantization.experts == "mxfp4"  # as published, everywhere
    assert find_recipe("qwen3-8b", "h100").quantization.weights == "fp8"
    assert find_recipe("qwen3-8b", "b300").quantization.weights == "fp8"  # our engines carry FP8 Q/DQ, not FP4 yet
    assert find_recipe("llama-3.1-8b", "h100").drafter.block_size == 10
    assert find_recipe("gemma-4-31b", "b300").parallelism.num_gpus == 1
    assert resolve_model(find_recipe("qwen3-coder", "b200").model.name).drafter.num_layers == 8
    assert find_recipe("demo", "rtx-pro-6000").trt_flavour() == "tensorrt-rtx"
    assert find_recipe("qwen3-8b", "b200").trt_flavour() == "tensorrt"


def test_draft_length_schedule_semantics():
    recipe = find_recipe("qwen3-8b", "h100")  # {1: 15, 8: 7, 32: 0}
    assert [recipe.draft_len_for(c) for c in (1, 7, 8, 31, 32, 500)] == [15, 15, 7, 7, 0, 0]


def test_llm_api_options_carry_the_dflash_speculative_config():
    options = find_recipe("gpt-oss-120b", "b300").llm_api_options(speculative_model="/models/drafter")
    assert options["speculative_config"] == {
        "decoding_type": "DFlash",
        "max_draft_len": 9,
        "speculative_model": "/models/drafter",
        # the recipe's {1: 9, 16: 6, 64: 3, 256: 0} ("from N sequences on") in TensorRT-LLM's form, whose key
        # is the largest batch size using that length (DecodingBaseConfig.draft_len_schedule)
        "target_layer_ids": [1, 9, 17, 25, 33],
        "draft_len_schedule": {15: 9, 63: 6, 255: 3},
    }
    assert options["tensor_parallel_size"] == 8 and options["moe_expert_parallel_size"] == 8
    assert options["kv_cache_config"] == {"dtype": "fp8", "free_gpu_memory_fraction": 0.85}
    assert options["moe_config"] == {"backend": "TRTLLM"}
    assert options["cuda_graph_config"] == {"enable_padding": True, "max_batch_size": 512}


def test_unknown_recipe_names_what_exists():
    with pytest.raises(RecipeError, match="exist for: b200, b300, h100, h200"):
        find_recipe("qwen3-8b", "a100")


# ----- bad recipes: file, key and line -----


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def _errors(path: Path) -> list[str]:
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    return info.value.errors


@pytest.mark.parametrize(
    "old, new, key, needle, words",
    [
        (
            "  max_seq_len: 16384",
            "  max_seq_len: 16384\n  max_batch: 8",
            "limits.max_batch",
            "max_batch: 8",
            "did you mean 'max_batch_size'",
        ),
        ("  use_plugins: true", "  use_plugins: true\n  plugin: x", "trt.plugin", "plugin: x", "unknown key"),
        ("  block_size: 16", "  block_size: sixteen", "drafter.block_size", "block_size: sixteen", "valid integer"),
        ("  decoupled: true", "  decoupled: 'yes'", "triton.decoupled", "decoupled:", "valid boolean"),
        ("  kv_cache: fp8", "  kv_cache: int4", "quantization.kv_cache", "kv_cache: int4", "'bf16'"),
        ("gpu: h100", "gpu: h1000", "gpu", "gpu: h1000", "unknown GPU"),
        ("  weights: fp8", "  weights: nvfp4", "quantization.weights", "weights: nvfp4", "does not run on h100"),
        ("{1: 15, 8: 7, 32: 0}", "{1: 15, 8: 7, 32: 9}", "drafter.draft_len_schedule", "draft_len_schedule", "must not grow"),
    ],
)
def test_bad_values_are_reported_with_file_key_and_line(tmp_path, old, new, key, needle, words):
    text = GOOD.read_text()
    assert old in text
    text = text.replace(old, new)
    path = _write(tmp_path, text)
    errors = _errors(path)
    assert len(errors) == 1
    assert errors[0].startswith(f"{path}:{_line_of(text, needle)}: {key}: ")
    assert words in errors[0]


def test_missing_key_points_at_its_section(tmp_path):
    text = GOOD.read_text().replace("  max_seq_len: 16384\n", "")
    path = _write(tmp_path, text)
    assert _errors(path)[0].startswith(f"{path}:{_line_of(text, 'limits:')}: limits.max_seq_len: required key is missing")


def test_all_problems_are_listed_and_the_message_is_one_line(tmp_path):
    text = GOOD.read_text().replace("  block_size: 16", "  block_size: 1").replace("backend: trt\n", "backend: tensorrt\n")
    path = _write(tmp_path, text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert len(info.value.errors) == 2 and "\n" not in str(info.value) and "1 more" in str(info.value)


def test_yaml_syntax_error_and_duplicate_key_have_lines(tmp_path):
    bad = GOOD.read_text().replace("  checkpoint: Qwen/Qwen3-8B", "  checkpoint: [Qwen/Qwen3-8B")
    path = _write(tmp_path, bad)
    assert "invalid YAML" in _errors(path)[0]
    dup = GOOD.read_text().replace("backend: trt\n", "backend: trt\nbackend: trtllm\n")
    path = _write(tmp_path, dup)
    assert _errors(path) == [f"{path}:{_line_of(dup, 'backend: trtllm')}: backend: key given twice"]


def test_cross_field_rules(tmp_path):
    text = GOOD.read_text().replace("backend: trt\n", "backend: trtllm\n")  # and it still has a `trt:` section
    assert "only for backend: trt" in _errors(_write(tmp_path, text))[0]
    multi = GOOD.read_text() + "parallelism:\n  num_gpus: 2\n  tp: 2\n"
    assert "runs on one GPU" in _errors(_write(tmp_path, multi))[0]


def test_shipped_location_must_match_content(tmp_path, monkeypatch):
    import trtllm_dflash.recipes.loader as loader

    (tmp_path / "qwen3-8b").mkdir()
    wrong = tmp_path / "qwen3-8b" / "h200.yaml"
    wrong.write_text(GOOD.read_text())  # says gpu: h100
    monkeypatch.setattr(loader, "recipes_dir", lambda: tmp_path)
    with pytest.raises(RecipeError, match="does not match the file name 'h200'.yaml"):
        load_recipe(wrong)


# ----- CLI -----


def test_cli_list_and_show():
    from trtllm_dflash.cli.app import app

    runner = CliRunner()
    result = runner.invoke(app, ["recipes", "list", "--json"])
    assert result.exit_code == 0
    names = [json.loads(line)["name"] for line in result.stdout.splitlines()]
    assert names == sorted(r.name for r in list_recipes())
    result = runner.invoke(app, ["recipes", "show", "gpt-oss-120b/b300"])
    assert result.exit_code == 0 and "decoding_type: DFlash" in result.stdout and "moe_expert_parallel_size: 8" in result.stdout
    shown = json.loads(runner.invoke(app, ["recipes", "show", str(GOOD), "--json"]).stdout)
    assert shown["name"] == "qwen3-8b/h100" and shown["drafter"]["block_size"] == 16


def test_cli_validate_reports_every_bad_file(tmp_path, run_main):
    bad = _write(tmp_path, GOOD.read_text().replace("  max_seq_len: 16384", "  max_seq_len: 16384\n  max_batch: 8"))
    code, out, err = run_main("recipes", "validate", str(GOOD), str(bad))
    assert code == 2
    assert f"ok: {GOOD}" in out
    assert f"{bad}:" in err and "limits.max_batch" in err and "Traceback" not in err


def test_cli_show_unknown_is_one_line_exit_2(run_main):
    code, out, err = run_main("recipes", "show", "qwen3-8b/a100")
    assert code == 2 and err.startswith("error: no recipe for qwen3-8b on a100") and len(err.strip().splitlines()) == 1


def test_resolve_recipe_accepts_names_and_paths():
    assert resolve_recipe("qwen3-8b/h100").name == resolve_recipe(str(GOOD)).name == "qwen3-8b/h100"
    assert resolve_gpu(find_recipe("gpt-oss-120b", "b300").gpu).sm_arch == "sm_103a"

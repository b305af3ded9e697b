"""The headline command end to end with local stand-ins:

    dflash-trt build --gpu b300 --model gpt-oss-120b --target DIR --drafter DIR --out OUT

with a tiny gpt-oss target in the published MXFP4 layout and a tiny z-lab-layout drafter. Every
stage that needs no GPU runs (checkpoints, quantize: nothing to do, trtllm, repository), in the
real CLI in a child process, offline."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from support import one_error_line, run_cli

from trtllm_dflash.testing.tiny import make_tiny_drafter, make_tiny_mxfp4_target, make_tiny_target

HEADLINE = ("build", "--gpu", "b300", "--model", "gpt-oss-120b")


def cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*args, columns=400)


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("headline")
    target = make_tiny_mxfp4_target(root / "target", seed=2, tokenizer=True)
    # the z-lab gpt-oss-120b drafter drafts blocks of 10; this one taps two of the four target layers
    drafter = make_tiny_drafter(root / "drafter", target, seed=2, block_size=10, target_layer_ids=(1, 3), mask_token_id=2)
    return target, drafter


@pytest.fixture(scope="module")
def headline(stand_ins, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    target, drafter = stand_ins
    out = tmp_path_factory.mktemp("headline-out") / "out"
    return cli(*HEADLINE, "--target", str(target), "--drafter", str(drafter), "--out", str(out)), out


def test_headline_build_completes_every_stage(headline, stand_ins):
    result, out = headline
    target, _ = stand_ins
    assert result.returncode == 0, (result.stdout, result.stderr)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is True
    assert {name: stage["status"] for name, stage in manifest["stages"].items()} == dict.fromkeys(
        ("checkpoints", "quantize", "trtllm", "repository"), "complete"
    )
    assert manifest["recipe"]["name"] == "gpt-oss-120b/b300" and manifest["recipe"]["backend"] == "trtllm"
    assert manifest["recipe"]["quantization"]["moe_experts"] == "mxfp4"  # the published experts, served as they are
    checkpoints = manifest["stages"]["checkpoints"]["summary"]
    assert checkpoints["target"]["experts"] == {"format": "mxfp4", "projections": 8}  # 4 layers x gate_up/down checked
    assert manifest["checkpoints"]["target"] == str(target.resolve())
    assert "stands in for gpt-oss-120b with other sizes" in result.stdout  # the memory plan is the catalog model's


def test_headline_options_name_the_local_pair_and_pass_the_schema(headline, stand_ins):
    from trtllm_dflash.backends.trtllm.options import validate_model_yaml

    result, out = headline
    target, drafter = stand_ins
    assert result.returncode == 0, result.stderr
    options = yaml.safe_load((out / "trtllm" / "llm_api.yaml").read_text())
    validate_model_yaml(out / "trtllm" / "llm_api.yaml")
    drafter_config = json.loads((drafter / "config.json").read_text())["dflash_config"]
    spec = options["speculative_config"]
    assert spec["decoding_type"] == "DFlash" and spec["max_draft_len"] == 9
    assert spec["mask_token_id"] == drafter_config["mask_token_id"] == 2
    assert spec["target_layer_ids"] == drafter_config["target_layer_ids"] == [1, 3]  # the validated pair's, not the catalog drafter's
    assert spec["speculative_model"] == str(drafter.resolve())
    assert options["tensor_parallel_size"] == 8 and options["moe_expert_parallel_size"] == 8
    assert options["moe_config"] == {"backend": "TRTLLM"} and options["kv_cache_config"]["dtype"] == "fp8"


def test_headline_repository_is_what_the_llm_api_triton_model_reads(headline, stand_ins):
    """NVIDIA's LLM-API model.py reads `model.yaml` from Triton's model version directory
    (pb_utils.get_model_dir()), so the file must be tensorrt_llm/1/model.yaml beside model.py."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from trtllm_dflash.backends.trtllm.options import validate_model_yaml

    result, out = headline
    target, _ = stand_ins
    assert result.returncode == 0, result.stderr
    model_dir = out / "repository" / "triton" / "tensorrt_llm"
    config = text_format.Parse((model_dir / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert config.name == "tensorrt_llm" and config.backend == "python" and config.model_transaction_policy.decoupled
    assert sorted(p.name for p in (model_dir / "1").iterdir()) == ["model.py", "model.yaml"]
    model_yaml = yaml.safe_load((model_dir / "1" / "model.yaml").read_text())
    validate_model_yaml(model_dir / "1" / "model.yaml")
    assert model_yaml["model"] == str(target.resolve()) and model_yaml["backend"] == "pytorch"
    assert model_yaml["triton_config"] == {"max_batch_size": 0, "decoupled": True}
    built = yaml.safe_load((out / "trtllm" / "llm_api.yaml").read_text())
    assert {k: v for k, v in model_yaml.items() if k not in ("model", "backend", "triton_config")} == built


def test_a_stand_in_of_another_family_is_refused_in_one_line(tmp_path, stand_ins):
    _, drafter = stand_ins
    qwen = make_tiny_target(tmp_path / "qwen3", "qwen3")
    line = one_error_line(cli(*HEADLINE, "--target", str(qwen), "--drafter", str(drafter), "--dry-run"))
    assert "is a qwen3 checkpoint, gpt-oss-120b is a gpt_oss model" in line


def test_target_with_a_directory_as_model_is_refused(stand_ins):
    target, drafter = stand_ins
    line = one_error_line(cli("build", "--gpu", "b300", "--model", str(target), "--target", str(target), "--drafter", str(drafter)))
    assert "--model" in line and "already a directory" in line


def test_a_drafter_with_shorter_blocks_than_the_recipe_is_refused(tmp_path, stand_ins):
    target, _ = stand_ins
    short = make_tiny_drafter(tmp_path / "drafter", target, block_size=8, mask_token_id=2)
    line = one_error_line(cli(*HEADLINE, "--target", str(target), "--drafter", str(short), "--dry-run"))
    assert "block_size 8" in line and "blocks of 10" in line


def test_a_malformed_mxfp4_stand_in_stops_at_the_checkpoints_stage(tmp_path, stand_ins):
    from safetensors.torch import load_file, save_file

    target, drafter = stand_ins
    broken = tmp_path / "target"
    broken.mkdir()
    for file in target.iterdir():
        (broken / file.name).write_bytes(file.read_bytes())
    state = load_file(str(target / "model.safetensors"))
    del state["model.layers.1.mlp.experts.gate_up_proj_scales"]
    save_file(state, str(broken / "model.safetensors"), metadata={"format": "pt"})
    result = cli(*HEADLINE, "--target", str(broken), "--drafter", str(drafter), "--out", str(tmp_path / "out"))
    assert "has no model.layers.1.mlp.experts.gate_up_proj_scales" in one_error_line(result)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text()) if (tmp_path / "out" / "manifest.json").is_file() else {}
    assert not manifest.get("complete")


def test_headline_build_prints_the_command_that_starts_it(headline, stand_ins):
    result, out = headline
    target, drafter = stand_ins
    line = next(line for line in result.stdout.splitlines() if "tritonserver --model-repository" in line)
    repository = (out / "repository" / "triton").resolve()
    assert line.endswith(f"tritonserver --model-repository {repository}")
    for mounted in (repository, target.resolve(), drafter.resolve()):  # model.yaml names them by absolute path
        assert f"-v {mounted}:{mounted}" in line
    assert "TensorRT-LLM 1.4.0rc1 or later" in line

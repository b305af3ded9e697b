"""Runtime per target family (decided at plan time), hybrid/MLA memory, and the pinned TensorRT-LLM llm-args check."""

from __future__ import annotations

import json

import pytest
import yaml

from trtllm_dflash.errors import DFlashError, PlanRefusedError
from trtllm_dflash.planning import plan_deployment
from trtllm_dflash.recipes import find_recipe, load_recipe, recipes_dir

NEW_RECIPES = [
    "gpt-oss-20b/h100",
    "gpt-oss-20b/b200",
    "qwen3.5-27b/b200",
    "qwen3.5-27b/h200",
    "qwen3.6-27b/b200",
    "qwen3.6-27b/h200",
    "qwen3.5-35b-a3b/h100",
    "qwen3-coder-next/b200",
    "gemma-4-31b-it/b300",
    "kimi-k2.5/b300",
]


@pytest.mark.parametrize("name", NEW_RECIPES)
def test_new_recipes_plan_and_dry_run(name, run_main):
    code, out, err = run_main("plan", "--recipe", name)
    assert code == 0, out + err
    assert f"backend {find_recipe(*name.split('/')).backend}:" in " ".join(out.split())
    code, out, err = run_main("build", "--recipe", name, "--dry-run")
    assert code == 0, out + err
    assert "checked against the llm_args of v1.4.0rc1 (NVIDIA/TensorRT-LLM@0372799d1543)" in " ".join(out.split())


@pytest.mark.parametrize(
    "model, gpu, families",
    [
        ("qwen3.5-27b", "b200", "hybrid Gated DeltaNet"),
        ("qwen3-coder-next", "b200", "hybrid Gated DeltaNet"),
        ("qwen3.5-35b-a3b", "h100", "hybrid Gated DeltaNet"),
        ("kimi-k2.5", "b300", "multi-head latent attention"),
    ],
)
def test_backend_trt_is_refused_for_families_our_engines_cannot_serve(model, gpu, families):
    plan = plan_deployment(model, gpu, backend="trt", num_gpus=8 if model == "kimi-k2.5" else None)
    assert not plan.ok and plan.refusals[0].kind == "backend"
    assert families in plan.refusals[0].problem and "use backend: trtllm" in plan.refusals[0].fix
    with pytest.raises(PlanRefusedError, match="use backend: trtllm"):
        plan.check()


def test_hybrid_recipe_with_backend_trt_is_refused_by_build(tmp_path, run_main):
    data = yaml.safe_load((recipes_dir() / "qwen3.5-27b" / "b200.yaml").read_text())
    data["backend"] = "trt"
    data.pop("trtllm")
    data["quantization"]["weights"] = "fp8"
    path = tmp_path / "hybrid-trt.yaml"
    path.write_text(yaml.safe_dump(data))
    code, out, err = run_main("build", "--recipe", str(path), "--dry-run")
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert "qwen3.5-27b is a hybrid Gated DeltaNet model; our engines have no linear-attention state" in line
    assert "use backend: trtllm (or torch)" in line


def test_default_backend_follows_the_family_with_its_reason():
    assert plan_deployment("qwen3-8b", "h100", use_recipe=False).backend == "trt"
    hybrid = plan_deployment("qwen3.5-27b", "b200", use_recipe=False)
    assert hybrid.backend == "trtllm" and "Gated DeltaNet" in hybrid.backend_reason and hybrid.attention == "hybrid-linear"
    assert plan_deployment("gemma-4-31b-it", "b300").backend_reason  # unverified for trtllm: allowed, with a note
    assert any("unverified" in n for n in plan_deployment("gemma-4-31b-it", "b300").notes)


def test_hybrid_linear_state_does_not_grow_with_context_but_kv_does():
    short = plan_deployment("qwen3.5-27b", "b200", context=4096)
    long = plan_deployment("qwen3.5-27b", "b200", context=32768)
    assert short.linear_state_bytes_per_sequence == long.linear_state_bytes_per_sequence > 0
    assert (
        long.kv_bytes_per_sequence - long.linear_state_bytes_per_sequence
        > short.kv_bytes_per_sequence - short.linear_state_bytes_per_sequence
    )
    # 48 linear layers x (1 + block 16) x (48 v-heads x 128 x 128 FP32 + 3 x (2 x 2048 + 6144) BF16)
    assert short.linear_state_bytes_per_sequence == 48 * 17 * (48 * 128 * 128 * 4 + 3 * 10240 * 2)
    # KV only on the 16 full-attention layers: 2 x 4 KV heads x 256 x FP8 per token
    assert short.kv_bytes_per_token == 16 * 2 * 4 * 256


def test_mla_kv_is_the_latent_per_token():
    plan = plan_deployment("kimi-k2.5", "b300")
    assert plan.attention == "mla" and plan.kv_bytes_per_token == 61 * (512 + 64)  # FP8


def _good_options():
    from trtllm_dflash.backends.trtllm.options import llm_api_options

    return llm_api_options(find_recipe("gpt-oss-120b", "b300"))[0]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda o: o.update(tensor_parallel=8), "tensor_parallel: unknown LLM-API key"),
        (lambda o: o["speculative_config"].update(use_rejection=True), "speculative_config.use_rejection: unknown LLM-API key"),
        (lambda o: o["speculative_config"].update(use_rejection_sampling="yes"), "use_rejection_sampling: expected bool"),
        (lambda o: o["moe_config"].update(backend="FASTEST"), "moe_config.backend: 'FASTEST' is not one of"),
        (lambda o: o["kv_cache_config"].update(free_gpu_memory_fraction=1.5), "free_gpu_memory_fraction: 1.5 must be <= 1.0"),
        (lambda o: o["speculative_config"].update(max_concurrency=32), "max_concurrency: cannot be combined with draft_len_schedule"),
        (lambda o: o["speculative_config"].update(draft_len_schedule={4: 5}), "must equal max_draft_len 9"),
        (lambda o: o["speculative_config"].update(attention_backend="FA3"), "attention_backend: 'FA3' is not one of"),
    ],
)
def test_llm_api_options_are_checked_against_the_pinned_llm_args(change, message):
    from trtllm_dflash.backends.trtllm.options import LLMApiOptions, validate_options

    options = _good_options()
    validate_options(options, LLMApiOptions)  # the shipped options pass
    change(options)
    with pytest.raises(DFlashError, match=message.replace("(", r"\(").replace(".", r"\.")):
        validate_options(options, LLMApiOptions)


def test_recipe_with_schedule_and_max_concurrency_is_refused(tmp_path):
    data = yaml.safe_load((recipes_dir() / "gpt-oss-20b" / "h100.yaml").read_text())
    data["trtllm"]["max_concurrency"] = 32
    path = tmp_path / "both.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(DFlashError, match="max_concurrency cannot be combined with drafter.draft_len_schedule"):
        load_recipe(path)


def test_moe_backend_must_match_the_gpu(tmp_path):
    data = yaml.safe_load((recipes_dir() / "gpt-oss-20b" / "h100.yaml").read_text())
    data["trtllm"]["moe_backend"] = "TRTLLM"
    path = tmp_path / "hopper-trtllm.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(DFlashError, match="use TRITON"):
        load_recipe(path)


def test_trtllm_schedule_uses_tensorrt_llm_semantics():
    from trtllm_dflash.recipes.schema import trtllm_draft_len_schedule

    recipe = find_recipe("qwen3-8b", "h100")  # ours: {1: 15, 8: 7, 32: 0}
    converted = trtllm_draft_len_schedule(recipe.drafter.draft_len_schedule, 64)
    assert converted == {7: 15, 31: 7}

    def trtllm_len(batch):  # TensorRT-LLM: the smallest key >= batch; above the largest key, 0
        keys = [k for k in sorted(converted) if k >= batch]
        return converted[keys[0]] if keys else 0

    assert [trtllm_len(c) for c in (1, 7, 8, 31, 32, 500)] == [recipe.draft_len_for(c) for c in (1, 7, 8, 31, 32, 500)]


def test_extractor_reads_pydantic_fields_from_source(tmp_path):
    from trtllm_dflash.backends.trtllm.llm_args_extract import main

    src = tmp_path / "tensorrt_llm" / "llmapi"
    src.mkdir(parents=True)
    body = "\n".join(
        f"class {name}{'(DecodingBaseConfig)' if name == 'DFlashDecodingConfig' else ''}:\n    x_{i}: int = 1\n"
        for i, name in enumerate(
            ["DecodingBaseConfig", "KvCacheConfig", "DecodeCudaGraphConfig", "MoeConfig", "BaseLlmArgs", "TorchLlmArgs"]
        )
    )
    body += """
class DFlashDecodingConfig(DecodingBaseConfig):
    mask_token_id: Optional[int] = Field(default=None, description="m")
    decoding_type: Literal["DFlash"] = Field(default="DFlash")
    attention_backend: Literal["VANILLA", "TRTLLM"] = Field(default="VANILLA")
    max_concurrency: Optional[PositiveInt] = Field(default=None, gt=0)
    _private: bool = PrivateAttr(True)
"""
    (src / "llm_args.py").write_text(body)
    out = tmp_path / "extract.json"
    assert main([str(tmp_path), "--tag", "vTEST", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    fields = data["classes"]["DFlashDecodingConfig"]["fields"]
    assert fields["attention_backend"] == {"type": "literal", "values": ["VANILLA", "TRTLLM"], "default": "VANILLA"}
    assert fields["max_concurrency"]["gt"] == 0 and "_private" not in fields
    assert data["classes"]["DFlashDecodingConfig"]["bases"] == ["DecodingBaseConfig"]
    assert data["source"]["release_tag"] == "vTEST"


@pytest.mark.parametrize(("model", "gpu"), [("qwen3.5-27b", "h200"), ("qwen3-coder-next", "b200"), ("qwen3.5-35b-a3b", "h100")])
def test_build_backend_flag_refuses_trt_for_hybrids_naming_trtllm(run_main, model, gpu):
    code, out, err = run_main("build", "--model", model, "--gpu", gpu, "--backend", "trt", "--dry-run")
    assert code == 2
    line = " ".join((out + err).split())
    assert "Gated DeltaNet" in line and "use backend: trtllm" in line


def test_build_backend_flag_switches_a_dense_recipe_to_trtllm(run_main):
    code, out, err = run_main("build", "--model", "qwen3-8b", "--gpu", "h100", "--backend", "trtllm", "--dry-run")
    assert code == 0, err
    assert "backend trtllm" in " ".join(out.split())


def test_gpt_oss_on_our_engines_plans_with_the_moe_caveat():
    """gpt-oss attention (sinks, sliding windows) exports to our engines, experts as a dense graph."""
    plan = plan_deployment("gpt-oss-20b", "h100", backend="trt")
    assert plan.ok and plan.backend == "trt"
    assert "dense graph" in plan.backend_reason and "TensorRT-LLM" in plan.backend_reason
    assert plan_deployment("gpt-oss-20b", "h100").backend == "trtllm"  # the default stays TensorRT-LLM

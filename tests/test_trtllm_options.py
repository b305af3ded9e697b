"""TensorRT-LLM's options as of the pinned release (v1.4.0rc1): the DFlash fields recipes expose, and
what a node with another TensorRT-LLM version is told."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.recipes import find_recipe, load_recipe, recipes_dir


def test_the_snapshot_is_the_tagged_release():
    from trtllm_dflash.backends.trtllm.llm_args_check import class_fields, llm_args_data, pinned_source, pinned_version

    source = llm_args_data()["source"]
    assert source["release_tag"] == "v1.4.0rc1" and source["commit"] == "0372799d1543ef5920c1318b829cf127800dbcb9"
    assert pinned_version() == "1.4.0rc1" and pinned_source().startswith("v1.4.0rc1 (NVIDIA/TensorRT-LLM@0372799d1543)")
    fields, complete = class_fields("DFlashDecodingConfig")
    assert complete  # the whole 1.4.0rc1 signature was read
    assert fields["attention_backend"]["values"] == ["VANILLA", "TRTLLM", "FA4"]
    for new in ("moe_backend", "spec_dec_variant", "context_recompute_tail", "skip_ctx_buffer_budget_check"):
        assert new in fields


def test_fa4_recipe_on_hopper_is_accepted(run_main, tmp_path):
    from trtllm_dflash.backends.trtllm.options import LLMApiOptions, llm_api_options, validate_options

    recipe = find_recipe("gpt-oss-120b", "h200")
    assert recipe.trtllm.attention_backend == "FA4"
    options, _ = llm_api_options(recipe)
    assert options["speculative_config"]["attention_backend"] == "FA4"
    validate_options(options, LLMApiOptions)
    code, out, err = run_main("repo", "--recipe", "gpt-oss-120b/h200", "--out", str(tmp_path / "repo"))
    assert code == 0, out + err
    model_yaml = (tmp_path / "repo" / "tensorrt_llm" / "1" / "model.yaml").read_text()
    assert "checked against TensorRT-LLM v1.4.0rc1" in model_yaml.splitlines()[1]
    assert yaml.safe_load(model_yaml)["speculative_config"]["attention_backend"] == "FA4"


def _recipe_file(tmp_path, name: str, edit) -> str:
    data = yaml.safe_load((recipes_dir() / name).read_text())
    edit(data)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _one_line(code: int, err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_fa4_on_blackwell_is_refused_in_one_line(run_main, tmp_path):
    path = _recipe_file(tmp_path, "gpt-oss-120b/b300.yaml", lambda d: d["trtllm"].update(attention_backend="FA4"))
    code, _, err = run_main("build", "--recipe", path, "--dry-run")
    line = _one_line(code, err)
    assert "attention_backend FA4 does not run on b300" in line and "VANILLA or TRTLLM" in line


def test_an_unknown_key_is_refused_in_one_line(run_main, tmp_path):
    path = _recipe_file(
        tmp_path, "gpt-oss-120b/h200.yaml", lambda d: d["trtllm"].update(extra_llm_api_options={"speculative_config_typo": 1})
    )
    code, _, err = run_main("build", "--recipe", path, "--dry-run")
    line = _one_line(code, err)
    assert "speculative_config_typo: unknown LLM-API key" in line and "v1.4.0rc1" in line


# An llm_args.py as TensorRT-LLM 1.3 had it (DFlash without FA4 or the 1.4 fields), installed where
# Python finds `tensorrt_llm`: what a node with that version has. It is read with ast, never imported.
OLDER_LLM_ARGS = textwrap.dedent("""
    from typing import Literal, Optional
    class DecodingBaseConfig(StrictBaseModel):
        max_draft_len: Optional[int] = None
        speculative_model: Optional[str] = None
        draft_len_schedule: Optional[dict[int, int]] = None
    class DFlashDecodingConfig(DecodingBaseConfig):
        mask_token_id: Optional[int] = None
        target_layer_ids: Optional[List[int]] = None
        decoding_type: Literal["DFlash"] = "DFlash"
        attention_backend: Literal["VANILLA", "TRTLLM"] = "VANILLA"
    class KvCacheConfig(StrictBaseModel):
        dtype: str = "auto"
        free_gpu_memory_fraction: Optional[float] = None
    class DecodeCudaGraphConfig(StrictBaseModel):
        enable_padding: bool = False
        max_batch_size: int = 0
    class MoeConfig(StrictBaseModel):
        backend: Literal["AUTO", "CUTLASS", "TRTLLM", "TRITON"] = "AUTO"
    class BaseLlmArgs(StrictBaseModel):
        model: str
        tensor_parallel_size: int = 1
        moe_expert_parallel_size: Optional[int] = None
        enable_attention_dp: bool = False
        max_batch_size: Optional[int] = None
        max_num_tokens: Optional[int] = None
        max_seq_len: Optional[int] = None
        kv_cache_config: KvCacheConfig = None
        speculative_config: SpeculativeConfig = None
    class TorchLlmArgs(BaseLlmArgs):
        cuda_graph_config: Optional[CudaGraphConfig] = None
        moe_config: MoeConfig = None
        backend: Literal["pytorch"] = "pytorch"
""")


@pytest.fixture
def older_tensorrt_llm(tmp_path, monkeypatch):
    package = tmp_path / "site" / "tensorrt_llm"
    (package / "llmapi").mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('needs CUDA: never imported by the check')\n")
    (package / "version.py").write_text('__version__ = "1.3.0rc20"\n')
    (package / "llmapi" / "llm_args.py").write_text(OLDER_LLM_ARGS)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))


def test_a_node_with_another_version_gets_one_line_per_unknown_key(older_tensorrt_llm):
    from trtllm_dflash.backends.trtllm.options import check_installed_tensorrt_llm, llm_api_options

    hopper, _ = llm_api_options(find_recipe("gpt-oss-120b", "h200"))  # FA4: new in the pinned release
    with pytest.raises(DFlashError) as refused:
        check_installed_tensorrt_llm(hopper, "model.yaml")
    message = str(refused.value)
    assert "\n" not in message
    assert "v1.4.0rc1" in message and "v1.3.0rc20" in message
    assert "speculative_config.attention_backend: 'FA4' is not one of ['VANILLA', 'TRTLLM']" in message
    blackwell, _ = llm_api_options(find_recipe("gpt-oss-120b", "b300"))  # only keys 1.3 knows
    assert "installed v1.3.0rc20" in check_installed_tensorrt_llm(blackwell)


def test_without_tensorrt_llm_the_pinned_release_is_what_checked():
    from trtllm_dflash.backends.trtllm.options import check_installed_tensorrt_llm, llm_api_options

    options, _ = llm_api_options(find_recipe("gpt-oss-120b", "h200"))
    assert "v1.4.0rc1" in check_installed_tensorrt_llm(options) and "not installed here" in check_installed_tensorrt_llm(options)


def test_hopper_moe_backends_for_mxfp4(tmp_path):
    cutlass = _recipe_file(tmp_path, "gpt-oss-120b/h200.yaml", lambda d: d["trtllm"].update(moe_backend="CUTLASS"))
    assert load_recipe(cutlass).trtllm.moe_backend == "CUTLASS"
    trtllm = _recipe_file(tmp_path, "gpt-oss-120b/h200.yaml", lambda d: d["trtllm"].update(moe_backend="TRTLLM"))
    with pytest.raises(DFlashError, match="use TRITON or CUTLASS"):
        load_recipe(trtllm)

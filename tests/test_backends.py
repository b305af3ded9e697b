"""The deployment backends: one factory, the stages each needs, and the new `backend` spelling."""

import pytest

from trtllm_dflash.backends import BACKEND_NAMES, backend_of_build, get_backend
from trtllm_dflash.errors import UnknownNameError


def test_one_factory_names_every_backend():
    assert BACKEND_NAMES == ("trt", "trtllm", "torch")
    assert get_backend("trt").stage_names() == ("checkpoints", "quantize", "export", "validate", "engines", "repository")
    assert get_backend("trtllm").stage_names() == ("checkpoints", "quantize", "trtllm", "repository")
    assert not get_backend("torch").needs_build and get_backend("trtllm").multi_gpu
    with pytest.raises(UnknownNameError, match="unknown backend 'tensorrt'"):
        get_backend("tensorrt")


def test_a_build_belongs_to_the_backend_whose_stage_finished():
    assert backend_of_build({"recipe": {"runtime": "trt"}, "stages": {"trtllm": {"status": "complete"}}}).name == "trtllm"
    assert backend_of_build({"recipe": {"runtime": "trtllm"}, "stages": {}}).name == "trtllm"
    assert backend_of_build({"recipe": {"runtime": "trt"}, "stages": {"checkpoints": {"status": "complete"}}}).name == "trt"


def test_recipes_accept_backend_as_the_new_spelling_of_runtime():
    from trtllm_dflash.recipes import Recipe, find_recipe

    data = find_recipe("qwen3-8b", "h100").model_dump(mode="python")
    data["backend"] = data.pop("runtime")
    assert Recipe.model_validate(data).backend == "trt"
    data["runtime"] = "trtllm"
    with pytest.raises(ValueError, match="disagree"):
        Recipe.model_validate(data)


@pytest.mark.parametrize("flag", ["--backend", "--runtime"])
def test_plan_and_build_take_backend_and_its_old_spelling_runtime(flag, run_main):
    import json

    code, out, _ = run_main("plan", "--model", "qwen3-8b", "--gpu", "h100", flag, "trtllm", "--json")
    assert code == 0 and json.loads(out)["runtime"] == "trtllm"
    code, out, _ = run_main("build", "--model", "qwen3-8b", "--gpu", "h100", flag, "trtllm", "--dry-run", "--json")
    assert code == 0 and [s["name"] for s in json.loads(out)["stages"]] == ["checkpoints", "quantize", "trtllm", "repository"]

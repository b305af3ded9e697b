"""The deployment backends: one factory, the stages each needs, and `backend` as their one name."""

import pytest

from trtllm_dflash.backends import BACKEND_NAMES, get_backend
from trtllm_dflash.errors import UnknownNameError


def test_one_factory_names_every_backend():
    assert BACKEND_NAMES == ("trt", "trtllm", "torch")
    assert get_backend("trt").stage_names() == ("checkpoints", "quantize", "export", "validate", "engines", "repository")
    assert get_backend("trtllm").stage_names() == ("checkpoints", "quantize", "trtllm", "repository")
    assert not get_backend("torch").needs_build and get_backend("trtllm").multi_gpu
    with pytest.raises(UnknownNameError, match="unknown backend 'tensorrt'"):
        get_backend("tensorrt")


def test_recipes_say_backend_and_the_old_runtime_spelling_is_refused():
    from pydantic import ValidationError

    from trtllm_dflash.recipes import Recipe, find_recipe

    data = find_recipe("qwen3-8b", "h100").model_dump(mode="python")
    assert Recipe.model_validate(data).backend == "trt"
    data["runtime"] = data.pop("backend")
    with pytest.raises(ValidationError, match="backend"):
        Recipe.model_validate(data)


def test_plan_and_build_take_backend(run_main):
    import json

    code, out, _ = run_main("plan", "--model", "qwen3-8b", "--gpu", "h100", "--backend", "trtllm", "--json")
    assert code == 0 and json.loads(out)["backend"] == "trtllm"
    code, out, _ = run_main("build", "--model", "qwen3-8b", "--gpu", "h100", "--backend", "trtllm", "--dry-run", "--json")
    assert code == 0 and [s["name"] for s in json.loads(out)["stages"]] == ["checkpoints", "quantize", "trtllm", "repository"]

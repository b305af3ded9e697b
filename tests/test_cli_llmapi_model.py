"""`--llmapi-model DIR` on the commands that write a trtllm repository (`build`, `repo --recipe`, `repo --build`):
the folder is checked before anything is written, recorded in the repository and mounted by the printed start
command; a missing or incomplete folder, or the option on a repository that is not trtllm's, is refused in one line.

The LLM-API folder here is a layout stand-in (model.py importing helpers.py from its own folder, as NVIDIA's does);
the real one is TensorRT-LLM's triton_backend/all_models/llmapi/tensorrt_llm, which cannot run on this machine.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support import one_error_line, run_cli

from trtllm_dflash.backends.trtllm import repository as trtllm
from trtllm_dflash.testing.tiny import make_tiny_drafter, make_tiny_mxfp4_target

CLONE = "git clone -b v1.4.0rc1 https://github.com/NVIDIA/TensorRT-LLM.git"


def cli(*args: str, cwd_env: dict | None = None) -> subprocess.CompletedProcess:
    # $DFLASH_TRT_LLMAPI_MODEL unset and no ./TensorRT-LLM: only the option can name the folder
    return run_cli(*args, env={trtllm.LLMAPI_MODEL_ENV: "", **(cwd_env or {})}, columns=400)


def llmapi_folder(root: Path) -> Path:
    folder = root / "TensorRT-LLM" / trtllm.LLMAPI_MODEL_SUBDIR
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text('name: "tensorrt_llm"\n')
    (folder / "1" / "helpers.py").write_text("MARK = 'helpers beside model.py'\n")
    (folder / "1" / "model.py").write_text("from helpers import MARK\n\nclass TritonPythonModel:\n    mark = MARK\n")
    return folder.resolve()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The gpt-oss-120b/b300 build (tiny MXFP4 stand-in pair) with --llmapi-model."""
    root = tmp_path_factory.mktemp("llmapi")
    target = make_tiny_mxfp4_target(root / "target", seed=2, tokenizer=True)
    drafter = make_tiny_drafter(root / "drafter", target, seed=2, block_size=10, target_layer_ids=(1, 3), mask_token_id=2)
    folder = llmapi_folder(root / "elsewhere")
    out = root / "out"
    result = cli(
        "build",
        "--gpu",
        "b300",
        "--model",
        "gpt-oss-120b",
        "--target",
        str(target),
        "--drafter",
        str(drafter),
        "--out",
        str(out),
        "--llmapi-model",
        str(folder),
    )
    return result, out, folder


def test_build_records_the_given_model_and_its_command_mounts_it(built):
    result, out, folder = built
    assert result.returncode == 0, (result.stdout, result.stderr)
    version = out / "repository" / "triton" / "tensorrt_llm" / "1"
    assert (version / "llmapi_model.txt").read_text().strip() == str(folder)
    line = next(line for line in result.stdout.splitlines() if "tritonserver --model-repository" in line)
    assert f"-v {folder}:{folder}" in line and f"-e {trtllm.LLMAPI_MODEL_ENV}={folder}" in line
    assert CLONE not in result.stdout  # found: no note asks for a clone


def test_the_build_artifact_carries_the_model_to_repo_build(built, tmp_path):
    """The folder travels in the build's artifact (manifest.json), not in the environment."""
    import json

    _, out, folder = built
    assert json.loads((out / "manifest.json").read_text())["artifact"]["llmapi_model"] == str(folder)
    result = cli("repo", "--build", str(out), "--out", str(tmp_path / "repo"))
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert (tmp_path / "repo" / "tensorrt_llm" / "1" / "llmapi_model.txt").read_text().strip() == str(folder)


def test_repo_of_the_build_takes_the_option_too(built, tmp_path):
    _, out, folder = built
    other = llmapi_folder(tmp_path / "other")
    result = cli(
        "repo", "--build", str(out), "--out", str(tmp_path / "repo"), "--llmapi-model", str(other / "1")
    )  # the version folder works too
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert (tmp_path / "repo" / "tensorrt_llm" / "1" / "llmapi_model.txt").read_text().strip() == str(other)


def test_repo_of_a_recipe_records_the_given_model(tmp_path):
    folder = llmapi_folder(tmp_path)
    result = cli("repo", "--recipe", "gpt-oss-120b/b300", "--out", str(tmp_path / "repo"), "--llmapi-model", str(folder))
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert (tmp_path / "repo" / "tensorrt_llm" / "1" / "llmapi_model.txt").read_text().strip() == str(folder)
    assert f"-e {trtllm.LLMAPI_MODEL_ENV}={folder}" in " ".join(result.stdout.split())
    # without the option (and nothing in the other places) the repository is written with a note saying what to clone
    result = cli("repo", "--recipe", "gpt-oss-120b/b300", "--out", str(tmp_path / "bare"))
    assert result.returncode == 0 and CLONE in " ".join(result.stdout.split())
    assert not (tmp_path / "bare" / "tensorrt_llm" / "1" / "llmapi_model.txt").exists()


@pytest.mark.parametrize(
    "command",
    [("repo", "--recipe", "gpt-oss-120b/b300", "--out", "{out}"), ("build", "--gpu", "b300", "--model", "gpt-oss-120b", "--dry-run")],
)
def test_a_missing_or_incomplete_folder_is_refused_in_one_line_naming_the_clone(tmp_path, command):
    args = [a.format(out=tmp_path / "repo") for a in command]
    line = one_error_line(cli(*args, "--llmapi-model", str(tmp_path / "nowhere")))
    assert "does not exist" in line and CLONE in line and trtllm.LLMAPI_MODEL_SUBDIR in line
    half = tmp_path / "half"
    (half / "1").mkdir(parents=True)
    (half / "1" / "model.py").write_text("")
    line = one_error_line(cli(*args, "--llmapi-model", str(half)))
    assert "lacks 1/helpers.py" in line and CLONE in line
    assert not (tmp_path / "repo").exists()  # refused before anything was written


def test_the_option_on_a_repository_that_is_not_trtllms_is_refused(tmp_path):
    folder = llmapi_folder(tmp_path)
    line = one_error_line(cli("repo", "--model", "demo", "--out", str(tmp_path / "repo"), "--llmapi-model", str(folder)))
    assert "--llmapi-model is for trtllm repositories" in line

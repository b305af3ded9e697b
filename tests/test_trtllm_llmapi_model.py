"""The trtllm repository against NVIDIA's LLM-API Triton model: config.pbtxt declares that model's inputs and
outputs, model.py finds the model where it really is (or says what to clone), and the start command mounts it.

The expected declarations were read in NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/
config.pbtxt @0a71057313ec (inputs image_url and lora_* left out: we send neither) and what the model reads in
1/helpers.py @0df60f9ad779 (get_sampling_params_from_request, get_output_config_from_request) and 1/model.py
@044a90d209e3 (text_input, streaming, stop; outputs it sends).
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from trtllm_dflash.backends.trtllm import repository as trtllm
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.recipes import find_recipe

OFFICIAL_INPUTS = {
    "text_input": ("TYPE_STRING", "-1"),
    "streaming": ("TYPE_BOOL", "1"),
    "sampling_param_best_of": ("TYPE_INT32", "1"),
    "sampling_param_temperature": ("TYPE_FP32", "1"),
    "sampling_param_top_k": ("TYPE_INT32", "1"),
    "sampling_param_top_p": ("TYPE_FP32", "1"),
    "sampling_param_frequency_penalty": ("TYPE_FP32", "1"),
    "sampling_param_presence_penalty": ("TYPE_FP32", "1"),
    "sampling_param_max_tokens": ("TYPE_INT32", "1"),
    "sampling_param_stop": ("TYPE_STRING", "-1"),
    "sampling_param_seed": ("TYPE_UINT64", "1"),
    "sampling_param_exclude_input_from_output": ("TYPE_BOOL", "1"),
    "sampling_param_return_perf_metrics": ("TYPE_BOOL", "1"),
    "return_finish_reason": ("TYPE_BOOL", "1"),
    "return_stop_reason": ("TYPE_BOOL", "1"),
    "return_cumulative_logprob": ("TYPE_BOOL", "1"),
    "stop": ("TYPE_BOOL", "1"),
}
OFFICIAL_OUTPUTS = {
    "text_output": ("TYPE_STRING", "-1"),
    "finish_reason": ("TYPE_STRING", "-1"),
    "stop_reason": ("TYPE_STRING", "-1"),
    "cumulative_logprob": ("TYPE_FP32", "-1"),
    "kv_cache_reused_block": ("TYPE_INT32", "-1"),
    "kv_cache_missed_block": ("TYPE_INT32", "-1"),
    "kv_cache_alloc_new_blocks": ("TYPE_INT32", "-1"),
    "kv_cache_alloc_total_blocks": ("TYPE_INT32", "-1"),
    "kv_cache_hit_rate": ("TYPE_FP32", "-1"),
    "arrival_time_ns": ("TYPE_INT64", "1"),
    "first_scheduled_time_ns": ("TYPE_INT64", "1"),
    "first_token_time_ns": ("TYPE_INT64", "1"),
    "last_token_time_ns": ("TYPE_INT64", "1"),
    "acceptance_rate": ("TYPE_FP32", "1"),
    "total_accepted_draft_tokens": ("TYPE_INT32", "1"),
    "total_draft_tokens": ("TYPE_INT32", "1"),
}
# helpers.py: sampling_params_args (prefixed sampling_param_) + output_config_args + stop; model.py: text_input, streaming, stop
READ_BY_THE_MODEL = [
    "text_input",
    "streaming",
    "stop",
    "sampling_param_stop",
    "return_finish_reason",
    "return_stop_reason",
    "return_cumulative_logprob",
] + [
    f"sampling_param_{a}"
    for a in (
        "best_of",
        "temperature",
        "top_k",
        "top_p",
        "frequency_penalty",
        "presence_penalty",
        "max_tokens",
        "seed",
        "exclude_input_from_output",
        "return_perf_metrics",
    )
]


def _declared(section: str, text: str) -> dict[str, tuple[str, str]]:
    block = re.search(rf"^{section} \[\n(.*?)\n\]", text, re.S | re.M).group(1)
    return {m[0]: (m[1], m[2].strip()) for m in re.findall(r'name: "(\w+)" data_type: (\w+) dims: \[ ([-\d ]+) \]', block)}


def test_config_declares_the_llmapi_models_inputs_and_outputs():
    text = trtllm.render_config("tensorrt_llm", True)
    inputs, outputs = _declared("input", text), _declared("output", text)
    assert outputs == OFFICIAL_OUTPUTS
    assert set(inputs) == set(OFFICIAL_INPUTS) and set(READ_BY_THE_MODEL) <= set(inputs)
    for name, (dtype, dims) in OFFICIAL_INPUTS.items():
        # integers our clients send as INT64 (gRPC); the model reads them with .item()
        assert inputs[name] == (trtllm.WIDENED_INPUTS.get(name, dtype), dims), name
    from trtllm_dflash.served_model.protocol import INPUTS, OWN_ONLY_INPUTS

    for name, (dtype, _, _) in INPUTS.items():  # every input our client sends is declared, with the type it sends
        if name not in OWN_ONLY_INPUTS:  # min_tokens / ignore_eos: sent only when asked for, refused for this model
            assert inputs[name][0] == dtype, name
    assert "decoupled: true" in text and "optional: true" not in text.split('name: "text_input"')[1].split("}")[0]


def _llmapi_folder(root):
    folder = root / "TensorRT-LLM" / trtllm.LLMAPI_MODEL_SUBDIR
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text('name: "tensorrt_llm"\n')
    (folder / "1" / "helpers.py").write_text("MARK = 'helpers beside model.py'\n")
    (folder / "1" / "model.py").write_text("from helpers import MARK\n\nclass TritonPythonModel:\n    mark = MARK\n")
    return folder


def test_the_model_is_found_where_the_docs_put_it_and_refused_in_one_line_elsewhere(tmp_path, monkeypatch):
    monkeypatch.delenv(trtllm.LLMAPI_MODEL_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DFlashError) as missing:
        trtllm.require_llmapi_model()
    message = f"{missing.value} {missing.value.fix}"
    assert "\n" not in message and "git clone -b v1.4.0rc1 https://github.com/NVIDIA/TensorRT-LLM.git" in message
    assert trtllm.LLMAPI_MODEL_ENV in message
    folder = _llmapi_folder(tmp_path)
    assert trtllm.find_llmapi_model() == folder.resolve()  # a clone in the working directory, as Triton's page has it
    monkeypatch.setenv(trtllm.LLMAPI_MODEL_ENV, str(tmp_path / "nowhere"))
    assert trtllm.find_llmapi_model() is None  # the variable, when set, is the only place looked at
    assert trtllm.find_llmapi_model(folder / "1") == folder.resolve()


def test_repository_records_the_model_and_the_command_mounts_it(tmp_path, monkeypatch):
    from trtllm_dflash.backends.trtllm.backend import serve_command

    folder = _llmapi_folder(tmp_path)
    monkeypatch.setenv(trtllm.LLMAPI_MODEL_ENV, str(folder))
    monkeypatch.delenv("DFLASH_TRT_TRITON_IMAGE", raising=False)
    repo, notes = trtllm.write_trtllm_repository(tmp_path / "repo", find_recipe("gpt-oss-120b", "b300"))
    version = repo / "tensorrt_llm" / "1"
    assert (version / "llmapi_model.txt").read_text().strip() == str(folder.resolve())
    command = serve_command(repo)
    assert f"-v {folder.resolve()}:{folder.resolve()}" in command and f"-e {trtllm.LLMAPI_MODEL_ENV}={folder.resolve()}" in command
    assert "${TRITON_IMAGE:?" in command  # the container month is not known here: the shell refuses an unset image
    monkeypatch.setenv("DFLASH_TRT_TRITON_IMAGE", "nvcr.io/nvidia/tritonserver:26.10-trtllm-python-py3")
    assert " nvcr.io/nvidia/tritonserver:26.10-trtllm-python-py3 tritonserver --model-repository " in serve_command(repo)
    # the written model.py loads NVIDIA's model.py with its helpers, from the recorded folder
    script = f"import runpy; ns = runpy.run_path({str(version / 'model.py')!r}); print(ns['TritonPythonModel'].mark)"
    env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "helpers beside model.py", done.stderr
    (version / "llmapi_model.txt").unlink()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode != 0 and "git clone -b v<tensorrt_llm.__version__" in done.stderr


def test_without_the_model_the_repository_notes_say_what_to_clone(tmp_path, monkeypatch):
    monkeypatch.setenv(trtllm.LLMAPI_MODEL_ENV, str(tmp_path / "missing"))
    repo, notes = trtllm.write_trtllm_repository(tmp_path / "repo", find_recipe("gpt-oss-120b", "b300"))
    assert not (repo / "tensorrt_llm" / "1" / "llmapi_model.txt").exists()
    from trtllm_dflash.served_model.repository import MANIFEST

    assert "git clone -b v1.4.0rc1" in (repo / MANIFEST).read_text()

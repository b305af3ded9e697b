"""Our clients (DFlashClient: `generate --url`, its streams, `bench --url`) against the wire protocol of NVIDIA's
LLM-API Triton model, on a real tritonserver (nvidia-pytriton's).

The served model is a PROTOCOL STAND-IN, not TensorRT-LLM (which does not install on this machine): a Python-backend
model behind the very config.pbtxt our trtllm repository writes (trtllm.render_config), answering as NVIDIA's
triton_backend/all_models/llmapi/tensorrt_llm/1/model.py (@044a90d209e3, @b35ac1b64368) and 1/helpers.py
(@0df60f9ad779) do:
- inputs read with .item(); return_finish_reason / return_stop_reason / return_cumulative_logprob and
  sampling_param_exclude_input_from_output / sampling_param_return_perf_metrics default to False;
- streamed responses carry CompletionOutput.text, the whole text so far, with flag COMPLETE_FINAL on the last;
  a non-streamed request gets one final response whose text starts with the prompt unless exclude_input_from_output
  (TensorRT-LLM's createResult: the prompt tokens are excluded only when asked, and never in streaming);
- finish_reason etc. only when asked, as str(value) ("None" before the end); perf metrics only when asked, as
  strings (np.asarray(..., dtype=<text_output's dtype>)), Triton passing them as BYTES.
Its "decoding" commits 3, 1, 2, 3, ... tokens per step (draft length 3), so steps and acceptance are known here.
"""

from __future__ import annotations

import pytest
from support import triton_server

pytest.importorskip("pytriton", reason="needs the serve extra (nvidia-pytriton's tritonserver)")

STAND_IN = '''"""Protocol stand-in for NVIDIA's LLM-API Triton model (NOT TensorRT-LLM): same inputs, outputs and stream semantics."""
import os
import site
import sys

_paths = [p for p in os.environ.get("DFLASH_TRT_PYTHONPATH", "").split(os.pathsep) if p]
if _paths:  # the test's environment first, as our repositories' model.py does (the stub ignores PYTHONPATH)
    _before = list(sys.path)
    for _path in _paths:
        site.addsitedir(_path)
    sys.path[:] = [p for p in sys.path if p not in _before] + _before

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

WORDS = [" alpha", " beta", " gamma", " delta", " epsilon", " zeta", " eta"]
COMMITTED = [3, 1, 2]  # tokens per step, cycling
DRAFT_LEN = 3


def scalar(request, name, default=None):  # helpers.get_input_scalar_by_name
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    array = tensor.as_numpy()
    if array.size != 1:
        raise pb_utils.TritonModelException(f"Expected a scalar tensor for tensor {name}")
    return array.item(0)


class TritonPythonModel:
    def initialize(self, args):
        config = pb_utils.get_output_config_by_name(json.loads(args["model_config"]), "text_output")
        self.output_dtype = pb_utils.triton_string_to_numpy(config["data_type"])

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.run, args=(request.get_response_sender(), self.convert(request))).start()
        return None

    def convert(self, request):
        prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()[0]
        return dict(
            arrival=time.monotonic_ns(),
            prompt=prompt.decode("utf-8") if isinstance(prompt, bytes) else str(prompt),
            max_tokens=scalar(request, "sampling_param_max_tokens", 16),
            exclude=scalar(request, "sampling_param_exclude_input_from_output", False),
            perf=scalar(request, "sampling_param_return_perf_metrics", False),
            flags={k: scalar(request, k, False) for k in ("return_finish_reason", "return_stop_reason", "return_cumulative_logprob")},
            streaming=scalar(request, "streaming", None) or False,
        )

    def run(self, sender, r):
        tokens, steps, first = [], 0, None
        while len(tokens) < r["max_tokens"]:
            take = min(COMMITTED[steps % len(COMMITTED)], r["max_tokens"] - len(tokens))
            tokens += [WORDS[(len(r["prompt"]) + len(tokens) + i) % len(WORDS)] for i in range(take)]
            steps += 1
            first = first or time.monotonic_ns()
            done = len(tokens) >= r["max_tokens"]
            time.sleep(0.01)
            if r["streaming"]:
                sender.send(self.response("".join(tokens), done, r, steps, len(tokens), first),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if done else 0)
        if not r["streaming"]:
            text = "".join(tokens) if r["exclude"] else r["prompt"] + "".join(tokens)
            sender.send(self.response(text, True, r, steps, len(tokens), first), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def response(self, text, done, r, steps, count, first):
        out = [pb_utils.Tensor("text_output", np.asarray([text.encode("utf-8")], dtype=self.output_dtype))]
        for flag, name, value in (("return_finish_reason", "finish_reason", "length" if done else None),
                                  ("return_stop_reason", "stop_reason", None), ("return_cumulative_logprob", "cumulative_logprob", None)):
            if r["flags"][flag]:
                out.append(pb_utils.Tensor(name, np.asarray([str(value)], dtype=np.object_)))
        if r["perf"]:
            accepted, drafted = count - steps, steps * DRAFT_LEN
            for name, value in (("kv_cache_reused_block", 0), ("kv_cache_hit_rate", 0.0), ("arrival_time_ns", r["arrival"]),
                                ("first_token_time_ns", first), ("last_token_time_ns", time.monotonic_ns()),
                                ("acceptance_rate", accepted / drafted), ("total_accepted_draft_tokens", accepted),
                                ("total_draft_tokens", drafted)):
                out.append(pb_utils.Tensor(name, np.asarray([value], dtype=self.output_dtype)))
        return pb_utils.InferenceResponse(output_tensors=out)
'''

WORDS = [" alpha", " beta", " gamma", " delta", " epsilon", " zeta", " eta"]
PROMPT = "def fib(n):"
MAX_TOKENS = 9  # steps of 3, 1, 2, 3 tokens


def expected_text(prompt: str, count: int) -> str:
    return "".join(WORDS[(len(prompt) + i) % len(WORDS)] for i in range(count))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from trtllm_dflash.backends.trtllm import repository as trtllm

    root = tmp_path_factory.mktemp("llmapi-standin") / "repo"
    (root / "tensorrt_llm" / "1").mkdir(parents=True)
    (root / "tensorrt_llm" / "config.pbtxt").write_text(trtllm.render_config("tensorrt_llm", True))  # what our repository declares
    (root / "tensorrt_llm" / "1" / "model.py").write_text(STAND_IN)
    with triton_server(root, startup_timeout=120) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    from trtllm_dflash.serving.client import DFlashClient

    return DFlashClient(server.endpoints.http, model="tensorrt_llm", grpc_url=server.endpoints.grpc, timeout=60)


def test_the_client_recognizes_the_llmapi_model(client):
    assert client.speaks_llmapi("http") and client.speaks_llmapi("grpc")


def test_generate_gets_the_text_without_the_prompt_a_finish_reason_and_acceptance(client):
    out = client.generate(PROMPT, max_new_tokens=MAX_TOKENS)
    assert out.text == expected_text(PROMPT, MAX_TOKENS)  # exclude_input_from_output was sent
    assert out.finish_reason == "length"  # return_finish_reason was sent
    assert out.acceptance_rate == pytest.approx(5 / 12)  # 4 steps drafting 3, 9 - 4 tokens accepted
    assert out.time_to_first_token > 0 and out.token_ids == [] and out.num_output_tokens == 0  # no ids from this model


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_streams_turn_cumulative_text_into_steps_and_end_on_the_last_response(client, protocol):
    chunks = list(client.stream(PROMPT, protocol=protocol, max_new_tokens=MAX_TOKENS))
    words = [WORDS[(len(PROMPT) + i) % len(WORDS)] for i in range(MAX_TOKENS)]
    assert [c.text for c in chunks] == ["".join(words[0:3]), words[3], "".join(words[4:6]), "".join(words[6:9])]  # one step each
    assert [c.final for c in chunks] == [False, False, False, True]  # "None" finish reasons do not end the stream
    assert chunks[-1].stats["finish_reason"] == "length" and "finish_reason" not in chunks[0].stats
    done = client.complete(PROMPT, protocol=protocol, max_new_tokens=MAX_TOKENS)
    assert done.text == expected_text(PROMPT, MAX_TOKENS) and done.finish_reason == "length"
    assert done.acceptance_rate == pytest.approx(5 / 12) and done.client_time_to_first_token == 0.0  # no token ids to time


def test_generate_url_prints_the_texts_and_the_figures_it_has(server):
    from support import run_cli

    for stream in ((), ("--stream",)):
        result = run_cli(
            "generate", "--url", server.endpoints.http, "--model-name", "tensorrt_llm", "--prompt", PROMPT, "-n", str(MAX_TOKENS), *stream
        )
        assert result.returncode == 0, result.stderr
        assert PROMPT + expected_text(PROMPT, MAX_TOKENS) in result.stdout
        assert "draft acceptance 42%" in result.stdout and "finish: length" in result.stdout


def test_bench_url_refuses_the_llmapi_model_in_one_line(server):
    from trtllm_dflash.bench.systems import ServerSystem
    from trtllm_dflash.errors import DFlashError

    with pytest.raises(DFlashError) as refused:
        ServerSystem(server.endpoints.http, model="tensorrt_llm")
    message = f"{refused.value} {refused.value.fix}"
    assert "\n" not in message and "NVIDIA's LLM-API model" in message and "--openai-url" in message


def test_a_rewritten_tail_is_sent_as_the_new_part_and_the_whole_text_kept():
    """TensorRT-LLM's detokenized text may rewrite its tail (a partial UTF-8 character becomes the character)."""
    from trtllm_dflash.served_model.protocol import LLMApiStream
    from trtllm_dflash.serving.client import Completion, _chunk

    reader = LLMApiStream()
    chunks = [
        _chunk({"text_output": t, "finish_reason": f}, final=None, reader=reader)
        for t, f in (("caf\ufffd", "None"), ("café au", "None"), ("café au lait", "length"))
    ]
    assert [c.text for c in chunks] == ["caf\ufffd", "é au", " lait"] and [c.final for c in chunks] == [False, False, True]
    assert Completion.from_chunks(chunks).text == "café au lait"


def test_the_openai_front_end_serves_the_llmapi_model(server):
    """`serve --openai-port` in front of the trtllm repository: completions and streams carry the model's
    text once (not its cumulative text again), end with its finish reason, and count usage with the tokenizer."""
    openai = pytest.importorskip("openai")
    from transformers import AutoTokenizer

    from trtllm_dflash.demo import DEMO_DIR
    from trtllm_dflash.serving.openai.server import OpenAIServer
    from trtllm_dflash.serving.server import free_port

    tokenizer = AutoTokenizer.from_pretrained(DEMO_DIR / "target")
    expected = expected_text(PROMPT, MAX_TOKENS)
    words = [WORDS[(len(PROMPT) + i) % len(WORDS)] for i in range(MAX_TOKENS)]
    with OpenAIServer(server.endpoints.grpc, port=free_port(), tokenizer=str(DEMO_DIR / "target")) as front:
        client = openai.OpenAI(base_url=front.url, api_key="unused", max_retries=0, timeout=60)
        done = client.completions.create(model="tensorrt_llm", prompt=PROMPT, max_tokens=MAX_TOKENS)
        assert done.choices[0].text == expected and done.choices[0].finish_reason == "length"
        assert done.usage.completion_tokens == len(tokenizer(expected, add_special_tokens=False)["input_ids"]) > 0
        assert done.usage.prompt_tokens == len(tokenizer(PROMPT, add_special_tokens=False)["input_ids"])
        chunks = list(client.completions.create(model="tensorrt_llm", prompt=PROMPT, max_tokens=MAX_TOKENS, stream=True))
        texts = [c.choices[0].text for c in chunks if c.choices]
        assert texts == ["".join(words[0:3]), words[3], "".join(words[4:6]), "".join(words[6:9]), ""]  # one chunk a step
        assert chunks[-1].choices[0].finish_reason == "length"

"""Serving against a REAL tritonserver on loopback (the binary bundled in nvidia-pytriton here,
/opt/tritonserver in NVIDIA's container): HTTP generate, generate_stream (SSE) and gRPC
streaming give the offline `dflash-trt generate` tokens; 16 concurrent streams are batched;
bad requests fail alone. One server per module (starting it loads torch in two stubs).

The served pair is the embedded demo pair when it is present, else a tiny random pair with a
character tokenizer; the test ids say which ([demo] or [tiny]).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import numpy as np
import pytest
from support import MAX_CONTEXT, MAX_TOKENS, PROMPTS, cli, concurrent_completions, pair, post, repo, triton_server  # noqa: F401 (fixtures)


@pytest.fixture(scope="module")
def server(repo):
    with triton_server(repo) as running:  # the Python backend stubs share its process group: none outlives it
        yield running


@pytest.fixture(scope="module")
def client(server):
    from trtllm_dflash.serving.client import DFlashClient

    return DFlashClient(server.endpoints.http, model="dflash", grpc_url=server.endpoints.grpc, timeout=300)


def served_block_size(repo) -> str | None:
    """The block size the repository's dflash model decodes with (the recipe's), if it sets one."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = text_format.Parse((repo / "dflash" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    return config.parameters["block_size"].string_value if "block_size" in config.parameters else None


def offline(pair, prompts: list[str], max_tokens: int, block_size: str | None, sampling: tuple[str, ...] = ()) -> list[dict]:
    """`dflash-trt generate --json` for the same prompts: the reference the server must match."""
    target, draft = pair
    args = ["generate", "--target", target, "--drafter", draft, "--json", "-n", str(max_tokens), *sampling]
    if block_size:
        args += ["--block-size", block_size]
    for prompt in prompts:
        args += ["--prompt", prompt]
    lines = [line for line in cli(*args).splitlines() if line.startswith("{")]
    return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def block_size(repo):
    return served_block_size(repo)


@pytest.fixture(scope="module")
def reference(pair, block_size):
    return offline(pair, PROMPTS, 32, block_size)


def _metrics(server, model: str = "dflash") -> dict:
    from trtllm_dflash.served_model.metrics import read_metrics

    return read_metrics(server.endpoints.metrics, model)


# ---------------------------------------------------------------------- the three ways in


def test_generate_endpoint_answers_text_output_equal_to_offline(server, reference):
    for prompt, expected in zip(PROMPTS, reference):
        status, body = post(server, "dflash", {"text_input": prompt, "sampling_param_max_tokens": 32, "sampling_param_temperature": 0})
        assert status == 200, body
        assert body["text_output"] == expected["text"]
        ids = body["output_ids"] if isinstance(body["output_ids"], list) else [body["output_ids"]]
        assert ids == expected["token_ids"]
        assert body["num_output_tokens"] == len(expected["token_ids"])
        assert body["finish_reason"] in ("length", "stop")
        lengths = body["acceptance_lengths"] if isinstance(body["acceptance_lengths"], list) else [body["acceptance_lengths"]]
        assert sum(lengths) + 1 == len(ids)  # every token after the first came from a verify step
        assert body["mean_acceptance_length"] == pytest.approx(np.mean(lengths), rel=1e-5)


def test_http_streaming_matches_offline_and_streams(client, reference):
    for prompt, expected in zip(PROMPTS, reference):
        chunks = list(client.stream(prompt, max_tokens=32))
        assert len(chunks) > 1, "generate_stream sent everything at once"
        assert chunks[-1].final and not any(c.final for c in chunks[:-1])
        assert [t for c in chunks for t in c.token_ids] == expected["token_ids"]
        assert "".join(c.text for c in chunks) == expected["text"]


def test_grpc_streaming_matches_offline(client, reference):
    for prompt, expected in zip(PROMPTS, reference):
        completion = client.complete(prompt, protocol="grpc", max_tokens=32)
        assert completion.token_ids == expected["token_ids"]
        assert completion.text == expected["text"]
        assert completion.acceptance_lengths == expected["acceptance_lengths"]
        assert completion.mean_acceptance_length == pytest.approx(expected["mean_acceptance_length"], abs=1e-3)


def test_seeded_sampling_matches_offline(client, pair, block_size):
    """Temperature > 0 with a seed: the counter-based RNG gives the offline tokens in any batch."""
    expected = offline(pair, PROMPTS[:2], 24, block_size, sampling=("--temperature", "0.8", "--top-p", "0.95", "--seed", "7"))
    for prompt, reference in zip(PROMPTS[:2], expected):
        completion = client.complete(prompt, protocol="grpc", max_tokens=24, temperature=0.8, top_p=0.95, seed=7)
        assert completion.token_ids == reference["token_ids"]


def test_autoregressive_baseline_model_gives_the_same_tokens(server, reference):
    from trtllm_dflash.serving.client import DFlashClient

    ar = DFlashClient(server.endpoints.http, model="ar", grpc_url=server.endpoints.grpc)
    for prompt, expected in zip(PROMPTS, reference):
        completion = ar.generate(prompt, max_tokens=32)
        assert completion.token_ids == expected["token_ids"]  # lossless: DFlash == target greedy
        assert completion.acceptance_rate == 0.0


def test_stop_strings_and_echoed_prompt(server, client, reference):
    text = reference[0]["text"]
    # a 3-character stop string that first occurs a few characters into the reference text
    cut = next((i for i in range(3, len(text) - 3) if text[i : i + 3].strip() and text.find(text[i : i + 3]) == i), None)
    assert cut is not None, f"reference text has no usable stop string: {text!r}"
    stop = text[cut : cut + 3]
    for protocol in ("http", "grpc"):
        completion = client.complete(PROMPTS[0], protocol=protocol, max_tokens=32, stop=[stop])
        assert completion.text == text[: text.find(stop)], protocol
        assert completion.finish_reason == "stop"
    whole = client.generate(PROMPTS[0], max_tokens=32, stop=[stop])
    assert whole.text == text[: text.find(stop)]
    echo = {"text_input": PROMPTS[0], "sampling_param_max_tokens": 32, "sampling_param_exclude_input_from_output": False}
    status, body = post(server, "dflash", echo)
    assert status == 200 and body["text_output"] == PROMPTS[0] + text


# ---------------------------------------------------------------------- in-flight batching


def test_sixteen_concurrent_streams_complete_correctly_and_are_batched(server, client, pair, block_size):
    prompts = [f"{PROMPTS[i % len(PROMPTS)]}{' ' * (i // len(PROMPTS))}" for i in range(16)]
    lengths = [8 + 5 * i for i in range(16)]  # different lengths: requests leave the batch at different steps
    expected = offline(pair, prompts, max(lengths), block_size)
    before = _metrics(server)
    results = concurrent_completions(client, prompts, lengths)
    for i in range(16):
        assert results[i].token_ids == expected[i]["token_ids"][: lengths[i]], f"request {i}"
    after = _metrics(server)
    steps = after["batch_size"].count - before["batch_size"].count
    rows = after["batch_size"].sum - before["batch_size"].sum
    assert steps > 0 and rows / steps > 1.0, f"mean batch size {rows / max(steps, 1):.2f}: requests were not batched"
    assert after["requests_total{success}"] - before["requests_total{success}"] == 16
    print(f"16 concurrent streams: mean batch size {rows / steps:.2f} over {steps:.0f} steps")


def test_metrics_expose_acceptance_ttft_and_tokens_per_second(server, client):
    from trtllm_dflash.serving.client import DFlashClient

    client.generate(PROMPTS[1], max_tokens=16)
    DFlashClient(server.endpoints.http, model="ar").generate(PROMPTS[1], max_tokens=16)
    metrics = _metrics(server)
    assert metrics["acceptance_length"].count > 0 and metrics["acceptance_length"].mean >= 1.0
    assert metrics["time_to_first_token_seconds"].count > 0
    assert metrics["request_tokens_per_second"].count > 0 and metrics["request_tokens_per_second"].mean > 0
    assert metrics["generated_tokens_total"] > 0
    assert _metrics(server, "ar")["batch_size"].count > 0  # the baseline is labelled apart


# ---------------------------------------------------------------------- bad requests


def _long_prompt(pair) -> str:
    from transformers import AutoTokenizer

    from trtllm_dflash.checkpoints import resolve_checkpoint

    tokenizer = AutoTokenizer.from_pretrained(resolve_checkpoint(pair[0], "target"))
    prompt = "def f(x):\n    return x\n"
    while len(tokenizer(prompt, add_special_tokens=False)["input_ids"]) <= MAX_CONTEXT:
        prompt += prompt
    return prompt


def test_bad_requests_fail_alone_with_a_clear_error(server, client, pair, reference):
    from trtllm_dflash.serving.client import ServerError

    # a good request streams while the bad ones arrive: it must finish untouched
    good: dict = {}
    worker = threading.Thread(target=lambda: good.update(c=client.complete(PROMPTS[2], protocol="grpc", max_tokens=32)))
    worker.start()
    bad_http = [
        ({"text_input": ""}, "empty prompt"),
        ({"text_input": "   "}, "empty prompt"),
        ({"text_input": "abc", "sampling_param_max_tokens": 0}, "sampling_param_max_tokens must be > 0"),
        ({"text_input": "abc", "sampling_param_max_tokens": -5}, "sampling_param_max_tokens must be > 0"),
        ({"text_input": "abc", "sampling_param_max_tokens": MAX_TOKENS + 1}, f"limit of {MAX_TOKENS}"),
        ({"text_input": "abc", "sampling_param_temperature": -0.5}, "sampling_param_temperature must be >= 0"),
        ({"text_input": "abc", "sampling_param_top_p": 1.5}, "sampling_param_top_p must be in (0, 1]"),
        ({"text_input": _long_prompt(pair)}, f"maximum context of {MAX_CONTEXT}"),
        # a wrong JSON type is refused by Triton's HTTP front end, before the model sees it
        ({"text_input": "abc", "sampling_param_max_tokens": "many"}, "Unable to parse 'data'"),
        ({"sampling_param_max_tokens": 4}, "text_input"),  # missing prompt
    ]
    for body, message in bad_http:
        status, answer = post(server, "dflash", body)
        assert status >= 400, (body, answer)
        assert message in answer["error"], (body, answer)
    for body, message in bad_http[:3]:  # the streaming endpoint and gRPC say the same
        with pytest.raises(ServerError, match=message):
            list(client.stream(body["text_input"], max_tokens=body.get("sampling_param_max_tokens")))
        with pytest.raises(ServerError, match=message):
            list(client.stream(body["text_input"], protocol="grpc", max_tokens=body.get("sampling_param_max_tokens")))
    _grpc_wrong_types(server)
    worker.join(300)
    assert good["c"].token_ids == reference[2]["token_ids"]
    assert client.generate(PROMPTS[3], max_tokens=32).token_ids == reference[3]["token_ids"]  # still serving


def _grpc_wrong_types(server) -> None:
    """Wrong tensor types and shapes through tritonclient get an error naming the input."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from trtllm_dflash.serving.client import grpc_inputs

    def infer(inputs) -> str:
        results: list = []
        client = grpcclient.InferenceServerClient(server.endpoints.grpc)
        client.start_stream(callback=lambda result, error: results.append(error))
        client.async_stream_infer("dflash", inputs, enable_empty_final_response=True)
        deadline = time.monotonic() + 120
        while not results and time.monotonic() < deadline:
            time.sleep(0.05)
        client.stop_stream()
        assert results and isinstance(results[0], InferenceServerException), results
        return results[0].message()

    wrong_dtype = grpcclient.InferInput("sampling_param_max_tokens", [1], "FP32")
    wrong_dtype.set_data_from_numpy(np.array([8.0], dtype=np.float32))
    assert "sampling_param_max_tokens" in infer(grpc_inputs({"text_input": "abc"}) + [wrong_dtype])
    two_prompts = grpcclient.InferInput("text_input", [2], "BYTES")
    two_prompts.set_data_from_numpy(np.array([b"a", b"b"], dtype=np.object_))
    assert "unexpected shape for input 'text_input'" in infer([two_prompts])  # Triton checks shapes first


def test_client_that_disconnects_mid_stream_is_dropped_and_the_server_keeps_serving(server, client, reference):
    metrics = _metrics(server)
    before, ended_before = metrics["requests_total{cancelled}"], metrics["requests_total{cancelled}"] + metrics["requests_total{success}"]
    # gRPC: the consumer stops after the first response (the client cancels its request)
    stream = client.stream(PROMPTS[0], protocol="grpc", max_tokens=MAX_TOKENS)
    first = next(stream)
    assert first.token_ids and not first.final
    stream.close()
    # HTTP: the connection closes after the first server-sent event
    request = urllib.request.Request(
        f"{server.endpoints.http}/v2/models/dflash/generate_stream",
        data=json.dumps({"text_input": PROMPTS[1], "streaming": True, "sampling_param_max_tokens": MAX_TOKENS}).encode(),
    )
    response = urllib.request.urlopen(request, timeout=300)
    assert response.readline().startswith(b"data:")
    response.close()
    # cancellation is noticed between decoding steps. Both requests must end; the HTTP one is
    # cancelled unless its 96 tokens were all decoded before tritonserver saw the closed socket (a
    # race a busy machine lost once: Triton's HTTP thread noticed late), so it may count as a success
    ended = lambda m: m["requests_total{cancelled}"] + m["requests_total{success}"]  # noqa: E731
    deadline = time.monotonic() + 300  # a hang bound
    while ended(_metrics(server)) < ended_before + 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    after = _metrics(server)
    assert ended(after) == ended_before + 2 and after["requests_total{cancelled}"] >= before + 1
    assert client.complete(PROMPTS[0], max_tokens=32).token_ids == reference[0]["token_ids"]

"""min_tokens and ignore_eos fix output lengths (what benchmark clients send), and fields the server
would ignore are refused. The decoder keeps a stop token it may not stop on, so a greedy sequence
is unchanged: the speculative output still equals the autoregressive one. Served on a REAL
tritonserver (the demo repository) through the OpenAI front end: stop strings wait for min_tokens,
greedy and sampled, and the speculative model answers as the `ar` model does."""

from __future__ import annotations

import pytest

from trtllm_dflash.decoding import Request
from trtllm_dflash.sampling_params import SamplingError, SamplingParams

PROMPT = "def fibonacci(n):"
N = 24


def test_min_tokens_is_checked_and_gates_stop_tokens():
    with pytest.raises(SamplingError) as caught:
        SamplingParams(max_new_tokens=8, min_tokens=9).validate()
    assert caught.value.field == "min_tokens" and "min_tokens must be in [0, 8]" in str(caught.value)
    with pytest.raises(SamplingError):
        SamplingParams(min_tokens=-1).validate()
    params = SamplingParams(min_tokens=3)
    assert [params.stops_at(k) for k in (1, 3, 4)] == [False, False, True]
    assert not SamplingParams(ignore_eos=True).stops_at(100)


@pytest.fixture(scope="module")
def pipes():
    from trtllm_dflash.api import DFlashPipeline

    return DFlashPipeline.load("demo", "demo"), DFlashPipeline.load("demo")  # speculative, autoregressive


def _run(pipe, **params) -> tuple[list[int], str]:
    result = pipe.decoder(1).generate([Request(pipe.encode(PROMPT), SamplingParams(max_new_tokens=N, **params))])[0]
    return result.token_ids, result.finish_reason


def test_decoder_greedy_min_tokens_and_ignore_eos_equal_autoregressive(pipes):
    spec, ar = pipes
    reference, _ = _run(spec)
    assert reference == _run(ar)[0]
    stop = reference[2]  # a token the greedy sequence produces early: the request's "EOS" here
    first = reference.index(stop)
    assert _run(spec, stop_token_ids=(stop,)) == (reference[: first + 1], "stop")
    later = [i for i, t in enumerate(reference) if t == stop and i >= 10]
    expected = (reference[: later[0] + 1], "stop") if later else (reference, "length")
    for pipe in pipes:  # not stopped before 10 tokens; the sequence itself unchanged, speculative == autoregressive
        assert _run(pipe, stop_token_ids=(stop,), min_tokens=10) == expected
        assert _run(pipe, stop_token_ids=(stop,), ignore_eos=True) == (reference, "length")


def test_decoder_sampled_min_tokens_and_ignore_eos(pipes):
    spec, _ = pipes
    sampled, _ = _run(spec, temperature=0.9, seed=11)
    stop = sampled[1]
    ids, reason = _run(spec, temperature=0.9, seed=11, stop_token_ids=(stop,), min_tokens=8)
    assert len(ids) >= 9 or reason == "length"
    assert stop not in ids[8:-1] and (reason == "length" or ids[-1] == stop)
    ids, reason = _run(spec, temperature=0.9, seed=11, stop_token_ids=(stop,), ignore_eos=True)
    assert len(ids) == N and reason == "length" and ids == sampled


# ---------------------------------------------------------------------- served (real tritonserver)

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def client(demo_triton):
    from trtllm_dflash.serving.openai.server import OpenAIServer
    from trtllm_dflash.serving.server import free_port

    with OpenAIServer(demo_triton.endpoints.grpc, port=free_port(), repository=demo_triton.repository) as front:
        yield openai.OpenAI(base_url=front.url, api_key="unused", max_retries=0, timeout=300)


def _complete(client, model: str = "dflash", **extra):
    answer = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=N,
        extra_body=extra,
        **{"temperature": 0, **{k: extra.pop(k) for k in ("temperature", "seed", "stop") if k in extra}},
    )
    return answer.choices[0].text, answer.usage.completion_tokens, answer.choices[0].finish_reason


def test_served_stop_string_waits_for_min_tokens_greedy(client):
    full, count, _ = _complete(client)
    assert count == N and "\n" in full
    short, short_count, reason = _complete(client, stop=["\n"])
    assert reason == "stop" and short == full[: full.index("\n")] and short_count < 10
    for model in ("dflash", "ar"):  # the speculative model and the target alone agree
        text, tokens, reason = _complete(client, model, stop=["\n"], min_tokens=10)
        assert tokens >= 11 or reason == "length"
        assert full.startswith(text) and len(text) > len(short)
        if reason == "stop":
            assert full[len(text)] == "\n"
        assert (text, tokens, reason) == _complete(client, "dflash", stop=["\n"], min_tokens=10)


def test_served_sampled_min_tokens_and_ignore_eos(client):
    text, tokens, reason = _complete(client, temperature=0.9, seed=5, stop=["\n"], min_tokens=12)
    assert tokens >= 13 or reason == "length"
    assert _complete(client, temperature=0.9, seed=5, ignore_eos=True)[1:] == (N, "length")
    assert _complete(client, ignore_eos=True)[1:] == (N, "length")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"repetition_penalty": 1.2}, "repetition_penalty"),
        ({"logprobs": 0}, "logprobs"),
        ({"min_p": 0.1}, "min_p"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"min_tokens": N + 1}, "min_tokens"),
        ({"ignore_eos": 1}, "ignore_eos"),
    ],
)
def test_served_ignored_fields_are_refused_by_name(client, extra, param):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="dflash", prompt=PROMPT, max_tokens=N, extra_body=extra)
    assert caught.value.status_code == 400 and caught.value.body["param"] == param and param in caught.value.body["message"]

"""Per-request speculative statistics where benchmark clients read them (issue 32, item 4).

vLLM's `metrics.speculative_decoding` (what aiperf 0.13 reads) and TensorRT-LLM's
`avg_decoded_tokens_per_iter`, on completions and chat, streamed and not, against a REAL
tritonserver (the session's demo_triton): their counts must be the acceptance lengths the same
prompt decodes with offline (the demo pair, greedy). The Prometheus counters kept beside ours
(vLLM's spec_decode_* names under our prefix) must move by exactly those counts.
"""

from __future__ import annotations

import json

import pytest

from trtllm_dflash.serving.openai.spec_stats import avg_decoded_tokens_per_iter, speculative_decoding

N = 40
PROMPT = "def parse_args(argv):"


def test_payload_of_known_lengths_holds_vllms_identities():
    """Lengths 3, 1, 8, 2 at draft length 7: accepted 2, 0, 7, 1."""
    payload = speculative_decoding([3, 1, 8, 2], draft_tokens=28)
    assert payload == {
        "mean_acceptance_length": 1.0 + 10 / 4,
        "draft_acceptance_rate": 10 / 28,
        "acceptance_histogram": [1, 1, 1, 0, 0, 0, 0, 1],
        "num_spec_steps": 4,
        "num_accepted_draft_tokens": 10,
        "num_draft_tokens": 28,
        "num_spec_tokens": 7,
        "per_step_accepted": [2, 0, 7, 1],
        "per_step_drafted": [7, 7, 7, 7],
    }
    assert avg_decoded_tokens_per_iter([3, 1, 8, 2]) == 3.5
    # a request that ended at its prefill token: no step, still the whole shape (vLLM sends it too)
    assert speculative_decoding([], 0)["num_spec_steps"] == 0 and avg_decoded_tokens_per_iter([]) == 1.0


# ---------------------------------------------------------------------- served (real tritonserver)

httpx = pytest.importorskip("httpx")


@pytest.fixture(scope="module")
def front(demo_triton):
    from trtllm_dflash.serving.openai.server import OpenAIServer
    from trtllm_dflash.serving.server import free_port

    with OpenAIServer(demo_triton.endpoints.grpc, port=free_port(), repository=demo_triton.repository) as running:
        yield running


@pytest.fixture(scope="module")
def reference():
    """The acceptance lengths of PROMPT offline, as a completion and as a chat (greedy, batch 1)."""
    from trtllm_dflash import DFlashPipeline

    pipe = DFlashPipeline.load("demo", "demo")
    plain, chat = pipe.generate([PROMPT], max_new_tokens=N)[0], pipe.generate([PROMPT], max_new_tokens=N, chat=True)[0]
    assert plain.acceptance_lengths and chat.acceptance_lengths
    return {
        "completions": plain.acceptance_lengths,
        "chat/completions": chat.acceptance_lengths,
        "draft_len": pipe.decoder(1).block_size - 1,
    }


def _body(route: str, model: str = "dflash", **extra) -> dict:
    body = {"model": model, "max_tokens": N, "temperature": 0, **extra}
    return {**body, "messages": [{"role": "user", "content": PROMPT}]} if route == "chat/completions" else {**body, "prompt": PROMPT}


def _post(front, route: str, **extra) -> dict:
    answer = httpx.post(f"{front.url}/{route}", json=_body(route, **extra), timeout=300)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _stream(front, route: str, **extra) -> list[dict]:
    chunks = []
    with httpx.stream("POST", f"{front.url}/{route}", json=_body(route, stream=True, **extra), timeout=300) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: ") :]))
    return chunks


def _check(payload: dict, lengths: list[int], draft_len: int, completion_tokens: int) -> None:
    accepted = [length - 1 for length in lengths]
    assert payload["per_step_accepted"] == accepted
    assert payload["num_spec_steps"] == len(lengths)
    assert payload["num_accepted_draft_tokens"] == sum(accepted)
    assert payload["num_draft_tokens"] == draft_len * len(lengths) and payload["per_step_drafted"] == [draft_len] * len(lengths)
    assert payload["num_spec_tokens"] == draft_len and len(payload["acceptance_histogram"]) == draft_len + 1
    assert payload["acceptance_histogram"] == [accepted.count(j) for j in range(draft_len + 1)]
    assert payload["mean_acceptance_length"] == pytest.approx(sum(lengths) / len(lengths))
    assert payload["draft_acceptance_rate"] == pytest.approx(sum(accepted) / (draft_len * len(lengths)))
    assert completion_tokens == 1 + sum(lengths)  # the prefill's token, then every step's


@pytest.mark.parametrize("route", ["completions", "chat/completions"])
def test_served_statistics_equal_the_decoded_acceptance_lengths(front, reference, route):
    lengths, draft_len = reference[route], reference["draft_len"]
    whole = _post(front, route)
    _check(whole["metrics"]["speculative_decoding"], lengths, draft_len, whole["usage"]["completion_tokens"])
    assert whole["choices"][0]["avg_decoded_tokens_per_iter"] == pytest.approx(sum(lengths) / len(lengths))
    ours = whole["usage"]["dflash"]  # unchanged, and the same counts
    assert ours["accepted_draft_tokens"] == whole["metrics"]["speculative_decoding"]["num_accepted_draft_tokens"]
    assert ours["draft_tokens"] == whole["metrics"]["speculative_decoding"]["num_draft_tokens"]

    # streamed with a usage chunk: the payload rides that chunk only (aiperf takes exactly one)
    chunks = _stream(front, route, stream_options={"include_usage": True})
    carrying = [c for c in chunks if "metrics" in c]
    assert carrying == [chunks[-1]] and chunks[-1]["choices"] == []
    assert carrying[0]["metrics"] == whole["metrics"]
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finish) == 1 and finish[0]["choices"][0]["avg_decoded_tokens_per_iter"] == whole["choices"][0]["avg_decoded_tokens_per_iter"]

    # streamed without one: on the finish chunk
    chunks = _stream(front, route)
    carrying = [c for c in chunks if "metrics" in c]
    assert len(carrying) == 1 and carrying[0]["choices"][0]["finish_reason"] == "length"
    assert carrying[0]["metrics"] == whole["metrics"]


def test_autoregressive_model_sends_no_speculative_statistics(front):
    answer = _post(front, "completions", model="ar", max_tokens=4)
    assert "metrics" not in answer and "avg_decoded_tokens_per_iter" not in answer["choices"][0]
    chunks = _stream(front, "chat/completions", model="ar", max_tokens=4, stream_options={"include_usage": True})
    assert not any("metrics" in c for c in chunks)


def test_prometheus_counters_move_by_the_requests_counts(demo_triton, front, reference):
    from trtllm_dflash.served_model.metrics import read_metrics

    draft_len = reference["draft_len"]
    before = read_metrics(demo_triton.endpoints.metrics, "dflash")
    answers = [_post(front, "completions"), _post(front, "chat/completions")]
    after = read_metrics(demo_triton.endpoints.metrics, "dflash")
    accepted = [a for answer in answers for a in answer["metrics"]["speculative_decoding"]["per_step_accepted"]]
    assert accepted == [length - 1 for route in ("completions", "chat/completions") for length in reference[route]]

    def moved(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    assert moved("spec_decode_num_drafts_total") == len(accepted)
    assert moved("spec_decode_num_draft_tokens_total") == draft_len * len(accepted)
    assert moved("spec_decode_num_accepted_tokens_total") == sum(accepted)
    for position in range(draft_len):
        assert moved(f"spec_decode_num_accepted_tokens_per_pos_total{{{position}}}") == sum(a > position for a in accepted)
    assert f"spec_decode_num_accepted_tokens_per_pos_total{{{draft_len}}}" not in after
    # the autoregressive model drafts nothing and has none of these counters
    assert not any(name.startswith("spec_decode_") for name in read_metrics(demo_triton.endpoints.metrics, "ar"))


def test_served_draft_counts_follow_the_draft_len_schedule():
    """With a draft_len_schedule a busy step verifies fewer drafts: the served totals count what each
    step verified (they counted block size - 1 per step, overstating drafts and understating the rate)."""
    from support import RecordingSink, serve_until

    from trtllm_dflash.backends import open_served_pipeline
    from trtllm_dflash.sampling_params import SamplingParams
    from trtllm_dflash.served_model.batching_loop import BatchingLoop
    from trtllm_dflash.served_model.model_parameters import ServingConfig
    from trtllm_dflash.served_model.protocol import GenerateInputs

    config = ServingConfig(
        target="demo", drafter="demo", max_context=256, max_tokens=64, max_batch=2, draft_len_schedule={1: 7, 2: 0}, device="cpu"
    )
    loop = BatchingLoop(config, open_served_pipeline(config))
    sinks = [RecordingSink(raise_errors=True), RecordingSink(raise_errors=True)]
    for sink, limit in zip(sinks, (12, 30)):  # both decode together (no drafts), then the second alone (7 a step)
        loop.accept(GenerateInputs(PROMPT, SamplingParams(max_new_tokens=limit, ignore_eos=True)), sink)
    serve_until(loop, lambda: all(s.finished for s in sinks))
    outputs = sinks[1].responses[-1][0]
    lengths = outputs["acceptance_lengths"].tolist()
    drafted = int(outputs["total_draft_tokens"][0])
    together = sum(1 for n in lengths if n == 1)
    assert 0 < drafted < 7 * len(lengths)
    assert drafted % 7 == 0 and drafted // 7 <= len(lengths) - together + 1  # only the steps alone drafted
    accepted = int(outputs["total_accepted_draft_tokens"][0])
    assert float(outputs["acceptance_rate"][0]) == pytest.approx(accepted / drafted, rel=1e-6)

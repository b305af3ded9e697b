"""Hostile requests against a REAL, supervised tritonserver (the pair and repository of
test_serving.py): out-of-range, NaN and undecodable inputs get a per-request error that names
the input; a request that segfaults tritonserver (its JSON parser, on input nested 40,000 arrays
deep) is survived: the supervisor restarts it on the same ports, the requests in flight fail
instead of hanging, the dead server's shared memory is removed and greedy outputs are unchanged.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request

import httpx
import numpy as np
import pytest
from support import MAX_CONTEXT, MAX_TOKENS, PROMPTS, pair, repo, supervised_server, wait_serving  # noqa: F401 (fixtures)
from support import post as _post

from trtllm_dflash.contracts.request_limits import MIN_TEMPERATURE, PROMPT_CHARS_PER_TOKEN
from trtllm_dflash.errors import DFlashError

DEEP_JSON = b'{"text_input": ' + b"[" * 40000 + b"]" * 40000 + b"}"


@pytest.fixture(scope="module")
def supervised(repo):
    """A server run as `dflash-trt serve` runs it (support.supervised_server)."""
    with supervised_server(repo) as server:
        yield server


def _grpc(server, inputs) -> tuple[str | None, float]:
    """(the error message, or None; seconds to the first response) of one gRPC streaming request."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    results: list = []
    client = grpcclient.InferenceServerClient(server.endpoints.grpc)
    client.start_stream(callback=lambda result, error: results.append(error))
    started = time.monotonic()
    client.async_stream_infer("dflash", inputs, enable_empty_final_response=True)
    while not results and time.monotonic() - started < 120:
        time.sleep(0.005)
    elapsed = time.monotonic() - started
    client.stop_stream()
    client.close()
    assert results, "no response in 120 s"
    error = results[0]
    return (error.message() if isinstance(error, InferenceServerException) else None), elapsed


def _tensor(name: str, array: np.ndarray, dtype: str):
    import tritonclient.grpc as grpcclient

    tensor = grpcclient.InferInput(name, list(array.shape), dtype)
    tensor.set_data_from_numpy(array)
    return tensor


# ---------------------------------------------------------------------- inputs in range


def test_out_of_range_http_inputs_get_a_400_naming_the_input(supervised):
    """Each value reaches the model as sent (INT64 inputs: 4294967304 is not narrowed to 8) and
    is refused with the input's name; JSON's NaN/Infinity literals (Triton's parser takes them)
    and an FP32 overflow (1e39 -> inf) are refused as well."""
    text = {"text_input": "abc"}
    cases = [
        (
            {**text, "sampling_param_max_tokens": 4294967304},
            f"sampling_param_max_tokens 4294967304 is above this server's limit of {MAX_TOKENS}",
        ),
        ({**text, "sampling_param_max_tokens": -5}, "sampling_param_max_tokens must be > 0, got -5"),
        ({**text, "sampling_param_temperature": float("nan")}, "sampling_param_temperature must be >= 0 and finite, got nan"),
        ({**text, "sampling_param_temperature": float("inf")}, "sampling_param_temperature must be >= 0 and finite, got inf"),
        ({**text, "sampling_param_temperature": 1e39}, "sampling_param_temperature must be >= 0 and finite, got inf"),
        ({**text, "sampling_param_top_p": float("nan")}, "sampling_param_top_p must be in (0, 1], got nan"),
        ({**text, "sampling_param_top_k": 4294967297}, "sampling_param_top_k must be in [0, 2147483647], got 4294967297"),
        ({**text, "sampling_param_top_k": -1}, "sampling_param_top_k must be in [0, 2147483647], got -1"),
        ({**text, "sampling_param_seed": 4294967296}, "sampling_param_seed must be in [0, 4294967295], got 4294967296"),
        ({**text, "sampling_param_seed": -1}, "sampling_param_seed must be in [0, 4294967295], got -1"),
        ({"text_input": "abc\udcff"}, "input text_input is not valid UTF-8"),  # a lone surrogate escape
        ({**text, "sampling_param_stop": ["x"] * 17}, "sampling_param_stop has 17 strings"),
    ]
    for body, message in cases:
        status, answer = _post(supervised, "dflash", body)
        assert (status, message in answer.get("error", "")) == (400, True), (body, status, answer)
    # beyond INT64 Triton's own parser refuses the request before the model runs
    for body in ({**text, "sampling_param_max_tokens": 2**63}, {**text, "sampling_param_seed": 2**64 - 1}):
        status, answer = _post(supervised, "dflash", body)
        assert status >= 400 and "Unable to parse 'data'" in answer["error"], (body, status, answer)


def test_out_of_range_grpc_inputs_and_a_5mb_prompt_are_refused_fast(supervised):
    from trtllm_dflash.serving.client import grpc_inputs

    nan = _tensor("sampling_param_temperature", np.array([np.nan], dtype=np.float32), "FP32")
    message, _ = _grpc(supervised, grpc_inputs({"text_input": "abc"}) + [nan])
    assert message == "sampling_param_temperature must be >= 0 and finite, got nan; use 0 for greedy decoding"

    undecodable = _tensor("text_input", np.array([b"def f(\xff\xfe):"], dtype=np.object_), "BYTES")
    message, _ = _grpc(supervised, [undecodable])
    assert message == "input text_input is not valid UTF-8; send UTF-8 text"

    message, _ = _grpc(supervised, grpc_inputs({"text_input": "abc", "sampling_param_max_tokens": 2**40}))
    assert message.startswith(f"sampling_param_max_tokens {2**40} is above this server's limit of {MAX_TOKENS}")
    message, _ = _grpc(supervised, grpc_inputs({"text_input": "abc", "sampling_param_seed": 2**62}))
    assert message.startswith(f"sampling_param_seed must be in [0, 4294967295], got {2**62}")

    # the character bound refuses a 5 MB prompt before the tokenizer sees it: this message is the
    # character check's, which `accept` runs before encoding (no clock: a busy machine is slow, not wrong)
    message, _ = _grpc(supervised, grpc_inputs({"text_input": "x = 1\n" * 833_334}))
    assert message.startswith(f"text_input has 5000004 characters, more than this server's limit of {MAX_CONTEXT * PROMPT_CHARS_PER_TOKEN}")

    # and the server still answers well-formed requests
    assert _grpc(supervised, grpc_inputs({"text_input": PROMPTS[0], "sampling_param_max_tokens": 4}))[0] is None


def test_sampling_params_validate_is_the_one_range_check():
    """The API, the decoder and the served model share SamplingParams.validate."""
    from trtllm_dflash.decoding import SamplingParams

    SamplingParams(max_new_tokens=1, temperature=1e30, top_k=2**31 - 1, top_p=1e-9, seed=2**32 - 1).validate()
    for bad, message in [
        (dict(temperature=float("nan")), "temperature must be >= 0 and finite, got nan"),
        (dict(temperature=float("inf")), "temperature must be >= 0 and finite, got inf"),
        (dict(top_p=float("nan")), "top_p must be in (0, 1], got nan"),
        (dict(top_k=2**31), "top_k must be in [0, 2147483647], got 2147483648"),
        (dict(seed=2**32), "seed must be in [0, 4294967295], got 4294967296"),
        (dict(seed=-1), "seed must be in [0, 4294967295], got -1"),
    ]:
        with pytest.raises(DFlashError, match=re.escape(message)):
            SamplingParams(**bad).validate()


# ---------------------------------------------------------------------- a request that kills tritonserver


def _greedy(server, prompt: str) -> list[int]:
    status, body = _post(server, "dflash", {"text_input": prompt, "sampling_param_max_tokens": 32, "sampling_param_temperature": 0})
    assert status == 200, body
    return body["output_ids"] if isinstance(body["output_ids"], list) else [body["output_ids"]]


def _stream_first_chunk_then_rest(client, prompt: str, outcome: dict, first: threading.Event) -> None:
    """Stream over gRPC; signal after the first chunk; record how the rest of the stream ended."""
    started = time.monotonic()
    try:
        for chunk in client.stream(prompt, protocol="grpc", max_tokens=MAX_TOKENS):
            first.set()
            if chunk.final:  # the model's own last response names why it ended; a cut stream's does not
                outcome["end"] = "finished" if chunk.stats.get("finish_reason") else "final without a finish reason"
    except Exception as exc:  # noqa: BLE001
        outcome["end"] = f"{type(exc).__name__}: {exc}"
    finally:
        first.set()
        outcome["seconds"] = time.monotonic() - started
        outcome["at"] = time.monotonic()


def test_deep_json_segfault_is_survived_with_the_same_outputs(supervised):
    from trtllm_dflash.serving.client import DFlashClient

    before = _greedy(supervised, PROMPTS[0])
    dead_pid, dead_files = supervised.process.pid, supervised.shm_files()
    assert dead_files, f"no shared-memory file starts with {supervised.shm_prefix}"

    # a request in flight when the server dies gets an error, not a hang
    streaming = DFlashClient(supervised.endpoints.http, grpc_url=supervised.endpoints.grpc, timeout=60)
    outcome, first = {}, threading.Event()
    worker = threading.Thread(target=_stream_first_chunk_then_rest, args=(streaming, PROMPTS[1], outcome, first))
    worker.start()
    assert first.wait(60)
    crashed = time.monotonic()
    request = urllib.request.Request(
        f"{supervised.endpoints.http}/v2/models/dflash/generate", data=DEEP_JSON, headers={"Content-Type": "application/json"}
    )
    with pytest.raises(OSError):  # no answer (URLError, RemoteDisconnected): the server died reading it
        urllib.request.urlopen(request, timeout=60).read()
    worker.join(30)
    assert not worker.is_alive(), "the request in flight hung when tritonserver died"
    assert outcome.get("end", "").startswith("ServerError"), outcome  # gRPC UNAVAILABLE, through the client

    # the service answers again, on the same ports, with the same greedy output (300 s: a hang bound)
    while not (supervised.restarts and supervised.process is not None and supervised.ready()):
        assert time.monotonic() - crashed < 300, f"not serving 300 s after the crash: {supervised.supervision_log}"
        time.sleep(0.2)
    print(f"serving again {time.monotonic() - crashed:.1f} s after the crash")
    assert supervised.process.pid != dead_pid
    assert _greedy(supervised, PROMPTS[0]) == before
    assert not [path for path in dead_files if path.exists()], "the dead server's shared memory is still in /dev/shm"
    assert supervised.shm_files() and set(supervised.shm_files()).isdisjoint(dead_files)  # the new server's own
    line = supervised.supervision_log[0]
    assert "tritonserver died unexpectedly (signal 11 (SIGSEGV)" in line and str(supervised.log_path) in line, line
    assert "restarting it on the same ports (restart 1 of at most 5 per 10 min)" in line, line
    assert "restarting it" in supervised.log_path.read_text(errors="replace")  # the log says where the second run starts


# ---------------------------------------------------------------------- the restart budget, without a server


class _CrashingServer:
    """A TritonServer whose 'tritonserver' creates a shared-memory file and segfaults soon after."""

    @staticmethod
    def make(tmp_path, lifetime: float):
        from trtllm_dflash.serving.server import TritonServer, free_port

        (tmp_path / "repo" / "m").mkdir(parents=True)
        (tmp_path / "repo" / "m" / "config.pbtxt").write_text('backend: "python"\n')

        class Crashing(TritonServer):
            def command(self):
                # SIGINT (stop()) ends it at once, as it does tritonserver
                script = f"touch /dev/shm/{self.shm_prefix}$$; trap 'exit 0' INT; sleep {lifetime} & wait; kill -SEGV $$"
                return ["sh", "-c", script], dict(os.environ)

            def ready(self):
                return True

        return Crashing(tmp_path / "repo", free_port(), free_port(), free_port(), log_file=tmp_path / "server.log")


def test_restart_budget_ends_supervision_with_one_line_and_cleans_up(tmp_path):
    server = _CrashingServer.make(tmp_path, lifetime=0.3)
    lines: list[str] = []
    server.start()
    try:
        with pytest.raises(DFlashError) as failure:
            server.supervise(max_restarts=2, window=60, log=lines.append, poll=0.05)
    finally:
        server.stop()
    restarts = [line for line in lines if "restarting it on the same ports" in line]
    assert len(restarts) == 2 and len(server.restarts) == 2, lines
    assert "(restart 2 of at most 2 per 1 min)" in restarts[1]
    assert all("signal 11 (SIGSEGV)" in line and "removed 1 shared-memory file(s)" in line for line in restarts)
    message = str(failure.value)
    assert "\n" not in message and "it died 3 times within 1 min, more than the 2 restarts allowed" in message
    assert str(server.log_path) in message
    assert server.process is None and server.shm_files() == []


def test_supervise_returns_when_asked_to_stop(tmp_path):
    server = _CrashingServer.make(tmp_path, lifetime=30)
    stop = threading.Event()
    server.start()
    try:
        thread = threading.Thread(target=server.supervise, kwargs={"stop_event": stop, "poll": 0.05})
        thread.start()
        time.sleep(0.2)
        stop.set()
        thread.join(5)
        assert not thread.is_alive() and server.restarts == []
    finally:
        server.stop()
    assert server.shm_files() == []


# ---------------------------------------------------------------------- Triton's HTTP port off


def test_no_triton_http_keeps_grpc_and_loopback(tmp_path):
    from trtllm_dflash.serving import DEFAULT_HOST
    from trtllm_dflash.serving.server import TritonServer, free_port

    server = _CrashingServer.make(tmp_path, lifetime=30)
    off = TritonServer(server.repository, free_port(), free_port(), free_port(), http=False)
    try:
        args, _ = off.command()
    finally:
        off.stop()
    assert "--allow-http=false" in args and not any(a.startswith("--allow-grpc") for a in args)
    assert off.endpoints.http is None and off.endpoints.grpc.startswith("127.0.0.1:")
    assert DEFAULT_HOST == "127.0.0.1" and f"--grpc-address={DEFAULT_HOST}" in args and f"--http-address={DEFAULT_HOST}" in args
    assert any(a == f"--backend-config=python,shm-region-prefix-name={off.shm_prefix}" for a in args)
    from typer.testing import CliRunner

    from trtllm_dflash.cli.app import app

    assert "--no-triton-http" in CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"}).output


@pytest.mark.slow
def test_no_triton_http_server_serves_grpc_only(repo):
    from trtllm_dflash.serving.client import grpc_inputs
    from trtllm_dflash.serving.server import TritonServer, free_port

    http_port = free_port()
    with TritonServer(repo, http_port, free_port(), free_port(), host="127.0.0.1", http=False) as server:
        assert _grpc(server, grpc_inputs({"text_input": PROMPTS[0], "sampling_param_max_tokens": 4}))[0] is None
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=5)
        assert b"nv_inference_request_success" in urllib.request.urlopen(server.endpoints.metrics, timeout=5).read()


def test_a_temperature_too_cold_for_float32_is_greedy_in_the_decoder():
    """Triton's own ports too: 1e-40 divided into float32 logits would overflow into an empty "stop"."""
    import torch

    from trtllm_dflash.decoding import SamplingParams
    from trtllm_dflash.runtime.scheduler import _sampling_tensors

    params = [SamplingParams(temperature=t) for t in (1e-40, 1e-38, MIN_TEMPERATURE / 2, MIN_TEMPERATURE, 0.7)]
    tensors = _sampling_tensors(params, torch.device("cpu"))
    assert tensors.temperature.tolist()[:3] == [0.0, 0.0, 0.0]
    assert tensors.temperature[3].item() == pytest.approx(MIN_TEMPERATURE) and tensors.temperature[4].item() == pytest.approx(0.7)


def _openai_stream(url: str, prompt: str, outcome: dict, first: threading.Event) -> None:
    """A streamed /v1/completions; records its events, how it ended and when."""
    import httpx

    body = {"model": "dflash", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True, "ignore_eos": True}
    try:
        with httpx.stream("POST", f"{url}/completions", json=body, timeout=httpx.Timeout(120, connect=10)) as response:
            outcome["status"] = response.status_code
            if response.status_code != 200:  # sent while the model was down: refused, not streamed
                outcome["end"] = f"http {response.status_code}"
                return
            for line in response.iter_lines():
                if line.startswith("data: "):
                    first.set()
                    data = line[len("data: ") :]
                    outcome.setdefault("events", []).append(data)
                    if data != "[DONE]" and "error" in json.loads(data):
                        outcome["end"] = "error event"
                    elif data == "[DONE]":
                        outcome.setdefault("end", "finished")
        outcome.setdefault("end", "closed without [DONE]")
    except Exception as exc:  # noqa: BLE001
        outcome["end"] = f"{type(exc).__name__}: {exc}"
    finally:
        outcome["at"] = time.monotonic()
        first.set()


def test_a_killed_model_process_is_noticed_streams_end_and_it_comes_back(supervised):
    """SIGKILL of the `dflash` model's stub (an OOM kill) during streams: supervision notices it,
    every stream in flight ends with an error within 30 s (an error event on the OpenAI API), the
    OpenAI /health says 503 meanwhile, and the model answers again with the same greedy tokens."""
    from trtllm_dflash.serving.client import DFlashClient
    from trtllm_dflash.serving.openai.server import OpenAIServer
    from trtllm_dflash.serving.server import free_port

    wait_serving(supervised)
    before = _greedy(supervised, PROMPTS[0])
    restarts, lines = len(supervised.restarts), len(supervised.supervision_log)
    with OpenAIServer(supervised.endpoints.grpc, host="127.0.0.1", port=free_port(), repository=supervised.repository) as front:
        url = front.url
        streams = []

        def triton_streams():
            started = []
            for i in range(2):
                client = DFlashClient(supervised.endpoints.http, grpc_url=supervised.endpoints.grpc, timeout=120)
                client.speaks_llmapi("grpc")  # the metadata request, before the timed part
                outcome, first = {"kind": "triton"}, threading.Event()
                thread = threading.Thread(target=_stream_first_chunk_then_rest, args=(client, PROMPTS[i], outcome, first))
                started.append((thread, outcome, first))
            for thread, _, _ in started:
                thread.start()
            streams.extend(started)

        # the Triton streams start first, their clients having read the model's metadata already: the
        # OpenAI streams (MAX_TOKENS tokens, under a second) must still be running when the kill comes
        def openai_streams():
            for i in range(4):
                outcome, first = {"kind": "openai"}, threading.Event()
                streams.append(
                    (threading.Thread(target=_openai_stream, args=(url, PROMPTS[i % len(PROMPTS)], outcome, first)), outcome, first)
                )
                streams[-1][0].start()

        triton_streams()
        openai_streams()

        def in_flight(kind: str) -> bool:
            return any(o["kind"] == kind and f.is_set() and "end" not in o for _, o, f in streams)

        def all_ended(kind: str) -> bool:
            return all("end" in o for _, o, _ in streams if o["kind"] == kind)

        # kill as soon as a stream of each kind is under way (waiting for all of them let short
        # streams finish first on a loaded machine); a kind whose streams all ended before the other
        # kind got going (either front end slow on a loaded machine) is followed by more of its own
        deadline = time.monotonic() + 300  # a hang bound
        while not (in_flight("openai") and in_flight("triton")):
            assert time.monotonic() < deadline, "no stream of each kind in flight at once within 300 s"
            if all_ended("triton"):
                triton_streams()
            if all_ended("openai"):
                openai_streams()
            time.sleep(0.005)
        (stub,) = [pid for pid, name in supervised.stubs.items() if name.startswith("dflash_")]
        os.kill(stub, signal.SIGKILL)
        killed = time.monotonic()

        saw_503 = False
        while not (len(supervised.restarts) > restarts and supervised.process is not None and supervised.ready()):
            assert time.monotonic() - killed < 300, f"not serving 300 s after the kill: {supervised.supervision_log}"  # a hang bound
            with httpx.Client(timeout=5) as probe:
                saw_503 |= probe.get(url.rsplit("/v1", 1)[0] + "/health").status_code == 503
            time.sleep(0.2)
        for thread, _, _ in streams:
            thread.join(max(0.0, 30 - (time.monotonic() - killed)))
            assert not thread.is_alive(), "a stream was still open 30 s after its model process died"
        ends = [(o["kind"], o["end"], o["at"] < killed) for _, o, _ in streams]
        # a stream cut by the kill (or sent while the model was down) ends in an error, never quietly; a
        # stream that finished is complete (its final response names the finish reason, [DONE] follows
        # one), even when that response, sent just before the kill, arrived after it
        for kind, end, _ in ends:
            assert end not in ("closed without [DONE]", "final without a finish reason"), ends
        assert any(kind == "openai" and end == "error event" for kind, end, _ in ends), ends
        assert any(kind == "triton" and end.startswith("ServerError") for kind, end, _ in ends), ends
        assert saw_503, "the OpenAI /health never said 503 while the model was down"
        # what supervision saw first: the dead stub, the probe's failed request, or (seen once in CI)
        # tritonserver itself segfaulting as its Python backend found the stub gone; each ends in a restart
        noticed = supervised.supervision_log[lines]
        assert any(why in noticed for why in ("stub of dflash_", "stub of dflash stopped answering", "tritonserver died unexpectedly")), (
            noticed
        )
        assert "restarting it on the same ports" in noticed, noticed
    assert _greedy(supervised, PROMPTS[0]) == before

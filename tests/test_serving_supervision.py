"""Supervision of a REAL tritonserver (issue 40, items 4 and 5): a restart that fails is retried
with backoff and the service answers again; the crash's log line names the request its model
received last (a fingerprint); a model process that stops answering (SIGSTOP) is found by the
periodic probe, the OpenAI /health says 503 within 5 s, and the service answers again after the
restart; /health is answered past the connection cap. Plus the restart budget and the probe's
busy-or-stalled rule without a server.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import httpx
import pytest
from support import cli, supervised_server, wait_serving

from trtllm_dflash.serving import server_watch

PROMPT = "def fibonacci(n):"
RESTART_BOUND = 300  # seconds: a hang bound for a restart on a slow 2-core machine, not a timing claim


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    out = tmp_path_factory.mktemp("supervision") / "repository"
    cli("repo", "--model", "demo", "--out", str(out), "--max-context", "512", "--max-tokens", "64", "--max-batch", "4", "--threads", "1")
    return out


@pytest.fixture(scope="module")
def supervised(repo):
    """A server run as `dflash-trt serve` runs it (support.supervised_server)."""
    with supervised_server(repo) as server:
        yield server


def _generate(server, prompt: str = PROMPT) -> str:
    body = {"text_input": prompt, "sampling_param_max_tokens": 8, "sampling_param_temperature": 0}
    request = urllib.request.Request(
        f"{server.endpoints.http}/v2/models/dflash/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())["text_output"]


def _wait_serving_again(server, restarts: int, since: float) -> None:
    while not (len(server.restarts) > restarts and server.process is not None and server.ready()):
        assert not server.supervision_errors, f"supervise() gave up: {server.supervision_errors}, {server.supervision_log}"
        assert time.monotonic() - since < RESTART_BOUND, f"not serving {RESTART_BOUND} s later: {server.supervision_log}"
        time.sleep(0.2)


def _stub(server, model: str) -> int:
    (pid,) = [pid for pid, name in server.stub_processes().items() if name.startswith(f"{model}_")]
    return pid


# ---------------------------------------------------------------------- without a server


def test_restart_budget_counts_deaths_after_the_same_request_once():
    budget = server_watch.RestartBudget(limit=2, window=60)
    assert budget.spend(0.0, "aaaa") is True
    for now in (1.0, 2.0, 3.0, 4.0):  # one client resending the request that crashes the server
        assert budget.spend(now, "aaaa") is False
    assert budget.used() == 1 and not budget.exhausted()
    assert budget.describe() == "restart 1 of at most 2 per 1 min"
    budget.spend(5.0, None)  # a death with no request noted (or a failed restart) counts each time
    assert budget.used() == 2 and not budget.exhausted()
    budget.spend(6.0, "bbbb")
    assert budget.used() == 3 and budget.exhausted()
    budget.spend(70.0, "aaaa")  # outside the window the earlier ones are forgotten
    assert budget.used() == 1 and len(budget.events) == 1


def test_an_unanswered_probe_is_a_stall_only_while_the_model_uses_no_cpu():
    """The probe's fallback rule (the SIGSTOP case is Triton's own "not healthy" answer): no answer
    within the timeout is a stall only when the model's process used (almost) no CPU meanwhile; a
    model busy with a full batch queues the probe and must not be restarted."""

    class Silent:  # a gRPC client whose requests are never answered
        def start_stream(self, callback):
            pass

        def async_stream_infer(self, *args, **kwargs):
            pass

        def stop_stream(self, cancel_requests=False):
            pass

    class Server:
        models: list[str] = []

        def __init__(self, pid: int) -> None:
            self.pid = pid

        def stub_processes(self) -> dict[int, str]:
            return {self.pid: "dflash_0_0"}

    idle = subprocess.Popen(["sleep", "60"])  # starts in milliseconds, then uses no CPU (as a stopped process)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        stalled = server_watch.ModelProbe(Server(idle.pid), timeout=1.0).probe(Silent(), "dflash")
        working = server_watch.ModelProbe(Server(busy.pid), timeout=1.0).probe(Silent(), "dflash")
    finally:
        idle.kill()
        busy.kill()
    assert stalled is not None and "no answer to a one-token probe" in stalled, stalled
    assert working is None


# ---------------------------------------------------------------------- against a real tritonserver


def test_a_probe_leaves_no_thread_behind(supervised):
    """`serve` probes every model each second for as long as it runs: a probe that left gRPC's
    request-reading thread waiting (a cancelled stream does) leaked a thread a second."""
    import tritonclient.grpc as grpcclient

    from trtllm_dflash.serving.client import health_probe

    client = grpcclient.InferenceServerClient(supervised.endpoints.grpc)
    try:
        assert health_probe(client, "dflash", 60.0) is not None  # the first one starts gRPC's own threads
        before = max(_settled_thread_count() for _ in range(5))
        for _ in range(10):
            result, error = health_probe(client, "dflash", 60.0)
            assert error is None
        # serve's own probe of this server runs beside this one: a probe of its in flight is one thread more for a moment
        assert min(_settled_thread_count() for _ in range(5)) <= before
    finally:
        client.close()


def _settled_thread_count() -> int:
    time.sleep(0.01)
    return threading.active_count()


def test_health_is_answered_past_the_connection_cap(supervised):
    from trtllm_dflash.serving.openai.server import OpenAIServer
    from trtllm_dflash.serving.server import free_port

    wait_serving(supervised)  # the test before may have restarted it

    with OpenAIServer(supervised.endpoints.grpc, port=free_port(), repository=supervised.repository, max_connections=2) as front:
        port = front.port
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(4)]
        try:
            time.sleep(0.5)  # uvicorn accepts them (the cap counts accepted connections)
            assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).status_code == 503
            health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
            assert health.status_code == 200, health.text
            # past the cap a connection gets one /health answer, not a way in for other requests
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                host = f"Host: 127.0.0.1:{port}\r\n\r\n".encode()
                sock.sendall(b"GET /health HTTP/1.1\r\n" + host + b"GET /v1/models HTTP/1.1\r\n" + host)
                answer = b""
                while chunk := sock.recv(65536):
                    answer += chunk
            assert answer.count(b"HTTP/1.1 ") == 1 and answer.startswith(b"HTTP/1.1 200"), answer
        finally:
            for sock in idle:
                sock.close()


def test_a_failed_restart_is_retried_and_the_crash_names_the_request_before_it(supervised, monkeypatch):
    wait_serving(supervised)  # the test before may have restarted it
    before = _generate(supervised)
    expected = server_watch.request_fingerprint("text_input", PROMPT.encode())
    restarts, lines = len(supervised.restarts), len(supervised.supervision_log)
    command, calls = supervised.command, []

    def failing_once():  # the first restart's tritonserver exits at once (status 1, an unknown flag)
        args, env = command()
        calls.append(len(calls))
        return (args + ["--no-such-flag=1"] if len(calls) == 1 else args), env

    monkeypatch.setattr(supervised, "command", failing_once)
    os.kill(_stub(supervised, "dflash"), signal.SIGKILL)
    killed = time.monotonic()
    _wait_serving_again(supervised, restarts, killed)

    log = supervised.supervision_log[lines:]
    print("\n".join(log))
    assert len(calls) == 2, log
    assert "the Python backend stub of dflash_0_0 died" in log[0], log
    assert f"the last request dflash received: fingerprint {expected}" in log[0], log
    assert "(restart 1 of at most 5 per 10 min)" in log[0], log
    assert (
        "the restart failed (tritonserver exited with status 1 while loading the repository); retrying in 1 s "
        "(restart 2 of at most 5 per 10 min)"
    ) in log[1], log
    assert log[2].startswith("tritonserver ready again"), log
    assert _generate(supervised) == before


def test_a_stalled_model_makes_health_503_within_5_s_and_is_restarted(supervised):
    from trtllm_dflash.serving.openai.server import OpenAIServer
    from trtllm_dflash.serving.server import free_port

    wait_serving(supervised)  # the test before may have restarted it

    restarts, lines = len(supervised.restarts), len(supervised.supervision_log)
    with OpenAIServer(supervised.endpoints.grpc, port=free_port(), repository=supervised.repository) as front:
        health = front.url.rsplit("/v1", 1)[0] + "/health"
        assert httpx.get(health, timeout=10).status_code == 200
        stub = _stub(supervised, "dflash")
        os.kill(stub, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            while (status := httpx.get(health, timeout=5).status_code) == 200 and time.monotonic() - stopped < 5:
                time.sleep(0.1)
            took = time.monotonic() - stopped
            assert status == 503 and took <= 5, f"/health said {status} {took:.1f} s after the stall: {supervised.supervision_log}"
            print(f"/health 503 {took:.1f} s after SIGSTOP")
            _wait_serving_again(supervised, restarts, stopped)
            while httpx.get(health, timeout=5).status_code != 200:  # the front end reconnects to the new server
                assert time.monotonic() - stopped < RESTART_BOUND, "the OpenAI /health never said 200 again"
                time.sleep(0.2)
            completion = httpx.post(
                f"{front.url}/completions", timeout=120, json={"model": "dflash", "prompt": PROMPT, "max_tokens": 4, "temperature": 0}
            )
            assert completion.status_code == 200, completion.text  # /health 200 means requests are answered
        finally:
            if server_watch.process_start_time(stub) is not None:  # a failure above: leave no stopped process
                os.kill(stub, signal.SIGKILL)
    log = supervised.supervision_log[lines:]
    print("\n".join(log))
    assert "the Python backend stub of dflash stopped answering (Triton answered a probe:" in log[0], log
    assert server_watch.STUB_UNHEALTHY in log[0], log
    assert server_watch.process_start_time(stub) is None, "the stalled stub outlived the restart"


def test_only_a_stopped_stub_is_stalled_at_its_first_failed_probe():
    """A stub missing Triton's health check on a loaded machine is not restarted at once: a running
    (or sleeping) process needs STALL_STRIKES failed probes in a row; a stopped one (SIGSTOP) does not."""
    import signal
    import subprocess
    import time

    from trtllm_dflash.serving.server_watch import STALL_STRIKES, STOPPED_STATES, process_state

    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        deadline = time.monotonic() + 5  # right after the fork it can be in D (exec loading `sleep` on a loaded machine)
        while process_state(sleeper.pid) not in ("R", "S") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process_state(sleeper.pid) in ("R", "S")  # starting, then sleeping: not stopped
        sleeper.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while process_state(sleeper.pid) not in STOPPED_STATES and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process_state(sleeper.pid) in STOPPED_STATES
        sleeper.send_signal(signal.SIGCONT)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert process_state(sleeper.pid) == "" and STALL_STRIKES >= 2

"""The OpenAI front end against hostile clients, without a tritonserver: a slow-loris client (headers
or body a byte at a time) gets 408 and is disconnected within `read_timeout`, connections past
`max_connections` get 503, /health answers 503 within about a second while Triton is down or
wedged, and a compressed body gets a 415 naming its Content-Encoding. Also: a `--model` that is a
broken symbolic link is named as one, not taken for a recipe name.

The front end points at a gRPC port where nothing listens (or one that accepts and never answers);
model discovery is skipped (no models), which every check here runs before.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import select
import socket
import time
from typing import Iterator

import httpx
import pytest
from typer.testing import CliRunner

from trtllm_dflash.cli.app import app
from trtllm_dflash.errors import DFlashError

pytest.importorskip("uvicorn")

TIMEOUT = 1.0  # the read timeout the slow-client tests run with (the default is 10 s)


@contextlib.contextmanager
def front_end(monkeypatch, triton_url: str | None = None, **options) -> Iterator:
    """An OpenAIServer on a free port with no models, in front of `triton_url` (default: a dead port)."""
    from trtllm_dflash.serving.openai.frontend import Frontend
    from trtllm_dflash.serving.openai.server import OpenAIServer
    from trtllm_dflash.serving.server import free_port

    monkeypatch.setattr(Frontend, "discover", lambda self: None)  # no Triton to list models from
    with OpenAIServer(triton_url or f"127.0.0.1:{free_port()}", port=free_port(), **options) as running:
        yield running


@pytest.fixture
def slow_front(monkeypatch):
    with front_end(monkeypatch, read_timeout=TIMEOUT) as running:
        yield running


def _connect(front) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", front.port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _trickle(sock: socket.socket, head: bytes, seconds: float = 6.0) -> tuple[bytes, float]:
    """Send `head`, then one byte every 0.2 s until the server answers or closes (or `seconds` pass);
    the bytes the server sent up to its close, and when the close came (inf: it did not)."""
    started = time.monotonic()
    sock.sendall(head)
    received = b""
    while time.monotonic() - started < seconds:
        readable, _, _ = select.select([sock], [], [], 0.2)
        if readable:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return received, time.monotonic() - started
            received += chunk
            continue
        try:
            sock.send(b"a")
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed: the next recv says so
    return received, float("inf")


def _json_body(response: bytes) -> dict:
    return json.loads(response.partition(b"\r\n\r\n")[2])


def test_headers_sent_a_byte_a_second_get_408_and_a_close(slow_front):
    with _connect(slow_front) as sock:
        answer, closed = _trickle(sock, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    assert closed < TIMEOUT + 2, f"the slow client was not cut off (after {closed} s)"
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    body = _json_body(answer)
    assert body["error"]["code"] == "request_timeout" and f"within {TIMEOUT:g} s" in body["error"]["message"]


def test_a_connection_that_sends_nothing_is_closed(slow_front):
    with _connect(slow_front) as sock:
        readable, _, _ = select.select([sock], [], [], 60)  # a bound that only catches a hang
        assert readable and sock.recv(100) == b""  # closed without an answer: no request had begun


def test_a_body_that_trickles_in_gets_408_and_a_close(slow_front):
    head = b'POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"model": '
    with _connect(slow_front) as sock:
        answer, closed = _trickle(sock, head)
    assert closed < TIMEOUT + 2, f"the slow body was not cut off (after {closed} s)"
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"connection: close" in answer.lower()
    body = _json_body(answer)
    assert body["error"]["code"] == "request_timeout" and "body did not arrive" in body["error"]["message"]


def test_the_rest_of_a_refused_body_is_bounded_too(monkeypatch):
    """Refused before its body is read (401 here), a request whose body trickles on is still cut off."""
    with front_end(monkeypatch, read_timeout=TIMEOUT, api_key="k") as front, _connect(front) as sock:
        answer, closed = _trickle(
            sock, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
        )
    assert answer.startswith(b"HTTP/1.1 401 ")
    assert closed < TIMEOUT + 2, f"the body after the answer was not cut off (after {closed} s)"


def test_prompt_clients_are_served_on_a_kept_alive_connection(slow_front):
    with httpx.Client(base_url=slow_front.url.removesuffix("/v1"), timeout=10) as client:
        for _ in range(3):  # each request within the timeout of the one before: the connection is kept
            assert client.get("/v1/models").json() == {"object": "list", "data": []}
            time.sleep(TIMEOUT / 2)


def test_connections_past_the_limit_get_503(monkeypatch):
    with front_end(monkeypatch, max_connections=3) as front:
        held = [_connect(front) for _ in range(3)]
        time.sleep(0.5)  # accepted
        with _connect(front) as extra:
            readable, _, _ = select.select([extra], [], [], 5)
            answer = extra.recv(65536) if readable else b""
        assert answer.startswith(b"HTTP/1.1 503 "), answer
        assert _json_body(answer)["error"]["code"] == "too_many_connections"
        for sock in held:
            sock.close()
        deadline = time.monotonic() + 5
        while (status := httpx.get(front.url + "/models", timeout=10).status_code) != 200 and time.monotonic() < deadline:
            time.sleep(0.1)  # the server has yet to see the closes
        assert status == 200  # room again


@pytest.mark.parametrize("triton", ["nothing listens", "accepts and never answers"])
def test_health_answers_503_fast_while_triton_is_not_there(monkeypatch, triton):
    from trtllm_dflash.serving.server import free_port

    with contextlib.ExitStack() as stack:
        if triton == "nothing listens":
            url = f"127.0.0.1:{free_port()}"
        else:  # a wedged server: the TCP handshake completes (the backlog), the gRPC one never does
            silent = stack.enter_context(socket.socket())
            silent.bind(("127.0.0.1", 0))
            silent.listen(16)
            url = f"127.0.0.1:{silent.getsockname()[1]}"
        front = stack.enter_context(front_end(monkeypatch, triton_url=url))
        for _ in range(2):  # the second probe too (the gRPC channel is then in its reconnect backoff)
            response = httpx.get(front.url.removesuffix("/v1") + "/health", timeout=30)  # 30 s: only a hang fails
            assert response.status_code == 503, response.status_code
            body = response.json()
            assert body["status"] == "not ready" and body["error"]["code"] == "model_server_not_ready"
            assert f"the model server (Triton at {url}) is not ready" in body["error"]["message"]


@pytest.mark.parametrize("encoding", ["gzip", "br"])
def test_a_compressed_body_gets_415_naming_the_encoding(monkeypatch, encoding):
    payload = json.dumps({"model": "dflash", "prompt": "hi"}).encode()
    with front_end(monkeypatch) as front:
        response = httpx.post(
            front.url + "/completions",
            content=gzip.compress(payload),
            timeout=10,
            headers={"Content-Type": "application/json", "Content-Encoding": encoding},
        )
        assert response.status_code == 415
        error = response.json()["error"]
        assert error["code"] == "unsupported_content_encoding"
        assert f"Content-Encoding: {encoding} is not supported" in error["message"] and "uncompressed" in error["message"]
        plain = httpx.post(
            front.url + "/completions",
            content=payload,
            timeout=10,  # identity passes the gate
            headers={"Content-Type": "application/json", "Content-Encoding": "identity"},
        )
        assert plain.status_code == 404 and plain.json()["error"]["code"] == "model_not_found"


# ---------------------------------------------------------------------- --model paths


@pytest.mark.parametrize("command", [["repo"], ["repo", "--gpu", "h100"], ["build", "--gpu", "h100"], ["plan", "--gpu", "h100"]])
def test_a_model_that_is_a_broken_link_is_named_as_one(tmp_path, command):
    loop, dangling = tmp_path / "loop", tmp_path / "dangling"
    os.symlink(loop.name, loop)
    os.symlink(tmp_path / "gone", dangling)
    for model, problem in (
        (loop, f"--model {loop} is a symbolic link loop"),
        (dangling, f"--model {dangling} is a symbolic link to {tmp_path / 'gone'}, which does not exist"),
    ):
        out = [] if command[0] == "plan" else ["--out", str(tmp_path / "out")]
        result = CliRunner().invoke(app, [*command, "--model", str(model), *out])
        assert result.exit_code != 0
        assert isinstance(result.exception, DFlashError), (result.output, result.exception)
        assert str(result.exception.problem).startswith(problem) and "recipe" not in result.exception.problem


def test_an_unsupported_value_is_refused_naming_the_value_that_is_accepted():
    """`top_logprobs` 0 passes, so its 400 says so rather than only "leave it out"; `response_format`
    {"type": "text"} asks for nothing (json_object and json_schema are grammars now, issue 42)."""
    from trtllm_dflash.serving.openai.frontend import Frontend, FrontendConfig, ModelInfo
    from trtllm_dflash.serving.openai.schemas import CompletionRequest, OpenAIError

    frontend = Frontend(FrontendConfig(triton_url="127.0.0.1:1"))
    info = ModelInfo("dflash", None, 512, 256, 16, True, 0)
    text = CompletionRequest(model="dflash", prompt="hi", response_format={"type": "text"})
    assert frontend.sampling(text, info).max_new_tokens == 16  # accepted: it asks for nothing this server lacks
    for extra, accepted in (({"top_logprobs": 5}, "or send 0"), ({"logit_bias": {"5": 3}}, None)):
        with pytest.raises(OpenAIError) as refused:
            frontend.sampling(CompletionRequest(model="dflash", prompt="hi", **extra), info)
        assert "leave it out" in str(refused.value.message) and (accepted is None or accepted in refused.value.message)


# ---------------------------------------------------------------------- keyless: Host and content type (issue 40 item 8)


def test_without_a_key_a_foreign_host_or_a_non_json_body_is_refused(monkeypatch):
    """A web page can POST text/plain to 127.0.0.1 without asking (a CORS simple request), and can
    point a name of its own at 127.0.0.1 (DNS rebinding): both are refused when no key guards the API."""
    payload = json.dumps({"model": "m", "prompt": "hi"}).encode()
    with front_end(monkeypatch, allowed_hosts=["api.internal"]) as front:
        url = front.url + "/completions"
        for host in ("attacker.example", "attacker.example:80", "127.0.0.2"):
            refused = httpx.post(url, content=payload, headers={"Content-Type": "application/json", "Host": host}, timeout=10)
            assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_host", host
        for host in ("api.internal:8080", "localhost", f"127.0.0.1:{front.port}", socket.gethostname()):
            passed = httpx.post(url, content=payload, headers={"Content-Type": "application/json", "Host": host}, timeout=10)
            assert passed.status_code == 404 and passed.json()["error"]["code"] == "model_not_found", host  # through the gate
        assert httpx.get(front.url.removesuffix("/v1") + "/health", headers={"Host": "attacker.example"}, timeout=10).status_code != 400
        for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
            refused = httpx.post(url, content=payload, headers={"Content-Type": kind}, timeout=10)
            assert refused.status_code == 415 and refused.json()["error"]["code"] == "unsupported_media_type", kind
        assert httpx.post(url, content=payload, headers={"Content-Type": "application/json; charset=utf-8"}, timeout=10).status_code == 404
    with front_end(monkeypatch, api_key="k") as keyed:  # a key is what guards it: any Host may carry one
        answer = httpx.post(
            keyed.url + "/completions",
            content=payload,
            timeout=10,
            headers={"Content-Type": "application/json", "Host": "attacker.example", "Authorization": "Bearer k"},
        )
        assert answer.status_code == 404

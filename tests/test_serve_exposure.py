"""What `dflash-trt serve --openai-port` exposes (issue 40 item 3), run as a user runs it, against a
REAL tritonserver: Triton's ports listen on loopback behind the OpenAI API and its HTTP port (which
takes no key, and a 40,000-deep JSON body segfaulted tritonserver 2.51) is closed unless asked;
seven such bodies sent to every port serve opens leave it answering; a non-loopback --host with
--openai-port is refused in one line.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from support import cli

NESTED = b"[" * 40_000 + b"]" * 40_000  # the body that crashed tritonserver's HTTP front end
SERVE = [sys.executable, "-c", "from trtllm_dflash.cli.app import main; main()", "serve"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    out = tmp_path_factory.mktemp("repo") / "repository"
    cli(
        "repo",
        "--model",
        "demo",
        "--baseline",
        "",
        "--out",
        str(out),
        "--max-context",
        "256",
        "--max-tokens",
        "16",
        "--max-batch",
        "2",
        "--threads",
        "1",
    )
    return out


def _refused(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(5)
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _post_raw(port: int, body: bytes) -> None:
    """An HTTP/1.1 POST of `body` to any port (a gRPC port answers it as a bad HTTP/2 preface)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        head = (
            "POST /v2/models/dflash/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        try:
            sock.sendall(head.encode() + body)
            sock.recv(1024)
        except OSError:
            pass  # the port may close the connection: what matters is that it keeps serving


def test_serve_with_the_openai_api_keeps_triton_behind_it_and_survives_nested_bodies(repo):
    from trtllm_dflash.serving.server import free_port

    http, grpc, metrics, openai_port = (free_port() for _ in range(4))
    command = SERVE + [
        str(repo),
        "--http-port",
        str(http),
        "--grpc-port",
        str(grpc),
        "--metrics-port",
        str(metrics),
        "--openai-port",
        str(openai_port),
    ]
    process = subprocess.Popen(command, env={**os.environ, "COLUMNS": "250"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        deadline = time.monotonic() + 600  # only catches a hang; readiness is what is awaited
        while not any(line.strip().startswith("OpenAI") for line in lines):
            assert process.poll() is None and time.monotonic() < deadline, "".join(lines)
            lines.append(process.stdout.readline())
        output = "".join(lines)
        assert "HTTP     off (behind the OpenAI API" in output and _refused(http)
        found = re.search(r"admin\s+token for Triton.s restricted APIs in (\S+)", output)
        assert found, output
        token_file = found.group(1)
        assert os.stat(token_file).st_mode & 0o777 == 0o600
        url = f"http://127.0.0.1:{openai_port}"
        for port in (openai_port, grpc, metrics):
            for _ in range(7):
                _post_raw(port, NESTED)
        nested = httpx.post(f"{url}/v1/completions", content=NESTED, headers={"Content-Type": "application/json"}, timeout=60)
        assert nested.status_code == 400, nested.text
        answer = httpx.post(
            f"{url}/v1/completions", json={"model": "dflash", "prompt": "def f(", "max_tokens": 4, "temperature": 0}, timeout=300
        )
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4
        assert httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=30).status_code == 200
        assert "restart" not in output and process.poll() is None
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_a_network_host_with_the_openai_api_is_refused_in_one_line(repo):
    result = subprocess.run(SERVE + [str(repo), "--host", "0.0.0.0", "--openai-port", "18080"], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "would open Triton's ports beside the OpenAI API" in result.stdout + result.stderr

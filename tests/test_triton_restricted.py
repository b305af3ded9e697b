"""Triton's own admin APIs need the admin header, against a REAL tritonserver (no mocks).

One server per module: shared-memory registration over HTTP and gRPC, the log settings, trace
settings, statistics and (on HTTP) the repository index are refused without `dflash-admin-token:
TOKEN` and accepted with it; health, metadata, model config and inference answer without it.
TOKEN is random per server (never derived from an API key: issue 40 item 2), in a file only its
owner reads, and in no process's environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
import uuid

import pytest
from support import triton_server, write_repository
from typer.testing import CliRunner

from trtllm_dflash.cli.app import app
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.serving import triton_access
from trtllm_dflash.serving.triton_access import GRPC_RESTRICTED, HEADER, HTTP_RESTRICTED, grpc_headers, http_headers

API_KEY = "s3cret:key=with,odd chars"  # the token is hex, so any key makes a well-formed flag


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    # the DFlash model alone (no autoregressive baseline): one Python stub to start, not two
    return write_repository(tmp_path_factory.mktemp("repo") / "repository", max_context=256, max_tokens=64, baseline=False)


@pytest.fixture(scope="module")
def server(repo):
    with triton_server(repo) as running:
        yield running


def _http(server, method: str, path: str, body: dict | None = None, headers: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    request = urllib.request.Request(f"{server.endpoints.http}{path}", data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else {}
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


@pytest.fixture
def shm_region():
    """A real POSIX shared-memory region (name, key, size), destroyed after the test."""
    import tritonclient.utils.shared_memory as shm

    name, key = f"dflash_test_{uuid.uuid4().hex[:8]}", f"/dflash_test_{uuid.uuid4().hex}"
    handle = shm.create_shared_memory_region(name, key, 64)
    yield name, key, 64
    shm.destroy_shared_memory_region(handle)


def _environments_of_group(pgid: int) -> list[bytes]:
    """The environments of the server's processes (tritonserver and its stubs), as /proc shows them."""
    from trtllm_dflash.serving.server import process_group_members

    environments = []
    for pid in process_group_members(pgid):
        try:
            environments.append(open(f"/proc/{pid}/environ", "rb").read())
        except OSError:
            pass
    return environments


# ------------------------------------------------------------------ arguments (no server)


def test_default_flags_restrict_the_admin_groups_with_a_random_token(repo):
    from trtllm_dflash.serving.server import TritonServer

    server = TritonServer(repo, 18000, 18001, 18002)
    try:
        args, env = server.command()
    finally:
        server.stop()  # removes the backend folder command() prepared
    token = server.admin_token
    assert f"--http-restricted-api={','.join(HTTP_RESTRICTED)}:{HEADER}={token}" in args
    assert f"--grpc-restricted-protocol={','.join(GRPC_RESTRICTED)}:{HEADER}={token}" in args
    assert token not in "".join(env.values())
    for group in ("health", "metadata", "inference", "model-config"):
        assert group not in HTTP_RESTRICTED + GRPC_RESTRICTED
    assert {"shared-memory", "logging", "trace", "model-repository"} <= set(HTTP_RESTRICTED)
    assert {"shared-memory", "logging", "trace"} <= set(GRPC_RESTRICTED)


def test_the_token_is_random_per_server(repo):
    from trtllm_dflash.serving.server import TritonServer

    first, second = TritonServer(repo, 18000, 18001, 18002), TritonServer(repo, 18000, 18001, 18002)
    assert first.admin_token != second.admin_token and len(first.admin_token) == 64
    try:
        args, _ = first.command()
    finally:
        first.stop()
    assert f"--http-restricted-api={','.join(HTTP_RESTRICTED)}:{HEADER}={first.admin_token}" in args
    assert f"--grpc-restricted-protocol={','.join(GRPC_RESTRICTED)}:{HEADER}={first.admin_token}" in args


def test_groups_are_chosen_checked_or_turned_off(repo):
    from trtllm_dflash.serving.server import TritonServer

    chosen = TritonServer(repo, 18000, 18001, 18002, http_restricted="Logging, model-config", grpc_restricted="none", http=False)
    assert chosen.http_restricted == ("logging", "model-config") and chosen.grpc_restricted == ()
    assert triton_access.restriction_args(chosen.http_restricted, chosen.grpc_restricted, "t", with_http=False) == []
    assert triton_access.restriction_args((), ("trace",), "t") == [f"--grpc-restricted-protocol=trace:{HEADER}=t"]
    with pytest.raises(DFlashError, match="'logs' is not a Triton API group"):
        TritonServer(repo, 18000, 18001, 18002, http_restricted="logs")
    with pytest.raises(DFlashError, match="'health' cannot be restricted"):
        TritonServer(repo, 18000, 18001, 18002, grpc_restricted=["shared-memory", "health"])


def test_serve_refuses_an_unknown_group_in_one_line(repo, run_main):
    code, out, err = run_main("serve", str(repo), "--triton-restricted-http", "shared-memory,logz")
    assert code == 2
    assert "'logz' is not a Triton API group" in out + err
    assert "Traceback" not in out + err


def test_serve_help_says_what_stays_open():
    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "1000", "TERMINAL_WIDTH": "1000"})
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert f"Default: {', '.join(HTTP_RESTRICTED)}" in text
    assert f"Default: {', '.join(GRPC_RESTRICTED)}" in text
    assert "health, metadata, inference (/generate) and model-config stay open" in text
    assert "health, metadata, inference, model-config and model-repository stay open" in text


# ------------------------------------------------------------------ a real tritonserver


def test_http_shared_memory_registration_needs_the_token(server, shm_region):
    name, key, size = shm_region
    body = {"key": key, "offset": 0, "byte_size": size}
    path = f"/v2/systemsharedmemory/region/{name}/register"
    for headers in (None, {HEADER: API_KEY}, {HEADER: "x" + server.admin_token[1:]}):  # none, the raw key, a wrong token
        code, answer = _http(server, "POST", path, body, headers)
        assert code == 403 and HEADER in answer["error"], (headers, code, answer)
    assert _http(server, "POST", path, body, http_headers(server.admin_token))[0] == 200
    code, status = _http(server, "GET", "/v2/systemsharedmemory/status", headers=http_headers(server.admin_token))
    assert code == 200 and [r["name"] for r in status] == [name]
    assert _http(server, "POST", "/v2/systemsharedmemory/unregister", headers=http_headers(server.admin_token))[0] == 200


def test_grpc_shared_memory_registration_needs_the_token(server, shm_region):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    name, key, size = shm_region
    client = grpcclient.InferenceServerClient(server.endpoints.grpc)
    try:
        # none, the HTTP header name (gRPC wants Triton's prefix), the raw key
        for headers in (None, http_headers(server.admin_token), grpc_headers(API_KEY)):
            with pytest.raises(InferenceServerException, match="restricted"):
                client.register_system_shared_memory(name, key, size, headers=headers)
        client.register_system_shared_memory(name, key, size, headers=grpc_headers(server.admin_token))
        assert list(client.get_system_shared_memory_status(headers=grpc_headers(server.admin_token), as_json=True)["regions"]) == [name]
        client.unregister_system_shared_memory(headers=grpc_headers(server.admin_token))
    finally:
        client.close()


def test_logging_trace_statistics_and_repository_index_are_refused_without_the_token(server):
    refused = [
        ("POST", "/v2/logging", {"log_verbose_level": 1}),
        ("GET", "/v2/logging", None),
        ("GET", "/v2/trace/setting", None),
        ("POST", "/v2/trace/setting", {"trace_level": ["TIMESTAMPS"]}),
        ("GET", "/v2/models/stats", None),
        ("POST", "/v2/repository/index", None),
        ("POST", "/v2/repository/models/dflash/unload", None),
        ("GET", "/v2/cudasharedmemory/status", None),
        ("POST", "/v2/systemsharedmemory/unregister", None),
    ]
    for method, path, body in refused:
        code, answer = _http(server, method, path, body)
        assert code == 403 and HEADER in answer["error"], (method, path, code, answer)
    code, settings = _http(server, "GET", "/v2/logging", headers=http_headers(server.admin_token))
    assert code == 200 and settings["log_verbose_level"] == 0  # the refused POST changed nothing
    code, index = _http(server, "POST", "/v2/repository/index", headers=http_headers(server.admin_token))
    assert code == 200 and [m["name"] for m in index] == ["dflash"]


def test_grpc_logging_and_statistics_are_refused_without_the_token(server):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(server.endpoints.grpc)
    try:
        for call in (
            lambda h: client.update_log_settings({"log_verbose_level": 1}, headers=h),
            lambda h: client.get_trace_settings(headers=h),
            lambda h: client.get_inference_statistics("dflash", headers=h),
        ):
            with pytest.raises(InferenceServerException, match="restricted"):
                call(None)
            call(grpc_headers(server.admin_token))
        client.update_log_settings({"log_verbose_level": 0}, headers=grpc_headers(server.admin_token))
    finally:
        client.close()


def test_health_metadata_config_and_what_the_front_end_reads_stay_open(server):
    import tritonclient.grpc as grpcclient

    assert _http(server, "GET", "/v2/health/ready")[0] == 200
    assert _http(server, "GET", "/v2/models/dflash")[0] == 200
    code, config = _http(server, "GET", "/v2/models/dflash/config")
    assert code == 200 and "parameters" in config
    client = grpcclient.InferenceServerClient(server.endpoints.grpc)
    try:  # the OpenAI front end's discover(): repository index, model config and metadata, no header
        assert [m["name"] for m in client.get_model_repository_index(as_json=True)["models"]] == ["dflash"]
        assert "parameters" in client.get_model_config("dflash", as_json=True)["config"]
        assert client.get_model_metadata("dflash", as_json=True)["name"] == "dflash"
    finally:
        client.close()


def test_inference_works_without_the_token(server):
    from trtllm_dflash.serving.client import DFlashClient

    out = DFlashClient(server.endpoints.http, model="dflash", timeout=300).generate("def fib(n):", max_new_tokens=8, temperature=0.0)
    assert out.text and len(out.token_ids) == 8


def test_the_token_is_in_an_owner_only_file_and_in_no_environment(server):
    """The token file is the operator's way to the admin APIs; the module turns it into the header."""
    path = server.admin_token_path
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o077 == 0
    line = subprocess.run(
        [sys.executable, "-m", "trtllm_dflash.serving.triton_access", str(path)], capture_output=True, text=True, check=True
    ).stdout
    name, value = line.strip().split(": ", 1)
    assert {name: value} == http_headers(server.admin_token)
    assert _http(server, "GET", "/v2/logging", headers={name: value})[0] == 200
    environments = _environments_of_group(server.process.pid)
    assert environments and not any(server.admin_token.encode() in env for env in environments)
    refused = subprocess.run([sys.executable, "-m", "trtllm_dflash.serving.triton_access"], capture_output=True, text=True)
    assert refused.returncode == 2 and "TOKEN_FILE" in refused.stderr

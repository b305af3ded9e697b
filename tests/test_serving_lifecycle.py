"""What a server leaves behind, and where it may live (issue 30, items 2 and 6).

- `dflash-trt serve` killed with SIGKILL: within 20 s no process of its tritonserver is left, the
  ports are free and its shared memory is gone (the watchdog, serving/server_watch.py);
- a new server cleans what a dead owner's server left, never a live owner's (`clean_leftovers`);
- a repository whose path has a space and non-ASCII characters is served (tritonserver is given
  an ASCII link to it), checkpoints under such a path are refused by `repo` in one line, and a
  stub that dies while its model loads ends the start-up at once instead of after the timeout.
The serve test runs the real CLI and a real tritonserver.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from support import cli

from trtllm_dflash.serving import server_watch
from trtllm_dflash.serving.server import SHM_DIR, TritonServer, _port_free, free_port


@pytest.fixture(scope="module")
def odd_repo(tmp_path_factory) -> Path:
    """The demo pair's repository at a path with a space and non-ASCII characters."""
    out = tmp_path_factory.mktemp("lifecycle") / "my ü 日本 repo"
    cli("repo", "--model", "demo", "--out", str(out), "--max-context", "256", "--max-tokens", "32", "--max-batch", "2", "--threads", "1")
    return out


def _sleeper(tag: str) -> subprocess.Popen:
    """A process in its own group whose command line carries `tag` (a server's shm prefix)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", tag], start_new_session=True)


def _dead_owner() -> dict:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    start = server_watch.process_start_time(done.pid)
    done.wait()
    return {"pid": done.pid, "start_time": start}


def test_leftovers_of_a_dead_owner_are_cleaned_and_a_live_owners_are_not(tmp_path):
    dead_dir, live_dir = tmp_path / "dflash-tritonserver-dead", tmp_path / "dflash-tritonserver-live"
    stray, alive = _sleeper("dflash_trt_deadbeef_"), _sleeper("dflash_trt_livebeef_")
    try:
        for folder, owner, process, prefix in (
            (dead_dir, _dead_owner(), stray, "dflash_trt_deadbeef_"),
            (live_dir, {"pid": os.getpid(), "start_time": server_watch.process_start_time(os.getpid())}, alive, "dflash_trt_livebeef_"),
        ):
            (folder / "backends").mkdir(parents=True)
            (folder / "tritonserver.log").write_text("the log a user was pointed at\n")
            (folder / server_watch.OWNER_FILE).write_text(json.dumps({**owner, "server_pgid": process.pid, "shm_prefix": prefix}))
            (SHM_DIR / f"{prefix}region").write_bytes(b"x")
        assert server_watch.clean_leftovers(tmp_path) == [dead_dir]
        assert stray.wait(10) == -signal.SIGKILL
        assert not (SHM_DIR / "dflash_trt_deadbeef_region").exists()
        assert sorted(p.name for p in dead_dir.iterdir()) == ["tritonserver.log"]  # the log stays, the rest goes
        assert alive.poll() is None and (SHM_DIR / "dflash_trt_livebeef_region").exists()
        assert (live_dir / "backends").is_dir()
    finally:
        for process in (stray, alive):
            process.kill()
            process.wait()
        for name in ("dflash_trt_deadbeef_region", "dflash_trt_livebeef_region"):
            (SHM_DIR / name).unlink(missing_ok=True)


def test_serve_killed_leaves_nothing_and_an_odd_path_is_served(odd_repo, tmp_path):
    ports = [free_port(), free_port(), free_port()]
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # its working folder lands where this test can find it
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trtllm_dflash.cli.app",
            "serve",
            str(odd_repo),
            "--http-port",
            str(ports[0]),
            "--grpc-port",
            str(ports[1]),
            "--metrics-port",
            str(ports[2]),
        ],
        stdout=open(tmp_path / "serve.out", "wb"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    said = lambda: (tmp_path / "serve.out").read_text(errors="replace")  # noqa: E731
    try:
        url = f"http://127.0.0.1:{ports[0]}"
        deadline = time.monotonic() + 300
        while True:
            assert serve.poll() is None, said()
            assert time.monotonic() < deadline, f"serve was not ready in 300 s: {said()}"
            try:
                with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.5)
        request = urllib.request.Request(
            f"{url}/v2/models/dflash/generate",
            data=json.dumps({"text_input": "def fib(n):", "sampling_param_max_tokens": 8, "sampling_param_temperature": 0}).encode(),
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            assert len(json.loads(response.read())["output_ids"]) == 8
        (workdir,) = list(tmp_path.glob(f"{server_watch.WORKDIR_PREFIX}*"))
        owner = server_watch.read_owner(workdir)
        assert owner["pid"] == serve.pid and server_watch.server_processes(owner), said()

        serve.send_signal(signal.SIGKILL)  # no cleanup of its own runs
        serve.wait(10)
        killed = time.monotonic()

        def left() -> dict:
            return {
                "processes": server_watch.server_processes(owner),
                "busy ports": [p for p in ports if not _port_free(p)],
                "shared memory": [p.name for p in SHM_DIR.iterdir() if p.name.startswith(owner["shm_prefix"])],
                "files": sorted(p.name for p in workdir.iterdir() if p.name != "tritonserver.log"),  # the log stays
            }

        while any(left().values()):
            assert time.monotonic() - killed < 90, f"90 s after serve was killed, left: {left()}; serve said: {said()}"  # a hang
            time.sleep(0.2)
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGINT)
            serve.wait(60)


def test_checkpoints_under_a_non_ascii_path_are_refused_by_repo_in_one_line(tmp_path, run_main):
    from trtllm_dflash import demo

    odd = tmp_path / "ü 日本"
    odd.mkdir()
    (odd / "target").symlink_to(demo.target_dir(), target_is_directory=True)
    (odd / "drafter").symlink_to(demo.drafter_dir(), target_is_directory=True)
    out = tmp_path / "repo"
    code, stdout, stderr = run_main("repo", "--model", str(odd / "target"), "--drafter", str(odd / "drafter"), "--out", str(out))
    assert code != 0
    errors = [line for line in (stdout + stderr).splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "non-ASCII" in errors[0] and "ln -s" in errors[0], stdout + stderr
    assert not out.exists()


def test_a_stub_that_dies_while_loading_ends_the_start_at_once(odd_repo, monkeypatch):
    """The old way of handing Triton the repository (its path, unquoted in the stub's command
    line) kills the stub at start-up; the start must say so within seconds, not at the timeout."""
    server = TritonServer(odd_repo, free_port(), free_port(), free_port(), host="127.0.0.1", startup_timeout=120)
    monkeypatch.setattr(server, "served_repository", lambda: server.repository)
    # a busy machine: the stub dies before the start begins to watch the log (a loaded run once
    # missed its death, which was already logged, and waited for the whole startup timeout)
    write_owner = server_watch.write_owner
    monkeypatch.setattr(server_watch, "write_owner", lambda *args: (write_owner(*args), time.sleep(8)))
    started = time.monotonic()
    with pytest.raises(Exception, match="stub died while the repository was loading"):
        server.start()
    assert time.monotonic() - started < 60
    assert server.process is None


def test_free_port_never_names_a_port_it_just_gave(monkeypatch):
    """The kernel may hand the port it just released to the next bind; free_port asks again then."""
    from trtllm_dflash.serving import server

    ports = iter([41001, 41001, 41001, 41002, 41003])

    class Socket:  # a bind to port 0 that gets the ports above, in turn
        def __init__(self, *args):
            self.port = next(ports)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            pass

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(server, "_RECENT_PORTS", server.collections.deque(maxlen=64))
    monkeypatch.setattr(server.socket, "socket", Socket)
    assert [server.free_port(), server.free_port(), server.free_port()] == [41001, 41002, 41003]

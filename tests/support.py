"""Helpers the test modules share (`from support import cli`): one copy instead of one per file.

pytest puts tests/ on sys.path (no __init__.py: rootdir-relative imports), so this is a plain module.
`conftest.run_main` runs `main()`, which turns a DFlashError into one line and exit 2; these run the
Typer app instead, so a test sees the exception itself.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from typer.testing import CliRunner


def invoke(*args: str):
    """`dflash-trt ARGS` through Typer's test runner: the Result, exceptions caught into it."""
    from trtllm_dflash.cli.app import app

    return CliRunner().invoke(app, list(args))


def cli(*args: str) -> str:
    """`dflash-trt ARGS`, which must succeed; its output."""
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return result.output


@contextlib.contextmanager
def supervised_server(repo) -> Iterator:
    """A TritonServer run as `dflash-trt serve` runs it: supervise() (with its probe) in a thread,
    its log lines in `supervision_log` and what made it give up in `supervision_errors`. On exit:
    supervision has ended without an error and nothing of the server is left (processes, /dev/shm)."""
    from trtllm_dflash.serving.server import TritonServer, free_port, process_group_members

    server = TritonServer(repo, free_port(), free_port(), free_port(), host="127.0.0.1", startup_timeout=600)
    server.start()
    server.supervision_log, server.supervision_errors, stop = [], [], threading.Event()

    def supervise() -> None:
        try:
            server.supervise(log=server.supervision_log.append, stop_event=stop, poll=0.2)
        except Exception as exc:  # noqa: BLE001 - reported on exit
            server.supervision_errors.append(exc)

    thread = threading.Thread(target=supervise, name="supervise", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stop.set()
        thread.join(120)
        group = server.process.pid if server.process is not None else None
        server.stop()
    assert not thread.is_alive() and not server.supervision_errors, server.supervision_errors
    assert server.shm_files() == []  # a stopped server leaves nothing in /dev/shm
    if group is not None:
        assert process_group_members(group) == []

"""Helpers the test modules share (`from support import cli`): one copy instead of one per file.

pytest puts tests/ on sys.path (no __init__.py: rootdir-relative imports), so this is a plain module.
`conftest.run_main` runs `main()`, which turns a DFlashError into one line and exit 2; these run the
Typer app instead, so a test sees the exception itself.
"""

from __future__ import annotations

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

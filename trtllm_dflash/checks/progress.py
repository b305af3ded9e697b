"""A pytest plugin (`pytest -p trtllm_dflash.checks.progress`) that logs each test as it runs.

Why: the GPU check runs its tests under a time limit. pytest prints its summary only at the
end, so a run stopped at the limit said nothing but "did not finish". This plugin appends one
JSON line per event to the file named by $DFLASH_SELFTEST_PROGRESS, flushed at once: how many
tests were collected, each test's start, and each test's outcome and duration (setup, call and
teardown together) when it finishes. Whoever stopped pytest reads the file afterwards
(`runs.read_progress`). Without the variable it does nothing.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

PROGRESS_ENV = "DFLASH_SELFTEST_PROGRESS"

_tests: dict[str, dict[str, Any]] = {}  # nodeid -> outcome and seconds so far


def write_event(record: dict[str, Any]) -> None:
    """Append one event to the progress file (a no-op without $DFLASH_SELFTEST_PROGRESS)."""
    path = os.environ.get(PROGRESS_ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({**record, "time": time.time()}) + "\n")
        f.flush()


def pytest_collection_finish(session) -> None:
    write_event({"event": "collected", "count": len(session.items)})


def pytest_collectreport(report) -> None:
    if report.failed:
        write_event({"event": "finish", "test": report.nodeid, "outcome": "error", "seconds": 0.0, "error": "collection failed"})


def pytest_runtest_logstart(nodeid: str, location) -> None:
    _tests[nodeid] = {"outcome": "passed", "seconds": 0.0, "error": ""}
    write_event({"event": "start", "test": nodeid})


def pytest_runtest_logreport(report) -> None:
    test = _tests.setdefault(report.nodeid, {"outcome": "passed", "seconds": 0.0, "error": ""})
    test["seconds"] += report.duration
    if report.failed:
        test["outcome"] = "failed" if report.when == "call" else "error"
        test["error"] = _failure_line(report)
    elif report.skipped and test["outcome"] == "passed":
        test["outcome"] = "skipped"


def _failure_line(report) -> str:
    """The first line of what failed ("assert 1 == 2", "RuntimeError: ..."), as pytest's summary shows it."""
    crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", None)
    text = crash if crash else str(report.longreprtext).strip()
    return (text.strip().splitlines() or [""])[0][:300]


def pytest_runtest_logfinish(nodeid: str, location) -> None:
    test = _tests.pop(nodeid, {"outcome": "passed", "seconds": 0.0, "error": ""})
    write_event({"event": "finish", "test": nodeid, **test})

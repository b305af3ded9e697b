"""Subprocesses of the GPU check that report as they go, and what is known when one is stopped.

Why: the check's test and warm-up steps run under time limits. A subprocess that reports only
when it exits says nothing when it is stopped at the limit. Here each subprocess appends one
JSON line per event to a progress file of its own (the pytest plugin `progress`, or the
warm-up workers, in the same format); the parent reads the files while the subprocesses run
(each finished test or case is passed to a callback at once) and after it stopped them, so a
stopped step still lists what finished, in how long, and what was running.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from trtllm_dflash.checks.progress import PROGRESS_ENV

POLL_S = 0.25
OUTCOMES = ("passed", "failed", "error", "skipped")


@dataclasses.dataclass(frozen=True)
class TestRecord:
    """One finished test (or warm-up case)."""

    test: str
    outcome: str  # passed, failed, error or skipped
    seconds: float
    error: str = ""  # the last line of a failure


@dataclasses.dataclass
class Progress:
    """What progress files said: tests collected, finished (in order) and started but not finished."""

    collected: int | None = None
    finished: list[TestRecord] = dataclasses.field(default_factory=list)
    running: dict[str, float] = dataclasses.field(default_factory=dict)  # test -> time.time() it started

    def counts(self) -> dict[str, int]:
        """Finished tests per outcome, in OUTCOMES order, outcomes that occurred only."""
        counted = {outcome: sum(r.outcome == outcome for r in self.finished) for outcome in OUTCOMES}
        return {outcome: n for outcome, n in counted.items() if n}

    def merge(self, other: "Progress") -> None:
        if other.collected is not None:
            self.collected = (self.collected or 0) + other.collected
        self.finished += other.finished
        self.running.update(other.running)


def read_progress(path: Path) -> Progress:
    """Parse one progress file; a line cut short by a killed writer is ignored."""
    progress = Progress()
    if not path.is_file():
        return progress
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        kind = event.get("event")
        if kind == "collected":
            progress.collected = int(event["count"])
        elif kind == "start":
            progress.running[event["test"]] = float(event.get("time", 0.0))
        elif kind == "finish":
            progress.running.pop(event["test"], None)
            record = TestRecord(event["test"], event["outcome"], float(event.get("seconds", 0.0)), event.get("error", ""))
            progress.finished.append(record)
    return progress


@dataclasses.dataclass
class LimitedRun:
    """Subprocesses run in parallel under one time limit."""

    returncodes: list[int | None]  # None: stopped at the limit
    output: str  # stdout and stderr of all of them, one after the other
    progress: Progress
    seconds: float
    limit_s: float
    stopped_at: float  # time.time() when they ended or were stopped

    @property
    def timed_out(self) -> bool:
        return any(code is None for code in self.returncodes)

    def running_for(self) -> list[tuple[str, float]]:
        """(test, seconds it had been running) of the tests still running when they were stopped."""
        started = sorted(self.progress.running.items(), key=lambda item: item[1])
        return [(test, max(self.stopped_at - since, 0.0)) for test, since in started]


def run_with_progress(
    commands: Sequence[Sequence[str]],
    cwd: Path,
    limit_s: float,
    on_finish: Callable[[TestRecord], None] | None = None,
    env: dict[str, str] | None = None,
) -> LimitedRun:
    """Run `commands` in parallel, each told its progress file by $DFLASH_SELFTEST_PROGRESS; pass
    every finished test to `on_finish` as it finishes; stop them all (their process groups) at
    `limit_s`. Returns whatever they reported either way."""
    with tempfile.TemporaryDirectory(prefix="dflash-selftest-run-") as folder:
        folder_path = Path(folder)
        progress_files = [folder_path / f"progress-{i}.jsonl" for i in range(len(commands))]
        output_files = [folder_path / f"output-{i}.txt" for i in range(len(commands))]
        processes = []
        started = time.perf_counter()
        for command, progress_file, output_file in zip(commands, progress_files, output_files):
            with output_file.open("w") as out:
                processes.append(
                    subprocess.Popen(
                        list(command),
                        cwd=cwd,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        env={**os.environ, **(env or {}), PROGRESS_ENV: str(progress_file)},
                    )
                )
        delivered: list[int] = [0] * len(commands)

        def deliver() -> None:
            for i, progress_file in enumerate(progress_files):
                finished = read_progress(progress_file).finished
                for record in finished[delivered[i] :]:
                    if on_finish is not None:
                        on_finish(record)
                delivered[i] = len(finished)

        try:
            while any(p.poll() is None for p in processes) and time.perf_counter() - started < limit_s:
                deliver()
                time.sleep(POLL_S)
        finally:  # also on Ctrl-C: their own sessions do not get the terminal's signal
            stopped_at = time.time()
            returncodes: list[int | None] = []
            for process in processes:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)  # pytest and whatever it started
                    process.wait()
                    returncodes.append(None)
                else:
                    returncodes.append(process.returncode)
        seconds = time.perf_counter() - started
        deliver()
        progress = Progress()
        for progress_file in progress_files:
            progress.merge(read_progress(progress_file))
        output = "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in output_files)
    return LimitedRun(returncodes, output, progress, seconds, limit_s, stopped_at)


# ------------------------------------------------------------------------------------- report


def counts_text(progress: Progress) -> str:
    """ "57 of 120 finished: 50 passed, 2 failed, 5 skipped" (the "of" where the total is known)."""
    total = f" of {progress.collected}" if progress.collected is not None else ""
    counted = ", ".join(f"{n} {outcome}" for outcome, n in progress.counts().items()) or "none"
    return f"{len(progress.finished)}{total} finished: {counted}"


def stopped_text(run: LimitedRun, what: str = "pytest") -> str:
    """One line for a run stopped at its limit: what finished, and what was running for how long."""
    running = "; ".join(f"{test} (running for {seconds:.0f} s)" for test, seconds in run.running_for()) or "nothing (between tests)"
    return f"{what} stopped at its {run.limit_s:.0f} s limit: {counts_text(run.progress)}; running when stopped: {running}"


def records_table(records: Sequence[TestRecord], running: Sequence[tuple[str, float]] = ()) -> str:
    """Markdown table of tests with their result and time, the ones stopped while running last."""
    lines = ["| test | result | time |", "|---|---|---:|"]
    for r in records:
        result = r.outcome + (f": {r.error}" if r.error and r.outcome in ("failed", "error") else "")
        lines.append(f"| `{r.test}` | {result.replace('|', '/')} | {r.seconds:.1f} s |")
    for test, seconds in running:
        lines.append(f"| `{test}` | **stopped while running** | {seconds:.1f} s |")
    return "\n".join(lines) + "\n"


def slowest(records: Sequence[TestRecord], count: int = 10) -> list[TestRecord]:
    return sorted(records, key=lambda r: r.seconds, reverse=True)[:count]

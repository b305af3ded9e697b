"""Stage directories that are either complete or absent.

Each stage writes into a hidden temporary directory next to its final place, writes its
`stage.json` (inputs key, outputs with digests) last, and is renamed into place in one step.
Ctrl-C, a crash or an exception removes the temporary directory (and a killed process leaves
only a hidden `.name.tmp-*` directory that no later run trusts and the next run deletes), so
a stage directory with a `stage.json` whose key matches is always a finished stage. A stage whose
key (recipe fields + upstream output digests + tool versions) is unchanged is skipped.

The runner reports each change (a stage about to run, finished, blocked, failed) so that the
build's manifest.json always says which planned stages are finished: a killed build leaves its
running stage recorded as `running`, never a manifest that calls the build complete. A full disk
(ENOSPC, EDQUOT) anywhere in a stage becomes one line (OutOfSpace) instead of a crash report.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable, Protocol

from trtllm_dflash.builder.manifest import files_digest, now, read_json, sha256_json, write_json_atomic
from trtllm_dflash.builder.stage_plan import size
from trtllm_dflash.errors import DFlashError, MissingDependencyError

STAGE_FILE = "stage.json"


class StageBlocked(MissingDependencyError):
    """A stage that cannot run on this machine (no GPU, no TensorRT): the build stops cleanly here."""


class OutOfSpace(DFlashError):
    """The disk (or quota) of the output ran out during a stage: one line, not a crash report."""


SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
SPACE_MESSAGES = ("No space left on device", "Disk quota exceeded")


def space_error(exc: BaseException) -> OSError | BaseException | None:
    """The out-of-space error behind `exc` (itself, a cause or a context), else None.

    Libraries wrap write failures (torch's `inline_container` RuntimeError, onnx's save), so the
    chain is walked and, failing an errno, the message is matched."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in SPACE_ERRNOS:
            return current
        if any(text in str(current) for text in SPACE_MESSAGES):
            return current
        current = current.__cause__ or current.__context__
    return None


def out_of_space(error: BaseException, what: str, out: Path, needed: str | None = None) -> OutOfSpace:
    """One line for a full disk: the directory that filled (the --out directory for anything under
    it, else the file's own folder), the space the step needs when the plan knows it, else the space free."""
    filename = getattr(error, "filename", None)
    directory = Path(out)
    if filename:
        path = Path(os.fsdecode(filename)).expanduser().absolute()
        if not path.is_relative_to(directory):
            directory = path.parent
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = f"{size(shutil.disk_usage(probe).free)} free there now"  # as the plan writes the stage sizes
    except OSError:
        free = "free space unknown"
    kind = "disk quota exceeded" if isinstance(error, OSError) and error.errno == errno.EDQUOT else "no space left on device"
    space = f"it needs {needed}; {free}" if needed else free
    return OutOfSpace(
        f"{kind} in {directory} during {what} ({space})",
        "free space there (or pass another --out) and rerun the same command: finished stages are kept and skipped",
    )


class Reporter(Protocol):
    """What the runner tells the user (the CLI implements it with rich).

    `status(text, done, total)`: what a stage is doing now and, inside a counted loop (graphs
    exported, engines built, calibration samples), how many of `total` are finished: a long
    stage is never one silent line."""

    def stage_started(self, stage: "Stage") -> None: ...
    def stage_skipped(self, stage: "Stage", record: dict) -> None: ...
    def stage_finished(self, stage: "Stage", record: dict) -> None: ...
    def stage_blocked(self, stage: "Stage", error: StageBlocked) -> None: ...
    def stage_failed(self, stage: "Stage", error: BaseException) -> None: ...
    def status(self, text: str, done: int | None = None, total: int | None = None) -> None: ...


class SilentReporter:
    def stage_started(self, stage):
        pass

    def stage_skipped(self, stage, record):
        pass

    def stage_finished(self, stage, record):
        pass

    def stage_blocked(self, stage, error):
        pass

    def stage_failed(self, stage, error):
        pass

    def status(self, text, done=None, total=None):
        pass


@dataclasses.dataclass
class StageContext:
    """What a running stage sees: its (temporary) directory and the finished upstream stages."""

    workdir: Path
    out: Path
    upstream: dict[str, dict]
    reporter: Reporter

    def upstream_dir(self, name: str) -> Path:
        return self.out / name

    def status(self, text: str, done: int | None = None, total: int | None = None) -> None:
        """Say what the stage does now; `done` of `total` inside a counted loop."""
        self.reporter.status(text, done, total)


@dataclasses.dataclass
class Stage:
    """One step of the build. `run` fills ctx.workdir and returns a JSON-able summary."""

    name: str
    title: str
    run: Callable[[StageContext], dict[str, Any] | None]
    inputs: dict[str, Any] = dataclasses.field(default_factory=dict)
    depends: tuple[str, ...] = ()  # must be complete; their outputs enter this stage's key
    uses: tuple[str, ...] = ()  # read when complete (and then part of the key), else done without
    size: str | None = None  # the plan's estimate of what it writes ("~6.6 MB"), named when the disk fills


@dataclasses.dataclass
class BuildResult:
    """Where a build stands: what the manifest records after every change.

    `planned` is every stage the build runs (the stage list the plan produced, in order); the
    build is complete only when each of them is finished, so a run cut short never reads as done."""

    records: dict[str, dict]
    blocked: dict[str, StageBlocked] = dataclasses.field(default_factory=dict)
    not_run: dict[str, str] = dataclasses.field(default_factory=dict)  # stage -> the unfinished stage it needs
    planned: list[str] = dataclasses.field(default_factory=list)
    running: dict[str, str] = dataclasses.field(default_factory=dict)  # stage -> when it started (at most one)
    failed: dict[str, str] = dataclasses.field(default_factory=dict)  # stage -> one line saying why

    @property
    def complete(self) -> bool:
        planned = self.planned or list(self.records)
        return all(name in self.records for name in planned) and not self.blocked and not self.not_run and not self.failed

    @property
    def first_blocked(self) -> tuple[str, StageBlocked] | None:
        return next(iter(self.blocked.items()), None)


def prepare_out_dir(out: Path) -> Path:
    """Create the output directory, refusing files and read-only locations with one line."""
    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise DFlashError(f"--out {out} is a file, not a directory", "pass a directory path (it is created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{uuid.uuid4().hex[:8]}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise DFlashError(
            f"cannot write to the output directory {out} ({exc.strerror or exc})",
            "choose a writable --out location",
        ) from None
    return out.resolve()


class StageRunner:
    """Runs stages in order into `out`, skipping the unchanged ones."""

    def __init__(self, out: Path, reporter: Reporter | None = None, force: bool = False) -> None:
        self.out = prepare_out_dir(out)
        self.reporter = reporter or SilentReporter()
        self.force = force
        self._lock_handle = None

    # ------------------------------------------------------------------ locking and cleanup

    def __enter__(self) -> "StageRunner":
        self._lock_handle = open(self.out / ".build.lock", "w")
        try:
            fcntl.flock(self._lock_handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_handle.close()
            raise DFlashError(f"another build is writing to {self.out}", "wait for it to finish or use another --out") from None
        for leftover in list(self.out.glob(".*.tmp-*")) + list(self.out.glob(".*.old-*")):
            shutil.rmtree(leftover, ignore_errors=True)  # from a killed run; never trusted
        return self

    def __exit__(self, *exc_info) -> None:
        if self._lock_handle is not None:
            fcntl.flock(self._lock_handle, fcntl.LOCK_UN)
            self._lock_handle.close()

    # ------------------------------------------------------------------ stages

    @staticmethod
    def upstream(stage: Stage, records: dict[str, dict]) -> dict[str, str]:
        names = list(stage.depends) + [n for n in stage.uses if n in records]
        return {name: records[name]["outputs_sha256"] for name in names}

    def key(self, stage: Stage, records: dict[str, dict]) -> str:
        return sha256_json({"stage": stage.name, "inputs": stage.inputs, "upstream": self.upstream(stage, records)})

    def completed(self, name: str, key: str | None = None) -> dict | None:
        """The record of a finished stage directory (with a matching key, if given)."""
        record = read_json(self.out / name / STAGE_FILE)
        if not isinstance(record, dict) or (key is not None and record.get("key") != key):
            return None
        for rel, info in record.get("files", {}).items():
            path = self.out / name / rel
            if not path.is_file() or path.stat().st_size != info["bytes"]:
                return None
        return record

    def run_stage(self, stage: Stage, records: dict[str, dict], starting: Callable[[str], None] | None = None) -> dict:
        """Run (or skip) one stage; `starting(started)` is called before any of its work, so the
        manifest says `running` while it runs and a kill leaves it so."""
        key = self.key(stage, records)
        if not self.force:
            record = self.completed(stage.name, key)
            if record is not None:
                self.reporter.stage_skipped(stage, record)
                return record
        started = now()
        if starting is not None:
            starting(started)
        self.reporter.stage_started(stage)
        workdir = self.out / f".{stage.name}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            workdir.mkdir()
            upstream = self.upstream(stage, records)
            ctx = StageContext(workdir, self.out, {n: records[n] for n in upstream}, self.reporter)
            summary = stage.run(ctx) or {}
            files = files_digest(workdir)
            record = {
                "stage": stage.name,
                "key": key,
                "inputs": stage.inputs,
                "upstream": upstream,
                "summary": summary,
                "files": files,
                "outputs_sha256": sha256_json({"files": files, "summary": summary}),
                "started": started,
                "finished": now(),
            }
            write_json_atomic(workdir / STAGE_FILE, record)
            self._swap_into_place(workdir, self.out / stage.name)
        except BaseException as exc:
            shutil.rmtree(workdir, ignore_errors=True)  # before measuring the free space: what a rerun has
            if isinstance(exc, StageBlocked):
                self.reporter.stage_blocked(stage, exc)
                raise
            self.reporter.stage_failed(stage, exc)
            # a DFlashError already is one line (and may name another place, e.g. a download's cache)
            full = space_error(exc) if isinstance(exc, Exception) and not isinstance(exc, DFlashError) else None
            if full is not None:
                raise out_of_space(full, f"the {stage.name} stage", self.out, stage.size) from None
            raise
        self.reporter.stage_finished(stage, record)
        return record

    def _swap_into_place(self, workdir: Path, final: Path) -> None:
        old = None
        if final.exists():
            old = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
            os.rename(final, old)
        os.rename(workdir, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def run(self, stages: list[Stage], on_change: Callable[["BuildResult"], None] | None = None) -> BuildResult:
        """Run stages in order. A stage this machine cannot run is recorded as blocked and the
        build goes on with the stages that do not need it, then stops cleanly.

        `on_change(result)` (the manifest writer) runs before a stage starts and after it ends,
        finished or not: a failed or interrupted stage is recorded as failed before the error goes
        on, and a killed process leaves it recorded as running."""
        result = BuildResult({}, planned=[stage.name for stage in stages])

        def report() -> None:
            if on_change is None:
                return
            try:
                on_change(result)
            except Exception as exc:  # noqa: BLE001 - a full disk while writing the manifest: one line
                full = space_error(exc)
                if full is None:
                    raise
                raise out_of_space(full, "the write of manifest.json", self.out) from None

        def starting(stage: Stage, started: str) -> None:
            result.running = {stage.name: started}
            report()

        for stage in stages:
            missing = [name for name in stage.depends if name not in result.records]
            if missing:
                result.not_run[stage.name] = missing[0]
                report()
                continue
            try:
                result.records[stage.name] = self.run_stage(stage, result.records, lambda started, s=stage: starting(s, started))
            except StageBlocked as blocked:
                result.blocked[stage.name] = blocked
            except BaseException as exc:
                result.failed[stage.name] = (
                    "interrupted" if isinstance(exc, KeyboardInterrupt) else ((str(exc).strip().splitlines() or [type(exc).__name__])[0])
                )
                result.running = {}
                try:
                    report()
                except Exception:  # noqa: BLE001 - the manifest on disk still says `running`: incomplete either way
                    pass
                raise
            result.running = {}
            report()
        return result

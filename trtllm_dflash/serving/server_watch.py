"""Nothing of a tritonserver outlives the process that started it.

Why: `dflash-trt serve` killed by SIGKILL (an OOM kill, a container stop after its grace period)
runs no cleanup, and tritonserver runs in its own session, so it and its Python backend stubs
lived on, holding the ports and /dev/shm regions (one orphaned stub ignored SIGTERM for an hour).

Two guards, both keyed by the server's working folder (/tmp/dflash-tritonserver-*), whose
`owner.json` names the process that started the server, the server's process group and its
shared-memory prefix:
- a watchdog process (`python -m trtllm_dflash.serving.server_watch FOLDER`, started by
  `TritonServer.start`) waits on a pipe only the owner holds open. When the owner dies, however it
  dies, the pipe closes and the watchdog kills the server's process group, removes its shm
  regions and its folder. Standard library only, so it starts in a few milliseconds;
- `clean_leftovers` (every `TritonServer.start`) does the same for any folder whose owner is dead
  and whose watchdog did not run (killed with it), and never touches a live owner's.
A process is only killed when its command line carries the server's shm prefix: a process group
id can be reused once its processes are gone.

It also holds what `TritonServer.supervise` judges a server by (below `stop_watchdog`): the
restart budget (`RestartBudget`), the notes each model process keeps of the last request it
received (`RequestNotes`, so a crash can name the request before it), and the periodic probe
that finds a model process which stopped answering (`ModelProbe`). Top-level imports stay in the
standard library: the watchdog must start in milliseconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

OWNER_FILE = "owner.json"
WORKDIR_PREFIX = "dflash-tritonserver-"
SHM_DIR = Path("/dev/shm")


def process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc), None where it is gone.

    With the pid it identifies a process across pid reuse."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[19]) if fields[0] != "Z" else None  # field 22 of stat; zombies count as gone


def write_owner(workdir: Path, server_pgid: int, shm_prefix: str) -> None:
    """Record who owns the server in `workdir` (rewritten at each start: a restart has a new group)."""
    owner = {"pid": os.getpid(), "start_time": process_start_time(os.getpid()), "server_pgid": server_pgid, "shm_prefix": shm_prefix}
    temporary = workdir / f".{OWNER_FILE}.tmp"
    temporary.write_text(json.dumps(owner))
    temporary.replace(workdir / OWNER_FILE)


def read_owner(workdir: Path) -> dict | None:
    try:
        owner = json.loads((workdir / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) and isinstance(owner.get("shm_prefix"), str) and owner["shm_prefix"] else None


def owner_alive(owner: dict) -> bool:
    start = process_start_time(int(owner.get("pid", 0) or 0))
    return start is not None and start == owner.get("start_time")


def process_group_members(pgid: int) -> list[int]:
    """Pids of the live processes in a process group (Linux /proc; empty where there is none)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:  # state, ppid, pgrp
            members.append(int(stat.parent.name))
    return members


def server_processes(owner: dict) -> list[int]:
    """Live processes of the recorded server: its group's members whose command line names its shm prefix."""
    pgid, prefix, found = int(owner.get("server_pgid", 0) or 0), owner["shm_prefix"].encode(), []
    for pid in process_group_members(pgid) if pgid > 0 else []:
        try:
            if prefix in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def shm_regions(prefix: str) -> list[Path]:
    """The /dev/shm files of the server whose Python backend names its regions `prefix`<uuid>."""
    try:
        return sorted(p for p in SHM_DIR.iterdir() if p.name.startswith(prefix))
    except OSError:
        return []


def remove_shm_regions(prefix: str) -> list[str]:
    """Remove a stopped server's shared-memory regions; the names of those removed."""
    removed = []
    for path in shm_regions(prefix):
        try:
            path.unlink()
            removed.append(path.name)
        except OSError:  # gone already, or not ours to remove
            pass
    return removed


def remove_server(workdir: Path, owner: dict, keep: tuple[str, ...] = ()) -> list[str]:
    """Kill the recorded server's processes, remove its shm regions and its folder (except `keep`).

    Returns the names of the shared-memory files removed."""
    for pid in server_processes(owner):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + 10
    while server_processes(owner) and time.monotonic() < deadline:
        time.sleep(0.05)
    removed = remove_shm_regions(owner["shm_prefix"])
    remove_workdir(workdir, keep)
    return removed


def remove_workdir(workdir: Path, keep: tuple[str, ...] = ()) -> None:
    """The folder without what it was made for (backends, the python-bin links, owner.json); the
    folder itself too unless it holds one of `keep` (a log the user was told about)."""
    try:
        entries = list(workdir.iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.name in keep:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            try:
                entry.unlink()
            except OSError:
                pass
    try:
        workdir.rmdir()  # only when empty
    except OSError:
        pass


def clean_leftovers(root: Path | None = None) -> list[Path]:
    """Remove what servers of dead owners left under `root` (the temp folder); the folders cleaned."""
    root = Path(root or tempfile.gettempdir())
    cleaned = []
    for workdir in sorted(root.glob(f"{WORKDIR_PREFIX}*")):
        owner = read_owner(workdir)
        if owner is None or owner_alive(owner):
            continue
        remove_server(workdir, owner, keep=tuple(p.name for p in workdir.glob("*.log")))
        cleaned.append(workdir)
    return cleaned


def start_watchdog(workdir: Path) -> subprocess.Popen:
    """The watchdog of the server in `workdir`; it acts when this process (its pipe's only writer) ends.

    Close its stdin (`stop_watchdog`) to end it after a clean stop."""
    return subprocess.Popen(
        [sys.executable, "-m", "trtllm_dflash.serving.server_watch", str(workdir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C or kill of the owner's process group does not reach it
    )


def stop_watchdog(watchdog: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """End a watchdog after its server stopped cleanly (it then only removes the folder's leftovers)."""
    if watchdog is None:
        return
    try:
        watchdog.stdin.close()
        watchdog.wait(timeout)
    except (OSError, subprocess.TimeoutExpired):
        watchdog.kill()


# ---------------------------------------------------------------------- what supervise() judges by

RETRY_FIRST_S = 1.0  # a restart that fails is retried after 1, 2, 4 ... s
RETRY_CAP_S = 30.0
NOTES_ENV = "DFLASH_TRT_NOTES_DIR"  # the folder where each model process keeps its RequestNotes
NOTE_PREFIX = "last-request-"
NOTE_BYTES = 64  # one fixed-size record, rewritten in place
FINGERPRINT_BYTES = 4096  # of the prompt (text, or token ids as int64)
PROBE_INTERVAL_S = 1.0
PROBE_TIMEOUT_S = 5.0
STUB_UNHEALTHY = "is not healthy"  # the Python backend's answer when a stub does not respond within ~1 s
STALL_STRIKES = 3  # failed probes in a row that make a running (not stopped) stub stalled
STOPPED_STATES = ("T", "t")  # stopped by a signal, stopped by a tracer
BUSY_CPU_SHARE = 0.05  # a probe unanswered while its model used this share of a core: busy, not stalled


def request_fingerprint(name: str, prompt: bytes) -> str:
    """12 hex digits of SHA-256 over an input's name and the first 4 KiB of the prompt: the same
    prompt gives the same fingerprint on every server, and a log line does not show the prompt."""
    return hashlib.sha256(name.encode() + b"\0" + prompt[:FINGERPRINT_BYTES]).hexdigest()[:12]


class RequestNotes:
    """Kept in each served model's process (the repository's model.py calls `record` in execute):
    the fingerprint and time of the last request it received, in <$DFLASH_TRT_NOTES_DIR>/last-request-<model>.

    Why a file: a process that crashes or stalls cannot say what it was doing; the note outlives
    it, and supervise() reads it to name the request before a crash. One pwrite per batch of
    requests; off (a no-op) where the server was not started by TritonServer."""

    def __init__(self, model: str) -> None:
        self.fd: int | None = None
        folder = os.environ.get(NOTES_ENV)
        if folder:
            try:
                self.fd = os.open(Path(folder) / f"{NOTE_PREFIX}{model}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            except OSError:
                pass

    def record(self, requests: list) -> None:
        """Note the last of `requests` (pb_utils.InferenceRequest) with a prompt (a probe has none); never raises."""
        if self.fd is None:
            return
        try:
            import triton_python_backend_utils as pb_utils

            for request in reversed(requests):
                fingerprint = _fingerprint_of(pb_utils, request)
                if fingerprint is not None:
                    os.pwrite(self.fd, f"{fingerprint} {time.time():.3f}".ljust(NOTE_BYTES).encode(), 0)
                    return
        except Exception:  # noqa: BLE001 - a note must never cost a request
            pass


def _fingerprint_of(pb_utils: Any, request: Any) -> str | None:
    for name in ("input_ids", "text_input"):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is None:
            continue
        array = tensor.as_numpy().reshape(-1)
        if name == "input_ids":
            return request_fingerprint(name, array[: FINGERPRINT_BYTES // 8].astype("<i8").tobytes())
        value = array[0] if array.size else b""
        return request_fingerprint(name, value if isinstance(value, bytes) else str(value).encode())
    return None


def last_request(workdir: Path, models: list[str]) -> tuple[str, str, float] | None:
    """(model, fingerprint, time.time() it came) of the latest request these models' processes
    noted since they started (RequestNotes); None when none did."""
    latest = None
    for model in models:
        try:
            fingerprint, at = (workdir / f"{NOTE_PREFIX}{model}").read_text().split()
            note = (model, fingerprint, float(at))
        except (OSError, ValueError):
            continue
        if latest is None or note[2] > latest[2]:
            latest = note
    return latest


def clear_notes(workdir: Path) -> None:
    """Forget the notes of a server that died (a new model process starts its own)."""
    for path in workdir.glob(f"{NOTE_PREFIX}*"):
        path.unlink(missing_ok=True)


class RestartBudget:
    """At most `limit` restarts within `window` seconds, where deaths that follow the same request
    fingerprint count once: a client that resends a request which crashes the server cannot spend
    the budget. Deaths with no request noted, and failed restarts, count each time."""

    def __init__(self, limit: int, window: float) -> None:
        self.limit, self.window = limit, window
        self.events: deque[tuple[float, str | None]] = deque()  # (monotonic time, fingerprint or None)

    def spend(self, now: float, fingerprint: str | None = None) -> bool:
        """Record a death or a failed restart; False when it does not count (its fingerprint did already)."""
        while self.events and now - self.events[0][0] > self.window:
            self.events.popleft()
        repeat = fingerprint is not None and any(seen == fingerprint for _, seen in self.events)
        self.events.append((now, fingerprint))
        return not repeat

    def used(self) -> int:
        """Restarts counted in the window: each with no fingerprint, and each fingerprint once."""
        named = {fingerprint for _, fingerprint in self.events if fingerprint is not None}
        return sum(1 for _, fingerprint in self.events if fingerprint is None) + len(named)

    def exhausted(self) -> bool:
        return self.used() > self.limit

    def describe(self) -> str:
        return f"restart {self.used()} of at most {self.limit} per {self.window / 60:g} min"


def process_state(pid: int) -> str:
    """The state letter /proc shows for `pid` (R running, S sleeping, T stopped, ...); "" if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def cpu_seconds(pids: list[int]) -> float:
    """CPU time (user + system) the processes used so far, from /proc; gone ones count 0."""
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat
        except (OSError, IndexError, ValueError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


class ModelProbe:
    """One thread per model of a running TritonServer, each sending its model a one-token request
    (gRPC, the `health_probe` input: answered by the model process, nothing decoded) every `interval` seconds.

    Why: a model process that stops answering (SIGSTOP, a deadlock) is neither dead nor reported
    not ready by Triton; unprobed, /health says 200 while every request to it fails. A model is
    stalled when Triton answers the probe that its stub "is not healthy" (the Python backend finds
    that within ~1 s), or when no answer comes within `timeout` while its process used (almost) no
    CPU: a model busy with a full batch queues the probe but works, and must not be restarted."""

    def __init__(self, server: Any, interval: float = PROBE_INTERVAL_S, timeout: float = PROBE_TIMEOUT_S) -> None:
        self.server, self.interval, self.timeout = server, interval, timeout
        self._stalled: dict[str, tuple[int, str]] = {}  # model -> (pid of the server it was found on, why)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(m,), name=f"dflash-probe-{m}", daemon=True) for m in server.models]
        for thread in self._threads:
            thread.start()

    def stalled(self, server_pid: int) -> dict[str, str]:
        """model -> why, for the models of the server process `server_pid` found stalled."""
        return {model: why for model, (pid, why) in list(self._stalled.items()) if pid == server_pid}

    def stop(self) -> None:
        """The threads end at their next wake-up; a probe in flight is not waited for (Ctrl-C must not wait)."""
        self._stop.set()

    def _run(self, model: str) -> None:
        import tritonclient.grpc as grpcclient

        client, strikes = None, 0
        while not self._stop.wait(self.interval):
            process = self.server.process
            if process is None or process.poll() is not None or model in self.stalled(process.pid):
                strikes = 0
                continue
            try:
                client = client or grpcclient.InferenceServerClient(self.server.endpoints.grpc)
                why = self.probe(client, model)
            except Exception:  # noqa: BLE001 - the server is down or restarting: supervise sees that, it is no stall
                why, client = None, _close(client)
            strikes = strikes + 1 if why is not None else 0
            # a stopped stub (SIGSTOP) is stalled at the first failed probe; otherwise only a failure that
            # lasts STALL_STRIKES probes is: on a loaded machine a starved stub misses Triton's 1 s health
            # check now and then (a full `make test` restarted a healthy server that way)
            # looked for only after a failed probe: finding the stubs scans /proc (~2 ms, 74 processes)
            stopped = why is not None and any(process_state(pid) in STOPPED_STATES for pid in self._stubs(model))
            if why is not None and (stopped or strikes >= STALL_STRIKES) and self.server.process is process:
                self._stalled[model] = (process.pid, why + (" (its process is stopped)" if stopped else f" ({strikes} probes in a row)"))
        _close(client)

    def _stubs(self, model: str) -> list[int]:
        return [pid for pid, name in self.server.stub_processes().items() if name.rsplit("_", 2)[0] == model]

    def probe(self, client: Any, model: str) -> str | None:
        """Why `model` is stalled, or None when it answered (an error counts as an answer) or is busy."""
        from trtllm_dflash.serving.client import health_probe

        # the model process answers `health_probe` itself, nothing decoded or counted (a repository written
        # before it refuses the input: an error is an answer too)
        pids = self._stubs(model)
        before, started = cpu_seconds(pids), time.monotonic()
        answer = health_probe(client, model, self.timeout)
        if answer is None:
            used, waited = cpu_seconds(pids) - before, time.monotonic() - started
            if pids and used < BUSY_CPU_SHARE * waited:
                return f"no answer to a one-token probe in {waited:.0f} s while its process used {used:.2f} s of CPU"
            return None
        message = " ".join(str(answer[1] or "").split())
        return f"Triton answered a probe: {message}" if STUB_UNHEALTHY in message else None


def _close(client: Any) -> None:
    try:
        if client is not None:
            client.close()
    except Exception:  # noqa: BLE001 - closing a channel to a dead server
        pass


def main(argv: list[str]) -> int:
    workdir = Path(argv[0])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the pipe's end makes it act
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    while sys.stdin.buffer.read(4096):
        pass
    owner = read_owner(workdir)
    if owner is not None:
        remove_server(workdir, owner, keep=tuple(p.name for p in workdir.glob("*.log")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

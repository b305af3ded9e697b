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
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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

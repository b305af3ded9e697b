"""Launching a real `tritonserver` on a model repository, and waiting until it serves.

Where NVIDIA's Triton container is present (/opt/tritonserver) its server and backends are
used. Elsewhere the server comes from the `nvidia-pytriton` wheel: its `tritonserver` binary,
its libraries (on LD_LIBRARY_PATH) and its Python backend, with the backend stub for this
Python version copied beside `libtriton_python.so` in a backend folder prepared per launch,
and LD_LIBRARY_PATH / PATH pinned so that the stub runs this interpreter's own libpython and
standard library (see `stub_interpreter_env`).

The Python backend stub starts its interpreter in isolated mode (PYTHONPATH is ignored), so
this Python's import paths are handed to the repository's model.py in DFLASH_TRT_PYTHONPATH.

Supervision (`TritonServer.supervise`, the wait loop of `dflash-trt serve`): a tritonserver
that dies on its own, or whose model process stops answering a periodic probe, is restarted on
the same ports (a failed restart is retried), within a restart budget. The bundled 2.51
binary segfaults on some HTTP requests before any model sees them (a JSON body nested ~40,000
arrays deep; a body of about 4 MiB or more); that cannot be fixed here, only survived. Each server gets a unique
prefix for the Python backend's shared-memory regions in /dev/shm, so the regions a dead server
leaves behind are removed exactly, never those of another server on the machine.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Callable

from trtllm_dflash.errors import DFlashError, MissingDependencyError
from trtllm_dflash.served_model.repository import PYTHONPATH_ENV, model_names
from trtllm_dflash.serving import DEFAULT_HOST, server_watch, triton_access
from trtllm_dflash.serving.server_watch import SHM_DIR, process_group_members

CONTAINER_ROOT = Path("/opt/tritonserver")
# A server that dies this often is not restarted again: a request that crashes it on every
# retry (or a broken environment) must end `serve`, not keep it restarting forever.
MAX_RESTARTS = 5
RESTART_WINDOW_S = 600.0
# Paths tritonserver may be given as they are (see TritonServer.served_repository)
SAFE_PATH = re.compile(r"[A-Za-z0-9_./+=@%:,-]+")
# Log lines that mean a Python backend stub died while its model was loading
STUB_DEATH_MARKS = ("terminate called after throwing", "Stub process", "Failed to initialize stub")


@dataclasses.dataclass(frozen=True)
class Endpoints:
    http: str | None  # http://host:port (generate, generate_stream, health); None with HTTP off
    grpc: str  # host:port (tritonclient.grpc)
    metrics: str  # http://host:port/metrics (Prometheus)


_RECENT_PORTS: collections.deque[int] = collections.deque(maxlen=64)  # free_port's latest answers


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now, and not one of this process's last 64 answers (for
    tests and examples). The kernel can hand a port it just released to the next bind, so two
    calls in a row could name one port, and a server given it twice refuses to start (CI saw
    `free_port(), free_port(), free_port()` give 36481 twice)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in _RECENT_PORTS:
            _RECENT_PORTS.append(port)
            return port


def find_tritonserver() -> tuple[Path, Path | None, Path | None]:
    """(binary, folder of its libraries or None, Python backend source folder or None for the container's)."""
    container = CONTAINER_ROOT / "bin" / "tritonserver"
    if container.is_file():
        return container, None, None
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(
            "no tritonserver found: not in NVIDIA's Triton container and nvidia-pytriton is not installed",
            "pip install 'trtllm-dflash[serve]' (bundles a tritonserver), or run in nvcr.io/nvidia/tritonserver",
        )
    package = Path(spec.submodule_search_locations[0])
    binary = package / "tritonserver" / "bin" / "tritonserver"
    libs = package.parent / "nvidia_pytriton.libs"
    if not binary.is_file():
        raise MissingDependencyError(f"nvidia-pytriton at {package} has no tritonserver binary", "reinstall nvidia-pytriton >= 0.5")
    return binary, libs, package / "tritonserver"


def prepare_backends(pytriton_server: Path, into: Path) -> Path:
    """A backend folder: pytriton's Python backend plus the stub for this Python version."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = pytriton_server / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        available = sorted(p.name for p in (pytriton_server / "python_backend_stubs").iterdir())
        raise MissingDependencyError(
            f"nvidia-pytriton has no Python backend stub for Python {version} (it has {', '.join(available)})",
            "run with one of those Python versions, or in NVIDIA's Triton container",
        )
    backends = into / "backends"
    shutil.copytree(pytriton_server / "backends", backends, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(stub, backends / "python" / "triton_python_backend_stub")
    return backends


def stub_python_path() -> list[str]:
    """This interpreter's import paths minus the standard library (the stub has its own)."""
    stdlib = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")}
    paths = []
    for entry in sys.path:
        path = os.path.abspath(entry) if entry else ""
        if not path or path in stdlib or path.endswith(".zip") or path.endswith("lib-dynload") or not os.path.isdir(path):
            continue
        if path not in paths:
            paths.append(path)
    return paths


def own_libpython() -> Path:
    """The shared libpython of the interpreter running this code (of the base install in a venv)."""
    libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    library = Path(libdir or "") / (soname or "")
    if not (libdir and soname and soname.startswith("libpython") and ".so" in soname and library.is_file()):
        raise MissingDependencyError(
            f"Python {sys.version.split()[0]} at {sys.base_prefix} has no shared libpython ({library}), "
            "which the Triton Python backend stub needs (another libpython would not match this standard library)",
            "serve with a Python built with --enable-shared (e.g. pyenv: PYTHON_CONFIGURE_OPTS=--enable-shared), "
            "or in NVIDIA's Triton container",
        )
    return library


def stub_interpreter_env(workdir: Path, server_libs: Path | None, env: dict[str, str]) -> dict[str, str]:
    """LD_LIBRARY_PATH and PATH that make the Python backend stub run THIS interpreter build.

    The stub links `libpython3.X.so.1.0` by name, so the loader picks the first one it finds:
    the system's (Debian's libpython3.11) wins over a pyenv/conda build unless ours is first on
    LD_LIBRARY_PATH. Its interpreter starts isolated (PYTHONHOME is ignored) and finds its
    standard library from `python3` on PATH: in an activated venv that is the venv's python,
    whose pyvenv.cfg points at the base install's stdlib, a different patch release than the
    system library (`import ssl`: undefined symbol _PyModule_Add). So both are pinned: our
    libpython first on LD_LIBRARY_PATH, and a folder whose only `python3` is our base
    interpreter first on PATH.
    """
    library = own_libpython()
    lib_dirs = ([str(server_libs)] if server_libs else []) + [str(library.parent)]
    python_dir = workdir / "python-bin"
    python_dir.mkdir(exist_ok=True)
    base_python = Path(os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable))
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for name in ("python3", f"python{version}", "python"):
        link = python_dir / name
        if not link.is_symlink():
            link.symlink_to(base_python)
    inherited_libs = [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    return {
        "LD_LIBRARY_PATH": os.pathsep.join(lib_dirs + inherited_libs),
        "PATH": os.pathsep.join([str(python_dir)] + [p for p in env.get("PATH", "").split(os.pathsep) if p]),
    }


class TritonServer:
    """A tritonserver process on a repository; a context manager that stops it on exit.

    with TritonServer("repo/", http_port=free_port(), ...) as server:
        DFlashClient(server.endpoints.http).generate("def f(")
    """

    def __init__(
        self,
        repository: str | Path,
        http_port: int = 8000,
        grpc_port: int = 8001,
        metrics_port: int = 8002,
        host: str = DEFAULT_HOST,
        log_file: str | Path | None = None,
        verbose: bool = False,
        startup_timeout: float = 600.0,
        http: bool = True,
        http_restricted: str | tuple[str, ...] | list[str] | None = None,
        grpc_restricted: str | tuple[str, ...] | list[str] | None = None,
    ) -> None:
        """http_restricted / grpc_restricted: Triton API groups closed to requests without the
        admin header ("a,b", a sequence, "none"; None: triton_access's defaults); the header's
        token is random per server, in a file only its owner reads (`admin_token_path`)."""
        self.repository = Path(repository).expanduser().resolve()
        if not self.repository.is_dir():
            raise DFlashError(f"repository {self.repository} does not exist", "write one with `dflash-trt repo --model demo --out REPO`")
        self.models = model_names(self.repository)
        if not self.models:
            raise DFlashError(f"{self.repository} has no model (no */config.pbtxt)", "point at a repository written by `dflash-trt repo`")
        ports = {"--http-port": http_port, "--grpc-port": grpc_port, "--metrics-port": metrics_port}
        if len(set(ports.values())) != 3:
            raise DFlashError(f"the HTTP, gRPC and metrics ports must differ, got {list(ports.values())}", "pick three different ports")
        self.ports = ports
        self.host = host
        self.http = http  # False: no HTTP port (--allow-http=false); gRPC and metrics stay
        self.verbose = verbose
        self.startup_timeout = startup_timeout
        # backend and stub paths live here: plain ASCII, like the repository path (served_repository)
        temp_root = tempfile.gettempdir() if SAFE_PATH.fullmatch(tempfile.gettempdir()) else "/tmp"
        self._workdir = Path(tempfile.mkdtemp(prefix=server_watch.WORKDIR_PREFIX, dir=temp_root))
        self.log_path = Path(log_file) if log_file else self._workdir / "tritonserver.log"
        self.process: subprocess.Popen | None = None
        # the Python backend names its regions /dev/shm/<prefix><uuid>: ours alone start with this
        self.shm_prefix = f"dflash_trt_{uuid.uuid4().hex[:16]}_"
        self.restarts: list[float] = []  # monotonic times of the restarts supervise() made
        self.started_at: float | None = None
        self.removed_shm: list[str] = []  # names of the shared-memory files the last stop() removed
        self.stubs: dict[int, str] = {}  # the Python backend stubs when the server became ready
        self._stub_starts: dict[int, int | None] = {}  # their start times (pid reuse)
        self.cleaned_leftovers: list[Path] = []  # folders of dead servers the last start() cleaned
        self._watchdog: subprocess.Popen | None = None  # kills the server if this process dies
        client_host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        self.endpoints = Endpoints(
            http=f"http://{client_host}:{http_port}" if http else None,
            grpc=f"{client_host}:{grpc_port}",
            metrics=f"http://{client_host}:{metrics_port}/metrics",
        )
        # Triton's admin APIs (triton_access.py) answer only requests carrying this token in the
        # header triton_access.HEADER: random per server, never derived from an API key
        self.http_restricted = triton_access.restricted_groups(
            triton_access.HTTP_RESTRICTED if http_restricted is None else http_restricted, "--triton-restricted-http (http_restricted=)"
        )
        self.grpc_restricted = triton_access.restricted_groups(
            triton_access.GRPC_RESTRICTED if grpc_restricted is None else grpc_restricted, "--triton-restricted-grpc (grpc_restricted=)"
        )
        self.admin_token = triton_access.admin_token()
        self.admin_token_path = self._workdir / triton_access.TOKEN_FILE

    # ------------------------------------------------------------------ lifecycle

    def command(self) -> tuple[list[str], dict[str, str]]:
        binary, libs, pytriton_server = find_tritonserver()
        args = [str(binary), f"--model-repository={self.served_repository()}", "--log-verbose=0", "--exit-timeout-secs=20"]
        for flag, port in self.ports.items():
            args.append(f"{flag}={port}")
        for service in ("http", "grpc", "metrics"):
            args.append(f"--{service}-address={self.host}")
        if not self.http:
            args.append("--allow-http=false")
        args.append(f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}")
        args += triton_access.restriction_args(self.http_restricted, self.grpc_restricted, self.admin_token, with_http=self.http)
        env = dict(os.environ)
        if pytriton_server is not None:
            args.append(f"--backend-directory={prepare_backends(pytriton_server, self._workdir)}")
            env.update(stub_interpreter_env(self._workdir, libs, env))
        env[PYTHONPATH_ENV] = os.pathsep.join(stub_python_path())
        env[server_watch.NOTES_ENV] = str(self._workdir)  # each model notes its last request there (a crash names it)
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env.setdefault("HF_HUB_OFFLINE", "1")
        return args, env

    def served_repository(self) -> Path:
        """The repository path tritonserver is given: a link without spaces or non-ASCII characters.

        The Python backend starts each model's stub through a shell command line built from the
        path unquoted (a space split it: the stub died parsing its arguments, `stol`, and the
        server waited forever), and the stub's interpreter may not decode non-ASCII paths. Triton
        does not resolve the link, so every path it hands out stays plain ASCII."""
        if SAFE_PATH.fullmatch(str(self.repository)):
            return self.repository
        link = self._workdir / "repository"
        if not link.is_symlink():
            link.symlink_to(self.repository, target_is_directory=True)
        return link

    def start(self) -> Endpoints:
        """Start the server and block until every model of the repository is ready."""
        self.cleaned_leftovers = server_watch.clean_leftovers(self._workdir.parent)
        self._workdir.mkdir(parents=True, exist_ok=True)  # a final stop() removed it
        triton_access.write_token(self.admin_token_path, self.admin_token)
        for flag, port in self.ports.items():
            if flag == "--http-port" and not self.http:
                continue
            if not _port_free(port):
                raise DFlashError(f"port {port} ({flag}) is already in use", f"pass another {flag} or stop what listens there")
        args, env = self.command()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_start = self._log_size()  # before the launch: a stub can die before wait_ready first looks
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            args,
            env=env,
            stdout=None if self.verbose else log,
            stderr=subprocess.STDOUT if not self.verbose else None,
            start_new_session=True,  # Ctrl-C reaches us; we stop the server in order
        )
        log.close()
        server_watch.write_owner(self._workdir, self.process.pid, self.shm_prefix)
        if self._watchdog is None or self._watchdog.poll() is not None:
            self._watchdog = server_watch.start_watchdog(self._workdir)
        try:
            self.wait_ready(log_start)
        except BaseException:
            self.stop()
            raise
        self.started_at = time.monotonic()
        self.stubs = self.stub_processes()
        self._stub_starts = {pid: server_watch.process_start_time(pid) for pid in self.stubs}
        return self.endpoints

    def wait_ready(self, log_start: int) -> None:
        """Until every model is ready; a stub death logged after byte `log_start` ends the wait at once."""
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise DFlashError(
                    f"tritonserver exited with {describe_exit(self.process.returncode)} while loading the repository:\n{self.log_tail()}",
                    f"read the full log at {self.log_path}",
                )
            if self.ready():
                return
            fatal = self._stub_failure_in_log(log_start)
            if fatal:  # tritonserver itself would wait for the dead stub until our timeout
                raise DFlashError(
                    f"a model's Python backend stub died while the repository was loading ({fatal}):\n{self.log_tail()}",
                    f"read the full log at {self.log_path}",
                )
            time.sleep(0.25)
        raise DFlashError(f"tritonserver was not ready after {self.startup_timeout:.0f} s:\n{self.log_tail()}", f"read {self.log_path}")

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def _stub_failure_in_log(self, since: int) -> str | None:
        """The first line after byte `since` of the log that says a stub died (None if none does)."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(since)
                text = log.read().decode("utf-8", errors="replace")
        except OSError:
            return None
        return next((line.strip() for line in text.splitlines() if any(mark in line for mark in STUB_DEATH_MARKS)), None)

    def stub_processes(self) -> dict[int, str]:
        """The live Python backend stubs of this server: pid -> model instance (e.g. "dflash_0_0")."""
        stubs = {}
        if self.process is None:
            return stubs
        for pid in process_group_members(self.process.pid):
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if args and args[0].endswith(b"triton_python_backend_stub") and len(args) > 8:
                stubs[pid] = args[8].decode(errors="replace")
        return stubs

    def dead_stubs(self) -> list[str]:
        """Model instances whose stub, alive when the server became ready, is gone (or a zombie).

        supervise() asks 5 times a second, in the process that also runs the OpenAI front end, so
        it reads only those stubs' /proc entries (a scan of every process held the GIL ~3 ms); the
        start time recorded with each pid tells a reused pid from the stub."""
        return sorted(name for pid, name in self.stubs.items() if server_watch.process_start_time(pid) != self._stub_starts.get(pid))

    def ready(self) -> bool:
        """Server ready and every model ready (asked over HTTP, or over gRPC with HTTP off)."""
        if not self.http:
            return _grpc_ready(self.endpoints.grpc, self.models)
        urls = [f"{self.endpoints.http}/v2/health/ready"] + [f"{self.endpoints.http}/v2/models/{m}/ready" for m in self.models]
        for url in urls:
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status != 200:
                        return False
            except (urllib.error.URLError, OSError):
                return False
        return True

    # ------------------------------------------------------------------ supervision

    def supervise(
        self,
        max_restarts: int = MAX_RESTARTS,
        window: float = RESTART_WINDOW_S,
        log: Callable[[str], None] = print,
        stop_event: threading.Event | None = None,
        poll: float = 0.5,
        probe_interval: float = server_watch.PROBE_INTERVAL_S,
    ) -> None:
        """Block while the server runs; restart it on the same ports whenever it dies on its own or
        a model's process stops answering (a probe every `probe_interval` s, server_watch.ModelProbe; 0: none).

        Each death is logged in one line (exit status or signal, the request its model received
        last, log path, shared-memory files removed). Requests in flight fail with the server's
        connections (clients see a closed connection or gRPC UNAVAILABLE, not a hang). A restart
        that fails is retried after 1, 2, 4 ... s. More than `max_restarts` deaths and failed
        restarts within `window` seconds (deaths after the same request count once:
        server_watch.RestartBudget) raise DFlashError (one line) with the server stopped. Returns
        when `stop_event` is set or the server was stopped (stop()).
        """
        stop_event = stop_event or threading.Event()
        budget = server_watch.RestartBudget(max_restarts, window)
        probe = server_watch.ModelProbe(self, probe_interval) if probe_interval else None
        try:
            while not stop_event.is_set():
                process = self.process
                if process is None:
                    return
                alive = process.poll() is None
                dead = self.dead_stubs() if alive else []
                stalled = probe.stalled(process.pid) if probe is not None and alive and not dead else {}
                if alive and not dead and not stalled:
                    stop_event.wait(poll)
                    continue
                if stop_event.is_set() or not self._restart_after(process, dead, stalled, budget, log, stop_event):
                    return
        finally:
            if probe is not None:
                probe.stop()

    def _restart_after(
        self,
        process: subprocess.Popen,
        dead: list[str],
        stalled: dict[str, str],
        budget: server_watch.RestartBudget,
        log: Callable[[str], None],
        stop_event: threading.Event,
    ) -> bool:
        """One death: stop what is left, log it, restart (retried with backoff); False if stop_event ended it."""
        now = time.monotonic()
        uptime = now - self.started_at if self.started_at is not None else 0.0
        suspects = [name.rsplit("_", 2)[0] for name in dead] or list(stalled) or self.models
        last = server_watch.last_request(self._workdir, suspects)
        server_watch.clear_notes(self._workdir)
        # a dead or stalled stub: Triton answers that model's requests with errors forever and its
        # streams hang, so the whole server goes, at once (no graceful wait for requests that
        # cannot finish), and comes back on the same ports (the Python backend restarts no stub)
        self.stop(graceful=not (dead or stalled), final=False)  # its stubs, its shared memory, its backend folder
        if stalled:
            what = (
                f"the Python backend stub of {', '.join(stalled)} stopped answering ({'; '.join(stalled.values())}); tritonserver stopped"
            )
        elif dead:
            what = f"the Python backend stub of {', '.join(dead)} died ({uptime:.0f} s after the server was ready); tritonserver stopped"
        else:
            what = f"tritonserver died unexpectedly ({describe_exit(process.returncode)}, {uptime:.0f} s after it was ready)"
        what += (
            f"; the last request {last[0]} received: fingerprint {last[1]}, {max(0.0, time.time() - last[2]):.1f} s before"
            if last
            else "; no model noted a request since it started"
        )
        cleaned = f"removed {len(self.removed_shm)} shared-memory file(s) it left in {SHM_DIR}"
        counted = budget.spend(now, last[1] if last else None)
        if budget.exhausted():
            raise DFlashError(
                f"{what}; {cleaned}; it died {budget.used()} times within {budget.window / 60:g} min, "
                f"more than the {budget.limit} restarts allowed, so it is not restarted again",
                f"read its log, {self.log_path}",
            )
        repeat = "" if counted else "; the same request preceded an earlier crash, so this one does not count again"
        log(f"{what}; log: {self.log_path}; {cleaned}; restarting it on the same ports ({budget.describe()}{repeat})")
        self._note_in_log(f"dflash-trt serve: {what}; restarting it")
        delay = server_watch.RETRY_FIRST_S
        while True:
            try:
                self.restart()
                break
            except (DFlashError, OSError) as exc:  # e.g. /dev/shm or /tmp full, a port taken meanwhile: try again later
                budget.spend(time.monotonic())
                reason = str(exc).splitlines()[0].rstrip(":")
                if budget.exhausted():
                    raise DFlashError(
                        f"the restart failed ({reason}); {budget.used()} deaths and failed restarts within "
                        f"{budget.window / 60:g} min, more than the {budget.limit} allowed, so it is not tried again",
                        f"read its log, {self.log_path}",
                    ) from None
                log(f"the restart failed ({reason}); retrying in {delay:g} s ({budget.describe()})")
                if stop_event.wait(delay):
                    return False
                delay = min(2 * delay, server_watch.RETRY_CAP_S)
        self.restarts.append(time.monotonic())
        log(f"tritonserver ready again after {time.monotonic() - now:.0f} s")
        return True

    def restart(self, port_wait: float = 30.0) -> Endpoints:
        """Stop what is left of the server and start it again on the same ports."""
        self.stop(final=False)
        deadline = time.monotonic() + port_wait
        while time.monotonic() < deadline and not all(
            _port_free(port) for flag, port in self.ports.items() if self.http or flag != "--http-port"
        ):
            time.sleep(0.2)  # a port of the dead server may take a moment to be released
        return self.start()

    def shm_files(self) -> list[Path]:
        """The /dev/shm files of this server's Python backend (its regions, alive or left behind)."""
        return server_watch.shm_regions(self.shm_prefix)

    def remove_shm(self) -> list[str]:
        """Remove this server's shared-memory regions (call only when it is not running)."""
        return server_watch.remove_shm_regions(self.shm_prefix)

    def _note_in_log(self, line: str) -> None:
        try:
            with open(self.log_path, "a") as log:
                log.write(f"{line}\n")
        except OSError:
            pass

    def stop(self, timeout: float = 30.0, graceful: bool = True, final: bool = True) -> int | None:
        """SIGINT (Triton unloads the models and exits), then SIGKILL if it does not.

        `graceful=False`: SIGKILL at once. `final=False` (a restart follows): the watchdog and
        the working folder stay."""
        process, self.process = self.process, None
        self.stubs = {}
        code = None
        if process is not None and process.poll() is None and not graceful:
            os.killpg(process.pid, signal.SIGKILL)
            code = process.wait()
        elif process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                code = process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                code = process.wait()
        elif process is not None:
            code = process.returncode
        if process is not None:
            # Python backend stubs live in the server's process group and may outlive it (a stub
            # busy in its model's finalize when the server exits): nothing of this server stays
            _kill_group(process.pid)
            # a server that exits cleanly unlinks its regions; one that crashed leaves them
            self.removed_shm = self.remove_shm()
        if final:  # the working folder goes, but for the log that was written there
            server_watch.remove_workdir(self._workdir, keep=(self.log_path.name,) if self.log_path.parent == self._workdir else ())
            server_watch.stop_watchdog(self._watchdog)
            self._watchdog = None
        else:  # a restart follows: it prepares the backends and the interpreter links again
            for folder in ("backends", "python-bin"):
                shutil.rmtree(self._workdir / folder, ignore_errors=True)
        return code

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def __enter__(self) -> "TritonServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _port_free(port: int) -> bool:
    """Nothing listens on the port on any address (binding the wildcard checks all of them)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def describe_exit(code: int | None) -> str:
    """'status 1', 'signal 11 (SIGSEGV)': how a process ended, from its Popen return code."""
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"signal {-code}"
    return f"status {code}"


def _grpc_ready(url: str, models: list[str]) -> bool:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    try:
        client = grpcclient.InferenceServerClient(url)
    except InferenceServerException:
        return False
    try:
        return client.is_server_ready(client_timeout=2) and all(client.is_model_ready(m, client_timeout=2) for m in models)
    except InferenceServerException:
        return False
    finally:
        client.close()


def _kill_group(pid: int, timeout: float = 10.0) -> None:
    """Stub processes left behind by the server (they share its process group), gone on return.

    SIGKILL is delivered asynchronously: a stub can still be exiting right after killpg, so wait
    until the group has no live member (bounded) rather than report a stop that is not finished.
    """
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + timeout
    while process_group_members(pid) and time.monotonic() < deadline:
        time.sleep(0.05)

"""The Python backend stub runs the same interpreter build as the process that launched the
server (libpython and standard library), whatever PATH and the system hold.

The stub links `libpython3.X.so.1.0` by name and starts an isolated interpreter that finds its
standard library through `python3` on PATH. On a machine with a pyenv/conda Python AND a system
libpython of the same minor version (Debian's /usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0),
an activated venv used to give the stub the system library with the venv's (pyenv's) standard
library, and `import ssl` failed with `undefined symbol: _PyModule_Add`. On such a machine (this
project's CI machine: pyenv 3.11.7 + Debian 3.11.2) `test_stub_runs_this_interpreter_in_an_activated_venv`
failed before the fix. Where the system holds no other libpython the mismatch cannot happen, and
the same test still checks what the stub runs: our libpython mapped, our version, our stdlib.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from support import triton_server

PROBE_PY = '''
import json, os, sys


class TritonPythonModel:
    """Records which interpreter the stub runs, then imports ssl (the module that broke)."""

    def initialize(self, args):
        maps = open("/proc/self/maps").read().splitlines()
        facts = {
            "version": sys.version,
            "base_prefix": sys.base_prefix,
            "os_module": os.__file__,
            "libpython": sorted({line.split()[-1] for line in maps if "libpython" in line}),
        }
        import ssl

        facts["ssl"] = ssl.OPENSSL_VERSION
        with open(os.environ["DFLASH_PROBE_OUT"], "w") as out:
            json.dump(facts, out)

    def execute(self, requests):
        return []
'''

PROBE_CONFIG = """name: "probe"
backend: "python"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def _probe_repository(root: Path) -> Path:
    (root / "probe" / "1").mkdir(parents=True)
    (root / "probe" / "config.pbtxt").write_text(PROBE_CONFIG)
    (root / "probe" / "1" / "model.py").write_text(PROBE_PY)
    return root


def _system_libpython_differs() -> str | None:
    """The libpython the loader finds without our pinning, when it is not ours (the bug's setup)."""
    from trtllm_dflash.serving.server import find_tritonserver, own_libpython

    _, libs, server = find_tritonserver()
    if server is None:
        return None
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = server / "python_backend_stubs" / version / "triton_python_backend_stub"
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    ldd = subprocess.run(["ldd", str(stub)], capture_output=True, text=True, env=env).stdout
    found = [line.split("=>")[1].split("(")[0].strip() for line in ldd.splitlines() if "libpython" in line and "=>" in line]
    if found and found[0] != "not found" and os.path.realpath(found[0]) != os.path.realpath(own_libpython()):
        return found[0]
    return None


def test_stub_runs_this_interpreter_in_an_activated_venv(tmp_path, monkeypatch):
    pytest.importorskip("pytriton", reason="needs the serve extra (nvidia-pytriton's tritonserver)")
    from trtllm_dflash.serving.server import own_libpython

    # `source .venv/bin/activate`: the venv's bin first on PATH, VIRTUAL_ENV set.
    venv_bin = Path(sys.prefix) / "bin"
    monkeypatch.setenv("PATH", os.pathsep.join([str(venv_bin), os.environ.get("PATH", "")]))
    monkeypatch.setenv("VIRTUAL_ENV", sys.prefix)
    monkeypatch.delenv("PYTHONHOME", raising=False)
    out = tmp_path / "facts.json"
    monkeypatch.setenv("DFLASH_PROBE_OUT", str(out))
    other = _system_libpython_differs()
    print(f"venv: {sys.prefix != sys.base_prefix}; unpinned loader would map: {other or 'our own libpython'}")

    repo = _probe_repository(tmp_path / "repo")
    with triton_server(repo, log_file=tmp_path / "server.log", startup_timeout=120):
        facts = json.loads(out.read_text())

    assert facts["version"] == sys.version
    assert [os.path.realpath(p) for p in facts["libpython"]] == [os.path.realpath(own_libpython())], facts["libpython"]
    stdlib = sysconfig.get_paths()["stdlib"]
    assert os.path.realpath(facts["os_module"]) == os.path.realpath(os.path.join(stdlib, "os.py"))
    assert facts["base_prefix"] == sys.base_prefix
    assert facts["ssl"].startswith("OpenSSL")


def test_stub_environment_puts_our_libpython_and_python_first(tmp_path, monkeypatch):
    """Without starting a server: what the launcher hands the stub, with a venv's bin and
    another folder holding a `python3` and a libpython ahead of ours."""
    pytest.importorskip("pytriton", reason="needs the serve extra (nvidia-pytriton's tritonserver)")
    from trtllm_dflash.serving.server import TritonServer, own_libpython

    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "python3").symlink_to(shutil.which("python3") or sys.executable)
    monkeypatch.setenv("PATH", os.pathsep.join([str(decoy), str(Path(sys.prefix) / "bin"), os.environ.get("PATH", "")]))
    monkeypatch.setenv("LD_LIBRARY_PATH", str(decoy))
    repo = _probe_repository(tmp_path / "repo")
    server = TritonServer(repo)
    try:
        args, env = server.command()
        first_python = shutil.which("python3", path=env["PATH"])
        assert os.path.realpath(first_python) == os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    finally:
        server.stop()
    lib_dirs = env["LD_LIBRARY_PATH"].split(os.pathsep)
    own = own_libpython()
    assert str(own.parent) in lib_dirs and lib_dirs.index(str(own.parent)) < lib_dirs.index(str(decoy))
    assert "--http-address=127.0.0.1" in args  # loopback unless --host opens it

"""A missing optional extra is bad input: every command that needs one says in ONE line which
extra to install and exits non-zero, never a traceback.

Fast: the CLI in a subprocess with every optional module hidden (`extras.hide_modules`, a
meta-path wrapper that makes `import triton` fail as if it were not installed). Slow: a real
venv with only `pip install -e .` (no extras) and torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trtllm_dflash.errors import MissingDependencyError
from trtllm_dflash.extras import EXTRA_OF, as_missing_extra, require

ROOT = Path(__file__).resolve().parents[1]
BASE_ONLY = (
    "import sys; from trtllm_dflash.extras import hide_modules; hide_modules(); "
    "from trtllm_dflash.cli.app import main; sys.argv[0] = 'dflash-trt'; main()"
)


def _one_line_error(result: subprocess.CompletedProcess, extra: str) -> str:
    """The run failed with exit 2 and exactly one line naming the extra to install."""
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output, output
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error:"), result.stderr
    assert f"pip install 'trtllm-dflash[{extra}]'" in errors[0], errors[0]
    return errors[0]


def _probe_repository(root: Path) -> Path:
    (root / "m" / "1").mkdir(parents=True)
    (root / "m" / "config.pbtxt").write_text('name: "m"\nbackend: "python"\n')
    return root


COMMANDS = {  # command -> the extra it must name
    "plugins": (["plugins", "build", "--arch", "sm_90a", "--out", "{tmp}/kernels"], "kernels"),
    "build": (["build", "--model", "demo", "--gpu", "rtx-pro-6000", "--out", "{tmp}/build"], "export"),
    "demo": (["demo", "--out", "{tmp}/demo"], "export,serve"),
    "openai": (["openai", "--triton-url", "127.0.0.1:1"], "serve"),
    "bench-openai": (["bench", "--openai-url", "http://127.0.0.1:1/v1", "--model", "m"], "bench"),
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_commands_name_the_missing_extra_in_one_line(name, tmp_path):
    args, extra = COMMANDS[name]
    args = [a.format(tmp=tmp_path) for a in args]
    result = subprocess.run([sys.executable, "-c", BASE_ONLY, *args], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    _one_line_error(result, extra)


def test_serve_without_the_serve_extra_names_it(tmp_path):
    repo = _probe_repository(tmp_path / "repo")
    result = subprocess.run([sys.executable, "-c", BASE_ONLY, "serve", str(repo)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "pip install 'trtllm-dflash[serve]'" in result.stderr


def test_require_and_main_name_the_extra():
    with pytest.raises(MissingDependencyError, match=r"pip install 'trtllm-dflash\[kernels\]'"):
        require("triton.no_such_module_here", "kernels")
    with pytest.raises(MissingDependencyError, match=r"`dflash_no_such_pkg`.*pip install 'trtllm-dflash\[bench\]'"):
        require("dflash_no_such_pkg", "bench")
    error = as_missing_extra(ModuleNotFoundError("No module named 'onnxscript'", name="onnxscript"))
    assert error is not None and "trtllm-dflash[export]" in str(error)
    assert as_missing_extra(ModuleNotFoundError("No module named 'left_pad'", name="left_pad")) is None
    extras = Path(ROOT / "pyproject.toml").read_text()
    for extra in set(EXTRA_OF.values()):  # every extra named in a message exists in pyproject.toml
        assert f"\n{extra} = [" in extras, extra


@pytest.fixture(scope="session")
def base_venv(tmp_path_factory) -> Path:
    """A venv with torch and `pip install -e .` only (no extras, no system site-packages)."""
    venv = tmp_path_factory.mktemp("base-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    torch_spec = f"torch=={__import__('torch').__version__.split('+')[0]}"
    subprocess.run(pip + [torch_spec], check=True, timeout=900)
    subprocess.run(pip + ["-e", str(ROOT)], check=True, timeout=900)
    return venv


@pytest.mark.slow
def test_base_install_commands_name_the_missing_extra(base_venv, tmp_path):
    python = str(base_venv / "bin" / "python")
    for module in ("triton", "onnx", "onnxscript", "pytriton", "tritonclient"):
        found = subprocess.run(
            [python, "-c", f"import importlib.util as u; print(u.find_spec('{module}') is not None)"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert found == "False", f"{module} is installed in the base venv"
    cli = str(base_venv / "bin" / "dflash-trt")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    for name, (args, extra) in sorted(COMMANDS.items()):
        args = [a.format(tmp=tmp_path) for a in args]
        started = time.monotonic()
        result = subprocess.run([cli, *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
        print(f"{name}: {time.monotonic() - started:.1f} s: {result.stderr.strip()}")
        _one_line_error(result, extra)

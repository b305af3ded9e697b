"""`make gpu-check SYSTEM_PYTHON=1`: the project installed offline into an interpreter that already
has torch, up to the GPU check's one-line "no CUDA" exit on this CPU machine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from trtllm_dflash.checks import system_install

ROOT = Path(__file__).resolve().parents[1]


def _bare_interpreter(path: Path, with_our_packages: bool) -> Path:
    """A venv without pip or packages of its own; `with_our_packages` makes this venv's packages
    (torch, transformers, pip, setuptools, ... but not trtllm_dflash, whose editable finder is a
    .pth of its own that a path entry does not run) importable, like a GPU image's preinstalled set."""
    venv.create(path, with_pip=False)
    python = path / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if with_our_packages:
        Path(site, "preinstalled.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _make_gpu_check(python: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "PIP_EXTRA_INDEX_URL": "", "PYTHONPATH": ""}
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run(
        [
            "make",
            "--no-print-directory",
            "gpu-check",
            "SYSTEM_PYTHON=1",
            f"PYTHON={python}",
            f"GPU_CHECK_ARGS=--out {tmp_path / 'RESULTS.md'}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.skipif(_cuda_visible(), reason="checks the stop at 'no CUDA device'; this machine has one (the GPU check runs there instead)")
def test_installs_offline_into_an_interpreter_with_torch_then_stops_at_no_cuda(tmp_path):
    python = _bare_interpreter(tmp_path / "system", with_our_packages=True)
    assert subprocess.run([python, "-c", "import trtllm_dflash.cli"], cwd=tmp_path, capture_output=True).returncode != 0
    done = _make_gpu_check(python, tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert f"installed {ROOT} into {python}" in output
    assert "no CUDA device is visible" in output
    assert sum("error:" in line for line in output.splitlines()) == 1, output
    assert not (tmp_path / "RESULTS.md").exists()
    # the install is real: the CLI imports from anywhere in that interpreter
    check = subprocess.run(
        [python, "-c", "import trtllm_dflash.cli.app, trtllm_dflash.plugins"], cwd=tmp_path, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_a_missing_package_is_named_in_one_line_and_nothing_is_installed(tmp_path):
    python = _bare_interpreter(tmp_path / "empty", with_our_packages=False)
    done = _make_gpu_check(python, tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output
    assert "lacks pip, torch, transformers" in errors[0] and "pydantic" in errors[0] and "setuptools>=77" in errors[0]


def test_requirements_come_from_pyproject_and_versions_are_checked():
    needed = system_install.needed_requirements()
    names = [text.split(">")[0].split("<")[0].split("=")[0] for text in needed]
    assert {"torch", "transformers", "pydantic", "triton", "pytest"} <= set(names)
    assert "onnx" not in names and "tritonclient[all]" not in names
    missing, outside = system_install.check_installed(["torch>=2.6", "no-such-distribution-xyz>=1", "transformers<5.0"])
    assert missing == ["no-such-distribution-xyz"]
    assert len(outside) == 1 and outside[0].startswith("transformers ") and "(tested: <5.0)" in outside[0]
    assert system_install.setuptools_problem() is None  # the make-setup venv has a new enough setuptools
    assert sys.version_info >= (3, 11)

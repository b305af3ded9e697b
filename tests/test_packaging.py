"""The package ships what it needs: every package folder listed, recipes and demo data in the wheel."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_listed():
    config = _config()
    listed = set(config["packages"])
    mapping = config["package-dir"]
    found = set()
    for name, folder in mapping.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            if ".venv" in init.parts or "__pycache__" in init.parts:
                continue
            relative = init.parent.relative_to(base).parts
            found.add(".".join((name, *relative)))
    assert found <= listed, f"add to pyproject packages: {sorted(found - listed)}"


def test_wheel_contains_recipes_and_package_data(tmp_path):
    pytest.importorskip("setuptools")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
    )
    # nothing alarming: no deprecated license table, no data folder outside `packages`
    warnings = [
        line for line in (built.stdout + built.stderr).splitlines() if "BackendWarning" in line or "is absent from the `packages`" in line
    ]
    assert not warnings, "\n".join(warnings)
    wheel = next(tmp_path.glob("trtllm_dflash-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "trtllm_dflash/ops/reference.py" in names and "trtllm_dflash/plugins/onnx_nodes.py" in names
    assert "trtllm_dflash/cli/app.py" in names
    recipes = [n for n in names if n.startswith("trtllm_dflash/engine_recipes/") and n.endswith(".yaml")]
    assert len(recipes) == len(list((ROOT / "engine_recipes").rglob("*.yaml")))
    shipped_demo = [p.relative_to(ROOT).as_posix() for p in (ROOT / "trtllm_dflash" / "demo").rglob("*") if p.is_file()]
    for path in shipped_demo:
        if "__pycache__" not in path:
            assert path in names, path


def _lock() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    return pins


def test_the_lock_pins_every_dependency_inside_its_range():
    """`make setup` installs requirements.lock: every requirement of `.[ci]` is pinned there, to a
    version pyproject allows, so a fresh clone installs what the tests last passed on."""
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = list(project["dependencies"])
    for extra in ("kernels", "export", "quant", "rtx", "serve", "dev"):  # what `.[ci]` installs (not bench: aiperf)
        wanted += extras[extra]
    wanted += [text for text in extras["ci"] if not text.startswith("trtllm-dflash[")]
    assert "bench" not in extras["ci"][0] and any(text.startswith("aiperf") for text in extras["bench"])
    pins = _lock()
    for text in wanted:
        requirement = Requirement(text)
        name = requirement.name.lower().replace("_", "-")
        assert name in pins, f"{name} is not in requirements.lock: run `make lock`"
        assert requirement.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} is outside {requirement}"


def test_the_installed_versions_are_the_locked_ones():
    """The venv `make setup` makes holds the locked versions (other environments are not its business)."""
    from importlib import metadata

    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        pytest.skip(f"not the `make setup` venv ({sys.prefix}): `make test-latest` and other environments choose their own versions")
    pins = _lock()
    for name in ("torch", "transformers", "triton", "onnx", "nvidia-modelopt", "tritonclient", "pydantic"):
        installed = metadata.version(name).split("+")[0]
        assert installed == pins[name], f"{name} {installed} is installed, the lock says {pins[name]}: run `make setup`"

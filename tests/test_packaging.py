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
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True,
    )
    wheel = next(tmp_path.glob("trtllm_dflash-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "trtllm_dflash/plugins/reference.py" in names
    assert "trtllm_dflash/cli/app.py" in names
    recipes = [n for n in names if n.startswith("trtllm_dflash/engine_recipes/") and n.endswith(".yaml")]
    assert len(recipes) == len(list((ROOT / "engine_recipes").rglob("*.yaml")))
    shipped_demo = [p.relative_to(ROOT).as_posix() for p in (ROOT / "trtllm_dflash" / "demo").rglob("*") if p.is_file()]
    for path in shipped_demo:
        if "__pycache__" not in path:
            assert path in names, path

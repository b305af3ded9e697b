"""`make gpu-check SYSTEM_PYTHON=1`: install this checkout into the interpreter already there.

GPU hosts often come with CUDA torch preinstalled and no package index (NVIDIA's containers on
air-gapped machines); `make setup` cannot run there. This checks that the packages the GPU check
needs are importable in THIS interpreter (naming every missing one in one line), then installs the
project without dependencies, without build isolation and without an index. Standard library
only, so it runs before anything of ours is installed:

    python -m trtllm_dflash.checks.system_install           # from the repository root
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# beyond the base dependencies: the Triton kernels, and pytest for the GPU tests step
EXTRAS = ("kernels",)
DEV_PACKAGES = ("pytest",)
SETUPTOOLS_MINIMUM = (77, 0)  # pyproject's build-system requirement (SPDX license string)


def _parse(text: str) -> tuple[str, object | None]:
    """(distribution name, specifier set or None where no `packaging` is importable to read it)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        try:  # pip carries a copy
            from pip._vendor.packaging.requirements import Requirement
        except ImportError:
            return re.match(r"[A-Za-z0-9_.-]+", text).group(0), None
    requirement = Requirement(text)
    return requirement.name, requirement.specifier


def needed_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The requirement strings the GPU check needs, read from pyproject.toml."""
    import tomllib

    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project["optional-dependencies"]
    needed = list(project["dependencies"])
    for extra in EXTRAS:
        needed += extras[extra]
    needed += [text for text in extras["dev"] if _parse(text)[0] in DEV_PACKAGES]
    return needed


def check_installed(requirements: list[str]) -> tuple[list[str], list[str]]:
    """(missing distributions, 'name version (wanted spec)' for installed versions outside their range)."""
    missing, outside = [], []
    for text in requirements:
        name, specifier = _parse(text)
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
            continue
        if specifier and not specifier.contains(version.split("+")[0], prereleases=True):
            outside.append(f"{name} {version} (tested: {specifier})")
    return missing, outside


def setuptools_problem() -> str | None:
    """Why this interpreter cannot build the project offline (None: it can)."""
    try:
        version = metadata.version("setuptools")
    except metadata.PackageNotFoundError:
        return "setuptools is not installed"
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if parts < SETUPTOOLS_MINIMUM:
        return f"setuptools {version} is older than {'.'.join(map(str, SETUPTOOLS_MINIMUM))}"
    return None


def main() -> int:
    where = f"{sys.executable} (Python {sys.version.split()[0]})"
    if sys.version_info < (3, 11):
        print(f"error: SYSTEM_PYTHON=1 needs Python 3.11 or newer; {where} is older: run plain `make gpu-check` (a venv)")
        return 2
    missing, outside = check_installed(["pip", *needed_requirements()])
    problem = setuptools_problem()
    if problem:
        missing.append(f"setuptools>=77 ({problem})")
    if missing:
        print(
            f"error: {where} lacks {', '.join(missing)}, which the GPU check needs: install them into it "
            "(from a wheelhouse where there is no index), or run plain `make gpu-check` to build a venv"
        )
        return 2
    if outside:
        print(f"warning: versions outside the tested ranges, the check may fail for that reason: {'; '.join(outside)}")
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-build-isolation", "-e", str(ROOT)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        print(f"{tail}\nerror: installing {ROOT} into {where} failed (pip output above)")
        return 2
    print(f"installed {ROOT} into {where} (editable, no dependencies, nothing downloaded)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

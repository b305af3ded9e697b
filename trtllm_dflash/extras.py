"""Optional dependencies: which extra of trtllm-dflash brings each one, and one way to import them.

`pip install trtllm-dflash` installs the base only; a command that needs more imports it through
`require()`, so a missing package is bad input (one line naming the extra, non-zero exit), not
a traceback. `main()` also turns any ModuleNotFoundError of a module listed here into the same
line, for imports made deep inside other libraries (torch.onnx -> onnxscript).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from trtllm_dflash.errors import MissingDependencyError

# top-level import name -> the extra of pyproject.toml that installs it
EXTRA_OF: dict[str, str] = {
    "triton": "kernels",
    "onnx": "export",
    "onnxscript": "export",
    "onnx_ir": "export",
    "onnxruntime": "export",
    "modelopt": "quant",
    "requests": "quant",  # ModelOpt imports it without declaring it
    "tensorrt_rtx": "rtx",
    "tensorrt_rtx_bindings": "rtx",
    "tensorrt": "trt",
    "tensorrt_llm": "trtllm",
    "tritonclient": "serve",
    "pytriton": "serve",
    "prometheus_client": "serve",
    "fastapi": "serve",
    "uvicorn": "serve",
    "matplotlib": "bench",
    "openai": "bench",
    "scipy": "dev",
    "xgrammar": "grammar",
}


def install_hint(extra: str) -> str:
    return f"pip install 'trtllm-dflash[{extra}]'"


def missing(module: str, extra: str | None = None, purpose: str = "") -> MissingDependencyError:
    """The error for a missing optional module: names it, what needed it, and the extra to install."""
    top = module.split(".")[0]
    extra = extra or EXTRA_OF.get(top)
    needed = f" ({purpose})" if purpose else ""
    fix = install_hint(extra) if extra else f"pip install {top}"
    return MissingDependencyError(f"the Python package `{top}` is not installed{needed}", fix)


def require(module: str, extra: str | None = None, purpose: str = "") -> ModuleType:
    """import_module(module), or a MissingDependencyError naming the extra that installs it.

    A package that is installed but misses one of ITS dependencies fails the same way, naming
    the module that is missing (the extra's install brings it too).
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        absent = exc.name or module
        raise missing(
            absent, extra if absent.split(".")[0] == module.split(".")[0] else EXTRA_OF.get(absent.split(".")[0], extra), purpose
        ) from None


def require_installed(modules: tuple[str, ...], purpose: str) -> None:
    """Fail up front, naming every missing module and the extras that bring them, without
    importing anything (for commands that would otherwise fail halfway, in a subprocess)."""
    import importlib.util

    absent = [m for m in modules if importlib.util.find_spec(m) is None]
    if absent:
        extras = ",".join(sorted({EXTRA_OF[m] for m in absent}))
        raise MissingDependencyError(f"{purpose} needs {', '.join(absent)}, which are not installed", install_hint(extras))


def as_missing_extra(exc: BaseException) -> MissingDependencyError | None:
    """A ModuleNotFoundError of a known optional module as the one-line error, else None."""
    if isinstance(exc, ModuleNotFoundError) and exc.name and exc.name.split(".")[0] in EXTRA_OF:
        return missing(exc.name)
    return None


class _HiddenModules:
    """A meta-path finder wrapper that finds nothing for the hidden top-level names."""

    def __init__(self, finder, hidden: frozenset[str]) -> None:
        self.finder, self.hidden = finder, hidden

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.hidden:
            return None
        find = getattr(self.finder, "find_spec", None)
        return find(name, path, target) if find else None

    def __getattr__(self, attr):
        return getattr(self.finder, attr)


def hide_modules(names=tuple(EXTRA_OF)) -> None:
    """Make `import NAME` (and importlib.util.find_spec) behave as if NAME were not installed.

    For testing what the base install (no extras) does, in a subprocess, without a second venv:
    call it before anything imports those modules. Installed distributions' metadata stays
    visible (importlib.metadata); the real base-install test covers that.
    """
    import sys

    hidden = frozenset(names)
    loaded = sorted(n for n in sys.modules if n.split(".")[0] in hidden)
    if loaded:
        raise RuntimeError(f"hide_modules() after {loaded} were imported")
    sys.meta_path[:] = [_HiddenModules(f, hidden) for f in sys.meta_path]

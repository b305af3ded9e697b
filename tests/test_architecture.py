"""The package's rooms and what each may import (docs/architecture.md explains the layers).

Every import is read from the source with `ast`, module-level and function-level alike (an import
hidden inside a function is still a dependency), including `TYPE_CHECKING` blocks. The tests fail
on an import cycle between files, on a file importing a higher layer, on two rooms (subpackages)
listed in ONE_WAY_ROOMS importing each other, on a source file that no layer claims, on shipped
code importing the tiny test checkpoints (`testing/tiny.py`), and on a source file over MAX_LINES lines.
"""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# lines as `ruff format` writes them (one argument per line where a call does not fit): 600 before the
# formatter, which put kernel signatures and long calls one argument per line (+7% to +50% in six files)
MAX_LINES = 650

# Top-level folders and the package each is installed as (pyproject's package-dir).
PACKAGE_DIRS = {
    "trtllm_dflash": "trtllm_dflash",
    "plugins": "trtllm_dflash.plugins",
    "cli": "trtllm_dflash.cli",
    "engine_recipes": "trtllm_dflash.engine_recipes",
}

# Lowest first. A file may import files of its own layer and of the layers below it, never above.
# Patterns are module names (fnmatch); the first layer whose pattern matches claims the file.
LAYERS: list[tuple[str, list[str]]] = [
    (
        "foundation",
        [
            "trtllm_dflash.errors",
            "trtllm_dflash.hf_compat",
            "trtllm_dflash.contracts",
            "trtllm_dflash.contracts.*",
            "trtllm_dflash.extras",
            "trtllm_dflash.chat",
            "trtllm_dflash.config",
            "trtllm_dflash.version",
            "trtllm_dflash.checks.system_install",
            "trtllm_dflash.catalog",
            "trtllm_dflash.catalog.*",
            "trtllm_dflash.demo",
            "trtllm_dflash.demo.corpus",
            "trtllm_dflash.engine_recipes*",
        ],
    ),
    # the DFlash math (reference ops, Triton kernels, torch ops), then its TensorRT packaging
    ("kernels", ["trtllm_dflash.ops", "trtllm_dflash.ops.*", "trtllm_dflash.plugins", "trtllm_dflash.plugins.*"]),
    (
        "modeling",
        [
            "trtllm_dflash.modeling",
            "trtllm_dflash.modeling.*",
            "trtllm_dflash.graphs",
            "trtllm_dflash.graphs.*",
            "trtllm_dflash.drafters",
            "trtllm_dflash.drafters.*",
            "trtllm_dflash.checkpoints",
            "trtllm_dflash.checkpoints.*",
        ],
    ),
    (
        "runtime",
        [
            "trtllm_dflash.runtime",
            "trtllm_dflash.runtime.*",
            "trtllm_dflash.decoding",
            "trtllm_dflash.sampling_params",
        ],
    ),
    (
        "library",
        [
            "trtllm_dflash",
            "trtllm_dflash.api",
            "trtllm_dflash.training",
            "trtllm_dflash.training.*",
            "trtllm_dflash.testing",
            "trtllm_dflash.testing.*",
        ],
    ),
    # what each backend serves, builds and writes, and the Triton model that opens its pipeline; what
    # one served model is and runs (served_model/: its repository files, config.pbtxt parameters, wire
    # protocol, batching loop, metrics, detokenizer), which the backends use, sits here too
    (
        "backends",
        [
            "trtllm_dflash.backends",
            "trtllm_dflash.backends.*",
            "trtllm_dflash.served_model",
            "trtllm_dflash.served_model.*",
        ],
    ),
    (
        "recipes and planning",
        [
            "trtllm_dflash.recipes",
            "trtllm_dflash.recipes.*",
            "trtllm_dflash.planning",
            "trtllm_dflash.planning.*",
        ],
    ),
    (
        "build, serve, measure",
        [
            "trtllm_dflash.builder",
            "trtllm_dflash.builder.*",
            "trtllm_dflash.serving",
            "trtllm_dflash.serving.*",
            "trtllm_dflash.bench",
            "trtllm_dflash.bench.*",
        ],
    ),
    ("commands", ["trtllm_dflash.cli", "trtllm_dflash.cli.*", "trtllm_dflash.checks", "trtllm_dflash.checks.*"]),
]


def source_files() -> dict[str, Path]:
    """Module name -> file, for every Python file the package installs."""
    modules = {}
    for folder, package in PACKAGE_DIRS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([package, *parts])] = path
    return modules


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's own modules that `module` imports anywhere in its file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            # `from pkg import sub` imports the submodule when there is one, else a name of pkg.
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = source_files()
    return {module: imports_of(module, path, modules) for module, path in modules.items()}


def layer_of(module: str) -> int | None:
    for index, (_, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(module, pattern) for pattern in patterns):
            return index
    return None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one file (Tarjan)."""
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = lowlink[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                lowlink[node] = min(lowlink[node], lowlink[target])
            elif target in on_stack:
                lowlink[node] = min(lowlink[node], index[target])
        if lowlink[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_source_file_has_a_layer():
    unclaimed = sorted(module for module in source_files() if layer_of(module) is None)
    assert not unclaimed, f"add these modules to a layer in LAYERS (and docs/architecture.md): {unclaimed}"


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles (function-level imports count): " + "; ".join(" <-> ".join(c) for c in found)


def test_no_module_imports_a_higher_layer():
    climbs = []
    for module, targets in sorted(import_graph().items()):
        own = layer_of(module)
        for target in sorted(targets):
            other = layer_of(target)
            if own is not None and other is not None and other > own:
                climbs.append(f"{module} ({LAYERS[own][0]}) imports {target} ({LAYERS[other][0]})")
    assert not climbs, "imports that climb a layer:\n" + "\n".join(climbs)


def test_shipped_code_does_not_import_the_test_fixtures():
    """`testing/tiny.py` (tiny random checkpoints) is for the tests and benchmarks only: a build, serve
    or library module that needs one of its models takes it from a module of its own."""
    importers = sorted(
        module
        for module, targets in import_graph().items()
        if "trtllm_dflash.testing.tiny" in targets and not fnmatch.fnmatchcase(module, "trtllm_dflash.testing.*")
    )
    assert not importers, f"these modules import trtllm_dflash.testing.tiny (only tests, benchmarks and testing/ may): {importers}"


def test_no_test_module_imports_another():
    """Helpers and fixtures several test modules use live in tests/support.py (or conftest.py): a test
    module imported by another would run its module fixtures twice and hide what it shares."""
    tests = ROOT / "tests"
    names = {path.stem for path in tests.glob("test_*.py")}
    importers = []
    for path in sorted(tests.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            imported = (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module] if isinstance(node, ast.ImportFrom) else []
            )
            importers += [f"{path.name} imports {name}" for name in imported if name in names]
    assert not importers, "move what these share into tests/support.py:\n" + "\n".join(importers)


def room_of(module: str) -> str:
    """The room a module belongs to: trtllm_dflash.X for a module in or of the subpackage X."""
    return ".".join(module.split(".")[:2])


def imports_between(graph: dict[str, set[str]], room: str, other: str) -> list[str]:
    """`module -> target` for every import (module- or function-level) from `room` into `other`."""
    return [
        f"{module} -> {target}"
        for module, targets in sorted(graph.items())
        if room_of(module) == room
        for target in sorted(targets)
        if room_of(target) == other
    ]


# Rooms that must not import each other both ways: the first may import the second, never the reverse.
ONE_WAY_ROOMS = [
    # backends write their repositories with served_model's helpers and run its BatchingLoop with the
    # pipeline they open (backends/triton_model.py); the served-model code never picks or imports a backend
    ("trtllm_dflash.backends", "trtllm_dflash.served_model"),
]


@pytest.mark.parametrize(("room", "other"), ONE_WAY_ROOMS)
def test_rooms_do_not_import_each_other_both_ways(room, other):
    graph = import_graph()
    assert not imports_between(graph, other, room), (
        f"{other} must not import {room} ({room} imports {other}, so the two rooms would import each other); "
        f"let a caller in {room} or above pass in what {other} needs:\n" + "\n".join(imports_between(graph, other, room))
    )


MAX_LOOSE_MODULES = 10  # top-level modules of trtllm_dflash/ beside the subpackages


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph read as rooms: a subpackage of trtllm_dflash, or one loose top-level module
    (plugins/ and cli/ count as the trtllm_dflash.plugins / .cli they install as)."""
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        rooms.setdefault(room_of(module), set()).update(room_of(t) for t in targets if room_of(t) != room_of(module))
    return rooms


def test_no_import_loop_between_rooms():
    """No room reaches itself through other rooms (function-level imports count): a newcomer can read
    the rooms bottom-up."""
    graph = import_graph()
    rooms = room_graph(graph)
    loops = cycles(rooms)
    detail = []
    for loop in loops:
        detail += [
            f"  {room} -> {other}: {', '.join(imports_between(graph, room, other)[:3])}"
            for room in loop
            for other in sorted(rooms[room] & set(loop))
        ]
    assert not loops, "rooms importing each other in a loop:\n" + "\n".join(detail)


def test_few_loose_modules_at_the_top():
    loose = sorted(p.name for p in (ROOT / "trtllm_dflash").glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= MAX_LOOSE_MODULES, f"{len(loose)} loose modules in trtllm_dflash/ (at most {MAX_LOOSE_MODULES}): {loose}"


@pytest.mark.parametrize("folder", ["trtllm_dflash", "plugins", "cli", "benchmarks"])
def test_no_source_file_over_the_line_limit(folder):
    long_files = {
        str(path.relative_to(ROOT)): count
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (count := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long_files, f"split these files (over {MAX_LINES} lines): {long_files}"


def test_the_checks_catch_what_they_guard(tmp_path):
    """The graph reader sees function-level imports, and the cycle finder finds a two-file loop."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from trtllm_dflash.builder import export\n")
    assert imports_of("trtllm_dflash.runtime.m", module, source_files()) == {"trtllm_dflash.builder.export"}
    module.write_text("def f():\n    from trtllm_dflash.testing import tiny\n")
    assert imports_of("trtllm_dflash.builder.m", module, source_files()) == {"trtllm_dflash.testing.tiny"}
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    loop = {"trtllm_dflash.served_model.x": {"trtllm_dflash.backends"}, "trtllm_dflash.backends.y": {"trtllm_dflash.served_model.z"}}
    assert imports_between(loop, "trtllm_dflash.served_model", "trtllm_dflash.backends") == [
        "trtllm_dflash.served_model.x -> trtllm_dflash.backends"
    ]
    # a loop through three rooms is seen, though no two files import each other
    planted = {
        "trtllm_dflash.ops.a": {"trtllm_dflash.modeling.b"},
        "trtllm_dflash.modeling.b": {"trtllm_dflash.runtime.c"},
        "trtllm_dflash.runtime.c": {"trtllm_dflash.ops"},
        "trtllm_dflash.ops": set(),
    }
    assert cycles(planted) == [] and cycles(room_graph(planted)) == [
        sorted(["trtllm_dflash.ops", "trtllm_dflash.modeling", "trtllm_dflash.runtime"])
    ]
    assert cycles(room_graph(import_graph())) == []  # and the real graph, read the same way, has none
    assert layer_of("trtllm_dflash.runtime.base") < layer_of("trtllm_dflash.builder.export")

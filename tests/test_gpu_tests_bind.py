"""The GPU-only tests still fit the code they call, checked where they cannot run.

Why: CI has no GPU, so a test file that skips without one (tests/*_gpu.py) is never imported past
its skip marks here, and a changed signature breaks it unseen until a GPU window, whose minutes are
few (one was found so: `verify_choice.check` called without its new first argument). This reads
those files as source and binds every call of a function they import from the project (or from
tests/support.py) to that function's current signature, and looks up every attribute they read
from a project module.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).parent
GPU_TEST_FILES = sorted(TESTS.glob("test_*gpu*.py"))
OWN_MODULES = ("trtllm_dflash", "support")


def _imported_names(tree: ast.Module) -> tuple[dict[str, Any], list[str]]:
    """Names bound by the file's imports from the project (anywhere in it), and the imports that fail."""
    names: dict[str, Any] = {}
    failed = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in OWN_MODULES:
            module = importlib.import_module(node.module)
            for alias in node.names:
                if hasattr(module, alias.name):
                    names[alias.asname or alias.name] = getattr(module, alias.name)
                    continue
                try:
                    names[alias.asname or alias.name] = importlib.import_module(f"{node.module}.{alias.name}")
                except ImportError:
                    failed.append(f"line {node.lineno}: cannot import {alias.name} from {node.module}")
    return names, failed


def _called(node: ast.Call, names: dict[str, Any]) -> Any:
    """What a call calls, where it is a project function: `name(...)` or `module.name(...)`."""
    func = node.func
    if isinstance(func, ast.Name):
        return names.get(func.id)
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and inspect.ismodule(names.get(func.value.id)):
        return getattr(names[func.value.id], func.attr, None)
    return None


def mismatches(source: str) -> list[str]:
    """Every import, attribute read and call of the project's in `source` that no longer fits it."""
    tree = ast.parse(source)
    names, problems = _imported_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and inspect.ismodule(names.get(node.value.id)):
            if not hasattr(names[node.value.id], node.attr):
                problems.append(f"line {node.lineno}: {node.value.id}.{node.attr} does not exist")
        if not isinstance(node, ast.Call):
            continue
        target = _called(node, names)
        if target is None or inspect.ismodule(target) or not callable(target):
            continue
        if any(isinstance(arg, ast.Starred) for arg in node.args) or any(keyword.arg is None for keyword in node.keywords):
            continue  # *args or **kwargs: the count is not known from the source
        try:
            signature = inspect.signature(target)
        except (TypeError, ValueError):  # builtins and extension functions without one
            continue
        try:
            signature.bind(*node.args, **{keyword.arg: keyword.value for keyword in node.keywords})
        except TypeError as error:
            problems.append(f"line {node.lineno}: {ast.unparse(node.func)}(...): {error}")
    return problems


def test_there_are_gpu_test_files_to_read():
    assert len(GPU_TEST_FILES) >= 8, GPU_TEST_FILES


@pytest.mark.parametrize("path", GPU_TEST_FILES, ids=lambda path: path.name)
def test_a_gpu_test_file_calls_the_project_as_it_is(path):
    assert mismatches(path.read_text()) == []


def test_the_check_finds_a_call_with_an_argument_missing_and_a_name_gone():
    source = """
from trtllm_dflash.runtime import verify_choice
from trtllm_dflash.ops.reference import argmax

def test_it():
    verify_choice.check(1, 16, 151936, None, None)
    argmax(None)
    verify_choice.no_such_function()
"""
    found = mismatches(source)
    assert len(found) == 2, found
    assert any("line 6: verify_choice.check(...): missing a required argument: 'device'" in f for f in found), found
    assert any("line 8: verify_choice.no_such_function does not exist" in f for f in found), found

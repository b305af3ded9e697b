"""Check LLM-API options against TensorRT-LLM's own argument classes, read from its source.

`llm_args.json` (beside this file) is an extract of tensorrt_llm/llmapi/llm_args.py at a
pinned release (v1.4.0rc1; the file records its tag, commit and how it was read): class -> field ->
type / allowed literal values / default / bounds, plus the cross-field rules this toolkit relies
on. It replaces a hand-made key list, so a key, a type or
a value that the pinned TensorRT-LLM would reject is refused here, at configuration time.
`python -m trtllm_dflash.backends.trtllm.llm_args_extract CHECKOUT` regenerates it from a local checkout.

Where TensorRT-LLM is installed (the GPU node), `installed_llm_args()` extracts the same table from
the installed package's own llm_args.py (read with `ast`, never imported), so options written
against the pinned release are checked against the version that will run them, key by key.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("llm_args.json")
ROOT = "TorchLlmArgs"


@functools.lru_cache(maxsize=None)
def llm_args_data(path: str | None = None) -> dict[str, Any]:
    """The pinned extract (classes, rules, source commit)."""
    return json.loads(Path(path or DATA).read_text())


def source_name(data: dict[str, Any]) -> str:
    """'v1.4.0rc1 (NVIDIA/TensorRT-LLM@0372799d1543)' or, for an untagged extract, the repository@commit."""
    src = data["source"]
    where = f"{src['repository']}@{src['commit'][:12]}"
    return f"{src['release_tag']} ({where})" if src.get("release_tag") else where


def pinned_source() -> str:
    return source_name(llm_args_data())


def pinned_version() -> str | None:
    """The TensorRT-LLM version the pinned extract is of ('1.4.0rc1'), when it is a release."""
    tag = llm_args_data()["source"].get("release_tag")
    return tag[1:] if tag and tag.startswith("v") else tag


def installed_llm_args() -> dict[str, Any] | None:
    """The extract of the installed TensorRT-LLM's llm_args.py (None when it is not installed).

    The package is located, not imported (importing it needs CUDA and its bindings).
    """
    from trtllm_dflash.backends.trtllm.llm_args_extract import extract

    try:
        spec = importlib.util.find_spec("tensorrt_llm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    source, version_file = root / "llmapi" / "llm_args.py", root / "version.py"
    if not source.is_file():
        return None  # the placeholder sdist on PyPI installs no package source
    version = "unknown"
    if version_file.is_file():
        for line in version_file.read_text().splitlines():
            if line.startswith("__version__"):
                version = line.split("=", 1)[1].strip().strip("\"'")
    return {
        "source": {"repository": "tensorrt_llm", "commit": f"installed {version}", "release_tag": f"v{version}"},
        "rules": llm_args_data().get("rules", {}),
        "classes": extract(source),
    }


def class_fields(name: str, data: dict[str, Any] | None = None) -> tuple[dict[str, Any], bool]:
    """All fields of a class including its bases, and whether the extract lists them all."""
    data = data or llm_args_data()
    cls = data["classes"][name]
    fields: dict[str, Any] = {}
    complete = bool(cls.get("fields_complete"))
    for base in cls.get("bases", []):
        if base in data["classes"]:
            base_fields, base_complete = class_fields(base, data)
            fields.update(base_fields)
            complete = complete and base_complete
    fields.update(cls["fields"])
    return fields, complete


def _type_problem(value: Any, spec: dict[str, Any]) -> str | None:
    kind = spec["type"]
    if value is None and spec.get("nullable"):  # e.g. cuda_graph_config: null turns CUDA graphs off
        return None
    optional = kind.startswith("optional[")
    if optional:
        if value is None:
            return None
        kind = kind[len("optional[") : -1]
    checks = {
        "bool": lambda v: isinstance(v, bool),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
        "any": lambda v: True,
        "list[int]": lambda v: isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v),
        "list[float]": lambda v: isinstance(v, list) and all(isinstance(i, (int, float)) for i in v),
        "dict[int,int]": lambda v: isinstance(v, dict) and all(isinstance(k, int) and isinstance(i, int) for k, i in v.items()),
    }
    if kind == "literal":
        if value not in spec["values"]:
            return f"{value!r} is not one of {spec['values']}"
        return None
    if kind == "nested":
        return None if isinstance(value, dict) else f"expected a mapping ({spec['cls']}), got {type(value).__name__}"
    if not checks.get(kind, lambda v: True)(value):
        return f"expected {spec['type']}, got {type(value).__name__} {value!r}"
    for bound, test, words in (("ge", lambda v, b: v >= b, ">="), ("gt", lambda v, b: v > b, ">"), ("le", lambda v, b: v <= b, "<=")):
        if bound in spec and isinstance(value, (int, float)) and not test(value, spec[bound]):
            return f"{value!r} must be {words} {spec[bound]}"
    return None


def check_class(options: dict[str, Any], name: str, where: str = "", data: dict[str, Any] | None = None) -> list[str]:
    """Every problem of `options` against class `name` of `data` (default: the pinned extract), as 'key.path: problem'."""
    data = data or llm_args_data()
    fields, complete = class_fields(name, data)
    problems = []
    for key, value in options.items():
        path = f"{where}{key}"
        spec = fields.get(key)
        if spec is None:
            close = [f for f in fields if f.replace("_", "") == key.replace("_", "") or f.startswith(key) or key.startswith(f)]
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            more = "" if complete else "; if it is a real key of that release, regenerate the extract"
            problems.append(f"{path}: unknown LLM-API key{hint}: not a field of {name} in TensorRT-LLM {source_name(data)}{more}")
            continue
        problem = _type_problem(value, spec)
        if problem:
            problems.append(f"{path}: {problem}")
        elif spec["type"] == "nested" and isinstance(value, dict):
            nested = spec["cls"]
            if spec.get("discriminator") and value.get(spec["discriminator"]) not in (None, "DFlash"):
                problems.append(
                    f"{path}.{spec['discriminator']}: {value.get(spec['discriminator'])!r} is not 'DFlash' "
                    "(this toolkit writes DFlash speculative configs only)"
                )
                continue
            problems += check_class(value, nested, f"{path}.", data)
    if name == "DFlashDecodingConfig":
        problems += check_decoding_rules(options, where)
    return problems


def check_decoding_rules(spec: dict[str, Any], where: str = "speculative_config.") -> list[str]:
    """DecodingBaseConfig's cross-field validators: schedule vs max_concurrency vs max_draft_len."""
    problems = []
    schedule = spec.get("draft_len_schedule")
    if spec.get("max_concurrency") is not None and schedule is not None:
        problems.append(
            f"{where}max_concurrency: cannot be combined with draft_len_schedule (TensorRT-LLM: mutually "
            "exclusive); drop trtllm.max_concurrency, the schedule's last entry already stops drafting"
        )
    if isinstance(schedule, dict) and schedule and all(isinstance(k, int) for k in schedule):
        max_len = spec.get("max_draft_len")
        first = schedule[min(schedule)]
        if max_len is not None and first != max_len:
            problems.append(f"{where}draft_len_schedule: the smallest batch size's length {first} must equal max_draft_len {max_len}")
        if max_len is not None and any(v > max_len for v in schedule.values()):
            problems.append(f"{where}draft_len_schedule: every length must be <= max_draft_len {max_len}")
    return problems

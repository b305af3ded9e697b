"""Check LLM-API options against TensorRT-LLM's own argument classes, read from its source.

`trtllm_llm_args.json` (beside this file) is an extract of tensorrt_llm/llmapi/llm_args.py at a
pinned commit: class -> field -> type / allowed literal values / default / bounds, plus the
cross-field rules this toolkit relies on. It replaces a hand-made key list, so a key, a type or
a value that the pinned TensorRT-LLM would reject is refused here, at configuration time.
`python -m trtllm_dflash.serving.llm_args_extract CHECKOUT` regenerates it from a local checkout.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("trtllm_llm_args.json")
ROOT = "TorchLlmArgs"


@functools.lru_cache(maxsize=None)
def llm_args_data(path: str | None = None) -> dict[str, Any]:
    """The pinned extract (classes, rules, source commit)."""
    return json.loads(Path(path or DATA).read_text())


def pinned_source() -> str:
    src = llm_args_data()["source"]
    return f"{src['repository']}@{src['commit'][:12]}" + (f" ({src['release_tag']})" if src.get("release_tag") else "")


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
    optional = kind.startswith("optional[")
    if optional:
        if value is None:
            return None
        kind = kind[len("optional["):-1]
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
    for bound, test, words in (("ge", lambda v, b: v >= b, ">="), ("gt", lambda v, b: v > b, ">"),
                               ("le", lambda v, b: v <= b, "<=")):
        if bound in spec and isinstance(value, (int, float)) and not test(value, spec[bound]):
            return f"{value!r} must be {words} {spec[bound]}"
    return None


def check_class(options: dict[str, Any], name: str, where: str = "") -> list[str]:
    """Every problem of `options` against class `name`, as 'key.path: problem'."""
    data = llm_args_data()
    fields, complete = class_fields(name, data)
    problems = []
    for key, value in options.items():
        path = f"{where}{key}"
        spec = fields.get(key)
        if spec is None:
            close = [f for f in fields if f.replace("_", "") == key.replace("_", "") or f.startswith(key) or key.startswith(f)]
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            more = "" if complete else "; if it is a real key of that release, regenerate the extract"
            problems.append(f"{path}: unknown LLM-API key{hint}: not a field of {name} in TensorRT-LLM {pinned_source()}{more}")
            continue
        problem = _type_problem(value, spec)
        if problem:
            problems.append(f"{path}: {problem}")
        elif spec["type"] == "nested" and isinstance(value, dict):
            nested = spec["cls"]
            if spec.get("discriminator") and value.get(spec["discriminator"]) not in (None, "DFlash"):
                problems.append(f"{path}.{spec['discriminator']}: {value.get(spec['discriminator'])!r} is not 'DFlash' "
                                "(this toolkit writes DFlash speculative configs only)")
                continue
            problems += check_class(value, nested, f"{path}.")
    if name == "DFlashDecodingConfig":
        problems += check_decoding_rules(options, where)
    return problems


def check_decoding_rules(spec: dict[str, Any], where: str = "speculative_config.") -> list[str]:
    """DecodingBaseConfig's cross-field validators: schedule vs max_concurrency vs max_draft_len."""
    problems = []
    schedule = spec.get("draft_len_schedule")
    if spec.get("max_concurrency") is not None and schedule is not None:
        problems.append(f"{where}max_concurrency: cannot be combined with draft_len_schedule (TensorRT-LLM: mutually "
                        "exclusive); drop trtllm.max_concurrency, the schedule's last entry already stops drafting")
    if isinstance(schedule, dict) and schedule and all(isinstance(k, int) for k in schedule):
        max_len = spec.get("max_draft_len")
        first = schedule[min(schedule)]
        if max_len is not None and first != max_len:
            problems.append(f"{where}draft_len_schedule: the smallest batch size's length {first} must equal max_draft_len {max_len}")
        if max_len is not None and any(v > max_len for v in schedule.values()):
            problems.append(f"{where}draft_len_schedule: every length must be <= max_draft_len {max_len}")
    return problems

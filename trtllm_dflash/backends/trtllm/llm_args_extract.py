"""Regenerate llm_args.json from a local TensorRT-LLM checkout (no import of tensorrt_llm).

    git clone --branch v1.4.0rc1 https://github.com/NVIDIA/TensorRT-LLM && \\
    python -m trtllm_dflash.backends.trtllm.llm_args_extract TensorRT-LLM --tag v1.4.0rc1

Reads tensorrt_llm/llmapi/llm_args.py with `ast`: for each class this toolkit writes options for,
every public annotated field with its type, literal values, default and ge/gt/le bounds. The
checker (llm_args_check.py) then validates model.yaml / trtllm-serve.yaml against it.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from trtllm_dflash.errors import DFlashError

CLASSES = {
    "DecodingBaseConfig": "DecodingBaseConfig",
    "DFlashDecodingConfig": "DFlashDecodingConfig",
    "KvCacheConfig": "KvCacheConfig",
    "CudaGraphConfig": "DecodeCudaGraphConfig",
    "MoeConfig": "MoeConfig",
    "BaseLlmArgs": "BaseLlmArgs",
    "TorchLlmArgs": "TorchLlmArgs",
}
_NESTED = {
    "KvCacheConfig": "KvCacheConfig",
    "SpeculativeConfig": "DFlashDecodingConfig",
    "CudaGraphConfig": "CudaGraphConfig",
    "CudaGraphConfigType": "CudaGraphConfig",
    "MoeConfig": "MoeConfig",
}
_SIMPLE = {
    "bool": "bool",
    "int": "int",
    "float": "float",
    "str": "str",
    "NonNegativeInt": "int",
    "PositiveInt": "int",
    "StrictInt": "int",
    "NonNegativeFloat": "float",
    "List[int]": "list[int]",
    "list[int]": "list[int]",
    "dict[int, int]": "dict[int,int]",
    "Dict[int, int]": "dict[int,int]",
    "List[float]": "list[float]",
}


def _type(annotation: ast.expr) -> dict[str, Any]:
    text = ast.unparse(annotation)
    optional = text.startswith("Optional[") and text.endswith("]")
    inner = text[len("Optional[") : -1] if optional else text
    if inner.startswith("Literal["):
        values = (
            [ast.literal_eval(e) for e in ast.parse(inner, mode="eval").body.slice.elts]
            if "," in inner
            else [ast.literal_eval(ast.parse(inner, mode="eval").body.slice)]
        )
        return {"type": "optional[literal]" if optional else "literal", "values": values}
    if inner in _NESTED:
        return {"type": "nested", "cls": _NESTED[inner]}
    if inner.startswith("Union[str, Path]"):
        inner = "str"
    kind = _SIMPLE.get(inner, "any")
    return {"type": f"optional[{kind}]" if optional else kind, "annotation": text}


def _field(node: ast.AnnAssign) -> dict[str, Any]:
    spec = _type(node.annotation)
    value = node.value
    if isinstance(value, ast.Call) and getattr(value.func, "id", "") in ("Field", "PydanticField"):
        args = {k.arg: k.value for k in value.keywords if k.arg}
        default = value.args[0] if value.args else args.get("default")
        for bound in ("ge", "gt", "le", "lt"):
            if bound in args:
                try:
                    spec[bound] = ast.literal_eval(args[bound])
                except ValueError:
                    pass
        if "status" in args:
            spec["status"] = ast.literal_eval(args["status"])
    else:
        default = value
    try:
        spec["default"] = ast.literal_eval(default) if default is not None else None
    except ValueError:
        spec["default"] = ast.unparse(default)
    return spec


def extract(llm_args_py: Path) -> dict[str, Any]:
    """class -> fields, for the classes in CLASSES, from llm_args.py source."""
    tree = ast.parse(Path(llm_args_py).read_text())
    found = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    classes: dict[str, Any] = {}
    for name, source_name in CLASSES.items():
        node = found.get(source_name)
        if node is None:
            raise DFlashError(f"{llm_args_py} has no class {source_name}", "use a TensorRT-LLM checkout with DFlash (1.3.0rc or later)")
        bases = [ast.unparse(b) for b in node.bases if ast.unparse(b) in CLASSES]
        fields = {
            s.target.id: _field(s)
            for s in node.body
            if isinstance(s, ast.AnnAssign)
            and isinstance(s.target, ast.Name)
            and not s.target.id.startswith("_")
            and not ast.unparse(s.annotation).startswith("ClassVar")
        }
        fields.pop("model_config", None)
        classes[name] = {"bases": bases, "fields_complete": True, "fields": fields}
    if "BaseCudaGraphConfig" in found:
        base = found["BaseCudaGraphConfig"]
        classes["CudaGraphConfig"]["fields"] = {
            s.target.id: _field(s) for s in base.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
        } | classes["CudaGraphConfig"]["fields"]
    return classes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path, help="TensorRT-LLM source checkout")
    parser.add_argument("--tag", default=None, help="the release tag checked out (recorded)")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("llm_args.json"))
    args = parser.parse_args(argv)
    source = args.checkout / "tensorrt_llm" / "llmapi" / "llm_args.py"
    if not source.is_file():
        print(f"error: {source} not found; pass the root of a TensorRT-LLM checkout", file=sys.stderr)
        return 2
    try:
        commit = subprocess.run(
            ["git", "-C", str(args.checkout), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown (not a git checkout)"
    old = json.loads(args.out.read_text()) if args.out.is_file() else {}
    data = {
        "source": {
            "repository": "NVIDIA/TensorRT-LLM",
            "path": "tensorrt_llm/llmapi/llm_args.py",
            "commit": commit,
            "release_tag": args.tag,
            "classes_read": "whole classes (extracted with ast)",
        },
        "rules": old.get("rules", {}),
        "classes": extract(source),
    }
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.out} ({len(data['classes'])} classes from {commit[:12]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

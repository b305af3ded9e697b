"""Writing a Triton model repository that serves DFlash with the Python backend.

    REPO/
      dflash/config.pbtxt     backend "python", decoupled, LLM-API style inputs/outputs, and the
                              ServingConfig as `parameters`
      dflash/1/model.py       a few lines that import trtllm_dflash.backends.triton_model
      ar/...                  optional: the same target without the drafter (the baseline)
      dflash_repository.json  what wrote it and from what

The repository is written into a temporary folder and renamed into place when complete, so a
failed or interrupted write never leaves something that looks like a repository.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.served_model.model_parameters import ServingConfig
from trtllm_dflash.served_model.protocol import INPUTS, LIST_INPUTS, OUTPUTS, PROBE_OUTPUTS

MANIFEST = "dflash_repository.json"
PYTHONPATH_ENV = "DFLASH_TRT_PYTHONPATH"

MODEL_PY = f'''"""Triton Python-backend model: DFlash speculative decoding (written by `dflash-trt repo`).

The stub's Python needs trtllm-dflash (`pip install "trtllm-dflash[serve]"` in the Triton
container). `dflash-trt serve` also passes its own environment in {PYTHONPATH_ENV}, because
the Python backend stub ignores PYTHONPATH.
"""

import os
import site
import sys

_paths = [p for p in os.environ.get("{PYTHONPATH_ENV}", "").split(os.pathsep) if p]
if _paths:  # site.addsitedir also runs .pth files (editable installs); ours go first
    _before = list(sys.path)
    for _path in _paths:
        site.addsitedir(_path)
    sys.path[:] = [p for p in sys.path if p not in _before] + _before


class TritonPythonModel:
    """Imports the toolkit (torch, transformers) only when the model loads, not for Triton's
    config auto-complete pass, which runs this file in a separate short-lived stub."""

    def initialize(self, args):
        from trtllm_dflash.backends.triton_model import TritonPythonModel as DFlashModel
        from trtllm_dflash.serving.server_watch import RequestNotes

        self.notes = RequestNotes(args["model_name"])  # so that `serve` can name the request before a crash
        self.model = DFlashModel()
        self.model.initialize(args)

    def execute(self, requests):
        self.notes.record(requests)
        return self.model.execute(requests)

    def finalize(self):
        self.model.finalize()
'''


def pbtxt_string(value: str) -> str:
    """A protobuf text-format string literal: UTF-8 bytes outside printable ASCII as octal escapes.

    Not JSON: protobuf's text format has no \\u escapes (json.dumps wrote them, and Triton read a
    non-ASCII checkpoint path back mangled, so the model found no directory)."""
    escaped = []
    for byte in value.encode("utf-8"):
        char = chr(byte)
        if char in '"\\':
            escaped.append("\\" + char)
        elif 0x20 <= byte < 0x7F:
            escaped.append(char)
        else:
            escaped.append(f"\\{byte:03o}")
    return '"' + "".join(escaped) + '"'


def check_servable_paths(config: ServingConfig) -> None:
    """Refuse checkpoint and engine paths the Python backend cannot open, before anything is written.

    Its stub starts Python in the C locale, so file names are ASCII there: a path with "ü" or
    "日本" fails in the tokenizer (seen with tritonserver 2.51), whatever the server's LANG.
    The repository itself may live anywhere: `serve` hands Triton an ASCII link to it."""
    for what, path in (("target", config.target), ("drafter", config.drafter), ("engines", config.engines)):
        if path is not None and not path.isascii():
            raise DFlashError(
                f"the {what} path {path} has non-ASCII characters, which Triton's Python backend cannot open "
                "(its stub runs Python with ASCII file names)",
                f"link or move it to an ASCII path (ln -s '{path}' /data/{what}) and pass that",
            )


def render_config(name: str, config: ServingConfig, inputs: dict = INPUTS, outputs: dict = OUTPUTS | PROBE_OUTPUTS) -> str:
    """config.pbtxt of one decoupled Python-backend model."""
    check_servable_paths(config)
    lines = [
        f"name: {pbtxt_string(name)}",
        'backend: "python"',
        "max_batch_size: 0  # the model batches requests itself, between decoding steps",
        "model_transaction_policy { decoupled: true }",
        "",
        "input [",
    ]
    entries = []
    for input_name, (dtype, _, optional) in inputs.items():
        dims = "[ -1 ]" if input_name in LIST_INPUTS else "[ 1 ]"
        extra = " optional: true" if optional else ""
        entries.append(f"  {{ name: {pbtxt_string(input_name)} data_type: {dtype} dims: {dims}{extra} }}")
    lines += [",\n".join(entries), "]", "output ["]
    entries = [
        f"  {{ name: {pbtxt_string(out)} data_type: {dtype} dims: [ {', '.join(map(str, dims))} ] }}"
        for out, (dtype, dims) in outputs.items()
    ]
    lines += [
        ",\n".join(entries),
        "]",
        "",
        "instance_group [ { count: 1 kind: KIND_CPU } ]  # one process owns the models and the loop",
        "",
    ]
    for key, value in config.to_parameters().items():
        lines.append(f"parameters {{ key: {pbtxt_string(key)} value: {{ string_value: {pbtxt_string(value)} }} }}")
    return "\n".join(lines) + "\n"


def write_model(repo: Path, name: str, config: ServingConfig) -> Path:
    """One model folder of the repository."""
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(render_config(name, config))
    (model_dir / "1" / "model.py").write_text(MODEL_PY)
    return model_dir


def write_repository(
    out: str | Path,
    models: Sequence[tuple[str, ServingConfig]],
    source: dict | None = None,
    force: bool = False,
) -> Path:
    """Write a complete repository at `out` (atomically); `force` replaces an existing one."""
    names = [name for name, _ in models]
    if not models:
        raise DFlashError("no model to put in the repository", "name a model (--model) or a build (--build)")
    if len(set(names)) != len(names):
        raise DFlashError(f"model names repeat: {names}", "give each model of the repository its own name")
    for name in names:
        check_model_name(name)
    with staged_directory(out, force) as staging:
        for name, config in models:
            write_model(staging, name, config)
        write_manifest(staging, {n: c.model_dump() for n, c in models}, source)
    return Path(out).expanduser().resolve()


def check_model_name(name: str) -> None:
    if not name or not all(c.isalnum() or c in "-_" for c in name):
        raise DFlashError(f"model name {name!r} is not a valid Triton model name", "use letters, digits, '-' and '_'")


def write_manifest(repo: Path, models: dict, source: dict | None) -> None:
    from trtllm_dflash import __version__

    manifest = {"writer": f"trtllm-dflash {__version__}", "models": models, "source": source or {}}
    (repo / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


@contextlib.contextmanager
def staged_directory(out: str | Path, force: bool = False) -> Iterator[Path]:
    """A temporary folder beside `out`, renamed to `out` only when the block completes."""
    out = Path(out).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise DFlashError(f"--out {out} is a file", "choose a directory for the repository")
    if out.exists() and any(out.iterdir()) and not force:
        raise DFlashError(f"--out {out} already exists and is not empty", "pass --force to replace it, or choose another --out")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as exc:
        raise DFlashError(f"cannot write in {out.parent} ({exc.strerror})", "choose a writable --out") from None
    try:
        yield staging
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def model_names(repo: str | Path) -> list[str]:
    """The models of a repository (folders with a config.pbtxt), sorted."""
    repo = Path(repo)
    return sorted(p.parent.name for p in repo.glob("*/config.pbtxt"))


def check_checkpoints(target: str, drafter: str | None) -> tuple[str, str | None]:
    """Check (cheaply, from config files) that the pair can be served; return the paths to record.

    `demo` stays `demo` (resolved where the server runs); directories become absolute paths.
    """
    from transformers import AutoConfig

    from trtllm_dflash.checkpoints import TOKENIZER_FILES, resolve_checkpoint, validate_pair
    from trtllm_dflash.config import DrafterConfig

    target_dir = resolve_checkpoint(target, "target")
    if not (target_dir / "config.json").is_file():
        raise DFlashError(f"target {target_dir} has no config.json", "point --model at a Hugging Face model directory")
    if not any((target_dir / name).is_file() for name in TOKENIZER_FILES):
        raise DFlashError(f"target {target_dir} has no tokenizer", "save the tokenizer next to the model; the server takes text")
    if drafter is not None:
        drafter_dir = resolve_checkpoint(drafter, "drafter")
        target_config = AutoConfig.from_pretrained(target_dir, local_files_only=True, trust_remote_code=False)
        validate_pair(target_config.get_text_config(), DrafterConfig.from_dir(drafter_dir))
    # absolute, links kept: a link is how a checkpoint under a non-ASCII path is served (check_servable_paths)
    record = lambda name, path: "demo" if name == "demo" else os.path.abspath(path)  # noqa: E731
    return record(target, target_dir), (record(drafter, drafter_dir) if drafter is not None else None)

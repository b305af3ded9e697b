"""What a user sees when a command fails in a way we did not foresee: one line, and a file.

The line names the command, the model family, the package versions that most often explain such
a failure (torch, transformers, TensorRT) and the file holding the full traceback; `--debug`
prints the traceback instead. Stages a command finished before the failure stay on disk: the
build pipeline writes each stage's manifest only when the stage completes.
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile
import traceback
from importlib import metadata
from pathlib import Path

# the options that name a model, in the order they are looked at
MODEL_OPTIONS = ("--target", "--model", "--build", "--drafter")
GROUPS = ("plugins", "recipes")  # commands with subcommands
VERSIONED = ("torch", "transformers", "tensorrt", "tensorrt-rtx-cu13-bindings", "tensorrt-llm")


def crash_dir() -> Path:
    """Where tracebacks go: $DFLASH_TRT_CRASH_DIR, else a folder in the temporary directory."""
    return Path(os.environ.get("DFLASH_TRT_CRASH_DIR") or Path(tempfile.gettempdir()) / "dflash-trt-crashes")


def command_name(argv: list[str]) -> str:
    """`dflash-trt generate` for argv `[..., "generate", "--target", ...]`; groups keep their subcommand."""
    words = [word for word in argv[1:] if not word.startswith("-")][:2]
    if words and words[0] not in GROUPS:
        words = words[:1]
    return " ".join(["dflash-trt", *words])


def model_family(argv: list[str]) -> str:
    """The model_type of the first checkpoint the command names, or the name as given."""
    for option in MODEL_OPTIONS:
        value = _option_value(argv, option)
        if value is None:
            continue
        config = Path(value) / "config.json"
        if config.is_file():
            try:
                return str(json.loads(config.read_text()).get("model_type", value))
            except (OSError, ValueError):
                return value
        return "qwen3 (demo pair)" if value == "demo" else value
    return "no model named"


def _option_value(argv: list[str], option: str) -> str | None:
    for i, word in enumerate(argv):
        if word == option and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(option + "="):
            return word.split("=", 1)[1]
    return None


def versions() -> str:
    found = []
    for name in VERSIONED:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            if name == "tensorrt":
                found.append("no tensorrt")
    return ", ".join(found)


def report(exc: BaseException, argv: list[str]) -> str:
    """Write the traceback to a new file and return the one line to print."""
    command = command_name(argv)
    folder = crash_dir()
    folder.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = folder / f"{command.replace(' ', '-')}-{stamp}-{os.getpid()}.log"
    model, installed = model_family(argv), versions()
    header = f"{' '.join(argv)}\nmodel: {model}\nversions: {installed}\n\n"
    path.write_text(header + "".join(traceback.format_exception(exc)), encoding="utf-8")
    message = (str(exc).strip().splitlines() or [""])[0]
    reason = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return (
        f"`{command}` failed unexpectedly ({reason}); model: {model}; {installed}; "
        f"full traceback in {path} (--debug prints it here); please report it with that file"
    )

"""What a build directory holds besides its graphs and engines, as the runtimes read it.

A build directory carries everything a runtime needs besides the weights' graphs: the drafter's
config.json and the target's tokenizer, generation config and config.json (no weights).
Pipelines over a build: trtllm_dflash/backends/trt.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from trtllm_dflash.errors import DFlashError


def tokenizer_and_stops(directory: Path) -> tuple[object | None, tuple[int, ...]]:
    """The tokenizer saved in `directory` and the end-of-sequence ids of the target."""
    from transformers import AutoTokenizer

    from trtllm_dflash.checkpoints import TOKENIZER_FILES

    tokenizer = None
    if any((directory / name).is_file() for name in TOKENIZER_FILES):
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True, trust_remote_code=False)
    stops: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        try:
            value = json.loads((directory / name).read_text()).get("eos_token_id")
        except (OSError, json.JSONDecodeError):
            continue
        stops.update([value] if isinstance(value, int) else [int(v) for v in value or []])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        stops.add(int(tokenizer.eos_token_id))
    return tokenizer, tuple(sorted(stops))


def export_dir_of(path: str | Path) -> Path:
    """The export/ folder of a build directory (or the folder itself if it is one)."""
    path = Path(path).expanduser()
    for candidate in (path, path / "export"):
        if (candidate / "graphs.json").is_file():
            return candidate
    raise DFlashError(
        f"{path} holds no exported graphs (graphs.json)", "pass the --out directory of a `dflash-trt build` whose export stage finished"
    )


def read_index(folder: Path, name: str, fix: str) -> dict:
    """A build folder's JSON index (graphs.json, engines.json); a DFlashError saying `fix` where it has none."""
    index = folder / name
    if not index.is_file():
        raise DFlashError(f"{folder} has no {name}", fix)
    return json.loads(index.read_text())

"""The embedded demo pair: a small target LM and its DFlash drafter, shipped with the package.

The name `demo` selects it wherever a model is named (`--target demo`, `--model demo`).
`drafter_v2_dir()` is a DFlash V2 drafter for the same target, trained from the V1 drafter.
"""

from __future__ import annotations

from pathlib import Path

from trtllm_dflash.errors import CheckpointError

DEMO_DIR = Path(__file__).resolve().parent


def _require(path: Path) -> Path:
    if not (path / "config.json").is_file():
        raise CheckpointError(
            f"the embedded demo checkpoint {path} is missing",
            "reinstall trtllm-dflash, or rebuild it with `python benchmarks/train_demo.py`",
        )
    return path


def target_dir() -> Path:
    return _require(DEMO_DIR / "target")


def drafter_dir() -> Path:
    return _require(DEMO_DIR / "drafter")


def drafter_v2_dir() -> Path:
    return _require(DEMO_DIR / "drafter_v2")

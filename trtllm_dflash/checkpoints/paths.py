"""Where a checkpoint is: a directory given by its path, or the embedded demo pair for the name `demo`.

The demo pair's directories come from `trtllm_dflash.demo` (its `__init__` imports only the
errors module), so nothing here depends on the API or the runtimes.
"""

from __future__ import annotations

from pathlib import Path

from trtllm_dflash.errors import CheckpointError


def resolve_checkpoint(name_or_path: str | Path, role: str) -> Path:
    """A directory from a path, or the embedded demo pair for the name `demo`."""
    if str(name_or_path) == "demo":
        from trtllm_dflash import demo

        return demo.target_dir() if role == "target" else demo.drafter_dir()
    path = Path(name_or_path).expanduser()
    if not path.exists():
        raise CheckpointError(f"{role} directory {path} does not exist", f"pass an existing {role} checkpoint directory")
    if not path.is_dir():
        raise CheckpointError(f"{role} path {path} is not a directory", f"pass the {role} checkpoint's directory")
    return path

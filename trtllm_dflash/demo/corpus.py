"""The demo pair's training text: the Python standard library's own source, on every machine.

Files are split into training and held-out sets by a hash of their path relative to the
standard library, so the split is the same on every machine with the same Python version and
does not depend on file order. Test suites, vendored packages and generated tables (codec
tables, pydoc topics) are left out: they are not the code a user would prompt with.
"""

from __future__ import annotations

import hashlib
import random
import sysconfig
from pathlib import Path

EXCLUDED_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "pydoc_data", "encodings", "_bundled"}
)
HELD_OUT_EVERY = 20  # about 5% of the files are held out


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[Path]:
    """Every kept `*.py` file of the standard library, in a stable (path) order."""
    root = root or stdlib_root()
    files = []
    for path in root.rglob("*.py"):
        relative = path.relative_to(root)
        if any(part in EXCLUDED_DIRS or part.startswith("config-") for part in relative.parts[:-1]):
            continue
        files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def is_held_out(relative_path: str) -> bool:
    digest = hashlib.sha1(relative_path.encode()).hexdigest()
    return int(digest[:8], 16) % HELD_OUT_EVERY == 0


def split_files(root: Path | None = None) -> tuple[list[Path], list[Path]]:
    """(training files, held-out files)."""
    root = root or stdlib_root()
    train, held_out = [], []
    for path in stdlib_files(root):
        (held_out if is_held_out(path.relative_to(root).as_posix()) else train).append(path)
    return train, held_out


def read_source(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def function_prompts(files: list[Path], count: int, seed: int = 0, max_chars: int = 200) -> list[str]:
    """Prompts that open a function: its `def` line and the lines after it, up to ~max_chars.

    Drawn evenly over `files` with a seeded RNG, so the held-out prompt set is reproducible. A
    prompt ends at the end of a line WITHOUT its newline: byte-level BPE merges a newline with the
    next line's indentation, so a prompt ending in a bare newline token is out of distribution.
    """
    rng = random.Random(seed)
    candidates: list[list[str]] = []
    for path in files:
        lines = read_source(path).splitlines(keepends=True)
        starts = [i for i, line in enumerate(lines) if line.lstrip().startswith("def ") and line.rstrip().endswith(":")]
        picks = []
        for start in starts:
            prompt = ""
            for line in lines[start:]:
                if len(prompt) + len(line) > max_chars and prompt:
                    break
                prompt += line
            if len(prompt) >= 40 and prompt.count("\n") >= 2:
                picks.append(prompt.rstrip())
        if picks:
            rng.shuffle(picks)
            candidates.append(picks)
    rng.shuffle(candidates)
    prompts: list[str] = []
    while len(prompts) < count and any(candidates):
        for picks in candidates:
            if picks and len(prompts) < count:
                prompts.append(picks.pop())
    return prompts

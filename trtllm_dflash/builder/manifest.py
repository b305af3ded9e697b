"""Hashes, tool versions and the build's top-level manifest.json.

Hashes are what make a build reproducible and re-runs cheap: a stage is keyed by the hash of its
inputs (recipe fields, input file digests, tool versions), so the same inputs give the same keys
on any machine, and the same graph bytes (the ONNX export is normalised, see export.py).
Checkpoint digests are cached by (path, size, mtime) so multi-GB checkpoints are read once.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

CHUNK = 8 << 20


def sha256_file(path: Path, progress: Callable[[int], None] | None = None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
            if progress is not None:
                progress(len(chunk))
    return digest.hexdigest()


def sha256_json(value: Any) -> str:
    """Digest of a JSON-able value, independent of key order."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


class HashCache:
    """File digests remembered by (absolute path, size, mtime_ns) in a small JSON file."""

    def __init__(self, file: Path) -> None:
        self.file = file
        try:
            self.entries: dict[str, Any] = json.loads(file.read_text())
        except (OSError, json.JSONDecodeError):
            self.entries = {}

    def digest(self, path: Path, progress: Callable[[int], None] | None = None) -> str:
        path = path.resolve()
        stat = path.stat()
        key = str(path)
        entry = self.entries.get(key)
        if entry and entry["size"] == stat.st_size and entry["mtime_ns"] == stat.st_mtime_ns:
            if progress is not None:
                progress(stat.st_size)
            return entry["sha256"]
        value = sha256_file(path, progress)
        self.entries[key] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": value}
        return value

    def save(self) -> None:
        write_json_atomic(self.file, self.entries)


def files_digest(root: Path, relative: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """`{relative path: {sha256, bytes}}` for every file under root (or the listed ones), sorted."""
    names = relative if relative is not None else sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    return {name: {"sha256": sha256_file(root / name), "bytes": (root / name).stat().st_size} for name in sorted(names)}


def write_json_atomic(path: Path, value: Any) -> None:
    """Write JSON so that readers see the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(value, handle, indent=2, sort_keys=True, default=str)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


TOOL_PACKAGES = {
    "torch": "torch",
    "transformers": "transformers",
    "modelopt": "nvidia-modelopt",
    "onnx": "onnx",
    "onnxscript": "onnxscript",
    "onnxruntime": "onnxruntime",
    "triton": "triton",
    "tensorrt": "tensorrt",
    "tensorrt_rtx": "tensorrt_rtx_cu13_bindings",
    "tensorrt_llm": "tensorrt_llm",
    "trtllm_dflash": "trtllm-dflash",
}


def tool_versions() -> dict[str, str | None]:
    """Installed versions from package metadata (nothing is imported)."""
    versions = {tool: package_version(dist) for tool, dist in TOOL_PACKAGES.items()}
    if versions["tensorrt"] is None:
        versions["tensorrt"] = package_version("tensorrt-cu12") or package_version("tensorrt-cu13")
    return versions


def ptx_isa_versions() -> dict[str, dict[str, str]]:
    """PTX ISA (and the oldest driver that can JIT it) per architecture of the plugin kernels.

    The plugins pin the PTX ISA per target (`plugins/aot.py`) because a PTX newer than the driver
    fails when TensorRT loads the kernel; the manifest records the choice per deployment arch.
    """
    try:
        from trtllm_dflash.plugins import aot
    except Exception:  # noqa: BLE001 - the plugins part (or Triton) is not installed
        return {}
    return {a.name: {"ptx_isa": a.ptx_isa_text, "min_driver": a.min_driver, "cuda": a.cuda} for a in aot.ARCHES.values()}


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None

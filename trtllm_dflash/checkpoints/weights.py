"""The safetensors files of a checkpoint directory: present (pickled weights are refused, never
loaded), and with headers that are JSON and not truncated, checked before any tensor is read."""

from __future__ import annotations

import json
from pathlib import Path

from trtllm_dflash.errors import CheckpointError


def require_safetensors(path: Path, role: str) -> list[Path]:
    files = sorted(path.glob("*.safetensors"))
    if files:
        return files
    pickled = [p.name for p in path.iterdir() if p.suffix in {".bin", ".pt", ".pth", ".ckpt"}]
    if pickled:
        raise CheckpointError(
            f"{role} {path} has only pickled weights ({', '.join(pickled[:3])})",
            "convert them to safetensors (for example `model.save_pretrained(dir, safe_serialization=True)`); "
            "pickled files are never loaded",
        )
    raise CheckpointError(f"{role} {path} has no *.safetensors weights", f"point at a complete {role} checkpoint")


def _read_header(file: Path) -> tuple[int, dict]:
    with open(file, "rb") as handle:
        header_len = int.from_bytes(handle.read(8), "little")
        if header_len <= 0 or header_len > file.stat().st_size - 8:
            raise ValueError("header length out of range")
        return header_len, json.loads(handle.read(header_len))


def safetensors_header(file: Path) -> dict:
    """The JSON header of a safetensors file (name -> dtype, shape, data_offsets), read without the
    tensors; ValueError when its length is out of range or it is not JSON."""
    return _read_header(file)[1]


def check_safetensors_headers(files: list[Path]) -> None:
    """Fail early, with the file name, on a truncated or corrupted safetensors file."""
    for file in files:
        try:
            header_len, header = _read_header(file)
            data_len = file.stat().st_size - 8 - header_len
            ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
            if ends and max(ends) > data_len:
                raise ValueError("tensor data is truncated")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{file} is not a valid safetensors file ({exc})", "re-download or re-export the checkpoint") from None

"""TensorRT engines from the exported graphs, with full TensorRT or TensorRT-RTX (one module).

Both flavours share TensorRT's Python API: Builder, OnnxParser, optimization profiles,
`build_serialized_network`. What differs is where they can build:
- TensorRT-RTX (`tensorrt_rtx`, a real PyPI wheel) builds ahead of time for a named compute
  capability without a GPU (`num_compute_capabilities`/`set_compute_capability`); engines are
  specialised on the device at load time.
- Full TensorRT (`tensorrt`, Hopper/Blackwell datacenter) builds on the GPU it targets, and keeps a
  persistent timing cache so rebuilds skip kernel timing.
Networks are strongly typed: precision comes from the graph (BF16/FP16 tensors, FP8 Q/DQ), which
is what both flavours recommend and what TensorRT-RTX requires.

When the flavour or a GPU is missing, `StageBlocked` says what is missing and how to get it; an
engine file is only ever the output of `build_serialized_network`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from trtllm_dflash.builder.export import Bounds
from trtllm_dflash.builder.stages import StageBlocked
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.runtime.tensorrt_flavours import INSTALL_HINT, import_tensorrt


class EngineBuildError(DFlashError):
    """TensorRT could not parse or build a graph."""


@dataclasses.dataclass
class Flavour:
    """An imported TensorRT flavour."""

    name: str  # "tensorrt" or "tensorrt-rtx"
    trt: Any
    version: str

    @property
    def aot(self) -> bool:
        return self.name == "tensorrt-rtx"


def load_flavour(name: str) -> Flavour:
    """Import a TensorRT flavour, or say exactly what to install."""
    try:
        trt = import_tensorrt(name)
    except ImportError as exc:
        raise StageBlocked(f"{name} is not installed ({exc})", INSTALL_HINT[name]) from None
    return Flavour(name, trt, trt.__version__)


def local_gpu() -> tuple[str, tuple[int, int]] | None:
    """Name and compute capability of CUDA device 0, or None without a usable GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(0), tuple(torch.cuda.get_device_capability(0))


def check_can_build(flavour: Flavour, compute_capability: tuple[int, int], gpu_label: str) -> None:
    """Full TensorRT builds on the GPU it targets; TensorRT-RTX builds anywhere."""
    if flavour.aot:
        return
    gpu = local_gpu()
    if gpu is None:
        raise StageBlocked(
            f"full TensorRT builds engines only on a GPU and none is visible here (target: {gpu_label})",
            f"run the same `dflash-trt build` on a {gpu_label} machine; the finished stages are reused",
        )
    if gpu[1] != tuple(compute_capability):
        raise StageBlocked(
            f"this machine's GPU is {gpu[0]} (SM {gpu[1][0]}.{gpu[1][1]}); the recipe targets {gpu_label} "
            f"(SM {compute_capability[0]}.{compute_capability[1]})",
            f"build on a {gpu_label}, or pass --gpu matching this machine",
        )


# ----------------------------------------------------------------------------- profiles


def profiles(graph: str, bounds: Bounds) -> list[dict[str, tuple[int, int, int]]]:
    """(min, opt, max) of every dynamic axis, one dict per optimization profile.

    Target: profile 0 for verify steps (T <= block size), profile 1 for prefill. Cache inputs
    cover `max_seq_len + block_size` slots (the decoding loop's capacity): `past` slots of the
    native graph, the whole in-place `capacity` of the plugin (verifying) graph, whose
    `draft_probs` has `drafts` rows (block - 1 at verify, one placeholder row at prefill).
    """
    mb, mi, ms, blk = bounds.max_batch, bounds.max_input_len, bounds.max_seq_len, bounds.block_size
    slots = ms + blk
    if graph == "target":
        drafts = max(blk - 1, 1)
        return [
            {
                "batch": (1, mb, mb),
                "tokens": (1, blk, blk),
                "picked": (1, blk, blk),
                "past": (1, max(slots // 2, 1), slots),
                "drafts": (1, drafts, drafts),
                "capacity": (1, slots, slots),
            },
            {
                "batch": (1, 1, mb),
                "tokens": (1, max(mi // 2, 1), mi),
                "picked": (1, 1, mi),
                "past": (1, 1, slots),
                "drafts": (1, 1, drafts),
                "capacity": (1, slots, slots),
            },
        ]
    if graph == "drafter":
        return [{"batch": (1, mb, mb), "block": (2, blk, blk), "ctx_rows": (1, blk, mi), "past": (1, max(slots // 2, 1), slots)}]
    raise ValueError(graph)


def _shape(dims: list, which: int, profile: dict[str, tuple[int, int, int]]) -> tuple[int, ...]:
    return tuple(profile[d][which] if isinstance(d, str) else int(d) for d in dims)


# ----------------------------------------------------------------------------- build


def _compute_capability_enum(trt, compute_capability: tuple[int, int]):
    name = f"SM{compute_capability[0]}{compute_capability[1]}"
    if not hasattr(trt.ComputeCapability, name):
        raise DFlashError(f"TensorRT-RTX cannot target {name}", "pick an RTX GPU of SM 7.5, 8.0, 8.6, 8.9, 12.0 or 12.1")
    return getattr(trt.ComputeCapability, name)


class _Logger:
    """A TensorRT logger that keeps errors for the one-line message."""

    def __init__(self, trt) -> None:
        self.errors: list[str] = []
        outer = self

        class Logger(trt.ILogger):
            def __init__(self):
                trt.ILogger.__init__(self)

            def log(self, severity, msg):
                if severity in (trt.ILogger.INTERNAL_ERROR, trt.ILogger.ERROR):
                    outer.errors.append(str(msg))

        self.logger = Logger()


def build_engine(
    flavour: Flavour,
    onnx_path: Path,
    engine_path: Path,
    graph_info: dict[str, Any],
    graph_profiles: list[dict[str, tuple[int, int, int]]],
    compute_capability: tuple[int, int],
    timing_cache: Path | None = None,
    optimization_level: int = 3,
) -> dict[str, Any]:
    """Parse an ONNX graph and build one serialized engine; returns what the manifest records."""
    trt = flavour.trt
    log = _Logger(trt)
    started = time.perf_counter()
    builder = trt.Builder(log.logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, log.logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = [parser.get_error(i).desc() for i in range(parser.num_errors)]
        raise EngineBuildError(f"TensorRT could not parse {onnx_path.name}: {'; '.join(errors) or log.errors}", "re-export the graph")
    config = builder.create_builder_config()
    config.builder_optimization_level = optimization_level
    if flavour.aot:
        config.num_compute_capabilities = 1
        config.set_compute_capability(_compute_capability_enum(trt, compute_capability), 0)
    cache = None
    if timing_cache is not None and not flavour.aot:  # TensorRT-RTX has no timing cache (it tunes on the device)
        cache = config.create_timing_cache(timing_cache.read_bytes() if timing_cache.is_file() else b"")
        config.set_timing_cache(cache, ignore_mismatch=False)

    inputs = {spec["name"]: spec["dims"] for spec in graph_info["inputs"]}
    for profile_dims in graph_profiles:
        profile = builder.create_optimization_profile()
        for i in range(network.num_inputs):
            name = network.get_input(i).name
            dims = inputs[name]
            profile.set_shape(name, _shape(dims, 0, profile_dims), _shape(dims, 1, profile_dims), _shape(dims, 2, profile_dims))
        config.add_optimization_profile(profile)

    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise EngineBuildError(
            f"TensorRT could not build {onnx_path.name}: {'; '.join(log.errors[-3:]) or 'no message'}",
            "check the recipe's shape bounds, or report the build log",
        )
    engine_path.parent.mkdir(parents=True, exist_ok=True)
    with open(engine_path, "wb") as handle:
        handle.write(serialized)
    if cache is not None:
        _write_atomic(timing_cache, bytes(cache.serialize()))
    return {
        "file": engine_path.name,
        "bytes": engine_path.stat().st_size,
        "profiles": [{k: list(v) for k, v in p.items()} for p in graph_profiles],
        "build_seconds": round(time.perf_counter() - started, 2),
    }


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)

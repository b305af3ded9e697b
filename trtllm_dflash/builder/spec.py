"""The build specification: one model on one GPU type, at one precision, with its limits.

Resolved from (lowest to highest priority) the catalog defaults for the model x GPU pair, an
optional recipe YAML file, and the command-line flags. Every combination that cannot work is
refused here, at plan time, with the GPUs or settings that would work: a user learns that NVFP4
needs Blackwell before anything is downloaded or built. No torch import.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from pathlib import Path
from typing import Any

from trtllm_dflash.builder import catalog
from trtllm_dflash.builder.catalog import GpuInfo, ModelInfo, ModelShape
from trtllm_dflash.errors import DFlashError

QUANTS = ("fp32", "bf16", "fp16", "fp8", "nvfp4", "mxfp4")
RUNTIMES = ("trt", "trtllm")
GRAPH_VARIANTS = ("native", "plugin")
KV_DTYPES = ("auto", "fp8")
# TensorRT-RTX builds ahead of time for these compute capabilities only (PLATFORM.md).
RTX_SMS = (75, 80, 86, 89, 120, 121)


class SpecError(DFlashError):
    """A build specification that cannot work."""


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Calibration text for post-training quantization: the built-in set or a user file."""

    dataset: str = "builtin"  # "builtin" or a path to a .txt (one sample per line) / .jsonl ("text")
    num_samples: int = 64
    max_length: int = 256


@dataclasses.dataclass(frozen=True)
class BuildSpec:
    """Everything a build needs to know, fully resolved."""

    model: str
    target: str
    drafter: str | None
    gpu: GpuInfo
    runtime: str
    quant: str
    drafter_quant: str = "bf16"
    kv_cache_dtype: str = "auto"
    num_gpus: int = 1
    max_batch: int = 8
    max_input_len: int = 512
    max_seq_len: int = 1024
    block_size: int | None = None
    graphs: tuple[str, ...] = ("native", "plugin")
    calibration: Calibration = Calibration()
    trtllm: tuple[tuple[str, Any], ...] = ()
    shape: ModelShape | None = None
    published_quant: str = "bf16"
    source: str = "catalog"

    @property
    def trt_flavour(self) -> str:
        return self.gpu.trt_flavour

    @property
    def compute_dtype(self) -> str:
        """The dtype of the graph's non-quantized tensors (activations, norms, caches)."""
        if self.quant in ("fp32", "fp16"):
            return self.quant
        return "bf16"

    @property
    def drafter_dtype(self) -> str:
        return self.drafter_quant if self.drafter_quant in ("fp32", "fp16", "bf16") else self.compute_dtype

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["gpu"] = {"name": self.gpu.name, "compute_capability": self.gpu.cc_text, "trt_flavour": self.gpu.trt_flavour}
        out["trtllm"] = dict(self.trtllm)
        out["graphs"] = list(self.graphs)
        out.pop("shape")
        return out

    def fingerprint(self) -> dict[str, Any]:
        """The fields that change what the build produces (not where it came from)."""
        out = self.to_dict()
        out.pop("source")
        return out


# ----------------------------------------------------------------------------- recipe files

RECIPE_KEYS = {
    "model", "target", "drafter", "gpu", "runtime", "quant", "drafter_quant", "kv_cache_dtype", "num_gpus",
    "max_batch", "max_input_len", "max_seq_len", "block_size", "graphs", "calibration", "trtllm",
}
CALIBRATION_KEYS = {"dataset", "num_samples", "max_length"}
INT_KEYS = {"num_gpus", "max_batch", "max_input_len", "max_seq_len", "block_size"}
STR_KEYS = {"model", "target", "drafter", "gpu", "runtime", "quant", "drafter_quant", "kv_cache_dtype"}


def _key_lines(text: str) -> dict[tuple[str, ...], int]:
    """1-based line of every mapping key (by its path), for error messages."""
    import yaml

    lines: dict[tuple[str, ...], int] = {}

    def walk(node, path: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                lines[path + (str(key.value),)] = key.start_mark.line + 1
                walk(value, path + (str(key.value),))

    try:
        walk(yaml.compose(text), ())
    except yaml.YAMLError:
        pass
    return lines


def _unknown_key(file: Path, key: str, path: tuple[str, ...], known: set[str], lines: dict) -> SpecError:
    close = difflib.get_close_matches(key, sorted(known), n=1)
    where = ".".join(path + (key,))
    line = lines.get(path + (key,))
    at = f" (line {line})" if line else ""
    hint = f"did you mean '{close[0]}'?" if close else f"valid keys: {', '.join(sorted(known))}"
    return SpecError(f"recipe {file}: unknown key '{where}'{at}", hint)


def load_recipe(path: str | Path) -> dict[str, Any]:
    """Read and check a recipe YAML file (unknown keys and wrong types are refused)."""
    import yaml

    file = Path(path).expanduser()
    if not file.is_file():
        raise SpecError(f"recipe file {file} does not exist", "pass --recipe with an existing YAML file")
    text = file.read_text()
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise SpecError(f"recipe {file} is not valid YAML{where}", "fix the YAML syntax") from None
    if not isinstance(raw, dict):
        raise SpecError(f"recipe {file} must be a mapping of keys to values", "see docs/build.md for the keys")
    lines = _key_lines(text)
    for key, value in raw.items():
        if key not in RECIPE_KEYS:
            raise _unknown_key(file, str(key), (), RECIPE_KEYS, lines)
        line = lines.get((key,))
        at = f" (line {line})" if line else ""
        if key in INT_KEYS and (not isinstance(value, int) or isinstance(value, bool)):
            raise SpecError(f"recipe {file}: '{key}'{at} must be an integer, got {value!r}", f"write {key}: <number>")
        if key in STR_KEYS and not isinstance(value, str):
            raise SpecError(f"recipe {file}: '{key}'{at} must be a string, got {value!r}", f"write {key}: <text>")
    calibration = raw.get("calibration", {})
    if not isinstance(calibration, dict):
        raise SpecError(f"recipe {file}: 'calibration' must be a mapping", "write calibration: {dataset: builtin}")
    for key in calibration:
        if key not in CALIBRATION_KEYS:
            raise _unknown_key(file, str(key), ("calibration",), CALIBRATION_KEYS, lines)
    if "trtllm" in raw and not isinstance(raw["trtllm"], dict):
        raise SpecError(f"recipe {file}: 'trtllm' must be a mapping of LLM-API options", "see docs/build.md")
    if "graphs" in raw and (not isinstance(raw["graphs"], list) or not set(raw["graphs"]) <= set(GRAPH_VARIANTS)):
        raise SpecError(f"recipe {file}: 'graphs' must be a list of {list(GRAPH_VARIANTS)}", "for example graphs: [native]")
    raw["_file"] = str(file)
    return raw


# ----------------------------------------------------------------------------- resolution


def _local_shape(target_dir: Path) -> ModelShape | None:
    """Shape of a local Hugging Face checkpoint from config.json and the safetensors headers."""
    config_file = target_dir / "config.json"
    if not config_file.is_file():
        return None
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError:
        return None
    config = config.get("text_config", config)
    params, size = 0, 0
    for file in target_dir.glob("*.safetensors"):
        size += file.stat().st_size
        try:
            with open(file, "rb") as handle:
                header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
            for name, info in header.items():
                if name != "__metadata__":
                    count = 1
                    for dim in info["shape"]:
                        count *= dim
                    params += count
        except (ValueError, KeyError, OSError):
            continue
    try:
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return ModelShape(
            num_layers=int(config["num_hidden_layers"]),
            hidden_size=hidden,
            num_kv_heads=int(config.get("num_key_value_heads", heads)),
            head_dim=int(config.get("head_dim") or hidden // heads),
            vocab_size=int(config["vocab_size"]),
            params_b=params / 1e9,
            checkpoint_gb=size / 1e9,
        )
    except (KeyError, TypeError, ValueError):
        return None


def _default_quant(model: ModelInfo, gpu: GpuInfo) -> str:
    if model.published_quant == "mxfp4":
        return "mxfp4"
    if model.name == "demo":
        return "bf16"
    if gpu.supports_nvfp4 and gpu.trt_flavour == "tensorrt":
        return "nvfp4"
    return "fp8" if gpu.supports_fp8 else "bf16"


def resolve_spec(
    model: str | None = None,
    gpu: str | None = None,
    recipe: str | Path | None = None,
    quant: str | None = None,
    drafter: str | None = None,
    **overrides: Any,
) -> BuildSpec:
    """Resolve catalog defaults, a recipe file and flags into a checked BuildSpec."""
    raw = load_recipe(recipe) if recipe is not None else {}
    source = raw.pop("_file", "catalog")
    model_name = model or raw.get("model")
    gpu_name = gpu or raw.get("gpu")
    if not model_name:
        raise SpecError("no model given", "pass --model NAME|DIR (for example --model demo)")
    if not gpu_name:
        raise SpecError("no GPU given", f"pass --gpu NAME, one of: {', '.join(g.name for g in catalog.GPUS)}")
    gpu_info = catalog.find_gpu(gpu_name)
    if gpu_info is None:
        close = difflib.get_close_matches(gpu_name.lower(), [g.name for g in catalog.GPUS], n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise SpecError(f"unknown GPU '{gpu_name}'", f"{hint}known GPUs: {', '.join(g.name for g in catalog.GPUS)}")

    info = catalog.find_model(model_name)
    local = Path(model_name).expanduser()
    if info is None and not local.is_dir():
        if local.exists():
            raise SpecError(f"--model {model_name} is not a directory", "pass a model name or a checkpoint directory")
        close = difflib.get_close_matches(model_name.lower(), [m.name for m in catalog.MODELS], n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise SpecError(
            f"unknown model '{model_name}' (neither a known name nor a directory)",
            f"{hint}known models: {', '.join(m.name for m in catalog.MODELS)}, or pass a local checkpoint directory",
        )
    if info is None:  # a local target directory
        info = ModelInfo(
            name=local.name, target=str(local.resolve()), drafter="", block_size=0, runtime="trt",
            shape=_local_shape(local),
        )

    def pick(key: str, default: Any) -> Any:
        if overrides.get(key) is not None:
            return overrides[key]
        return raw.get(key, default)

    calibration = Calibration(**{**dataclasses.asdict(Calibration()), **raw.get("calibration", {})})
    if overrides.get("calibration"):
        calibration = dataclasses.replace(calibration, dataset=str(overrides["calibration"]))
    spec = BuildSpec(
        model=info.name,
        target=pick("target", info.target),
        drafter=drafter or raw.get("drafter") or info.drafter or None,
        gpu=gpu_info,
        runtime=pick("runtime", info.runtime),
        quant=(quant or raw.get("quant") or _default_quant(info, gpu_info)).lower(),
        drafter_quant=pick("drafter_quant", "bf16"),
        kv_cache_dtype=pick("kv_cache_dtype", "fp8" if info.runtime == "trtllm" and gpu_info.supports_fp8 else "auto"),
        num_gpus=pick("num_gpus", info.num_gpus),
        max_batch=pick("max_batch", info.max_batch),
        max_input_len=pick("max_input_len", info.max_input_len),
        max_seq_len=pick("max_seq_len", info.max_seq_len),
        block_size=pick("block_size", info.block_size or None),
        graphs=tuple(pick("graphs", list(GRAPH_VARIANTS))),
        calibration=calibration,
        trtllm=tuple(sorted({**dict(info.trtllm), **raw.get("trtllm", {})}.items())),
        shape=info.shape,
        published_quant=info.published_quant,
        source=source,
    )
    check_spec(spec)
    return spec


def check_spec(spec: BuildSpec) -> None:
    """Refuse combinations that cannot work, naming what would."""
    gpu = spec.gpu
    if spec.quant not in QUANTS:
        raise SpecError(f"unknown quantization '{spec.quant}'", f"use one of: {', '.join(QUANTS[:5])}")
    if spec.runtime not in RUNTIMES:
        raise SpecError(f"unknown runtime '{spec.runtime}'", "use 'trt' (our TensorRT engines) or 'trtllm' (TensorRT-LLM)")
    if spec.quant == "nvfp4" and not gpu.supports_nvfp4:
        raise SpecError(
            f"NVFP4 needs compute capability >= 10.0 (Blackwell); {gpu.name} is SM {gpu.cc_text}",
            f"use --quant fp8 on {gpu.name}, or a GPU that supports NVFP4: {', '.join(catalog.gpus_supporting('nvfp4'))}",
        )
    if spec.quant == "fp8" and not gpu.supports_fp8:
        raise SpecError(
            f"FP8 needs compute capability >= 8.9 (Ada, Hopper, Blackwell); {gpu.name} is SM {gpu.cc_text}",
            f"use --quant bf16 on {gpu.name}, or a GPU that supports FP8: {', '.join(catalog.gpus_supporting('fp8'))}",
        )
    if spec.quant == "mxfp4" and spec.published_quant != "mxfp4":
        raise SpecError("--quant mxfp4 keeps a checkpoint's published MXFP4 weights", "use nvfp4 or fp8 to quantize this model")
    if spec.kv_cache_dtype not in KV_DTYPES:
        raise SpecError(f"unknown kv_cache_dtype '{spec.kv_cache_dtype}'", f"use one of: {', '.join(KV_DTYPES)}")
    if spec.kv_cache_dtype == "fp8" and not gpu.supports_fp8:
        raise SpecError(
            f"an FP8 KV cache needs compute capability >= 8.9; {gpu.name} is SM {gpu.cc_text}",
            f"set kv_cache_dtype: auto, or use one of: {', '.join(catalog.gpus_supporting('fp8'))}",
        )
    if spec.drafter_quant not in ("fp32", "bf16", "fp16", "fp8"):
        raise SpecError(f"drafter_quant '{spec.drafter_quant}' is not supported", "use bf16 (default), fp16 or fp8")
    if spec.runtime == "trt":
        if spec.num_gpus != 1:
            raise SpecError(
                f"the trt runtime builds single-GPU engines; this recipe asks for {spec.num_gpus} GPUs",
                "use runtime: trtllm for tensor/expert parallelism, or num_gpus: 1",
            )
        if gpu.trt_flavour == "tensorrt-rtx" and gpu.sm not in RTX_SMS:
            raise SpecError(f"TensorRT-RTX cannot build for SM {gpu.cc_text}", "pick an RTX GPU from the catalog")
        if spec.quant == "mxfp4":
            raise SpecError("MXFP4 weights are served by the trtllm runtime only", "use runtime: trtllm, or --quant nvfp4")
    for name in ("max_batch", "max_input_len", "max_seq_len"):
        if getattr(spec, name) < 1:
            raise SpecError(f"{name} must be >= 1, got {getattr(spec, name)}", f"set {name} to a positive number")
    if spec.max_input_len > spec.max_seq_len:
        raise SpecError(
            f"max_input_len {spec.max_input_len} exceeds max_seq_len {spec.max_seq_len}", "raise max_seq_len or lower max_input_len"
        )
    if spec.block_size is not None and spec.block_size < 2:
        raise SpecError(f"block_size must be >= 2, got {spec.block_size}", "use the drafter's block size")
    if not spec.drafter:
        raise SpecError(f"no drafter for {spec.model}", "pass --drafter DIR (a z-lab style DFlash checkpoint)")
    if not spec.graphs or "native" not in spec.graphs:
        raise SpecError("graphs must include 'native'", "the plugin-free graphs are what every toolchain can build")

"""ModelOpt checkpoints: the FP8 targets the quantize stage writes, and FP8 / NVFP4 drafter exports.

Targets (transformers has no loader for `quant_method: modelopt`): `load_target` (targets.py)
opens them for the torch runtime, simulating the FP8 arithmetic; the export stage opens them with
FP8 layers kept (`fp8_modules=True`), which export as Q/DQ ONNX. Writing them is the quantize
stage's job (builder/quantize.py).

Drafters: `load_drafter` (drafters.py) dequantizes an export's FP8 or NVFP4 weights on load
(`dequantize_drafter`), so the drafter runs in the model dtype.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from trtllm_dflash.errors import CheckpointError
from trtllm_dflash.graphs.dtypes import cast_parameters
from trtllm_dflash.modeling.fp8_linear import FP8_MAX, FP8Linear


def is_modelopt_checkpoint(config: dict[str, Any]) -> bool:
    return (config.get("quantization_config") or {}).get("quant_method") == "modelopt"


def fake_quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Round to FP8 E4M3 with a per-tensor scale and back: what an FP8 GEMM sees."""
    q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return (q.float() * scale).to(x.dtype)


def load_modelopt_model(
    path: Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, fp8_modules: bool = False, config=None
):
    """Load a ModelOpt FP8 checkpoint into a transformers model that computes like the FP8 engine.

    Weights are dequantized exactly (FP8 value x weight_scale); each quantized Linear rounds its
    input to FP8 with the calibrated input_scale before the matmul. With `fp8_modules` the
    quantized layers become `FP8Linear` (FP8 weights kept, exported as Q/DQ ONNX) instead.
    transformers itself has no loader for `quant_method: modelopt`. `config`: the checkpoint's
    transformers config when the caller has parsed it already (it is not changed).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    config = copy.deepcopy(config) if config is not None else AutoConfig.from_pretrained(path, local_files_only=True)
    algo = (getattr(config, "quantization_config", None) or {}).get("quant_algo")
    if algo != "FP8":
        raise CheckpointError(
            f"{path} is a ModelOpt {algo} checkpoint; the torch runtime loads ModelOpt FP8 only",
            "serve it with TensorRT-LLM or the engines built from it",
        )
    for attribute in ("quantization_config",):
        if hasattr(config, attribute):
            delattr(config, attribute)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    state: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        state.update(load_file(str(file)))
    weights: dict[str, torch.Tensor] = {}
    input_scales: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.endswith(".weight_scale") or name.endswith(".input_scale") or name.endswith("_scale"):
            continue
        if tensor.dtype == torch.float8_e4m3fn:
            module = name[: -len(".weight")]
            tensor = tensor.float() * state[f"{module}.weight_scale"].float()
            if f"{module}.input_scale" in state:
                input_scales[module] = state[f"{module}.input_scale"].float()
        weights[name] = tensor.to(dtype)
    fp8_layers = {name[: -len(".weight")] for name, t in state.items() if t.dtype == torch.float8_e4m3fn}
    if fp8_modules:
        for name in sorted(fp8_layers):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            bias = getattr(getattr(parent, child), "bias", None)
            layer = FP8Linear(
                state[f"{name}.weight"],
                state[f"{name}.weight_scale"],
                state.get(f"{name}.input_scale"),
                None if bias is None else weights.get(f"{name}.bias"),
            )
            setattr(parent, child, layer)
            weights.pop(f"{name}.weight", None)
            weights.pop(f"{name}.bias", None)
        input_scales = {}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and getattr(config, "tie_word_embeddings", False))]
    if fp8_modules:  # the FP8 layers hold their weights already
        missing = [m for m in missing if m.rpartition(".")[0] not in fp8_layers]
    if missing or unexpected:
        raise CheckpointError(
            f"{path} does not match its config ({len(missing)} missing, {len(unexpected)} unexpected tensors)", "re-run the quantize stage"
        )
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    modules = dict(model.named_modules())
    for name, scale in input_scales.items():
        modules[name].register_forward_pre_hook(lambda module, args, scale=scale: (fake_quantize_fp8(args[0], scale.to(args[0].device)),))
    if fp8_modules:
        return cast_parameters(model, dtype).to(device).eval()
    return model.to(device).eval()


# ----------------------------------------------------------------------------- ModelOpt drafter exports

# ModelOpt FP8 / NVFP4 exports: scales next to each quantized weight. Activation (`input_scale`)
# and KV-cache scales are dropped: once the weights are dequantized the drafter runs in the model
# dtype, so nothing it computes is rounded to FP8 / FP4 (and its own KV cache is not FP8).
FP8_SCALE_SUFFIXES = (".weight_scale", ".weight_scale_2", ".input_scale", ".k_scale", ".v_scale", ".output_scale")
# `quant_algo` values of ModelOpt's hf_quant_config.json this loader dequantizes, by weight layout
FP8_ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN")
NVFP4_ALGOS = ("NVFP4", "W4A16_NVFP4")


def dequantize_drafter(state: dict[str, torch.Tensor], path: Path, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A drafter export's tensors with its ModelOpt FP8 / NVFP4 weights dequantized to float32 (the
    export's `quant_algo`, from hf_quant_config.json or `config`, its parsed config.json); an
    unquantized export as it comes."""
    algo = _quant_algo(path, config)
    if algo in FP8_ALGOS:
        state = _dequantize_fp8(state, path)
    elif algo in NVFP4_ALGOS:
        state = _dequantize_nvfp4(state, path)
    elif algo is not None:
        raise CheckpointError(
            f"drafter {path} is quantized with {algo}, which this loader cannot dequantize (it reads ModelOpt "
            f"{', '.join(FP8_ALGOS + NVFP4_ALGOS)})",
            "export the drafter unquantized, in FP8 or in NVFP4 (drafter quantization changes only speed, never the output)",
        )
    _check_dequantized(state, path, algo)
    return state


def _quant_algo(path: Path, config: dict[str, Any]) -> str | None:
    """`quant_algo` of a ModelOpt export (hf_quant_config.json, or config.json's quantization_config);
    a quantization_config of another tool (no quant_algo) is refused rather than read as plain weights."""
    sources = []
    if (path / "hf_quant_config.json").is_file():
        try:
            sources.append(json.loads((path / "hf_quant_config.json").read_text()))
        except json.JSONDecodeError as exc:
            raise CheckpointError(
                f"{path / 'hf_quant_config.json'} is not valid JSON ({exc.msg}, line {exc.lineno})", "fix or re-export it"
            )
    sources.append(config.get("quantization_config") or {})
    for source in sources:
        algo = (source.get("quantization") or {}).get("quant_algo", source.get("quant_algo"))
        if algo:
            return str(algo).upper()
    for source in sources:
        method = source.get("quant_method")
        if method:
            raise CheckpointError(
                f"drafter {path}/config.json has quantization_config quant_method {method!r} without a ModelOpt quant_algo",
                "export the drafter with ModelOpt (FP8 or NVFP4) or unquantized",
            )
    return None


def _quantized_names(state: dict[str, torch.Tensor], dtypes: tuple[torch.dtype, ...]) -> list[str]:
    return [name for name, t in state.items() if t.dtype in dtypes and not name.endswith(FP8_SCALE_SUFFIXES)]


def _require_quantized(state: dict[str, torch.Tensor], path: Path, algo: str, dtypes: tuple[torch.dtype, ...]) -> None:
    """A config that names a quantization no tensor carries: the files and the config disagree."""
    if not _quantized_names(state, dtypes):
        raise CheckpointError(
            f"drafter {path} declares quant_algo {algo} but none of its weights is stored as {algo} "
            f"({'uint8 packed E2M1 with weight_scale / weight_scale_2' if algo == 'NVFP4' else 'F8_E4M3 with weight_scale'})",
            "remove hf_quant_config.json / quantization_config from an unquantized drafter, or re-export it with ModelOpt",
        )


def _scale(state: dict[str, torch.Tensor], name: str, path: Path, suffix: str, what: str) -> torch.Tensor:
    """The scale `suffix` of quantized weight `name`, present and finite and positive."""
    scale_name = name.removesuffix(".weight") + suffix
    if scale_name not in state:
        raise CheckpointError(f"drafter {path}: {what} tensor {name} has no {scale_name}", "re-export the drafter with ModelOpt")
    scale = state[scale_name]
    values = scale.float()
    if not bool(torch.isfinite(values).all()) or not bool((values > 0).all()):
        raise CheckpointError(f"drafter {path}: {scale_name} has non-finite or non-positive values", "re-export the drafter with ModelOpt")
    return scale


def _dequantize_fp8(state: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    """FP8 weights times their per-tensor (or per-output-channel) `weight_scale`, in float32:
    one multiplication, so each weight is the float32 nearest to FP8 value x scale."""
    _require_quantized(state, path, "FP8", (torch.float8_e4m3fn, torch.float8_e5m2))
    out = {}
    for name, tensor in state.items():
        if name.endswith(FP8_SCALE_SUFFIXES):
            continue
        if tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            scale = _scale(state, name, path, ".weight_scale", "FP8").float()
            if scale.numel() == 1:
                scale = scale.reshape(())
            elif tensor.dim() == 2 and scale.shape in ((tensor.shape[0],), (tensor.shape[0], 1)):
                scale = scale.reshape(-1, 1)  # one scale per output channel
            else:
                raise CheckpointError(
                    f"drafter {path}: FP8 {name} {tuple(tensor.shape)} has a weight_scale of shape {tuple(scale.shape)}; "
                    f"FP8 takes one scale per tensor or per output channel ({tensor.shape[0]})",
                    "re-export the drafter with ModelOpt FP8 (per-tensor scales)",
                )
            tensor = tensor.float() * scale
        out[name] = tensor
    return out


def _dequantize_nvfp4(state: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    """ModelOpt NVFP4 weights (`weight` uint8 [out, in/2], two E2M1 codes per byte, low nibble
    first; `weight_scale` E4M3 [out, in/16]; `weight_scale_2` float32 per tensor) -> float32
    code x weight_scale x weight_scale_2, the float32 nearest to the exact value (modeling/fp4).
    Unquantized tensors (`fc`, norms, an own LM head) are kept as they come."""
    from trtllm_dflash.modeling.fp4 import NVFP4_BLOCK, dequantize_nvfp4

    _require_quantized(state, path, "NVFP4", (torch.uint8,))
    out = {}
    for name, tensor in state.items():
        if name.endswith(FP8_SCALE_SUFFIXES):
            continue
        if tensor.dtype == torch.uint8:
            block = _scale(state, name, path, ".weight_scale", "NVFP4")
            tensor_scale = _scale(state, name, path, ".weight_scale_2", "NVFP4")
            fix = "re-export the drafter with ModelOpt NVFP4 (group size 16)"
            if block.dtype != torch.float8_e4m3fn:
                raise CheckpointError(f"drafter {path}: {name}'s weight_scale is {block.dtype}, NVFP4 block scales are F8_E4M3", fix)
            if tensor_scale.numel() != 1:
                raise CheckpointError(
                    f"drafter {path}: {name}'s weight_scale_2 has shape {tuple(tensor_scale.shape)}, NVFP4 has one scale per tensor", fix
                )
            if tensor.dim() < 2 or block.shape != (*tensor.shape[:-1], tensor.shape[-1] * 2 // NVFP4_BLOCK):
                raise CheckpointError(
                    f"drafter {path}: NVFP4 {name} {tuple(tensor.shape)} and its weight_scale {tuple(block.shape)} do not match "
                    f"([out, in/2] uint8 and [out, in/{NVFP4_BLOCK}])",
                    fix,
                )
            tensor = dequantize_nvfp4(tensor, block, tensor_scale.float().reshape(()), torch.float32)
        elif tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            raise CheckpointError(f"drafter {path}: {name} is FP8 in an NVFP4 export", "re-export the drafter with ModelOpt NVFP4")
        out[name] = tensor
    return out


def _check_dequantized(state: dict[str, torch.Tensor], path: Path, algo: str | None) -> None:
    """Every tensor the drafter will use is a float tensor: a packed or FP8 weight that slipped
    through (vLLM #53116 / #51581 read the raw quantized K/V weights) is refused, never cast."""
    raw = _quantized_names(state, (torch.uint8, torch.int8, torch.float8_e4m3fn, torch.float8_e5m2))
    if raw:
        declared = f"its quantization config says {algo}" if algo else "it has no hf_quant_config.json / quantization_config"
        raise CheckpointError(
            f"drafter {path} has {len(raw)} quantized tensor(s) left after loading (e.g. {raw[0]}, {state[raw[0]].dtype}); {declared}",
            "export it with ModelOpt and its hf_quant_config.json (quant_algo FP8 or NVFP4)",
        )

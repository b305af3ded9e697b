"""Loading the ModelOpt FP8 checkpoints the quantize stage writes (transformers has no loader for them).

The checkpoint loader (`checkpoints.load_target`) opens them for the torch runtime, simulating the
FP8 arithmetic; the export stage opens them with FP8 layers kept (`fp8_modules=True`), which export
as Q/DQ ONNX. Writing them is the quantize stage's job (builder/quantize.py).
"""

from __future__ import annotations

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


def load_modelopt_model(path: Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, fp8_modules: bool = False):
    """Load a ModelOpt FP8 checkpoint into a transformers model that computes like the FP8 engine.

    Weights are dequantized exactly (FP8 value x weight_scale); each quantized Linear rounds its
    input to FP8 with the calibrated input_scale before the matmul. With `fp8_modules` the
    quantized layers become `FP8Linear` (FP8 weights kept, exported as Q/DQ ONNX) instead.
    transformers itself has no loader for `quant_method: modelopt`.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = json.loads((path / "config.json").read_text())
    quant = raw["quantization_config"]
    algo = quant.get("quant_algo")
    if algo != "FP8":
        raise CheckpointError(
            f"{path} is a ModelOpt {algo} checkpoint; the torch runtime loads ModelOpt FP8 only",
            "serve it with TensorRT-LLM or the engines built from it",
        )
    config = AutoConfig.from_pretrained(path, local_files_only=True)
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
            layer = FP8Linear(state[f"{name}.weight"], state[f"{name}.weight_scale"], state.get(f"{name}.input_scale"),
                              None if bias is None else weights.get(f"{name}.bias"))
            setattr(parent, child, layer)
            weights.pop(f"{name}.weight", None)
            weights.pop(f"{name}.bias", None)
        input_scales = {}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and getattr(config, "tie_word_embeddings", False))]
    if fp8_modules:  # the FP8 layers hold their weights already
        missing = [m for m in missing if m.rpartition(".")[0] not in fp8_layers]
    if missing or unexpected:
        raise CheckpointError(f"{path} does not match its config ({len(missing)} missing, {len(unexpected)} unexpected tensors)", "re-run the quantize stage")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    modules = dict(model.named_modules())
    for name, scale in input_scales.items():
        modules[name].register_forward_pre_hook(lambda module, args, scale=scale: (fake_quantize_fp8(args[0], scale.to(args[0].device)),))
    if fp8_modules:
        return cast_parameters(model, dtype).to(device).eval()
    return model.to(device).eval()

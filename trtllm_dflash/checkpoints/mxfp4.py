"""gpt-oss checkpoints with MXFP4 experts, as OpenAI publishes them, loaded without transformers' quantizer.

The published layout (openai/gpt-oss-20b, openai/gpt-oss-120b): per layer i and projection
`gate_up_proj` (out 2I, in H) or `down_proj` (out H, in I),

    model.layers.{i}.mlp.experts.{proj}_blocks  uint8 [E, out, in/32, 16]
    model.layers.{i}.mlp.experts.{proj}_scales  uint8 [E, out, in/32]

with the expert biases, attention, router, embeddings and LM head in BF16, and config.json's
`quantization_config: {quant_method: mxfp4, modules_to_not_convert: [...]}`.

transformers opens these only through its Mxfp4 quantizer (Triton kernels from the Hugging Face
kernel hub on a GPU, or its own dequantization). We dequantize the experts with our codec
(modeling/fp4.py, bit-equal to transformers' conversion) into a plain, unquantized model: the
same weights on CPU or GPU, nothing downloaded. TensorRT-LLM serves the files as published.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from trtllm_dflash.errors import CheckpointError
from trtllm_dflash.modeling.fp4 import MXFP4_BLOCK, dequantize_mxfp4, expert_weight_layout

MXFP4 = "mxfp4"
EXPERT_PROJECTIONS = ("gate_up_proj", "down_proj")
EXPERTS = "model.layers.{layer}.mlp.experts.{proj}"


def quant_method(config: Mapping[str, Any]) -> str | None:
    """`quantization_config.quant_method` of a config.json (a dict, or a transformers config's attribute)."""
    quant = config.get("quantization_config") or {}
    return quant.get("quant_method") if isinstance(quant, Mapping) else getattr(quant, "quant_method", None)


def is_mxfp4_checkpoint(config: Mapping[str, Any]) -> bool:
    return quant_method(config) == MXFP4


def expert_shapes(config: Mapping[str, Any], where: Path) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """(blocks shape, scales shape) of each expert projection, from config.json's sizes."""
    try:
        experts, hidden, inner = (int(config[k]) for k in ("num_local_experts", "hidden_size", "intermediate_size"))
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(
            f"MXFP4 target {where}/config.json lacks num_local_experts, hidden_size or intermediate_size",
            "MXFP4 experts are read for gpt-oss checkpoints only; use the config.json published with the weights",
        ) from None
    bad = {name: size for name, size in (("hidden_size", hidden), ("intermediate_size", inner)) if size % MXFP4_BLOCK}
    if bad:
        raise CheckpointError(
            f"MXFP4 target {where}: {', '.join(f'{k} {v}' for k, v in bad.items())} is not a multiple of {MXFP4_BLOCK}",
            "MXFP4 blocks hold 32 elements of the input dimension; fix config.json or re-export the checkpoint",
        )
    groups = {"gate_up_proj": (2 * inner, hidden), "down_proj": (hidden, inner)}
    return {
        proj: ((experts, out, size // MXFP4_BLOCK, MXFP4_BLOCK // 2), (experts, out, size // MXFP4_BLOCK))
        for proj, (out, size) in groups.items()
    }


def tensor_index(files: list[Path]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (safetensors dtype, shape) from the files' headers (no tensor data is read)."""
    index = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                view = handle.get_slice(name)
                index[name] = (view.get_dtype(), tuple(view.get_shape()))
    return index


def check_mxfp4_tensors(index: Mapping[str, tuple[str, tuple[int, ...]]], config: Mapping[str, Any], where: Path) -> int:
    """Refuse, in one line, an MXFP4 checkpoint whose expert blocks or scales are missing or misshapen.

    Returns the number of expert projections checked."""
    shapes = expert_shapes(config, where)
    checked = 0
    for layer in range(int(config["num_hidden_layers"])):
        for proj, (blocks_shape, scales_shape) in shapes.items():
            base = EXPERTS.format(layer=layer, proj=proj)
            for suffix, shape in (("blocks", blocks_shape), ("scales", scales_shape)):
                name = f"{base}_{suffix}"
                if name not in index:
                    if base in index:  # unquantized experts under an MXFP4 config.json
                        raise CheckpointError(
                            f"MXFP4 target {where} stores {base} unquantized, but config.json says quant_method mxfp4",
                            "drop quantization_config from config.json (the experts are not MXFP4)",
                        )
                    raise CheckpointError(
                        f"MXFP4 target {where} has no {name} (quant_method mxfp4 needs {proj}_blocks and {proj}_scales in every layer)",
                        "re-download the complete checkpoint",
                    )
                dtype, got = index[name]
                if dtype != "U8" or got != shape:
                    raise CheckpointError(
                        f"MXFP4 target {where}: {name} is {dtype} {list(got)}, config.json implies U8 {list(shape)}",
                        "re-download the checkpoint or fix num_local_experts / hidden_size / intermediate_size in config.json",
                    )
            checked += 1
    return checked


def dequantize_experts(state: dict[str, torch.Tensor], num_layers: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The state with each `<proj>_blocks` / `<proj>_scales` pair replaced by `<proj>` in transformers' layout."""
    out = dict(state)
    for layer in range(num_layers):
        for proj in EXPERT_PROJECTIONS:
            base = EXPERTS.format(layer=layer, proj=proj)
            blocks, scales = out.pop(f"{base}_blocks"), out.pop(f"{base}_scales")
            out[base] = expert_weight_layout(dequantize_mxfp4(blocks, scales, dtype))
    return out


def load_mxfp4_model(path: Path, config, dtype: torch.dtype, **model_kwargs: Any):
    """A plain (unquantized) transformers model with the checkpoint's weights, experts dequantized exactly.

    `config` is the checkpoint's transformers config; `model_kwargs` go to the model's constructor
    (attention and experts implementations)."""
    from transformers import AutoModelForCausalLM

    raw = json.loads((path / "config.json").read_text())
    raw = raw.get("text_config", raw)
    files = sorted(path.glob("*.safetensors"))
    check_mxfp4_tensors(tensor_index(files), raw, path)
    config = copy.deepcopy(config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # a plain model: no quantizer replaces the experts
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, **model_kwargs)
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    weights = dequantize_experts(state, int(raw["num_hidden_layers"]), dtype)
    expected = model.state_dict()
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()  # not stored when tied
    missing = sorted(set(expected) - set(weights) - tied)
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        what = f"is missing {', '.join(missing[:3])}" if missing else f"has unexpected {', '.join(unexpected[:3])}"
        raise CheckpointError(f"MXFP4 target {path} {what}", "use the complete published gpt-oss checkpoint")
    for name, tensor in weights.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise CheckpointError(
                f"MXFP4 target {path}: {name} has shape {list(tensor.shape)}, config.json implies {list(expected[name].shape)}",
                "re-download the checkpoint or fix config.json",
            )
    model.load_state_dict(weights, strict=False)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    return model

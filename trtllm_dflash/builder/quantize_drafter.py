"""The drafter in NVFP4 (ModelOpt), with `fc` kept in BF16.

`fc` projects the concatenation of several target hidden states into the drafter's width; its
inputs have the target's outlier channels, side by side, and TensorRT Edge-LLM's validated NVFP4
drafters keep it in higher precision. Every other linear layer gets NVFP4 weights and
calibrated NVFP4 activation scales. Calibration runs the drafter's training forward (blocks
anchored in the calibration text, the target's tapped hidden states as context), which goes
through the nn.Linear modules ModelOpt instruments; the decoding step uses fused weights instead.

The output is the z-lab layout (same tensor names and config.json) with each quantized linear as
ModelOpt exports one: `weight` U8, `weight_scale` F8_E4M3, `weight_scale_2` and `input_scale`
F32, plus `hf_quant_config.json` naming the modules left in BF16.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

from trtllm_dflash.builder import nvfp4
from trtllm_dflash.builder.quantize import calibration_batches, import_modelopt

NVFP4_GROUP = 16


def quantize_drafter(
    drafter_dir: Path,
    target_dir: Path,
    out_dir: Path,
    calibration,
    progress: Callable[..., None] = lambda text, done=None, total=None: None,
) -> dict[str, Any]:
    """Calibrate the drafter in NVFP4 on the target's hidden states and write the quantized drafter."""
    nvfp4.require_cuda("NVFP4 quantization of the drafter")
    mtq, _ = import_modelopt()
    from trtllm_dflash.checkpoints import load_drafter, load_target
    from trtllm_dflash.modeling.taps import HiddenTaps

    target = load_target(target_dir, device="cuda", dtype=torch.bfloat16, require_tokenizer=True)
    drafter = load_drafter(drafter_dir, target, device="cuda", dtype=torch.bfloat16).eval()
    decoder = target.model.get_decoder()
    taps = HiddenTaps(decoder.layers, drafter.config.target_layer_ids)
    batches = calibration_batches(target.tokenizer, calibration, "cuda")

    def forward_loop(model) -> None:
        for i, ids in enumerate(batches):
            progress("calibrating the nvfp4 drafter on the calibration samples", i, len(batches))
            decoder(input_ids=ids, use_cache=False)
            drafter_forward(model, target.model, ids, taps.features())

    try:
        with torch.no_grad():
            drafter = mtq.quantize(drafter, nvfp4.drafter_config(), forward_loop=forward_loop)
    finally:
        taps.remove()
    progress("writing the nvfp4 drafter")
    counts = write_quantized_drafter(drafter, drafter_dir, out_dir)
    return {"quant": "nvfp4", "kept_bf16": list(nvfp4.DRAFTER_KEPT_MODULES), "calibration_samples": len(batches), **counts}


def drafter_forward(drafter, target_model, input_ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """The drafter's training forward over blocks anchored every block_size tokens of `input_ids`."""
    from trtllm_dflash.training.objective import make_block_batch

    config = drafter.config
    seq_len = input_ids.shape[1]
    starts = torch.arange(1, max(seq_len - 1, 2), config.block_size, device=input_ids.device)[None]
    batch = make_block_batch(
        input_ids, starts, torch.ones_like(input_ids), config.block_size, config.mask_token_id, config.attentions, history=config.history
    )
    embeds = drafter.embed(batch.block_tokens, target_model.get_input_embeddings())
    ctx_positions = torch.arange(seq_len, device=input_ids.device).expand(input_ids.shape[0], -1)
    return drafter.forward_train(embeds, batch.block_positions, features.to(embeds.dtype), ctx_positions, batch.masks)


def write_quantized_drafter(drafter: torch.nn.Module, source_dir: Path, out_dir: Path) -> dict[str, int]:
    """The quantized drafter's tensors in ModelOpt's NVFP4 layout, config and sidecar files copied."""
    from modelopt.torch.export.quant_utils import (
        get_activation_scaling_factor,
        get_quantization_format,
        get_weight_scaling_factor,
        get_weight_scaling_factor_2,
        to_quantized_weight,
    )
    from safetensors.torch import save_file

    state: dict[str, torch.Tensor] = {}
    quantized: list[str] = []
    for name, module in drafter.named_modules():
        if not isinstance(module, torch.nn.Linear) or get_quantization_format(module) != "nvfp4":
            continue
        scale, scale_2 = get_weight_scaling_factor(module), get_weight_scaling_factor_2(module)
        state[f"{name}.weight"] = to_quantized_weight(module.weight.detach(), scale, "nvfp4", scale_2, NVFP4_GROUP)
        state[f"{name}.weight_scale"] = scale
        state[f"{name}.weight_scale_2"] = scale_2.float().reshape(())
        state[f"{name}.input_scale"] = get_activation_scaling_factor(module).float().reshape(())
        quantized.append(name)
    for key, tensor in drafter.state_dict().items():
        if "_quantizer." in key:  # ModelOpt's calibration state (amax, pre-quant scales), not weights
            continue
        if key not in state:
            state[key] = tensor.detach().to(torch.bfloat16) if tensor.is_floating_point() else tensor.detach()
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous().cpu() for k, v in state.items()}, str(out_dir / "model.safetensors"))
    for file in source_dir.iterdir():
        if file.is_file() and file.suffix != ".safetensors" and file.name not in ("model.safetensors.index.json", "hf_quant_config.json"):
            shutil.copy2(file, out_dir / file.name)
    exclude = sorted({name for name, m in drafter.named_modules() if isinstance(m, torch.nn.Linear)} - set(quantized))
    quantization = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": NVFP4_GROUP, "exclude_modules": exclude}
    (out_dir / "hf_quant_config.json").write_text(
        json.dumps({"producer": {"name": "modelopt"}, "quantization": quantization}, indent=2) + "\n"
    )
    config = json.loads((out_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "modelopt", **quantization}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return {"quantized_linears": len(quantized), "kept_linears": len(exclude)}

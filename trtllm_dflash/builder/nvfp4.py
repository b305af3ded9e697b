"""NVFP4 through ModelOpt: the quantization configs, the CUDA requirement, and the MXFP4 -> NVFP4 cast.

ModelOpt computes NVFP4 block scales with CUDA kernels (on CPU: "amax must be a CUDA tensor"),
so every NVFP4 step that calibrates refuses on a machine without a CUDA GPU, in one line. Any
CUDA GPU calibrates: on Hopper ModelOpt emulates NVFP4 (fake quantization); serving NVFP4 needs
Blackwell (SM >= 10.0), which the planner checks.

The weight cast of gpt-oss's MXFP4 experts needs no GPU and no calibration: the E2M1 codes carry
over, and each MXFP4 block of 32 (scale 2^k) becomes two NVFP4 blocks of 16 with block scale
2^(k - m) and tensor scale 2^m, m = k_max - 8. Both are exact in E4M3 (it holds 2^-9 .. 2^8)
when k >= k_max - 17; other blocks are rounded, and the error is reported. ModelOpt implements
this cast (`quantize_mxfp4_to_nvfp4_lossless`); `mxfp4_to_nvfp4` wraps it and measures it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from trtllm_dflash.builder.stages import StageBlocked
from trtllm_dflash.checkpoints import safetensors_header
from trtllm_dflash.modeling.fp4 import MXFP4_BLOCK, dequantize_mxfp4, dequantize_nvfp4

GPU_FIX = (
    "run the same `dflash-trt build` on a machine with a CUDA GPU (finished stages are reused): "
    "Blackwell serves NVFP4, an H100/H200 calibrates it with ModelOpt's NVFP4 emulation"
)

# the drafter's `fc` projects the concatenated target hidden states: kept in BF16 (as TensorRT Edge-LLM validated)
DRAFTER_KEPT_MODULES = ("fc",)


def require_cuda(what: str) -> None:
    """Refuse an NVFP4 step on a machine without CUDA, in one line naming the GPU requirement."""
    if not torch.cuda.is_available():
        raise StageBlocked(
            f"{what} needs a CUDA GPU: ModelOpt computes NVFP4 scales with CUDA kernels "
            "(on CPU it fails with 'amax must be a CUDA tensor')",
            GPU_FIX,
        )


def with_kv_cache(config: dict[str, Any], kv_cache: str) -> dict[str, Any]:
    """`config` plus ModelOpt's FP8 KV-cache quantizers when the KV cache is FP8 (FP8 and NVFP4 PTQ alike)."""
    import modelopt.torch.quantization as mtq

    if kv_cache == "fp8":
        kv = copy.deepcopy(mtq.FP8_KV_CFG)["quant_cfg"]
        config["quant_cfg"] = list(config["quant_cfg"]) + list(kv) if isinstance(kv, list) else {**config["quant_cfg"], **kv}
    return config


def dense_config(kv_cache: str) -> dict[str, Any]:
    """ModelOpt's NVFP4 PTQ (weights and activations, E4M3 scale per 16, FP32 per tensor), plus the FP8 KV cache."""
    import modelopt.torch.quantization as mtq

    return with_kv_cache(copy.deepcopy(mtq.NVFP4_DEFAULT_CFG), kv_cache)


def experts_config(kv_cache: str) -> dict[str, Any]:
    """NVFP4 for the MoE experts only (attention, router, embeddings stay BF16 as published).

    The weight quantizers are static-block, so their per-block amax can be pinned to the
    closed-form values of the MXFP4 source after calibration (`pin_expert_amax`); the input
    quantizers keep their calibrated amax (the activation scales).
    """
    import modelopt.torch.quantization as mtq

    entries = copy.deepcopy(mtq.NVFP4_DEFAULT_CFG)["quant_cfg"]
    nvfp4 = next(e["cfg"] for e in entries if e.get("quantizer_name") == "*weight_quantizer")
    static = {**nvfp4, "block_sizes": {**nvfp4["block_sizes"], "type": "static"}}
    quant_cfg = [
        {"quantizer_name": "*", "enable": False},
        {"quantizer_name": "*mlp.experts*weight_quantizer", "cfg": static},
        {"quantizer_name": "*mlp.experts*input_quantizer", "cfg": copy.deepcopy(nvfp4)},
    ]
    return with_kv_cache({**copy.deepcopy(mtq.NVFP4_DEFAULT_CFG), "quant_cfg": quant_cfg}, kv_cache)


def drafter_config() -> dict[str, Any]:
    """NVFP4 for the drafter's layers, with `fc` (and any own LM head / embedding) left in BF16."""
    import modelopt.torch.quantization as mtq

    config = copy.deepcopy(mtq.NVFP4_DEFAULT_CFG)
    kept = [{"quantizer_name": f"{name}.*", "enable": False} for name in (*DRAFTER_KEPT_MODULES, "lm_head", "embed_tokens")]
    config["quant_cfg"] = list(config["quant_cfg"]) + kept
    return config


# ----------------------------------------------------------------------------- the MXFP4 -> NVFP4 weight cast


@dataclasses.dataclass
class NVFP4Weight:
    """One tensor cast from MXFP4, in the layout ModelOpt exports, with how exact the cast was."""

    weight: torch.Tensor  # uint8 [..., K/2], E2M1 codes, low nibble first
    weight_scale: torch.Tensor  # float8_e4m3fn [..., K/16]
    weight_scale_2: torch.Tensor  # float32 []
    blocks: int  # MXFP4 blocks in the tensor
    exact_blocks: int  # blocks whose scale fits E4M3 under the tensor scale (cast exactly)
    max_abs_error: float  # largest |NVFP4 - MXFP4| over the dequantized tensor
    max_rel_error: float  # largest |NVFP4 - MXFP4| / |MXFP4| over its non-zero elements

    @property
    def exact(self) -> bool:
        return self.max_abs_error == 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "blocks": self.blocks,
            "exact_blocks": self.exact_blocks,
            "exact": self.exact,
            "max_abs_error": self.max_abs_error,
            "max_rel_error": self.max_rel_error,
        }


def mxfp4_to_nvfp4(blocks: torch.Tensor, scales: torch.Tensor) -> NVFP4Weight:
    """gpt-oss `<proj>_blocks` [..., G, 16] and `<proj>_scales` [..., G] -> NVFP4, on any device.

    The cast is ModelOpt's closed form (tensor scale 2^(k_max - 8)); the errors are measured
    against the MXFP4 source dequantized by our own codec.
    """
    from modelopt.torch.export import mxfp4_kmax, quantize_mxfp4_to_nvfp4_lossless

    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != MXFP4_BLOCK // 2:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not match")
    packed = blocks.flatten(-2)
    device = str(blocks.device)
    weight, weight_scale, weight_scale_2, total, exact = quantize_mxfp4_to_nvfp4_lossless(
        packed, scales, mxfp4_kmax(scales, device), device
    )
    source = dequantize_mxfp4(blocks, scales)
    diff = (dequantize_nvfp4(weight, weight_scale, weight_scale_2) - source).abs()
    nonzero = source != 0
    rel = (diff[nonzero] / source[nonzero].abs()).max() if bool(nonzero.any()) else torch.tensor(0.0)
    return NVFP4Weight(weight, weight_scale, weight_scale_2, total, exact, float(diff.max()), float(rel))


def pin_expert_amax(model: torch.nn.Module, source_dir: Path) -> dict[str, Any]:
    """After calibration: set every expert weight quantizer's amax to the MXFP4 source's closed form.

    Tensor amax 6 * 448 * 2^(k_max - 8) and block amax 6 * 2^k (the data's own max for blocks
    outside E4M3's window) make ModelOpt's export write block scale 2^(k - m) and tensor scale
    2^m, so the exported codes are the published ones. Returns the per-tensor exactness report.
    """
    from modelopt.torch.quantization.nn import NVFP4StaticQuantizer
    from modelopt.torch.quantization.utils.numeric_utils import mxfp4_to_nvfp4_global_amax, mxfp4_to_nvfp4_per_block_amax
    from safetensors import safe_open

    modules = dict(model.named_modules())
    report: dict[str, Any] = {}
    for file in sorted(source_dir.glob("*.safetensors")):
        with safe_open(file, framework="pt", device="cpu") as handle:
            for key in sorted(k for k in handle.keys() if k.endswith("_scales")):  # noqa: SIM118 - safe_open is not a dict
                base = key.removesuffix("_scales")
                quantizer = modules.get(base + "_weight_quantizer")
                if quantizer is None:
                    continue
                if not isinstance(quantizer, NVFP4StaticQuantizer) or quantizer._amax is None:
                    raise RuntimeError(f"{base}: the expert weight quantizer is not a calibrated static NVFP4 quantizer")
                scales, blocks = handle.get_tensor(key), handle.get_tensor(base + "_blocks")
                global_amax, info = mxfp4_to_nvfp4_global_amax(scales)
                amax = mxfp4_to_nvfp4_per_block_amax(blocks, scales).to(quantizer._amax.device, torch.float32)
                if amax.numel() != quantizer._amax.numel():
                    raise RuntimeError(f"{base}: {quantizer._amax.numel()} calibrated blocks, {amax.numel()} in the MXFP4 source")
                quantizer.global_amax = torch.tensor(global_amax, dtype=torch.float32, device=amax.device)
                with torch.no_grad():
                    quantizer._amax.copy_(amax.view_as(quantizer._amax))
                entry = {"blocks": info["n_total_blocks"], "exact_blocks": info["n_lossless_blocks"]}
                if info["n_lossless_blocks"] < info["n_total_blocks"]:  # measure what the rounding cost
                    entry = mxfp4_to_nvfp4(blocks.to(amax.device), scales.to(amax.device)).summary()
                report[base] = entry
    if not report:
        raise RuntimeError(f"no MXFP4 expert tensor of {source_dir} matched a quantized expert of the model")
    return report


def nvfp4_layout(directory: Path) -> dict[str, Any]:
    """What an exported checkpoint holds, read from the safetensors headers and the quantization config.

    TensorRT-LLM loads an NVFP4 ModelOpt checkpoint from `weight` U8, `weight_scale` F8_E4M3,
    `weight_scale_2` F32, `input_scale` F32 per linear layer and `quantization_config`
    (`quant_algo: NVFP4`, `kv_cache_quant_algo: FP8`).
    """
    counts: dict[str, int] = {}
    for file in directory.glob("*.safetensors"):
        for name, info in safetensors_header(file).items():
            if name == "__metadata__":
                continue
            suffix = name.rsplit(".", 1)[-1] if "." in name else name
            if suffix in ("weight", "weight_scale", "weight_scale_2", "input_scale", "k_scale", "v_scale"):
                key = f"{suffix}:{info['dtype']}"
                counts[key] = counts.get(key, 0) + 1
    config: dict[str, Any] = {}
    for name in ("hf_quant_config.json", "config.json"):
        path = directory / name
        if path.is_file():
            raw = json.loads(path.read_text())
            config = raw.get("quantization", raw.get("quantization_config", {})) or config
            if config:
                break
    return {
        "tensors": counts,
        "quant_algo": config.get("quant_algo"),
        "kv_cache_quant_algo": config.get("kv_cache_quant_algo"),
        "exclude_modules": config.get("exclude_modules", []),
    }

"""Post-training quantization of the target with NVIDIA ModelOpt, and loading what it exports.

FP8 (E4M3 weights and activations, per-tensor scales; optionally an FP8 KV cache) calibrates on
CPU or GPU; NVFP4 calibration needs CUDA (ModelOpt computes its block scales with CUDA kernels;
an H100 runs its NVFP4 emulation), so on a machine without a GPU the stage stops with that reason
and the build resumes on a GPU machine. The output is a Hugging Face checkpoint in ModelOpt's format (`quant_method:
modelopt`, FP8 weights with `weight_scale`/`input_scale`), which TensorRT-LLM loads directly and
which `checkpoints.modelopt.load_modelopt_model` loads for the torch runtime, simulating the FP8 arithmetic.
NVFP4 experts of gpt-oss come from its published MXFP4 ones (nvfp4.py: the weights are cast,
the activation scales calibrated). The drafter is quantized separately (quantize_drafter.py).
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

from trtllm_dflash.builder import nvfp4
from trtllm_dflash.builder.stages import StageBlocked
from trtllm_dflash.checkpoints import safetensors_header
from trtllm_dflash.errors import CheckpointError, DFlashError
from trtllm_dflash.recipes.precision import Precision

BUILTIN_CALIBRATION = Path(__file__).with_name("calibration.txt")


def calibration_texts(calibration) -> list[str]:
    """The calibration samples: the built-in mixed set (code, math, chat, prose) or a user file."""
    if calibration.dataset == "builtin":
        lines = BUILTIN_CALIBRATION.read_text().splitlines()
        texts = [line.replace("\\n", "\n") for line in lines if line.strip()]
    else:
        path = Path(calibration.dataset).expanduser()
        if not path.is_file():
            raise DFlashError(f"calibration file {path} does not exist", "pass a .txt (one sample per line) or .jsonl file with 'text'")
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        if path.suffix == ".jsonl":
            try:
                texts = [json.loads(line)["text"] for line in lines]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise DFlashError(f'{path} is not JSONL with a "text" field per line', "fix the calibration file") from None
        else:
            texts = lines
    if not texts:
        raise DFlashError(f"the calibration set {calibration.dataset} is empty", "give at least one sample")
    return texts[: calibration.num_samples]


def quant_config(precision: Precision) -> dict[str, Any]:
    """ModelOpt's config for PTQ of the target's weights (FP8 or NVFP4), with FP8 KV-cache scales when asked."""
    import modelopt.torch.quantization as mtq

    if precision.weights == "nvfp4":
        return nvfp4.dense_config(precision.kv_cache)
    if not precision.fp8_weights:
        raise ValueError(precision.weights)
    return nvfp4.with_kv_cache(copy.deepcopy(mtq.FP8_DEFAULT_CFG), precision.kv_cache)


def require_cuda_for(precision: Precision) -> None:
    """NVFP4 (dense PTQ, or the cast of published MXFP4 experts) refuses without CUDA; FP8 runs anywhere."""
    if precision.converts_experts:
        nvfp4.require_cuda("converting the MXFP4 experts to NVFP4 (activation scales from calibration)")
    elif precision.weights == "nvfp4":
        nvfp4.require_cuda("NVFP4 PTQ of the target")


def import_modelopt():
    """ModelOpt's quantization and HF export, or a blocked stage naming the extra to install."""
    try:
        import modelopt.torch.quantization as mtq
        from modelopt.torch.export import export_hf_checkpoint
    except ImportError as exc:
        raise StageBlocked(f"nvidia-modelopt is not installed ({exc})", "pip install 'trtllm-dflash[quant]'") from None
    return mtq, export_hf_checkpoint


def calibration_batches(tokenizer, calibration, device: str) -> list[torch.Tensor]:
    """Token ids of each calibration sample, cut to the recipe's calibration length."""
    return [
        tokenizer(text, return_tensors="pt", truncation=True, max_length=calibration.max_seq_len)["input_ids"].to(device)
        for text in calibration_texts(calibration)
    ]


def quantize_target(
    target_dir: Path,
    out_dir: Path,
    precision: Precision,
    calibration,
    progress: Callable[..., None] = lambda text, done=None, total=None: None,
) -> dict[str, Any]:
    """Calibrate the target with ModelOpt and export it as a quantized Hugging Face checkpoint.

    `precision` (the build's, recipes/precision.py) says how: FP8 or NVFP4 weights, or, when it
    `converts_experts`, gpt-oss as published with its experts cast to NVFP4 (weights exactly where
    the scales fit, see nvfp4.py) and calibrated for their activation scales, everything else as
    published; FP8 KV-cache scales with `kv_cache: fp8`.
    """
    require_cuda_for(precision)
    experts_from_mxfp4 = precision.converts_experts
    progress("importing ModelOpt")
    mtq, export_hf_checkpoint = import_modelopt()
    from trtllm_dflash.checkpoints import load_target

    device = "cuda" if torch.cuda.is_available() else "cpu"
    # an MXFP4 gpt-oss loads with its experts dequantized exactly (E2M1 x 2^k fits BF16; checkpoints/mxfp4.py)
    dtype = torch.bfloat16 if device == "cuda" or experts_from_mxfp4 else torch.float32
    target = load_target(target_dir, device=device, dtype=dtype)
    model, tokenizer = target.model, target.tokenizer
    if experts_from_mxfp4:
        config, label = nvfp4.experts_config(precision.kv_cache), "nvfp4 experts"
    else:
        config, label = quant_config(precision), precision.weights
    if tokenizer is None:
        raise CheckpointError(f"target {target_dir} has no tokenizer, so it cannot be calibrated", "save the tokenizer next to the model")
    batches = calibration_batches(tokenizer, calibration, device)

    def forward_loop(model) -> None:
        for i, ids in enumerate(batches):
            progress(f"calibrating the target ({label}) on the calibration samples", i, len(batches))
            model(ids)

    with torch.no_grad():
        model = mtq.quantize(model, config, forward_loop=forward_loop)
    extra: dict[str, Any] = {}
    if experts_from_mxfp4:
        progress("pinning the expert weight scales to the MXFP4 source")
        cast = nvfp4.pin_expert_amax(model, target_dir)
        extra["expert_cast"] = {
            "tensors": len(cast),
            "exact_tensors": sum(e["exact_blocks"] == e["blocks"] for e in cast.values()),
            "inexact": {name: e for name, e in cast.items() if e["exact_blocks"] < e["blocks"]},
        }
    progress("exporting the quantized checkpoint")
    out_dir.mkdir(parents=True, exist_ok=True)
    export_hf_checkpoint(model, export_dir=out_dir)
    _copy_tokenizer(target_dir, out_dir)
    counts = _count_quantized(out_dir)
    if precision.weights == "nvfp4" or experts_from_mxfp4:
        extra["layout"] = nvfp4.nvfp4_layout(out_dir)
    # the summary's keys are the manifest's (cli/build.py prints "quant"), kept as they were
    return {"quant": label, "kv_cache_dtype": precision.kv_cache, "calibration_samples": len(batches), "device": device, **counts, **extra}


def _copy_tokenizer(source: Path, dest: Path) -> None:
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "tokenizer.model",
        "vocab.json",
        "merges.txt",
        "chat_template.jinja",
    ):
        if (source / name).is_file():
            shutil.copy2(source / name, dest / name)


def _count_quantized(directory: Path) -> dict[str, int]:
    quantized = total = 0
    for file in directory.glob("*.safetensors"):
        for name, info in safetensors_header(file).items():
            if name.endswith(".weight"):
                total += 1
                quantized += info["dtype"] in ("F8_E4M3", "U8")
    return {"quantized_weights": quantized, "weights": total}

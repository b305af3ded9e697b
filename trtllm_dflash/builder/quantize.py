"""Post-training quantization of the target with NVIDIA ModelOpt, and loading what it exports.

FP8 (E4M3 weights and activations, per-tensor scales; optionally an FP8 KV cache) calibrates on
CPU or GPU; NVFP4 calibration needs CUDA (ModelOpt computes its block scales with CUDA kernels),
so on a machine without a GPU the stage stops with that reason and the build resumes there on a
GPU machine. The output is a Hugging Face checkpoint in ModelOpt's format (`quant_method:
modelopt`, FP8 weights with `weight_scale`/`input_scale`), which TensorRT-LLM loads directly and
which `modelopt_checkpoints.load_modelopt_model` loads for the torch runtime, simulating the FP8 arithmetic.
The drafter is not quantized: it is small, and its accuracy is what tau depends on.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

from trtllm_dflash.builder.stages import StageBlocked
from trtllm_dflash.errors import CheckpointError, DFlashError
from trtllm_dflash.modelopt_checkpoints import FP8_MAX, fake_quantize_fp8, is_modelopt_checkpoint, load_modelopt_model

# the loading side moved to trtllm_dflash.modelopt_checkpoints; these names stay importable from here
__all__ = ["FP8_MAX", "fake_quantize_fp8", "is_modelopt_checkpoint", "load_modelopt_model", "quantize_target"]

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
                raise DFlashError(f"{path} is not JSONL with a \"text\" field per line", "fix the calibration file") from None
        else:
            texts = lines
    if not texts:
        raise DFlashError(f"the calibration set {calibration.dataset} is empty", "give at least one sample")
    return texts[: calibration.num_samples]


def quant_config(quant: str, kv_cache_dtype: str) -> dict[str, Any]:
    import modelopt.torch.quantization as mtq

    if quant == "fp8":
        config = copy.deepcopy(mtq.FP8_DEFAULT_CFG)
    elif quant == "nvfp4":
        config = copy.deepcopy(mtq.NVFP4_DEFAULT_CFG)
    else:
        raise ValueError(quant)
    if kv_cache_dtype == "fp8":
        kv = copy.deepcopy(mtq.FP8_KV_CFG)["quant_cfg"]
        config["quant_cfg"] = list(config["quant_cfg"]) + list(kv) if isinstance(kv, list) else {**config["quant_cfg"], **kv}
    return config


def require_cuda_for(quant: str) -> None:
    if quant == "nvfp4" and not torch.cuda.is_available():
        raise StageBlocked(
            "NVFP4 calibration needs a CUDA GPU: ModelOpt computes NVFP4 block scales with CUDA kernels "
            "(on CPU it fails with 'amax must be a CUDA tensor')",
            "run the same `dflash-trt build` on a Blackwell GPU machine (the finished stages are reused), "
            "or use --quant fp8 / bf16 here",
        )


def quantize_target(
    target_dir: Path,
    out_dir: Path,
    quant: str,
    kv_cache_dtype: str,
    calibration,
    progress: Callable[[str], None] = lambda text: None,
) -> dict[str, Any]:
    """Calibrate the target with ModelOpt and export it as a quantized Hugging Face checkpoint."""
    require_cuda_for(quant)
    progress("importing ModelOpt")
    try:
        import modelopt.torch.quantization as mtq
        from modelopt.torch.export import export_hf_checkpoint
    except ImportError as exc:
        raise StageBlocked(f"nvidia-modelopt is not installed ({exc})", "pip install 'trtllm-dflash[quant]'") from None
    from trtllm_dflash.checkpoints import load_target

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    target = load_target(target_dir, device=device, dtype=dtype)
    if target.tokenizer is None:
        raise CheckpointError(f"target {target_dir} has no tokenizer, so it cannot be calibrated", "save the tokenizer next to the model")
    texts = calibration_texts(calibration)
    batches = [
        target.tokenizer(text, return_tensors="pt", truncation=True, max_length=calibration.max_seq_len)["input_ids"].to(device)
        for text in texts
    ]

    def forward_loop(model) -> None:
        for i, ids in enumerate(batches):
            progress(f"calibrating {quant}: sample {i + 1}/{len(batches)}")
            model(ids)

    model = target.model
    with torch.no_grad():
        model = mtq.quantize(model, quant_config(quant, kv_cache_dtype), forward_loop=forward_loop)
    progress("exporting the quantized checkpoint")
    out_dir.mkdir(parents=True, exist_ok=True)
    export_hf_checkpoint(model, export_dir=out_dir)
    _copy_tokenizer(target_dir, out_dir)
    counts = _count_quantized(out_dir)
    return {"quant": quant, "kv_cache_dtype": kv_cache_dtype, "calibration_samples": len(batches), "device": device, **counts}


def _copy_tokenizer(source: Path, dest: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja"):
        if (source / name).is_file():
            shutil.copy2(source / name, dest / name)


def _count_quantized(directory: Path) -> dict[str, int]:
    quantized = total = 0
    for file in directory.glob("*.safetensors"):
        with open(file, "rb") as handle:
            header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
        for name, info in header.items():
            if name.endswith(".weight"):
                total += 1
                quantized += info["dtype"] in ("F8_E4M3", "U8")
    return {"quantized_weights": quantized, "weights": total}

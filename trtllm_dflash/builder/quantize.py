"""Post-training quantization of the target with NVIDIA ModelOpt, and loading what it exports.

FP8 (E4M3 weights and activations, per-tensor scales; optionally an FP8 KV cache) calibrates on
CPU or GPU; NVFP4 calibration needs CUDA (ModelOpt computes its block scales with CUDA kernels),
so on a machine without a GPU the stage stops with that reason and the build resumes there on a
GPU machine. The output is a Hugging Face checkpoint in ModelOpt's format (`quant_method:
modelopt`, FP8 weights with `weight_scale`/`input_scale`), which TensorRT-LLM loads directly and
which `load_modelopt_model` below loads for the torch runtime, simulating the FP8 arithmetic.
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

BUILTIN_CALIBRATION = Path(__file__).with_name("calibration.txt")
FP8_MAX = 448.0  # largest finite float8_e4m3fn


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


# ----------------------------------------------------------------------------- loading


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
    quantized layers become `fp8.FP8Linear` (FP8 weights kept, exported as Q/DQ ONNX) instead.
    transformers itself has no loader for `quant_method: modelopt`.
    """
    from safetensors.torch import load_file
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
        from trtllm_dflash.builder.fp8 import FP8Linear

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
        from trtllm_dflash.builder.export import cast_parameters

        return cast_parameters(model, dtype).to(device).eval()
    return model.to(device).eval()

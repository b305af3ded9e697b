"""The steps `dflash-trt build` runs for a planned deployment, as `dflash-trt plan` lists them."""

from __future__ import annotations

from trtllm_dflash.planning.candidate import Candidate
from trtllm_dflash.planning.records import BuildStep


def build_steps(cfg: Candidate) -> tuple[BuildStep, ...]:
    model, p = cfg.model, cfg.precision
    drafter = model.drafter.checkpoint if model.drafter else "(none)"
    steps = [BuildStep("checkpoints", f"resolve the target {model.checkpoint} and the drafter {drafter}; validate the pair",
                       ("torch", "transformers"))]
    if cfg.backend == "torch":
        steps.append(BuildStep("repository", "write the Triton model repository (Python backend, torch runtime, decoupled)"))
        return tuple(steps)
    gpu = cfg.gpu
    arch = f"{gpu.sm_arch} (SM {gpu.compute_capability_str})"
    calibration = cfg.recipe.quantization.calibration if cfg.recipe is not None else None
    samples = f"{calibration.num_samples} samples of {calibration.dataset}" if calibration else "builtin calibration text"
    quantized = {p.weights, p.experts} - {"bf16", "fp16", "fp32", model.native_expert_precision}
    if cfg.backend == "trtllm":
        if model.native_expert_precision == "mxfp4" and p.experts == "nvfp4" and p.weights == "bf16":
            steps.append(BuildStep("quantize", "convert the MXFP4 experts to NVFP4 with ModelOpt (bit-exact, no calibration)",
                                   ("modelopt",)))
        elif quantized:
            needs = ("modelopt", "torch", "nvfp4-gpu") if "nvfp4" in quantized else ("modelopt", "torch")
            steps.append(BuildStep("quantize", f"ModelOpt {'/'.join(sorted(quantized))} PTQ of the target ({samples}); "
                                   "export a Hugging Face checkpoint TensorRT-LLM loads", needs))
        steps.append(BuildStep("config", f"write and validate the TensorRT-LLM LLM-API options (DFlash speculative_config, "
                               f"tp {cfg.layout.tp} / ep {cfg.layout.ep}, KV {p.kv_cache}); model.yaml and trtllm-serve config"))
        steps.append(BuildStep("repository", "write the Triton repository (tensorrt_llm Python model, decoupled)"))
        return tuple(steps)
    flavour = cfg.recipe.trt_flavour() if cfg.recipe is not None else gpu.trt_flavour
    plugins = cfg.recipe is None or cfg.recipe.trt is None or cfg.recipe.trt.use_plugins
    if quantized:
        needs = ("modelopt", "torch", "nvfp4-gpu") if "nvfp4" in quantized else ("modelopt", "torch")
        steps.append(BuildStep("quantize", f"ModelOpt {'/'.join(sorted(quantized))} PTQ of the target ({samples}); "
                               f"KV cache {p.kv_cache}; drafter stays {p.drafter}", needs))
    steps.append(BuildStep("export", f"ONNX graphs: target (prefill + verify, taps {list(model.drafter.target_layer_ids) if model.drafter else []}) "
                           f"and drafter block forward ({'DFlash plugin nodes' if plugins else 'plugin-free'})",
                           ("torch", "onnx")))
    if plugins:
        steps.append(BuildStep("plugins", f"compile the DFlash Triton kernels ahead of time for {gpu.sm_arch}", ("triton",)))
    engine_needs = ("tensorrt-rtx",) if flavour == "tensorrt-rtx" else ("tensorrt", "cuda-gpu")
    steps.append(BuildStep("engines", f"{flavour} engines for {arch}: batch <= {cfg.max_batch}, tokens <= {cfg.max_num_tokens}, "
                           f"sequence <= {cfg.context}, block {cfg.block_size}", engine_needs))
    steps.append(BuildStep("repository", "write the Triton model repository (Python backend driving the engines, decoupled)"))
    return tuple(steps)

"""The TensorRT-LLM configuration for recipes with the `trtllm` runtime (e.g. gpt-oss-120b on B300).

TensorRT-LLM's PyTorch backend has DFlash built in, so for these models the build writes the
LLM-API options (the YAML that `trtllm-serve --config` and the Triton `tensorrt_llm` Python model
read) and checks them, instead of building engines. Keys follow PLATFORM.md; when
`tensorrt_llm` is importable the options are also checked by its own `LlmArgs`.
"""

from __future__ import annotations

from typing import Any

from trtllm_dflash.builder.spec import BuildSpec
from trtllm_dflash.errors import DFlashError

# LLM-API keys this toolkit writes, with their types.
TOP_LEVEL = {
    "model": str,
    "backend": str,
    "tensor_parallel_size": int,
    "moe_expert_parallel_size": int,
    "max_batch_size": int,
    "max_num_tokens": int,
    "max_seq_len": int,
    "kv_cache_config": dict,
    "cuda_graph_config": dict,
    "moe_config": dict,
    "speculative_config": dict,
}
SPECULATIVE = {
    "decoding_type": str,
    "max_draft_len": int,
    "speculative_model": str,
    "mask_token_id": int,
    "target_layer_ids": list,
    "max_concurrency": int,
    "draft_len_schedule": dict,
}
KV_CACHE = {"dtype": str, "free_gpu_memory_fraction": float, "enable_block_reuse": bool}
CUDA_GRAPH = {"enable_padding": bool, "max_batch_size": int}
MOE = {"backend": str}
NESTED = {"speculative_config": SPECULATIVE, "kv_cache_config": KV_CACHE, "cuda_graph_config": CUDA_GRAPH, "moe_config": MOE}


class TrtllmConfigError(DFlashError):
    """LLM-API options TensorRT-LLM would reject."""


def moe_backend(spec: BuildSpec) -> str:
    """Hopper runs MXFP4 experts with the Triton MoE backend; Blackwell with TRTLLM kernels."""
    return "TRTLLM" if spec.gpu.sm >= 100 else "TRITON"


def llm_api_options(spec: BuildSpec, target: str, drafter: str, mask_token_id: int, target_layer_ids: list[int], block_size: int) -> dict[str, Any]:
    """The LLM-API options of a DFlash deployment under TensorRT-LLM's PyTorch backend."""
    extra = dict(spec.trtllm)
    options: dict[str, Any] = {
        "model": target,
        "backend": "pytorch",
        "tensor_parallel_size": int(extra.pop("tensor_parallel_size", spec.num_gpus)),
        "moe_expert_parallel_size": int(extra.pop("moe_expert_parallel_size", spec.num_gpus)),
        "max_batch_size": spec.max_batch,
        "max_num_tokens": max(spec.max_input_len, spec.max_batch * block_size),
        "max_seq_len": spec.max_seq_len,
        "kv_cache_config": {
            "free_gpu_memory_fraction": 0.85,
            **({"dtype": "fp8"} if spec.kv_cache_dtype == "fp8" else {}),
        },
        "cuda_graph_config": {"enable_padding": True, "max_batch_size": spec.max_batch},
        "speculative_config": {
            "decoding_type": "DFlash",
            "max_draft_len": block_size - 1,
            "speculative_model": drafter,
            "mask_token_id": int(mask_token_id),
            "target_layer_ids": [int(i) for i in target_layer_ids],
        },
    }
    if spec.published_quant == "mxfp4":  # MoE experts in MXFP4 (gpt-oss)
        options["moe_config"] = {"backend": moe_backend(spec)}
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(options.get(key), dict):
            options[key] = {**options[key], **value}
        else:
            options[key] = value
    return options


def check_options(options: dict[str, Any]) -> list[str]:
    """Refuse unknown keys and wrong types; returns what was checked (for the manifest)."""
    checked = []
    for key, value in options.items():
        if key not in TOP_LEVEL:
            raise TrtllmConfigError(f"unknown TensorRT-LLM option '{key}'", f"valid options: {', '.join(sorted(TOP_LEVEL))}")
        _check_type(key, value, TOP_LEVEL[key])
        if key in NESTED:
            for sub, sub_value in value.items():
                if sub not in NESTED[key]:
                    raise TrtllmConfigError(f"unknown option '{key}.{sub}'", f"valid: {', '.join(sorted(NESTED[key]))}")
                _check_type(f"{key}.{sub}", sub_value, NESTED[key][sub])
        checked.append(key)
    spec = options.get("speculative_config", {})
    if spec.get("decoding_type") != "DFlash":
        raise TrtllmConfigError("speculative_config.decoding_type must be DFlash", "this toolkit deploys DFlash drafters")
    if options["tensor_parallel_size"] < 1 or options["max_batch_size"] < 1:
        raise TrtllmConfigError("tensor_parallel_size and max_batch_size must be >= 1", "fix the recipe")
    if options["moe_expert_parallel_size"] > options["tensor_parallel_size"]:
        raise TrtllmConfigError("moe_expert_parallel_size exceeds tensor_parallel_size", "use at most one expert group per GPU")
    return checked


def _check_type(key: str, value: Any, kind: type) -> None:
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        raise TrtllmConfigError(f"TensorRT-LLM option '{key}' must be {kind.__name__}, got {value!r}", "fix the recipe's trtllm section")


def check_with_tensorrt_llm(options: dict[str, Any]) -> str:
    """Validate with TensorRT-LLM's own argument model where it is installed."""
    try:
        from tensorrt_llm.llmapi.llm_args import TorchLlmArgs  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 - not installed (placeholder sdist on PyPI; see PLATFORM.md)
        return "tensorrt_llm not installed: checked against the option list in trtllm.py"
    TorchLlmArgs(**options)
    return "checked by tensorrt_llm.llmapi TorchLlmArgs"

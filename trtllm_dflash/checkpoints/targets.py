"""Target checkpoints: any Hugging Face causal-LM directory (config.json, *.safetensors, tokenizer files).

Plain checkpoints load through transformers; gpt-oss's published MXFP4 experts (mxfp4.py) and the
ModelOpt FP8 checkpoints the quantize stage writes (modelopt.py) load through our own readers.
Only safetensors are read, nothing is unpickled, and `trust_remote_code` is never needed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from safetensors import SafetensorError

from trtllm_dflash.checkpoints.paths import resolve_checkpoint
from trtllm_dflash.checkpoints.weights import check_safetensors_headers, require_safetensors
from trtllm_dflash.errors import CheckpointError

# A directory holds a tokenizer (one AutoTokenizer can open) when it has any one of these.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
# What a build copies from the target into its tokenizer/ folder (export, then engines), so a runtime
# opens the target's tokenizer and stop ids without the weights: the files above, those that complete
# them (BPE merges, special tokens, chat template), and the generation config and config.json
# (eos_token_id; the model type AutoTokenizer falls back to).
BUILD_TOKENIZER_FILES = TOKENIZER_FILES + (
    "merges.txt",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
    "config.json",
)


@dataclasses.dataclass
class Target:
    """A loaded target model with its tokenizer (None when the directory has none)."""

    model: torch.nn.Module
    tokenizer: object | None
    path: Path

    @property
    def config(self):
        return self.model.config.get_text_config()

    def stop_token_ids(self) -> tuple[int, ...]:
        """End-of-sequence ids from the generation config and the tokenizer."""
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.model.config, self.tokenizer):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return tuple(sorted(ids))


def load_target(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None, require_tokenizer: bool = False
) -> Target:
    """Load a Hugging Face causal LM (and its tokenizer) from a local directory."""
    from transformers import AutoConfig

    path = resolve_checkpoint(path, "target")
    if not (path / "config.json").is_file():
        raise CheckpointError(f"target {path} has no config.json", "point --target at a Hugging Face model directory")
    files = require_safetensors(path, "target")
    check_safetensors_headers(files)
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    except (ValueError, KeyError, OSError) as exc:
        raise CheckpointError(
            f"target config in {path} is not supported by this transformers ({str(exc).splitlines()[0]})",
            "upgrade transformers or use a Qwen3/Llama-family checkpoint",
        ) from None
    dtype = dtype or (torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32)
    if (getattr(config, "quantization_config", None) or {}).get("quant_method") == "modelopt":
        # ModelOpt FP8 output of `dflash-trt build` (transformers has no loader for it)
        from trtllm_dflash.checkpoints.modelopt import load_modelopt_model

        model = load_modelopt_model(path, device, dtype, config=config)
        return Target(model=model, tokenizer=_load_tokenizer(path, require_tokenizer, config), path=path)
    checkpoint_config = config  # the whole config.json (a multimodal one too): what the tokenizer reads
    cls = model_class(config)
    if not isinstance(config, cls.config_class):  # a text class for a multimodal config (Qwen3.5 repos)
        config = config.get_text_config()
    implementations = dict(
        attn_implementation=attention_implementation(config),
        # torch's grouped_mm (the default MoE path) has no float64 kernel; float64 is for tests
        **({"experts_implementation": "eager"} if dtype == torch.float64 else {}),
    )
    if (getattr(config, "quantization_config", None) or {}).get("quant_method") == "mxfp4":
        # gpt-oss as published: MXFP4 experts, dequantized by our codec (transformers' quantizer would fetch kernels)
        from trtllm_dflash.checkpoints.mxfp4 import load_mxfp4_model

        model = load_mxfp4_model(path, config, dtype, **implementations)
        model.to(device).eval()
        return Target(model=model, tokenizer=_load_tokenizer(path, require_tokenizer, checkpoint_config), path=path)
    try:
        model = cls.from_pretrained(
            path,
            config=config,
            dtype=dtype,
            **implementations,
            use_safetensors=True,
            trust_remote_code=False,
            local_files_only=True,
        )
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(
            f"cannot load target weights from {path} ({str(exc).splitlines()[0]})", "check the checkpoint files"
        ) from None
    model.to(device).eval()
    return Target(model=model, tokenizer=_load_tokenizer(path, require_tokenizer, checkpoint_config), path=path)


def model_class(config):
    """The transformers class that runs a target's text path.

    A causal-LM class where transformers has one (that includes loading the text part of
    Qwen3.5/3.6 and Gemma 4 multimodal checkpoints); otherwise the image-text-to-text class of
    multimodal checkpoints such as Kimi-K2.5, whose text path is a DeepSeek-V3 causal LM.
    """
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    for auto in (AutoModelForCausalLM, AutoModelForImageTextToText):
        found = auto._model_mapping.get(type(config), None)
        if found is not None:
            return found
    raise CheckpointError(
        f"transformers has no causal-LM class for model_type {config.model_type!r}",
        "use a text causal LM checkpoint (or the text part of a multimodal model)",
    )


def attention_implementation(config) -> str:
    """SDPA where the model's own code supports it, else its eager reference implementation.

    Never a silent switch to an implementation the model does not support: gpt-oss's attention
    sinks exist only in eager (and kernel-hub) attention, so SDPA would drop them.
    """
    return "sdpa" if getattr(model_class(config), "_supports_sdpa", False) else "eager"


def _load_tokenizer(path: Path, required: bool, config):
    """The target's tokenizer; `config` is the checkpoint's config, parsed already (AutoTokenizer would parse it again)."""
    from transformers import AutoTokenizer

    if any((path / name).is_file() for name in TOKENIZER_FILES):
        return AutoTokenizer.from_pretrained(path, config=config, local_files_only=True, trust_remote_code=False)
    if required:
        raise CheckpointError(f"target {path} has no tokenizer", "save the tokenizer next to the model (tokenizer.save_pretrained(dir))")
    return None

"""Loading target and drafter checkpoints, and checking that they belong together.

A target is any Hugging Face causal-LM directory (config.json, *.safetensors, tokenizer files).
A drafter is a directory with config.json + *.safetensors in the z-lab layout, ModelOpt's DFlash
export (same layout, optionally FP8 or NVFP4 with hf_quant_config.json, dequantized on load) or
vLLM Speculators' DFlash layout (docs/generate.md lists what is supported). Only safetensors are
read, nothing is unpickled, and `trust_remote_code` is never needed.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from trtllm_dflash.config import DrafterConfig
from trtllm_dflash.errors import CheckpointError, CompatibilityError
from trtllm_dflash.modeling.dflash2 import DFlash2Drafter
from trtllm_dflash.modeling.drafter import DFlashDrafter

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


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


def resolve_checkpoint(name_or_path: str | Path, role: str) -> Path:
    """A directory from a path, or the embedded demo pair for the name `demo`."""
    if str(name_or_path) == "demo":
        from trtllm_dflash import demo

        return demo.target_dir() if role == "target" else demo.drafter_dir()
    path = Path(name_or_path).expanduser()
    if not path.exists():
        raise CheckpointError(f"{role} directory {path} does not exist", f"pass an existing {role} checkpoint directory")
    if not path.is_dir():
        raise CheckpointError(f"{role} path {path} is not a directory", f"pass the {role} checkpoint's directory")
    return path


def _require_safetensors(path: Path, role: str) -> list[Path]:
    files = sorted(path.glob("*.safetensors"))
    if files:
        return files
    pickled = [p.name for p in path.iterdir() if p.suffix in {".bin", ".pt", ".pth", ".ckpt"}]
    if pickled:
        raise CheckpointError(
            f"{role} {path} has only pickled weights ({', '.join(pickled[:3])})",
            "convert them to safetensors (for example `model.save_pretrained(dir, safe_serialization=True)`); "
            "pickled files are never loaded",
        )
    raise CheckpointError(f"{role} {path} has no *.safetensors weights", f"point at a complete {role} checkpoint")


def _read_header(file: Path) -> tuple[int, dict]:
    with open(file, "rb") as handle:
        header_len = int.from_bytes(handle.read(8), "little")
        if header_len <= 0 or header_len > file.stat().st_size - 8:
            raise ValueError("header length out of range")
        return header_len, json.loads(handle.read(header_len))


def safetensors_header(file: Path) -> dict:
    """The JSON header of a safetensors file (name -> dtype, shape, data_offsets), read without the
    tensors; ValueError when its length is out of range or it is not JSON."""
    return _read_header(file)[1]


def _check_safetensors_headers(files: list[Path]) -> None:
    """Fail early, with the file name, on a truncated or corrupted safetensors file."""
    for file in files:
        try:
            header_len, header = _read_header(file)
            data_len = file.stat().st_size - 8 - header_len
            ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
            if ends and max(ends) > data_len:
                raise ValueError("tensor data is truncated")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise CheckpointError(
                f"{file} is not a valid safetensors file ({exc})", "re-download or re-export the checkpoint"
            ) from None


def load_target(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None, require_tokenizer: bool = False
) -> Target:
    """Load a Hugging Face causal LM (and its tokenizer) from a local directory."""
    from transformers import AutoConfig

    path = resolve_checkpoint(path, "target")
    if not (path / "config.json").is_file():
        raise CheckpointError(f"target {path} has no config.json", "point --target at a Hugging Face model directory")
    files = _require_safetensors(path, "target")
    _check_safetensors_headers(files)
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

        model = load_modelopt_model(path, device, dtype)
        return Target(model=model, tokenizer=_load_tokenizer(path, require_tokenizer), path=path)
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
        return Target(model=model, tokenizer=_load_tokenizer(path, require_tokenizer), path=path)
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
        raise CheckpointError(f"cannot load target weights from {path} ({str(exc).splitlines()[0]})", "check the checkpoint files") from None
    model.to(device).eval()
    return Target(model=model, tokenizer=_load_tokenizer(path, require_tokenizer), path=path)


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


def _load_tokenizer(path: Path, required: bool):
    from transformers import AutoTokenizer

    if any((path / name).is_file() for name in TOKENIZER_FILES):
        return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    if required:
        raise CheckpointError(f"target {path} has no tokenizer", "save the tokenizer next to the model (tokenizer.save_pretrained(dir))")
    return None


def read_drafter_weights(path: Path) -> dict[str, torch.Tensor]:
    files = _require_safetensors(path, "drafter")
    _check_safetensors_headers(files)
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state.update(load_file(str(file)))
        except SafetensorError as exc:
            raise CheckpointError(f"{file} is not a valid safetensors file ({exc})", "re-download or re-export the drafter") from None
    return state


# Tensors a drafter export may carry that the drafter does not use: Speculators' copies of the
# verifier's final norm / LM head (used only in training), rotary buffers.
IGNORED_DRAFTER_TENSORS = ("verifier_norm.weight", "verifier_lm_head.weight")
OWN_WEIGHTS = ("lm_head.weight", "embed_tokens.weight")
# ModelOpt FP8 / NVFP4 exports: scales next to each quantized weight. Activation (`input_scale`)
# and KV-cache scales are dropped: once the weights are dequantized the drafter runs in the model
# dtype, so nothing it computes is rounded to FP8 / FP4 (and its own KV cache is not FP8).
FP8_SCALE_SUFFIXES = (".weight_scale", ".weight_scale_2", ".input_scale", ".k_scale", ".v_scale", ".output_scale")
# `quant_algo` values of ModelOpt's hf_quant_config.json this loader dequantizes, by weight layout
FP8_ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN")
NVFP4_ALGOS = ("NVFP4", "W4A16_NVFP4")


def load_drafter(
    path: str | Path,
    target: Target | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    sliding_window_size: int | None = None,
) -> DFlashDrafter:
    """Load a DFlash drafter (z-lab, ModelOpt or Speculators layout); with `target`, check first
    that the pair fits. `sliding_window_size` overrides the checkpoint's bounded draft history."""
    path = resolve_checkpoint(path, "drafter")
    config = DrafterConfig.from_dir(path)
    if sliding_window_size is not None:
        if sliding_window_size <= 0:
            raise CompatibilityError(f"sliding_window_size is {sliding_window_size}", "pass a positive number of context positions")
        config = dataclasses.replace(config, sliding_window_size=sliding_window_size)
    if config.mask_token_id is None:
        config = dataclasses.replace(config, mask_token_id=resolve_mask_token(path, target))
    if target is not None:
        validate_pair(target.config, config)
    elif config.block_size < 2:
        raise CompatibilityError(f"drafter block_size is {config.block_size}", "DFlash needs a block size >= 2")
    state = _normalize_drafter_state(read_drafter_weights(path), path)
    drafter = new_drafter(config, _drafter_vocab(config, target, state))
    drafter.attach_own_weights(state.get("lm_head.weight"), state.get("embed_tokens.weight"))
    if target is not None:
        _check_own_weights(drafter, target.config)
        _check_codebooks(state, target.config)
    expected = drafter.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing:
        raise CheckpointError(
            f"drafter {path} is missing {len(missing)} tensor(s), e.g. {', '.join(missing[:3])}",
            "check that num_hidden_layers and target_layer_ids in config.json match the weights",
        )
    if unexpected:
        v2 = any(name.startswith(V2_TENSOR_PREFIXES) or "_conv." in name for name in unexpected) and not config.is_v2
        raise CheckpointError(
            f"drafter {path} has {len(unexpected)} unexpected tensor(s), e.g. {', '.join(unexpected[:3])}",
            "these are DFlash V2 tensors: set architectures to [\"DFlash2DraftModel\"] in config.json"
            if v2
            else "use a z-lab DFlash layout (layers.N.*, fc, hidden_norm, norm) or fix num_hidden_layers in config.json",
        )
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise CheckpointError(
                f"drafter tensor {name} has shape {tuple(tensor.shape)}, config.json implies {tuple(expected[name].shape)}",
                "fix config.json (hidden_size, heads, head_dim, target_layer_ids) to match the weights",
            )
    drafter.load_state_dict(state)
    if target is not None:
        dtype = dtype or next(target.model.parameters()).dtype
        device = next(target.model.parameters()).device
    return drafter.to(device=device, dtype=dtype or torch.float32).eval()


V2_TENSOR_PREFIXES = ("candidate_selector.",)


def new_drafter(config: DrafterConfig, vocab_size: int | None = None) -> DFlashDrafter:
    """An initialised drafter of the config's kind (V2 needs the vocabulary for its codebooks)."""
    if config.is_v2:
        if vocab_size is None:
            raise CheckpointError("a DFlash V2 drafter needs its vocabulary size", "set vocab_size in the drafter's config.json")
        return DFlash2Drafter(config, vocab_size)
    return DFlashDrafter(config)


def _drafter_vocab(config: DrafterConfig, target: Target | None, state: dict[str, torch.Tensor]) -> int | None:
    """The vocabulary of a V2 drafter's codebooks: the config's, else the target's, else the weights'."""
    if not config.is_v2:
        return None
    if config.vocab_size is not None:
        return config.vocab_size
    if target is not None:
        return int(target.config.vocab_size)
    codebook = state.get("candidate_selector.predecessor_codebook")
    return None if codebook is None else int(codebook.shape[0])


def resolve_mask_token(path: Path, target: Target | None) -> int:
    """The mask token of a drafter whose config has no id: the token the config names
    (`dflash_config.mask_token`, as SGLang reads it), else the target tokenizer's mask token,
    else the token `<|MASK|>` in its vocabulary."""
    tokenizer = target.tokenizer if target is not None else None
    raw = json.loads((path / "config.json").read_text())
    named = (raw.get("dflash_config") or {}).get("mask_token") or raw.get("mask_token")
    if tokenizer is not None:
        vocab = tokenizer.get_vocab()
        if isinstance(named, str):
            if named not in vocab:
                raise CheckpointError(
                    f"drafter {path}/config.json names mask token {named!r}, which the target's tokenizer does not have",
                    "set dflash_config.mask_token_id, or use the target the drafter was trained for",
                )
            return int(vocab[named])
        if getattr(tokenizer, "mask_token_id", None) is not None:
            return int(tokenizer.mask_token_id)
        if MASK_TOKEN in vocab:
            return int(vocab[MASK_TOKEN])
    where = "the target's tokenizer has no mask token" if tokenizer is not None else "no target tokenizer to look it up in"
    raise CheckpointError(
        f"drafter {path}/config.json has no mask_token_id and {where}",
        "set dflash_config.mask_token_id in the drafter's config.json (the id the drafter was trained with)",
    )


MASK_TOKEN = "<|MASK|>"


def _normalize_drafter_state(state: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    """Tensor names and dtypes as DFlashDrafter expects them, from any supported export."""
    if "fc.weight" not in state:  # names under a module prefix (e.g. `model.fc.weight`)
        prefixes = [name[: -len("fc.weight")] for name in state if name.endswith(".fc.weight")]
        if len(prefixes) == 1:
            prefix = prefixes[0]
            state = {name.removeprefix(prefix): tensor for name, tensor in state.items()}
    state = {name: t for name, t in state.items() if name not in IGNORED_DRAFTER_TENSORS and "rotary_emb" not in name}
    algo = _quant_algo(path)
    if algo in FP8_ALGOS:
        state = _dequantize_fp8(state, path)
    elif algo in NVFP4_ALGOS:
        state = _dequantize_nvfp4(state, path)
    elif algo is not None:
        raise CheckpointError(
            f"drafter {path} is quantized with {algo}, which this loader cannot dequantize (it reads ModelOpt "
            f"{', '.join(FP8_ALGOS + NVFP4_ALGOS)})",
            "export the drafter unquantized, in FP8 or in NVFP4 (drafter quantization changes only speed, never the output)",
        )
    _check_dequantized(state, path, algo)
    return state


def _quant_algo(path: Path) -> str | None:
    """`quant_algo` of a ModelOpt export (hf_quant_config.json, or config.json's quantization_config);
    a quantization_config of another tool (no quant_algo) is refused rather than read as plain weights."""
    sources = []
    for name in ("hf_quant_config.json", "config.json"):
        if (path / name).is_file():
            try:
                raw = json.loads((path / name).read_text())
            except json.JSONDecodeError as exc:
                raise CheckpointError(f"{path / name} is not valid JSON ({exc.msg}, line {exc.lineno})", "fix or re-export it")
            sources.append(raw if name == "hf_quant_config.json" else raw.get("quantization_config") or {})
    for source in sources:
        algo = (source.get("quantization") or {}).get("quant_algo", source.get("quant_algo"))
        if algo:
            return str(algo).upper()
    for source in sources:
        method = source.get("quant_method")
        if method:
            raise CheckpointError(
                f"drafter {path}/config.json has quantization_config quant_method {method!r} without a ModelOpt quant_algo",
                "export the drafter with ModelOpt (FP8 or NVFP4) or unquantized",
            )
    return None


def _quantized_names(state: dict[str, torch.Tensor], dtypes: tuple[torch.dtype, ...]) -> list[str]:
    return [name for name, t in state.items() if t.dtype in dtypes and not name.endswith(FP8_SCALE_SUFFIXES)]


def _require_quantized(state: dict[str, torch.Tensor], path: Path, algo: str, dtypes: tuple[torch.dtype, ...]) -> None:
    """A config that names a quantization no tensor carries: the files and the config disagree."""
    if not _quantized_names(state, dtypes):
        raise CheckpointError(
            f"drafter {path} declares quant_algo {algo} but none of its weights is stored as {algo} "
            f"({'uint8 packed E2M1 with weight_scale / weight_scale_2' if algo == 'NVFP4' else 'F8_E4M3 with weight_scale'})",
            "remove hf_quant_config.json / quantization_config from an unquantized drafter, or re-export it with ModelOpt",
        )


def _scale(state: dict[str, torch.Tensor], name: str, path: Path, suffix: str, what: str) -> torch.Tensor:
    """The scale `suffix` of quantized weight `name`, present and finite and positive."""
    scale_name = name.removesuffix(".weight") + suffix
    if scale_name not in state:
        raise CheckpointError(f"drafter {path}: {what} tensor {name} has no {scale_name}", "re-export the drafter with ModelOpt")
    scale = state[scale_name]
    values = scale.float()
    if not bool(torch.isfinite(values).all()) or not bool((values > 0).all()):
        raise CheckpointError(f"drafter {path}: {scale_name} has non-finite or non-positive values", "re-export the drafter with ModelOpt")
    return scale


def _dequantize_fp8(state: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    """FP8 weights times their per-tensor (or per-output-channel) `weight_scale`, in float32:
    one multiplication, so each weight is the float32 nearest to FP8 value x scale."""
    _require_quantized(state, path, "FP8", (torch.float8_e4m3fn, torch.float8_e5m2))
    out = {}
    for name, tensor in state.items():
        if name.endswith(FP8_SCALE_SUFFIXES):
            continue
        if tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            scale = _scale(state, name, path, ".weight_scale", "FP8").float()
            if scale.numel() == 1:
                scale = scale.reshape(())
            elif tensor.dim() == 2 and scale.shape in ((tensor.shape[0],), (tensor.shape[0], 1)):
                scale = scale.reshape(-1, 1)  # one scale per output channel
            else:
                raise CheckpointError(
                    f"drafter {path}: FP8 {name} {tuple(tensor.shape)} has a weight_scale of shape {tuple(scale.shape)}; "
                    f"FP8 takes one scale per tensor or per output channel ({tensor.shape[0]})",
                    "re-export the drafter with ModelOpt FP8 (per-tensor scales)",
                )
            tensor = tensor.float() * scale
        out[name] = tensor
    return out


def _dequantize_nvfp4(state: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    """ModelOpt NVFP4 weights (`weight` uint8 [out, in/2], two E2M1 codes per byte, low nibble
    first; `weight_scale` E4M3 [out, in/16]; `weight_scale_2` float32 per tensor) -> float32
    code x weight_scale x weight_scale_2, the float32 nearest to the exact value (modeling/fp4).
    Unquantized tensors (`fc`, norms, an own LM head) are kept as they come."""
    from trtllm_dflash.modeling.fp4 import NVFP4_BLOCK, dequantize_nvfp4

    _require_quantized(state, path, "NVFP4", (torch.uint8,))
    out = {}
    for name, tensor in state.items():
        if name.endswith(FP8_SCALE_SUFFIXES):
            continue
        if tensor.dtype == torch.uint8:
            block = _scale(state, name, path, ".weight_scale", "NVFP4")
            tensor_scale = _scale(state, name, path, ".weight_scale_2", "NVFP4")
            fix = "re-export the drafter with ModelOpt NVFP4 (group size 16)"
            if block.dtype != torch.float8_e4m3fn:
                raise CheckpointError(f"drafter {path}: {name}'s weight_scale is {block.dtype}, NVFP4 block scales are F8_E4M3", fix)
            if tensor_scale.numel() != 1:
                raise CheckpointError(
                    f"drafter {path}: {name}'s weight_scale_2 has shape {tuple(tensor_scale.shape)}, NVFP4 has one scale per tensor", fix
                )
            if tensor.dim() < 2 or block.shape != (*tensor.shape[:-1], tensor.shape[-1] * 2 // NVFP4_BLOCK):
                raise CheckpointError(
                    f"drafter {path}: NVFP4 {name} {tuple(tensor.shape)} and its weight_scale {tuple(block.shape)} do not match "
                    f"([out, in/2] uint8 and [out, in/{NVFP4_BLOCK}])",
                    fix,
                )
            tensor = dequantize_nvfp4(tensor, block, tensor_scale.float().reshape(()), torch.float32)
        elif tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            raise CheckpointError(f"drafter {path}: {name} is FP8 in an NVFP4 export", "re-export the drafter with ModelOpt NVFP4")
        out[name] = tensor
    return out


def _check_dequantized(state: dict[str, torch.Tensor], path: Path, algo: str | None) -> None:
    """Every tensor the drafter will use is a float tensor: a packed or FP8 weight that slipped
    through (vLLM #53116 / #51581 read the raw quantized K/V weights) is refused, never cast."""
    raw = _quantized_names(state, (torch.uint8, torch.int8, torch.float8_e4m3fn, torch.float8_e5m2))
    if raw:
        declared = f"its quantization config says {algo}" if algo else "it has no hf_quant_config.json / quantization_config"
        raise CheckpointError(
            f"drafter {path} has {len(raw)} quantized tensor(s) left after loading (e.g. {raw[0]}, {state[raw[0]].dtype}); {declared}",
            "export it with ModelOpt and its hf_quant_config.json (quant_algo FP8 or NVFP4)",
        )


def _check_own_weights(drafter: DFlashDrafter, target_config) -> None:
    vocab = int(target_config.vocab_size)
    for name, module in (("lm_head", drafter.lm_head), ("embed_tokens", drafter.embed_tokens)):
        rows = None if module is None else (module.out_features if name == "lm_head" else module.num_embeddings)
        if rows is not None and rows != vocab:
            raise CompatibilityError(
                f"drafter's own {name} has {rows} rows, the target vocabulary has {vocab} tokens",
                "use the drafter trained for this target's tokenizer",
            )


def _check_codebooks(state: dict[str, torch.Tensor], target_config) -> None:
    """A V2 drafter's selector codebooks have one row per target token."""
    vocab = int(target_config.vocab_size)
    for name in ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook"):
        if name in state and state[name].shape[0] != vocab:
            raise CompatibilityError(
                f"drafter's {name} has {state[name].shape[0]} rows, the target vocabulary has {vocab} tokens",
                "use the DFlash V2 drafter trained for this target's tokenizer",
            )


def validate_pair(target_config, drafter: DrafterConfig) -> None:
    """Check that a drafter fits a target; raise with the problem and the fix."""
    hidden = int(target_config.hidden_size)
    vocab = int(target_config.vocab_size)
    layers = int(target_config.num_hidden_layers)
    if drafter.hidden_size != hidden:
        raise CompatibilityError(
            f"drafter hidden_size {drafter.hidden_size} != target hidden_size {hidden}",
            "use the drafter trained for this target (its context features are the target's hidden states)",
        )
    if drafter.vocab_size is not None and drafter.vocab_size != vocab:
        raise CompatibilityError(
            f"drafter vocab_size {drafter.vocab_size} != target vocab_size {vocab}",
            "use the drafter trained for this target's tokenizer",
        )
    if drafter.num_target_layers is not None and drafter.num_target_layers != layers:
        raise CompatibilityError(
            f"drafter was trained on a {drafter.num_target_layers}-layer target, this target has {layers} layers",
            "use the drafter trained for this target",
        )
    bad = [i for i in drafter.target_layer_ids if not 0 <= i < layers]
    if bad:
        raise CompatibilityError(
            f"target_layer_ids {list(drafter.target_layer_ids)} has ids outside [0, {layers}): {bad}",
            "ids name target decoder layers, 0-based (id i is the output of layer i)",
        )
    if drafter.mask_token_id is not None and not 0 <= drafter.mask_token_id < vocab:
        raise CompatibilityError(
            f"mask_token_id {drafter.mask_token_id} is outside the target vocabulary [0, {vocab})",
            "set dflash_config.mask_token_id to a token id of the target's vocabulary",
        )
    if drafter.block_size < 2:
        raise CompatibilityError(f"drafter block_size is {drafter.block_size}", "DFlash needs a block size >= 2")
    if drafter.layer_types and len(drafter.layer_types) != drafter.num_hidden_layers:
        raise CompatibilityError(
            f"layer_types has {len(drafter.layer_types)} entries for {drafter.num_hidden_layers} layers",
            "give one layer type per draft layer",
        )
    sliding = [t for t in drafter.layer_types if t == "sliding_attention"]
    if sliding and not drafter.sliding_window and drafter.swa_window_size is None:  # use_swa gives the window
        raise CompatibilityError("drafter has sliding_attention layers but no sliding_window", "set sliding_window in config.json")
    if drafter.sliding_window_size is not None and drafter.sliding_window_size <= 0:
        raise CompatibilityError(
            f"drafter sliding_window_size is {drafter.sliding_window_size}", "use a positive number of context positions or leave it unset"
        )


def save_drafter(drafter: DFlashDrafter, path: str | Path) -> Path:
    """Write a drafter in the z-lab layout (config.json + model.safetensors), loadable by other tools."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in drafter.state_dict().items()}
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(drafter.config.to_dict(), indent=2) + "\n")
    return path

"""Loading target and drafter checkpoints, and checking that they belong together.

A target is any Hugging Face causal-LM directory (config.json, *.safetensors, tokenizer files).
A drafter is a z-lab style directory (config.json + model.safetensors). Only safetensors are
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


def _check_safetensors_headers(files: list[Path]) -> None:
    """Fail early, with the file name, on a truncated or corrupted safetensors file."""
    for file in files:
        try:
            with open(file, "rb") as handle:
                header_len = int.from_bytes(handle.read(8), "little")
                if header_len <= 0 or header_len > file.stat().st_size - 8:
                    raise ValueError("header length out of range")
                header = json.loads(handle.read(header_len))
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
        from trtllm_dflash.builder.quantize import load_modelopt_model

        model = load_modelopt_model(path, device, dtype)
        return Target(model=model, tokenizer=_load_tokenizer(path, require_tokenizer), path=path)
    cls = model_class(config)
    if not isinstance(config, cls.config_class):  # a text class for a multimodal config (Qwen3.5 repos)
        config = config.get_text_config()
    try:
        model = cls.from_pretrained(
            path,
            config=config,
            dtype=dtype,
            attn_implementation=attention_implementation(config),
            # torch's grouped_mm (the default MoE path) has no float64 kernel; float64 is for tests
            **({"experts_implementation": "eager"} if dtype == torch.float64 else {}),
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


def load_drafter(
    path: str | Path, target: Target | None = None, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> DFlashDrafter:
    """Load a z-lab style DFlash drafter; with `target`, check first that the pair fits."""
    path = resolve_checkpoint(path, "drafter")
    config = DrafterConfig.from_dir(path)
    if target is not None:
        validate_pair(target.config, config)
    elif config.block_size < 2:
        raise CompatibilityError(f"drafter block_size is {config.block_size}", "DFlash needs a block size >= 2")
    state = read_drafter_weights(path)
    drafter = DFlashDrafter(config)
    expected = drafter.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing:
        raise CheckpointError(
            f"drafter {path} is missing {len(missing)} tensor(s), e.g. {', '.join(missing[:3])}",
            "check that num_hidden_layers and target_layer_ids in config.json match the weights",
        )
    if unexpected:
        raise CheckpointError(
            f"drafter {path} has {len(unexpected)} unexpected tensor(s), e.g. {', '.join(unexpected[:3])}",
            "use a z-lab DFlash layout (layers.N.*, fc, hidden_norm, norm) or fix num_hidden_layers in config.json",
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


def validate_pair(target_config, drafter: DrafterConfig) -> None:
    """Check that a drafter fits a target; raise with the problem and the fix."""
    hidden = int(target_config.hidden_size)
    vocab = int(target_config.vocab_size)
    layers = int(target_config.num_hidden_layers)
    if drafter.hidden_size != hidden:
        raise CompatibilityError(
            f"drafter hidden_size {drafter.hidden_size} != target hidden_size {hidden}",
            "use the drafter trained for this target (DFlash drafters share the target's embedding and LM head)",
        )
    if drafter.vocab_size is not None and drafter.vocab_size != vocab:
        raise CompatibilityError(
            f"drafter vocab_size {drafter.vocab_size} != target vocab_size {vocab}",
            "use the drafter trained for this target's tokenizer",
        )
    if drafter.num_target_layers != layers:
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
    if not 0 <= drafter.mask_token_id < vocab:
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
    if sliding and not drafter.sliding_window:
        raise CompatibilityError("drafter has sliding_attention layers but no sliding_window", "set sliding_window in config.json")


def save_drafter(drafter: DFlashDrafter, path: str | Path) -> Path:
    """Write a drafter in the z-lab layout (config.json + model.safetensors), loadable by other tools."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in drafter.state_dict().items()}
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(drafter.config.to_dict(), indent=2) + "\n")
    return path

"""Tiny random checkpoints, written to disk in the real layouts, for tests, benchmarks and CI.

Nothing is downloaded: targets are transformers Qwen3 / Llama models with random weights saved
with `save_pretrained` (safetensors), drafters are random DFlashDrafters saved in the z-lab layout.
"""

from __future__ import annotations

from pathlib import Path

import torch

from trtllm_dflash.checkpoints import save_drafter
from trtllm_dflash.config import DrafterConfig
from trtllm_dflash.modeling.drafter import DFlashDrafter
from trtllm_dflash.testing.qwen3_8b_shaped import spread_logits

TINY_SPECIALS = ("<unk>", "<eos>", "<mask>")
TINY_CHARS = [chr(c) for c in range(32, 127)] + ["\n", "\t"]


def make_tiny_tokenizer(path: str | Path) -> Path:
    """A character-level fast tokenizer (ids 0..99: 3 specials, printable ASCII, newline, tab)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(list(TINY_SPECIALS) + TINY_CHARS)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", eos_token="<eos>", mask_token="<mask>")
    fast.save_pretrained(path)
    return Path(path)


TINY_VOCAB = len(TINY_SPECIALS) + len(TINY_CHARS)


# transformers model_type of every target family the runtime supports, by our short name
FAMILIES = {
    "qwen3": "qwen3",
    "llama": "llama",
    "qwen3_moe": "qwen3_moe",
    "gemma3": "gemma3_text",
    "gpt_oss": "gpt_oss",
    "gemma4": "gemma4_text",
    "qwen3_5": "qwen3_5_text",
    "qwen3_5_moe": "qwen3_5_moe_text",
    "qwen3_next": "qwen3_next",
    "deepseek_v3": "deepseek_v3",
}
HYBRID_FAMILIES = ("qwen3_5", "qwen3_5_moe", "qwen3_next")
TINY_SLIDING_WINDOW = 8  # small, so that a short generation crosses it


def tiny_target_config(family: str = "qwen3", vocab_size: int = 128, num_layers: int = 4, hidden_size: int = 64):
    """A tiny config of `family` from transformers' own config class: the family's real layer kinds
    (sliding windows, sinks, per-layer head dims, shared KV, linear attention, MLA, experts)."""
    from transformers import AutoConfig

    if family not in FAMILIES:
        raise ValueError(f"unknown tiny family {family!r}; known: {', '.join(FAMILIES)}")
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        rms_norm_eps=1e-6,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        architectures=None,
    )
    dense = dict(intermediate_size=2 * hidden_size, max_position_embeddings=1024)
    experts = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=hidden_size // 2)
    hybrid_layers = (["linear_attention"] * 3 + ["full_attention"]) * max(1, num_layers // 4)
    linear = dict(
        layer_types=hybrid_layers,
        num_hidden_layers=len(hybrid_layers),
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=hidden_size // 4,
        linear_value_head_dim=hidden_size // 4,
        linear_conv_kernel_dim=4,
        max_position_embeddings=1024,
    )
    layers = dict(num_hidden_layers=num_layers)
    model_type = FAMILIES[family]
    if family == "qwen3":
        config = AutoConfig.for_model(model_type, **common, **dense, **layers, rope_theta=10000.0, tie_word_embeddings=True)
    elif family == "llama":
        config = AutoConfig.for_model(model_type, **common, **dense, **layers, rope_theta=10000.0, tie_word_embeddings=False)
    elif family == "qwen3_moe":
        config = AutoConfig.for_model(model_type, **common, **dense, **layers, **experts, decoder_sparse_step=1)
    elif family == "gemma3":
        config = AutoConfig.for_model(
            model_type,
            **common,
            **dense,
            **layers,
            sliding_window=TINY_SLIDING_WINDOW,
            layer_types=["sliding_attention", "full_attention"] * (num_layers // 2),
            final_logit_softcapping=30.0,
        )
    elif family == "gpt_oss":  # attention sinks, alternating sliding / full layers, MoE; eager attention
        config = AutoConfig.for_model(
            model_type,
            **common,
            **layers,
            intermediate_size=hidden_size,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=TINY_SLIDING_WINDOW,
        )
    elif family == "gemma4":  # per-layer head dims, sliding + global layers, K = V globals, shared KV layers
        types = ["sliding_attention", "sliding_attention", "full_attention"] * 2
        config = AutoConfig.for_model(
            model_type,
            **common,
            **dense,
            num_hidden_layers=len(types),
            layer_types=types,
            sliding_window=TINY_SLIDING_WINDOW,
            global_head_dim=2 * hidden_size // 4,
            num_global_key_value_heads=1,
            attention_k_eq_v=True,
            num_kv_shared_layers=2,
            vocab_size_per_layer_input=vocab_size,
            hidden_size_per_layer_input=16,
            final_logit_softcapping=30.0,
        )
    elif family == "qwen3_5":
        config = AutoConfig.for_model(model_type, **common, **linear, intermediate_size=2 * hidden_size)
    elif family == "qwen3_5_moe":
        config = AutoConfig.for_model(model_type, **common, **linear, **experts, shared_expert_intermediate_size=hidden_size // 2)
    elif family == "qwen3_next":
        config = AutoConfig.for_model(
            model_type,
            **common,
            **linear,
            **experts,
            intermediate_size=2 * hidden_size,
            shared_expert_intermediate_size=hidden_size // 2,
        )
    else:  # deepseek_v3: MLA (decompressed 24-d keys, 16-d values in the cache) + MoE
        mla = {k: v for k, v in common.items() if k != "head_dim"}
        mla["num_key_value_heads"] = mla["num_attention_heads"]
        config = AutoConfig.for_model(
            model_type,
            **mla,
            **dense,
            **layers,
            moe_intermediate_size=hidden_size // 2,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
            kv_lora_rank=16,
            q_lora_rank=32,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
        )
    from transformers import AutoModelForCausalLM

    config.architectures = [AutoModelForCausalLM._model_mapping[type(config)].__name__]
    return config


def make_tiny_target(path: str | Path, family: str = "qwen3", seed: int = 0, tokenizer: bool = False, **config_kwargs) -> Path:
    """A random causal LM of `family` saved with `save_pretrained` (safetensors).

    With `tokenizer=True` a character-level tokenizer is saved next to it (its vocabulary fits
    the default vocab_size of 128; the eos id is 1 and the mask id 2).
    """
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_target_config(family, **config_kwargs)
    model = AutoModelForCausalLM.from_config(config)
    spread_logits(model)
    _long_memory(model)
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    if tokenizer:
        make_tiny_tokenizer(path)
    return path


# config.json's quantization_config of openai/gpt-oss-20b and -120b: only the MoE experts are MXFP4
GPT_OSS_MXFP4_CONFIG = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
}


def make_tiny_mxfp4_target(path: str | Path, seed: int = 0, tokenizer: bool = False, **config_kwargs) -> Path:
    """A random tiny gpt-oss target saved as OpenAI publishes gpt-oss: the experts as MXFP4
    `<proj>_blocks` / `<proj>_scales` uint8 tensors (our writer, the OCP MX rule), everything else
    BF16, and `quantization_config` with `quant_method: mxfp4`. Hidden and intermediate sizes are
    multiples of 32 (one MXFP4 block)."""
    import json

    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from trtllm_dflash.modeling.fp4 import quantize_mxfp4

    torch.manual_seed(seed)
    config = tiny_target_config("gpt_oss", **config_kwargs)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    spread_logits(model)
    state = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    for layer in range(config.num_hidden_layers):
        for proj in ("gate_up_proj", "down_proj"):
            name = f"model.layers.{layer}.mlp.experts.{proj}"
            blocks, scales = quantize_mxfp4(state.pop(name).transpose(1, 2))  # [E, in, out] -> the checkpoint's [E, out, in]
            state[f"{name}_blocks"], state[f"{name}_scales"] = blocks.contiguous(), scales.contiguous()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(path)
    raw = json.loads((path / "config.json").read_text())
    raw["quantization_config"] = GPT_OSS_MXFP4_CONFIG
    (path / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    if tokenizer:
        make_tiny_tokenizer(path)
    return path


# multimodal checkpoints whose text path is a supported family (what the real repos hold)
MULTIMODAL_FAMILIES = {"qwen3_5": "qwen3_5", "gemma4": "gemma4", "kimi_k25": "deepseek_v3"}


def make_tiny_multimodal_target(path: str | Path, model_type: str, seed: int = 0) -> Path:
    """A random multimodal checkpoint (`model_type` qwen3_5, gemma4 or kimi_k25: a tiny vision tower
    around a tiny text model), saved as the real repositories are: Qwen3.5/3.6, Gemma 4 and
    Kimi-K2.5 checkpoints are multimodal, and DFlash serves their text path."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    torch.manual_seed(seed)
    text = tiny_target_config(MULTIMODAL_FAMILIES[model_type])
    text.pad_token_id = 0  # multimodal wrappers map image placeholders to it
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    if model_type == "qwen3_5":
        vision.update(depth=1, num_heads=2, out_hidden_size=text.hidden_size)
    config = AutoConfig.for_model(model_type, text_config=text.to_dict(), vision_config=vision)
    model = AutoModelForImageTextToText._model_mapping[type(config)]._from_config(config)
    spread_logits(model)
    _long_memory(model)
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    return path


def _long_memory(model) -> None:
    """Slow decay in Gated DeltaNet layers: transformers' random init decays the recurrent state by
    about e^-20 per token, so a wrongly rolled-back state would be forgotten before it could show."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "A_log") and hasattr(module, "dt_bias"):
                module.A_log.copy_(torch.empty_like(module.A_log).uniform_(0.02, 0.2, generator=generator).log())
                module.dt_bias.fill_(-2.0)


def tiny_drafter_config(
    target_config,
    num_layers: int = 2,
    block_size: int = 8,
    mask_token_id: int | None = None,
    target_layer_ids: tuple[int, ...] | None = None,
    **overrides,
) -> DrafterConfig:
    layers = int(target_config.num_hidden_layers)
    values = dict(
        hidden_size=int(target_config.hidden_size),
        intermediate_size=2 * int(target_config.hidden_size),
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=int(target_config.hidden_size) // 4,
        num_target_layers=layers,
        target_layer_ids=tuple(target_layer_ids) if target_layer_ids is not None else tuple(range(min(num_layers, layers))),
        mask_token_id=int(target_config.vocab_size) - 1 if mask_token_id is None else mask_token_id,
        block_size=block_size,
        vocab_size=int(target_config.vocab_size),
        rope_theta=10000.0,
        max_position_embeddings=1024,
    )
    values.update(overrides)
    return DrafterConfig(**values)


def make_tiny_drafter(path: str | Path, target_path: str | Path, seed: int = 0, **kwargs) -> Path:
    """A random DFlash drafter for the target at `target_path`, saved in the z-lab layout."""
    from transformers import AutoConfig

    torch.manual_seed(seed)
    config = tiny_drafter_config(AutoConfig.from_pretrained(target_path).get_text_config(), **kwargs)
    return save_drafter(DFlashDrafter(config), path)


def make_tiny_v2_drafter(path: str | Path, target_path: str | Path, seed: int = 0, selector_top_k: int = 8, **kwargs) -> Path:
    """A random DFlash V2 drafter (DFlash2DraftModel) for the target at `target_path`, in the published
    tensor layout: random convolution projections and base kernels, random codebooks."""
    from transformers import AutoConfig

    from trtllm_dflash.drafters.dflash2.modeling import DFlash2Drafter

    torch.manual_seed(seed)
    target_config = AutoConfig.from_pretrained(target_path).get_text_config()
    v1 = DFlashDrafter(tiny_drafter_config(target_config, **kwargs))
    drafter = DFlash2Drafter.from_v1(v1, int(target_config.vocab_size), selector_rank=16, selector_top_k=selector_top_k)
    perturb_v2(drafter, seed)
    return save_drafter(drafter, path)


def perturb_v2(drafter, seed: int = 0, scale: float = 0.3) -> None:
    """Move a V2 drafter's convolutions and codebooks away from identity / zero (tests)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in drafter.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                for param in (conv.kernel_projection.weight, conv.base_kernel):
                    param.add_(scale * torch.randn(param.shape, generator=generator).to(param))
        selector = drafter.candidate_selector
        for param in (selector.hidden_projection.weight, selector.predecessor_codebook, selector.successor_codebook):
            param.copy_(torch.randn(param.shape, generator=generator).to(param))


MODELOPT_QUANTIZED_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_modelopt_drafter(source_dir: str | Path, dest_dir: str | Path, algo: str, kv_cache_fp8: bool = True) -> Path:
    """A z-lab drafter re-written as ModelOpt exports a quantized one, byte for byte, without ModelOpt
    (which cannot calibrate NVFP4 without CUDA for a whole model): every decoder-layer linear
    quantized, `fc`, norms and any own LM head / embedding kept as they come (as our build keeps fc).

        FP8    `weight` F8_E4M3 = w / s, `weight_scale` F32 [] s = amax / 448
        NVFP4  `weight` U8 [out, in/2] (E2M1 codes, low nibble first), `weight_scale` F8_E4M3
               [out, in/16], `weight_scale_2` F32 [] (modeling/fp4.quantize_nvfp4: NVFP4QTensor's rule)

    plus an `input_scale` F32 [] per linear and, with `kv_cache_fp8`, `k_proj.k_scale` / `v_proj.v_scale`,
    and hf_quant_config.json + config.json `quantization_config` naming `algo`. Tests read it back
    with our loader; tests/test_drafter_quantized.py checks the bytes against ModelOpt's own packing.
    """
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from trtllm_dflash.modeling.fp4 import quantize_nvfp4
    from trtllm_dflash.modeling.fp8_linear import FP8_MAX

    source_dir, dest_dir = Path(source_dir), Path(dest_dir)
    if algo not in ("FP8", "NVFP4"):
        raise ValueError(f"algo is {algo!r}: FP8 or NVFP4")
    dest_dir.mkdir(parents=True, exist_ok=True)
    state: dict[str, torch.Tensor] = {}
    kept = set()
    for file in sorted(source_dir.glob("*.safetensors")):
        for name, tensor in load_file(str(file)).items():
            module = name.removesuffix(".weight")
            if not (name.endswith(".weight") and module.rsplit(".", 1)[-1] in MODELOPT_QUANTIZED_LINEARS):
                state[name] = tensor
                if name.endswith(".weight") and tensor.dim() == 2:
                    kept.add(module)
                continue
            if algo == "FP8":
                scale = (tensor.float().abs().amax() / FP8_MAX).reshape(())
                state[name] = (tensor.float() / scale).to(torch.float8_e4m3fn)
                state[f"{module}.weight_scale"] = scale
            else:
                state[name], state[f"{module}.weight_scale"], state[f"{module}.weight_scale_2"] = quantize_nvfp4(tensor)
            state[f"{module}.input_scale"] = torch.tensor(0.5)
            if kv_cache_fp8 and module.endswith(("k_proj", "v_proj")):
                kv = module.rsplit(".", 1)[-1][0]  # "k" or "v"
                state[f"{module}.{kv}_scale"] = torch.tensor(0.25)
    save_file({k: v.contiguous() for k, v in state.items()}, str(dest_dir / "model.safetensors"))
    for file in source_dir.iterdir():
        if file.is_file() and file.suffix != ".safetensors" and file.name != "model.safetensors.index.json":
            shutil.copy2(file, dest_dir / file.name)
    quantization = {"quant_algo": algo, "kv_cache_quant_algo": "FP8" if kv_cache_fp8 else None, "exclude_modules": sorted(kept)}
    if algo == "NVFP4":
        quantization["group_size"] = 16
    (dest_dir / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}, "quantization": quantization}, indent=2))
    config = json.loads((dest_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "modelopt", **quantization}
    (dest_dir / "config.json").write_text(json.dumps(config, indent=2))
    return dest_dir


# token ids below TINY_VOCAB, so a trained pair can be served with the character tokenizer
CYCLES = ((5, 17, 9, 30, 22, 11, 41), (60, 73, 66, 88, 95, 61, 84, 79, 57, 70, 99))


def cycle_sequences(count: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """Windows of two fixed token cycles (7 and 11 tokens): every next token is determined."""
    rows = []
    for _ in range(count):
        cycle = torch.tensor(CYCLES[int(torch.randint(0, len(CYCLES), (1,), generator=generator))])
        start = int(torch.randint(0, len(cycle), (1,), generator=generator))
        rows.append(cycle.roll(-start).repeat(length // len(cycle) + 1)[:length])
    return torch.stack(rows)


def make_cycle_pair(
    root: str | Path, block_size: int = 8, seed: int = 0, family: str = "qwen3", tokenizer: bool = False
) -> tuple[Path, Path]:
    """A tiny target of `family` trained for seconds to continue two token cycles, and a DFlash
    drafter distilled from it, saved to disk. The drafter proposes the target's own tokens, so long
    runs are accepted: the pair exercises acceptance, stop tokens and length cuts inside a block
    (and, for a hybrid target, state rollback at every acceptance length). With `tokenizer=True`
    the character tokenizer is saved beside the target, so the pair can be served with text."""
    from transformers import AutoModelForCausalLM

    from trtllm_dflash.training.trainer import DrafterTrainer, TrainConfig

    root = Path(root)
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    config = tiny_target_config(family)
    target = AutoModelForCausalLM.from_config(config)
    _long_memory(target)
    optimizer = torch.optim.AdamW(target.parameters(), lr=5e-3)
    for _ in range(150):
        batch = cycle_sequences(16, 24, generator)
        loss = target(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    target.eval()
    target_dir = root / "target"
    target.save_pretrained(target_dir, safe_serialization=True)
    if tokenizer:
        make_tiny_tokenizer(target_dir)

    drafter = DFlashDrafter(tiny_drafter_config(config, block_size=block_size, target_layer_ids=(1, 3), mask_token_id=0))
    trainer = DrafterTrainer(target, drafter, TrainConfig(steps=200, lr=1e-2, anchors=16, seed=seed))

    def batches():
        while True:  # as long as the generations it will draft for: positions do not extrapolate
            batch = cycle_sequences(8, 80, generator)
            yield batch, torch.ones_like(batch)

    trainer.train(batches())
    trainer.close()
    drafter_dir = save_drafter(drafter, root / "drafter")
    return target_dir, drafter_dir

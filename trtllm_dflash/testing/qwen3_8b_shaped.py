"""Random-weight models at Qwen3-8B's full width, built in memory (nothing downloaded or written).

Every GEMM and attention runs at the real checkpoint's width for a fraction of its weights, so the
GPU check (`checks/selftest.py`: decode step costs, CUDA graphs) and the NVFP4 accuracy measurement
(`builder/nvfp4_accuracy.py`) see real sizes without a download; the full-depth step benchmark
(`bench/gpu_step.py`) builds all 36 layers, and its CPU mode the same code at a tiny width (the
`sizes` overrides). `spread_logits` is the random-init adjustment the tiny test checkpoints
(`testing/tiny.py`) use too.
"""

from __future__ import annotations

import torch

from trtllm_dflash.config import DrafterConfig
from trtllm_dflash.modeling.drafter import DFlashDrafter


def spread_logits(model) -> None:
    """Scale the LM head so random models have peaked, well-separated next-token distributions."""
    with torch.no_grad():
        head = model.get_output_embeddings()
        if head.weight is not model.get_input_embeddings().weight:
            head.weight.mul_(4.0)


# Qwen3-8B's layer shape (catalog/models.py) and its DFlash drafter's mask token id
QWEN3_8B_SHAPE = dict(
    hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=12288, vocab_size=151936
)
QWEN3_8B_MASK_TOKEN_ID = 151669


def built_in(dtype: torch.dtype, device: str | torch.device, build):
    """`build()` with parameters created on `device` in `dtype` (no full-precision copy on the GPU)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return build()
    finally:
        torch.set_default_dtype(previous)


def qwen3_8b_shaped_config(num_layers: int = 2, vocab_size: int = QWEN3_8B_SHAPE["vocab_size"], **sizes):
    """Qwen3-8B's config with `num_layers` layers: every GEMM and attention at full width, for a
    fraction of the weights (2 layers + embedding + LM head: 1.6 B parameters, 3.3 GB in bf16).
    `sizes` overrides QWEN3_8B_SHAPE's widths (hidden_size, heads, head_dim, intermediate_size)."""
    from transformers import Qwen3Config

    unknown = set(sizes) - set(QWEN3_8B_SHAPE)
    if unknown:
        raise TypeError(f"unknown sizes {sorted(unknown)}; known: {sorted(QWEN3_8B_SHAPE)}")
    shape = {**QWEN3_8B_SHAPE, **sizes, "vocab_size": vocab_size}
    return Qwen3Config(
        **shape,
        num_hidden_layers=num_layers,
        max_position_embeddings=40960,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        architectures=["Qwen3ForCausalLM"],
    )


def make_qwen3_8b_shaped_target(
    num_layers: int = 2,
    vocab_size: int = QWEN3_8B_SHAPE["vocab_size"],
    device: str | torch.device = "meta",
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    **sizes,
):
    """A random-weight Qwen3ForCausalLM of Qwen3-8B's width (or `sizes`'), built in memory on `device`.

    Nothing is written to disk (full width is gigabytes). `device="meta"` allocates nothing and is
    for checking shapes; on "cuda" the weights are initialised on the GPU directly.
    """
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = qwen3_8b_shaped_config(num_layers, vocab_size, **sizes)
    model = built_in(dtype, device, lambda: Qwen3ForCausalLM(config))
    if torch.device(device).type != "meta":
        spread_logits(model)
    return model.eval()


def qwen3_8b_shaped_drafter_config(
    target_config, num_layers: int = 1, block_size: int = 16, target_layer_ids: tuple[int, ...] | None = None
) -> DrafterConfig:
    """z-lab/Qwen3-8B-DFlash-b16's layer shape for a target built by `make_qwen3_8b_shaped_target`
    (its widths taken from the target's config).

    The real drafter has 5 layers and taps 5 of the 36 target layers; against a 2-layer target it
    would cost more than the target, so by default this one has `num_layers` (default 1) and taps
    every target layer (at most 5); `target_layer_ids` names the taps instead."""
    layers = int(target_config.num_hidden_layers)
    vocab = int(target_config.vocab_size)
    return DrafterConfig(
        hidden_size=int(target_config.hidden_size),
        intermediate_size=int(target_config.intermediate_size),
        num_hidden_layers=num_layers,
        num_attention_heads=int(target_config.num_attention_heads),
        num_key_value_heads=int(target_config.num_key_value_heads),
        head_dim=int(target_config.head_dim),
        num_target_layers=layers,
        target_layer_ids=tuple(target_layer_ids) if target_layer_ids is not None else tuple(range(min(layers, 5))),
        mask_token_id=QWEN3_8B_MASK_TOKEN_ID if QWEN3_8B_MASK_TOKEN_ID < vocab else vocab - 1,
        block_size=block_size,
        vocab_size=vocab,
        rope_theta=1_000_000.0,
        max_position_embeddings=40960,
    )


def make_qwen3_8b_shaped_drafter(
    target_config,
    num_layers: int = 1,
    block_size: int = 16,
    device: str | torch.device = "meta",
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    target_layer_ids: tuple[int, ...] | None = None,
) -> DFlashDrafter:
    """A random DFlash drafter matching `make_qwen3_8b_shaped_target` (see the config's docstring)."""
    torch.manual_seed(seed)
    config = qwen3_8b_shaped_drafter_config(target_config, num_layers, block_size, target_layer_ids)
    return built_in(dtype, device, lambda: DFlashDrafter(config)).eval()

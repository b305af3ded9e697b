"""Tiny random checkpoints, written to disk in the real layouts, for tests and CI.

Nothing is downloaded: targets are transformers Qwen3 / Llama models with random weights saved
with `save_pretrained` (safetensors), drafters are random DFlashDrafters saved in the z-lab layout.
"""

from __future__ import annotations

from pathlib import Path

import torch

from trtllm_dflash.checkpoints import save_drafter
from trtllm_dflash.config import DrafterConfig
from trtllm_dflash.modeling.drafter import DFlashDrafter


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


def tiny_target_config(family: str = "qwen3", vocab_size: int = 128, num_layers: int = 4, hidden_size: int = 64):
    from transformers import LlamaConfig, Qwen3Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    if family == "qwen3":
        return Qwen3Config(**common, rope_theta=10000.0, tie_word_embeddings=True, architectures=["Qwen3ForCausalLM"])
    if family == "llama":
        return LlamaConfig(**common, rope_theta=10000.0, tie_word_embeddings=False, architectures=["LlamaForCausalLM"])
    raise ValueError(f"unknown tiny family {family!r}")


def make_tiny_target(
    path: str | Path, family: str = "qwen3", seed: int = 0, tokenizer: bool = False, **config_kwargs
) -> Path:
    """A random causal LM of `family` saved with `save_pretrained` (safetensors).

    With `tokenizer=True` a character-level tokenizer is saved next to it (its vocabulary fits
    the default vocab_size of 128; the eos id is 1 and the mask id 2).
    """
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_target_config(family, **config_kwargs)
    model = AutoModelForCausalLM.from_config(config)
    _spread_logits(model)
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    if tokenizer:
        make_tiny_tokenizer(path)
    return path


def _spread_logits(model) -> None:
    """Scale the LM head so random models have peaked, well-separated next-token distributions."""
    with torch.no_grad():
        head = model.get_output_embeddings()
        if head.weight is not model.get_input_embeddings().weight:
            head.weight.mul_(4.0)


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
    config = tiny_drafter_config(AutoConfig.from_pretrained(target_path), **kwargs)
    return save_drafter(DFlashDrafter(config), path)


CYCLES = ((5, 17, 9, 30, 22, 11, 41), (60, 73, 66, 88, 95, 61, 104, 79, 117, 70, 99))


def cycle_sequences(count: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """Windows of two fixed token cycles (7 and 11 tokens): every next token is determined."""
    rows = []
    for _ in range(count):
        cycle = torch.tensor(CYCLES[int(torch.randint(0, len(CYCLES), (1,), generator=generator))])
        start = int(torch.randint(0, len(cycle), (1,), generator=generator))
        rows.append(cycle.roll(-start).repeat(length // len(cycle) + 1)[:length])
    return torch.stack(rows)


def make_cycle_pair(root: str | Path, block_size: int = 8, seed: int = 0) -> tuple[Path, Path]:
    """A tiny target trained for seconds to continue two token cycles, and a DFlash drafter
    distilled from it, saved to disk. The drafter proposes the target's own tokens, so long runs
    are accepted: the pair exercises acceptance, stop tokens and length cuts inside a block."""
    from transformers import AutoModelForCausalLM

    from trtllm_dflash.training.trainer import DrafterTrainer, TrainConfig

    root = Path(root)
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    config = tiny_target_config("qwen3")
    target = AutoModelForCausalLM.from_config(config)
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

    drafter = DFlashDrafter(tiny_drafter_config(config, block_size=block_size, target_layer_ids=(1, 3), mask_token_id=0))
    trainer = DrafterTrainer(target, drafter, TrainConfig(steps=200, lr=1e-2, num_anchors=16, seed=seed))

    def batches():
        while True:  # as long as the generations it will draft for: positions do not extrapolate
            batch = cycle_sequences(8, 80, generator)
            yield batch, torch.ones_like(batch)

    trainer.train(batches())
    trainer.close()
    drafter_dir = save_drafter(drafter, root / "drafter")
    return target_dir, drafter_dir

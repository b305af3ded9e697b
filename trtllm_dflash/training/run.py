"""`train-drafter` as a library call: check the inputs, prepare data, train, checkpoint, export.

Everything that can be wrong with the inputs (data, target, tokenizer, block size, layer ids,
output directory) is checked by `check_options` from config files alone, BEFORE the target is
loaded or any data is generated, so a typo costs a second, not an hour. Training state goes to
`<out>/checkpoint/` (safetensors only) every `checkpoint_every` steps; `resume=True` continues
from it with the same batches and anchors. The result is a z-lab layout drafter in `<out>`
(config.json + model.safetensors) plus `training.json` (options, losses, time, tau).

`v2=True` trains a DFlash V2 drafter (convolutions + candidate selector); `init_from` starts it
from an existing V1 drafter (`DFlash2Drafter.from_v1`: identity convolutions, a selector that
changes nothing yet), whose layers, taps and mask token it keeps.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from trtllm_dflash.checkpoints import TOKENIZER_FILES, load_drafter, load_target, new_drafter, resolve_checkpoint, save_drafter
from trtllm_dflash.config import MAX_BLOCK_SIZE, V2_ARCHITECTURE, V2_DEFAULTS, DrafterConfig, default_target_layer_ids
from trtllm_dflash.contracts.drafter_kinds import DFLASH
from trtllm_dflash.drafters import kind_of
from trtllm_dflash.drafters.dflash2.modeling import DFlash2Drafter
from trtllm_dflash.errors import CheckpointError, DFlashError
from trtllm_dflash.modeling.drafter import DFlashDrafter
from trtllm_dflash.training import data as datamod
from trtllm_dflash.training.checkpoint import load_checkpoint, save_checkpoint
from trtllm_dflash.training.objective import default_gamma
from trtllm_dflash.training.trainer import DrafterTrainer, TrainConfig

CHECKPOINT_DIR = "checkpoint"
DATA_CACHE = "data.safetensors"
SUMMARY = "training.json"


@dataclasses.dataclass(kw_only=True)
class TrainDrafterOptions(TrainConfig):
    """What `dflash-trt train-drafter` takes (defaults follow the paper where they fit a CPU): the
    optimisation settings of `TrainConfig` (steps, lr, anchors, gamma, seed, ...), and the run's."""

    target: str | Path
    data: Sequence[str | Path]
    out: str | Path
    layers: int = 1
    block_size: int = 16  # TrainConfig's, with the paper's default
    target_layer_ids: Sequence[int] | None = None  # default: z-lab's rule for max(layers, 3) taps
    mask_token_id: int | None = None  # default: the tokenizer's mask token
    intermediate_size: int | None = None  # default: the target's
    batch_size: int = 8
    seq_len: int = 512
    regenerate: bool = False
    prompt_tokens: int = 64  # prompt length cut from plain-text sequences when regenerating
    max_sequences: int | None = None  # random subset of the data (seeded)
    regenerate_batch: int = 16
    data_cache: str | Path | None = None  # reuse (or write) the prepared sequences here, e.g. across runs
    cache_features: bool = True  # keep target features in memory after the first epoch
    checkpoint_every: int = 100
    resume: bool = False
    threads: int | None = None
    save_dtype: str = "bfloat16"
    v2: bool = False  # train a DFlash V2 drafter (DFlash2DraftModel)
    init_from: str | Path | None = None  # V2: start from this V1 drafter (its layers, taps, mask id)
    selector_rank: int = V2_DEFAULTS["selector_rank"]
    selector_top_k: int = V2_DEFAULTS["selector_top_k"]


@dataclasses.dataclass
class CheckedOptions:
    """Options plus what `check_options` worked out from the target's files."""

    options: TrainDrafterOptions
    target_dir: Path
    data_files: list[Path]
    out: Path
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int


def check_options(options: TrainDrafterOptions) -> CheckedOptions:
    """Every input check that needs no model weights; raises DFlashError with the fix."""
    from transformers import AutoConfig, AutoTokenizer

    o = options
    if o.block_size < 2:
        raise DFlashError(f"block size must be >= 2, got {o.block_size}", "use --block-size 8 or 16 (the paper uses 16)")
    if o.layers < 1:
        raise DFlashError(f"--layers must be >= 1, got {o.layers}", "give the number of draft layers (1-8)")
    for name, value in (("steps", o.steps), ("batch-size", o.batch_size), ("anchors", o.anchors), ("checkpoint-every", o.checkpoint_every)):
        if value < 1:
            raise DFlashError(f"--{name} must be >= 1, got {value}", f"pass a positive --{name}")
    if not o.lr > 0:
        raise DFlashError(f"--lr must be > 0, got {o.lr}", "the paper uses 6e-4")
    if o.seq_len <= o.block_size:
        raise DFlashError(f"--seq-len {o.seq_len} must be larger than the block size {o.block_size}", "raise --seq-len")
    if o.regenerate and not 0 < o.prompt_tokens < o.seq_len:
        raise DFlashError(f"--prompt-tokens must be in (0, {o.seq_len}), got {o.prompt_tokens}", "lower --prompt-tokens")
    if o.data_cache and Path(o.data_cache).expanduser().is_dir():
        raise DFlashError(f"--data-cache {o.data_cache} is a directory", "pass a file path (a .safetensors file)")
    if o.init_from is not None and not o.v2:
        raise DFlashError("--init-from starts a V2 drafter from a V1 one", "add --v2 (or leave out --init-from)")
    if o.init_from is not None and not (resolve_checkpoint(o.init_from, "drafter") / "config.json").is_file():
        raise CheckpointError(f"--init-from {o.init_from} has no config.json", "point it at a V1 drafter directory (z-lab layout)")
    if o.v2:
        if o.block_size > MAX_BLOCK_SIZE:
            raise DFlashError(f"DFlash V2 blocks are 2..{MAX_BLOCK_SIZE}, got --block-size {o.block_size}", "use --block-size 8 or 16")
        if o.selector_rank < 1 or o.selector_top_k < 1:
            raise DFlashError(
                f"--selector-rank and --selector-top-k must be >= 1, got {o.selector_rank} and {o.selector_top_k}",
                "the published sizes are 256 and 16",
            )
        if not o.selector_loss_weight >= 0:
            raise DFlashError(f"--selector-loss-weight must be >= 0, got {o.selector_loss_weight}", "the default is 1.0")
    if o.save_dtype not in ("bfloat16", "float16", "float32"):
        raise DFlashError(f"unknown --save-dtype {o.save_dtype!r}", "use bfloat16, float16 or float32")

    data_files = datamod.find_data_files(o.data)
    target_dir = resolve_checkpoint(o.target, "target")
    if not (target_dir / "config.json").is_file():
        raise CheckpointError(f"target {target_dir} has no config.json", "point --target at a Hugging Face model directory")
    if not any((target_dir / name).is_file() for name in TOKENIZER_FILES):
        raise CheckpointError(
            f"target {target_dir} has no tokenizer",
            "save the tokenizer next to the model (tokenizer.save_pretrained(dir)); training reads text",
        )
    try:
        target_config = AutoConfig.from_pretrained(target_dir, local_files_only=True, trust_remote_code=False).get_text_config()
    except (ValueError, KeyError, OSError) as exc:
        raise CheckpointError(
            f"cannot read the target config in {target_dir} ({str(exc).splitlines()[0]})", "use a Hugging Face causal LM"
        ) from None
    num_layers = int(target_config.num_hidden_layers)
    ids = tuple(int(i) for i in o.target_layer_ids) if o.target_layer_ids else default_taps(num_layers, o.layers)
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad:
        raise DFlashError(
            f"target layer ids {list(ids)} include {bad}, outside the target's {num_layers} layers [0, {num_layers})",
            "ids are 0-based decoder layers (id i = output of layer i)",
        )
    if len(set(ids)) != len(ids):
        raise DFlashError(f"target layer ids {list(ids)} repeat a layer", "list each tapped layer once")

    mask_id = o.mask_token_id
    if mask_id is None:
        tokenizer = AutoTokenizer.from_pretrained(target_dir, local_files_only=True, trust_remote_code=False)
        mask_id = tokenizer.mask_token_id
        if mask_id is None:
            raise DFlashError(
                f"the tokenizer of {target_dir} has no mask token",
                "pass --mask-token-id ID (a special or reserved token the target never generates)",
            )
    if not 0 <= mask_id < int(target_config.vocab_size):
        raise DFlashError(
            f"--mask-token-id {mask_id} is outside the vocabulary [0, {target_config.vocab_size})", "pick a token id of the target"
        )

    out = Path(o.out).expanduser()
    if out.exists() and not out.is_dir():
        raise DFlashError(f"--out {out} is a file", "pass a directory path")
    checkpoint = out / CHECKPOINT_DIR
    if o.resume and not ((checkpoint / "state.json").is_file() or (checkpoint / DATA_CACHE).is_file()):
        raise DFlashError(f"--resume given but {checkpoint} holds no checkpoint", "run without --resume to start training")
    if not o.resume and out.is_dir() and any(out.iterdir()):
        raise DFlashError(
            f"--out {out} is not empty",
            "pass --resume to continue its training, or choose a new --out (nothing there is overwritten)",
        )
    return CheckedOptions(o, target_dir, data_files, out, num_layers, ids, int(mask_id))


def default_taps(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """z-lab's spacing for max(layers, 3) taps (a 1-layer drafter still sees shallow, middle and
    deep features); on targets too shallow for that rule, taps spread over all layers."""
    count = min(max(num_draft_layers, 3), num_target_layers)
    ids = sorted(set(default_target_layer_ids(num_target_layers, count)))
    if len(ids) < count:
        ids = sorted({round(k * (num_target_layers - 1) / max(1, count - 1)) for k in range(count)})
    return tuple(ids)


def drafter_config(target_config, checked: CheckedOptions) -> DrafterConfig:
    """A drafter shaped like the target's layers (the target's width, heads and RoPE)."""
    o = checked.options
    heads = int(target_config.num_attention_heads)
    rope = getattr(target_config, "rope_parameters", None) or {}
    return DrafterConfig(
        hidden_size=int(target_config.hidden_size),
        intermediate_size=int(o.intermediate_size or target_config.intermediate_size),
        num_hidden_layers=o.layers,
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(target_config, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(target_config, "head_dim", None) or target_config.hidden_size // heads),
        num_target_layers=checked.num_target_layers,
        target_layer_ids=checked.target_layer_ids,
        mask_token_id=checked.mask_token_id,
        block_size=o.block_size,
        vocab_size=int(target_config.vocab_size),
        rms_norm_eps=float(getattr(target_config, "rms_norm_eps", 1e-6)),
        rope_theta=float(getattr(target_config, "rope_theta", None) or rope.get("rope_theta", 1_000_000.0)),
        max_position_embeddings=int(getattr(target_config, "max_position_embeddings", 4096)),
    )


Progress = Callable[[str, int, int, dict], None]  # (phase, done, total, metrics)


def prepare_sequences(checked: CheckedOptions, target, progress: Progress | None = None) -> list[datamod.TokenSequence]:
    """Tokenized (and, with regeneration, target-regenerated) training sequences, cached on disk."""
    from safetensors.torch import load_file, save_file

    o = checked.options
    cache = checked.out / CHECKPOINT_DIR / DATA_CACHE
    shared = Path(o.data_cache).expanduser() if o.data_cache else None
    for source in (cache, shared):
        if source is not None and source.is_file():
            sequences = datamod.from_tensors(load_file(str(source)))
            if source != cache:
                save_file(datamod.to_tensors(sequences), str(cache))
            return sequences
    examples = datamod.read_examples(checked.data_files, target.tokenizer)
    sequences = datamod.tokenize_examples(target.tokenizer, examples, o.seq_len, min_length=o.block_size + 1)
    if not sequences:
        raise DFlashError("no training sequence is longer than the block size", "pass more text, or a smaller --block-size")
    if o.max_sequences and len(sequences) > o.max_sequences:
        keep = torch.randperm(len(sequences), generator=torch.Generator().manual_seed(o.seed))[: o.max_sequences]
        sequences = [sequences[i] for i in sorted(keep.tolist())]
    if o.regenerate:
        done = [0]

        def tick(count: int) -> None:
            done[0] += count
            if progress:
                progress("regenerate", done[0], len(sequences), {})

        sequences = datamod.regenerate(
            target.model, sequences, o.prompt_tokens, o.seq_len, target.stop_token_ids(), o.regenerate_batch, tick
        )
        sequences = [s for s in sequences if sum(s.loss_mask) >= 2]
        if not sequences:
            raise DFlashError("the target generated nothing to train on", "check the prompts and the target's stop tokens")
    else:
        sequences = [s for s in sequences if sum(s.loss_mask) >= 2]
        if not sequences:
            raise DFlashError("the data has prompts but no responses to train on", "add responses, or pass --regenerate")
    cache.parent.mkdir(parents=True, exist_ok=True)
    save_file(datamod.to_tensors(sequences), str(cache))
    if shared is not None:
        shared.parent.mkdir(parents=True, exist_ok=True)
        save_file(datamod.to_tensors(sequences), str(shared))
    return sequences


def train_drafter(options: TrainDrafterOptions, progress: Progress | None = None) -> dict:
    """Run the whole training; returns the summary also written to `<out>/training.json`."""
    checked = check_options(options)
    o = checked.options
    if o.threads:
        torch.set_num_threads(o.threads)
    started = time.perf_counter()
    target = load_target(checked.target_dir, require_tokenizer=True)
    checkpoint = checked.out / CHECKPOINT_DIR
    sequences = prepare_sequences(checked, target, progress)  # creates `checkpoint` once the data is ready
    data_seconds = time.perf_counter() - started

    torch.manual_seed(o.seed)
    drafter = initial_drafter(checked, target).to(next(target.model.parameters()).dtype)
    config = drafter.config
    train_config = TrainConfig(**{f.name: getattr(o, f.name) for f in dataclasses.fields(TrainConfig)})
    trainer = DrafterTrainer(target.model, drafter, train_config)
    history: list[dict] = []
    previous_seconds = 0.0
    if o.resume and (checkpoint / "state.json").is_file() and (checkpoint / "weights.safetensors").is_file():
        state = load_checkpoint(checkpoint, drafter, trainer.optimizer, trainer.generator)
        trainer.step_index = int(state["step"])
        history = state.get("history", [])
        previous_seconds = float(state.get("train_seconds", 0.0))

    pad_id = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else 0
    feature_cache: dict[int, torch.Tensor] = {}
    batches = datamod.iterate_batches(sequences, o.batch_size, o.seed, pad_id, start_step=trainer.step_index)
    train_started = time.perf_counter()
    window: list[dict] = []
    try:
        while trainer.step_index < o.steps:
            indices, input_ids, loss_mask = next(batches)
            lengths = [len(sequences[i].input_ids) for i in indices]
            features = _features(trainer, indices, lengths, input_ids, feature_cache if o.cache_features else None)
            metrics = trainer.train_step(input_ids, loss_mask, features)
            window.append(metrics)
            step = trainer.step_index
            if progress:  # the mean since the last checkpoint: the numbers the checkpoint and the final line report
                progress("train", step, o.steps, _mean_metrics(window, step))
            if step % o.checkpoint_every == 0 or step == o.steps:
                history.append(_mean_metrics(window, step))
                window = []
                seconds = previous_seconds + time.perf_counter() - train_started
                save_checkpoint(
                    checkpoint, drafter, trainer.optimizer, step, trainer.generator, {"history": history, "train_seconds": seconds}
                )
                if progress:
                    progress("checkpoint", step, o.steps, history[-1])
    finally:
        trainer.close()
    train_seconds = previous_seconds + time.perf_counter() - train_started

    drafter.eval()
    dtype = getattr(torch, o.save_dtype)
    save_drafter(_cast(drafter, dtype), checked.out)
    summary = {
        "target": str(checked.target_dir),
        "data": [str(p) for p in o.data][:8] + ([f"... and {len(o.data) - 8} more"] if len(o.data) > 8 else []),
        "num_sequences": len(sequences),
        "num_trained_tokens": int(sum(sum(s.loss_mask) for s in sequences)),
        "regenerated": o.regenerate,
        "options": {
            k: (list(v) if isinstance(v, (list, tuple)) else str(v) if isinstance(v, Path) else v)
            for k, v in dataclasses.asdict(o).items()
            if k not in ("target", "data", "out")
        },
        "drafter": {
            "layers": config.num_hidden_layers,
            "block_size": config.block_size,
            "target_layer_ids": list(config.target_layer_ids),
            "mask_token_id": config.mask_token_id,
            "gamma": o.gamma or default_gamma(o.block_size),
            "parameters": sum(p.numel() for p in drafter.parameters()),
            **_kind_summary(config, o.init_from),
        },
        "final": history[-1] if history else {},
        "history": history,
        "data_seconds": round(data_seconds, 1),
        "train_seconds": round(train_seconds, 1),
    }
    (checked.out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    shutil.rmtree(checkpoint, ignore_errors=True)
    return summary


def initial_drafter(checked: CheckedOptions, target) -> DFlashDrafter:
    """The drafter training starts from: a fresh V1 or V2 drafter shaped like the target, or
    (`init_from`) a V2 drafter converted from a V1 one, drafting exactly what it drafts."""
    o = checked.options
    vocab = int(target.config.vocab_size)
    sizes = {"selector_rank": o.selector_rank, "selector_top_k": o.selector_top_k}
    if o.init_from is not None:
        v1 = load_drafter(o.init_from, target=target, dtype=torch.float32)
        if v1.config.kind != DFLASH:
            raise DFlashError(f"--init-from {o.init_from} is already a {kind_of(v1.config).label}", "pass a V1 drafter (DFlashDraftModel)")
        return DFlash2Drafter.from_v1(v1, vocab, **sizes)
    config = drafter_config(target.config, checked)
    if o.v2:
        config = dataclasses.replace(config, architectures=(V2_ARCHITECTURE,), **{**V2_DEFAULTS, **sizes})
        if config.hidden_size % config.conv_group_size:
            raise DFlashError(
                f"hidden size {config.hidden_size} is not a multiple of the V2 conv group {config.conv_group_size}",
                "DFlash V2 needs a target whose hidden size is a multiple of 16",
            )
    return new_drafter(config, vocab)


def _kind_summary(config: DrafterConfig, init_from: Path | None) -> dict:
    """What the summary records of the drafter's kind beyond V1's shape (with where a converted one started)."""
    extra = kind_of(config).training_summary(config)
    return {**extra, "init_from": str(init_from) if init_from else None} if extra else {}


def _cast(drafter: DFlashDrafter, dtype: torch.dtype) -> DFlashDrafter:
    """A copy of the drafter in `dtype` (the trained one stays as it is)."""
    selector = getattr(drafter, "candidate_selector", None)
    copy = new_drafter(drafter.config, None if selector is None else selector.predecessor_codebook.shape[0])
    copy.load_state_dict(drafter.state_dict())
    return copy.to(dtype)


def _features(trainer: DrafterTrainer, indices: list[int], lengths: list[int], input_ids: torch.Tensor, cache: dict | None) -> torch.Tensor:
    """Tapped target features of a batch; with a cache, computed once per sequence and kept in bf16.

    Padding rows are zeros: the drafter never sees them (context is strictly before an anchor).
    """
    if cache is None:
        return trainer.target_features(input_ids)
    if not all(i in cache for i in indices):
        features = trainer.target_features(input_ids)
        for row, (i, length) in enumerate(zip(indices, lengths)):
            cache.setdefault(i, features[row, :length].to(torch.bfloat16).clone())
    width = input_ids.shape[1]
    rows = [cache[i] for i in indices]
    return torch.stack([torch.nn.functional.pad(r, (0, 0, 0, width - r.shape[0])) for r in rows]).float()


def _mean_metrics(window: list[dict], step: int) -> dict:
    """The mean of each metric over `window`, the steps from `first_step` to `step`."""
    keys = ("loss", "accuracy", "base_loss", "selector_loss", "candidate_recall", "selector_accuracy")
    out = {"step": step, "first_step": step - len(window) + 1}
    for key in keys:
        if not any(key in m for m in window) and key not in ("loss", "accuracy"):
            continue
        values = [m[key] for m in window if key in m and not math.isnan(m[key])]
        out[key] = round(sum(values) / len(values), 4) if values else float("nan")
    out["lr"] = window[-1]["lr"] if window else 0.0
    return out

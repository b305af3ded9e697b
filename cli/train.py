"""`dflash-trt train-drafter`: distil a DFlash drafter for any Hugging Face causal LM."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from trtllm_dflash.cli.common import quiet_libraries
from trtllm_dflash.errors import DFlashError


def _layer_ids(text: Optional[str]) -> Optional[list[int]]:
    if not text:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise DFlashError(
            f"--target-layer-ids {text!r} is not a comma-separated list of integers", "e.g. --target-layer-ids 1,4,6"
        ) from None


def train_drafter(
    target: str = typer.Option(..., "--target", help="Target model directory (Hugging Face layout, with its tokenizer) or 'demo'."),
    data: list[Path] = typer.Option(
        ..., "--data", help="Text files, directories of them, or JSONL (text / prompt+response / messages). Repeatable."
    ),
    out: Path = typer.Option(..., "--out", help="Output directory: the drafter in the z-lab layout (+ training.json)."),
    layers: int = typer.Option(1, "--layers", help="Draft decoder layers (the paper: 5; 1-2 keep a CPU drafter cheap)."),
    block_size: int = typer.Option(16, "--block-size", "-b", help="Block size B (>= 2; the paper uses 16)."),
    target_layer_ids: Optional[str] = typer.Option(
        None, "--target-layer-ids", help="Tapped target layers, e.g. 1,4,6 (default: z-lab's spacing)."
    ),
    mask_token_id: Optional[int] = typer.Option(None, "--mask-token-id", help="MASK token id (default: the tokenizer's mask token)."),
    steps: int = typer.Option(1000, "--steps", help="Optimizer steps."),
    lr: float = typer.Option(6e-4, "--lr", help="Peak learning rate (AdamW, warmup then cosine)."),
    batch_size: int = typer.Option(8, "--batch-size", help="Sequences per step."),
    seq_len: int = typer.Option(512, "--seq-len", help="Tokens per training sequence (the paper: 3072)."),
    anchors: int = typer.Option(512, "--anchors", help="Random block anchors per sequence (the paper: 512)."),
    gamma: Optional[float] = typer.Option(None, "--gamma", help="Loss decay (default: 7 for B=16, 5 for B=10, 4 for B=8)."),
    regenerate: bool = typer.Option(
        False, "--regenerate", help="Replace responses by the target's greedy continuation first (the paper's recipe)."
    ),
    prompt_tokens: int = typer.Option(64, "--prompt-tokens", help="With --regenerate: prompt length cut from plain-text sequences."),
    max_sequences: Optional[int] = typer.Option(None, "--max-sequences", help="Use a seeded random subset of this many sequences."),
    data_cache: Optional[Path] = typer.Option(
        None, "--data-cache", help="Reuse the prepared (regenerated) sequences from this file, or write them there."
    ),
    checkpoint_every: int = typer.Option(100, "--checkpoint-every", help="Steps between resumable checkpoints."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --out from its last checkpoint."),
    seed: int = typer.Option(0, "--seed", help="Seed of initialisation, data order and anchors."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch CPU threads."),
    cache_features: bool = typer.Option(
        True, "--cache-features/--no-cache-features", help="Keep target features in memory after the first epoch."
    ),
    v2: bool = typer.Option(
        False,
        "--v2",
        help="Train a DFlash V2 drafter (grouped dynamic convs + candidate selector), from scratch or --init-from a V1 drafter.",
    ),
    init_from: Optional[Path] = typer.Option(
        None,
        "--init-from",
        help="With --v2: start from this V1 drafter (DFlash2Drafter.from_v1: identity convs, "
        "a selector that changes nothing yet; its layers, taps and mask id are kept).",
    ),
    selector_rank: int = typer.Option(
        256, "--selector-rank", help="With --v2: rank R of the selector codebooks (2*V*R weights; published: 256)."
    ),
    selector_top_k: int = typer.Option(16, "--selector-top-k", help="With --v2: candidates per draft position (published: 16)."),
    selector_loss_weight: float = typer.Option(1.0, "--selector-loss-weight", help="With --v2: loss = base + weight * selector loss."),
) -> None:
    """Train a DFlash drafter for a frozen target (paper recipe) and write it in the z-lab layout."""
    from trtllm_dflash.training.run import TrainDrafterOptions, check_options
    from trtllm_dflash.training.run import train_drafter as run

    options = TrainDrafterOptions(
        target=target,
        data=data,
        out=out,
        layers=layers,
        block_size=block_size,
        target_layer_ids=_layer_ids(target_layer_ids),
        mask_token_id=mask_token_id,
        steps=steps,
        lr=lr,
        batch_size=batch_size,
        seq_len=seq_len,
        anchors=anchors,
        gamma=gamma,
        regenerate=regenerate,
        prompt_tokens=prompt_tokens,
        max_sequences=max_sequences,
        data_cache=data_cache,
        checkpoint_every=checkpoint_every,
        resume=resume,
        seed=seed,
        threads=threads,
        cache_features=cache_features,
        v2=v2,
        init_from=init_from,
        selector_rank=selector_rank,
        selector_top_k=selector_top_k,
        selector_loss_weight=selector_loss_weight,
    )
    quiet_libraries()
    checked = check_options(options)  # every input error surfaces here, before anything is loaded
    console = Console(highlight=False)
    shape = f"taps {list(checked.target_layer_ids)}, mask id {checked.mask_token_id}"
    kind = (
        f"a V2 drafter from {init_from} (block {block_size}"
        if init_from
        else (f"a {layers}-layer {'V2 ' if v2 else ''}drafter (block {block_size}, {shape}")
    )
    console.print(f"training {kind}) for {checked.target_dir} on {len(checked.data_files)} file(s)")
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console) as bar:
        tasks: dict[str, int] = {}

        # every loss and accuracy shown is the mean over the steps since the last checkpoint (one step's
        # batch alone jumps around), labelled with those steps: the bar, the checkpoint lines and the final line agree
        def progress(phase: str, done: int, total: int, metrics: dict) -> None:
            if phase == "checkpoint":
                console.log(f"{_steps(metrics)}: mean loss {metrics['loss']:.4f}, accuracy {metrics['accuracy']:.3f} (checkpoint saved)")
                return
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total, info="", completed=0)
            info = f"mean of {_steps(metrics)}: loss {metrics['loss']:.3f} acc {metrics['accuracy']:.2f}" if "loss" in metrics else ""
            if "selector_accuracy" in metrics:
                info += f" selector acc {metrics['selector_accuracy']:.2f} recall {metrics['candidate_recall']:.2f}"
            bar.update(tasks[phase], completed=done, info=info)

        summary = run(options, progress)
    final = summary["final"]
    scores = f": final loss {final['loss']:.4f}, accuracy {final['accuracy']:.3f} (mean of {_steps(final)})" if final else ""
    console.print(
        f"[green]wrote[/] {out} ({summary['drafter']['parameters']:,} parameters, {summary['train_seconds']:.0f} s training){scores}"
    )
    console.print(
        f"check its acceptance: dflash-trt generate --target {checked.target_dir} --drafter {out} --prompt TEXT "
        "(tau 1.00 means no draft token was accepted)",
        soft_wrap=True,
    )


def _steps(metrics: dict) -> str:
    """'steps 901-1000' (or 'step 7'): the steps a mean loss or accuracy was taken over."""
    first, last = metrics.get("first_step", metrics.get("step")), metrics.get("step")
    return f"step {last}" if first == last else f"steps {first}-{last}"

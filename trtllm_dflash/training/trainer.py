"""Distilling a DFlash drafter from a frozen target (the optimisation loop).

Only the draft layers, `fc`, `hidden_norm` and `norm` are trained; the target (and with it the
embedding and LM head the drafter borrows) stays frozen. AdamW, linear warmup + cosine decay,
gradient clipping, as in the paper. A DFlash V2 drafter trains all of its weights, the
convolutions and the candidate selector included (objective.selector_loss).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterator

import torch

from trtllm_dflash.modeling.drafter import DFlashDrafter
from trtllm_dflash.modeling.taps import HiddenTaps
from trtllm_dflash.training.objective import cosine_lr, dflash_loss, make_block_batch, sample_anchors


@dataclasses.dataclass
class TrainConfig:
    steps: int = 1000
    lr: float = 6e-4
    warmup_fraction: float = 0.04
    grad_clip: float = 1.0
    weight_decay: float = 0.0
    anchors: int = 512  # per sequence, as in the paper; fewer when the sequence is shorter
    block_size: int | None = None  # default: the drafter config's
    gamma: float | None = None  # default: 7 for B=16, 5 for B=10, 4 for B=8
    seed: int = 0
    selector_loss_weight: float = 1.0  # V2 drafters: loss = base + weight * selector loss


@dataclasses.dataclass
class TrainState:
    step: int
    optimizer: torch.optim.Optimizer
    losses: list[float]


Batch = tuple[torch.Tensor, torch.Tensor]  # input_ids [b, S], loss_mask [b, S] (1 = trained position)


@torch.no_grad()
def unstick_selector(drafter: DFlashDrafter, seed: int = 0) -> None:
    """Give a V2 drafter whose codebooks are both zero (`from_v1`, or a fresh one) a random
    predecessor codebook. The selector's extra score is bilinear in the two codebooks, so at
    zero/zero neither gets a gradient; with the successor still zero the drafter drafts exactly
    as before, and training can move it."""
    selector = getattr(drafter, "candidate_selector", None)
    if selector is None or selector.predecessor_codebook.any() or selector.successor_codebook.any():
        return
    generator = torch.Generator().manual_seed(seed)
    codebook = selector.predecessor_codebook
    codebook.copy_(torch.randn(codebook.shape, generator=generator).to(codebook))


class DrafterTrainer:
    """One optimizer over a drafter, stepping on batches of target-annotated sequences."""

    def __init__(self, target: torch.nn.Module, drafter: DFlashDrafter, config: TrainConfig) -> None:
        self.target = target.eval().requires_grad_(False)
        self.drafter = drafter.train()
        self.config = config
        self.block_size = config.block_size or drafter.config.block_size
        decoder = target.get_decoder()
        self.taps = HiddenTaps(decoder.layers, drafter.config.target_layer_ids)
        self.decoder = decoder
        self.embedding = target.get_input_embeddings()
        self.lm_head = target.get_output_embeddings()
        self.windows = drafter.config.attentions
        self.generator = torch.Generator().manual_seed(config.seed)
        unstick_selector(drafter, config.seed)
        self.optimizer = torch.optim.AdamW(
            [p for p in drafter.parameters() if p.requires_grad], lr=config.lr, weight_decay=config.weight_decay
        )
        self.step_index = 0

    @torch.no_grad()
    def target_features(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.decoder(input_ids=input_ids, use_cache=False)
        return self.taps.features().detach()

    def train_step(self, input_ids: torch.Tensor, loss_mask: torch.Tensor, features: torch.Tensor | None = None) -> dict:
        """One optimizer step; `features` are the tapped target states (computed here when None)."""
        config = self.config
        if features is None:
            features = self.target_features(input_ids)
        features = features.to(next(self.drafter.parameters()).dtype)
        eligible = loss_mask.bool().clone()
        eligible[:, 0] = False  # a block needs some context before its anchor
        eligible[:, -1] = False  # and at least one position after it
        anchors = sample_anchors(eligible.cpu(), config.anchors, self.generator).to(input_ids.device)
        batch = make_block_batch(
            input_ids,
            anchors,
            loss_mask,
            self.block_size,
            self.drafter.config.mask_token_id,
            self.windows,
            config.gamma,
            history=self.drafter.config.history,
        )
        lr = cosine_lr(self.step_index, config.steps, config.lr, config.warmup_fraction)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss, metrics = dflash_loss(self.drafter, self.embedding, self.lm_head, features, batch, config.selector_loss_weight)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        metrics["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), config.grad_clip))
        self.optimizer.step()
        self.step_index += 1
        metrics["lr"] = lr
        metrics["step"] = self.step_index
        return metrics

    def train(self, batches: Iterator[Batch], on_step: Callable[[dict], None] | None = None) -> list[dict]:
        history = []
        while self.step_index < self.config.steps:
            input_ids, loss_mask = next(batches)
            metrics = self.train_step(input_ids, loss_mask)
            history.append(metrics)
            if on_step is not None:
                on_step(metrics)
        self.drafter.eval()
        return history

    def close(self) -> None:
        self.taps.remove()

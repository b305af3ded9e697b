"""The DFlash training objective (paper recipe, DFLASH.md).

Random anchors in the response each start a block: the anchor token is clean, the next B-1
positions are MASK. All blocks of a sequence are trained in one pass with a sparse mask: a block
sees the target context strictly before its anchor and itself, never another block. The loss is
cross-entropy at block positions 1..B-1 weighted exp(-(k-1)/gamma); the anchor has weight 0.

DFlash V2 drafters add a selector term (the public description is NeMo AutoModel's `dflash2_core`;
the original objective is not published): loss = base + selector_loss_weight * selector, where
the selector CE runs over the top-k candidates of the unary logits, scored with the TRUE previous
token (the anchor for position 1), with the same position weights; positions whose true token is
not a candidate are left out (their share is `1 - candidate_recall`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import torch
import torch.nn.functional as F

from trtllm_dflash.contracts.draft_window import DraftWindow

IGNORE = -100
GAMMA_BY_BLOCK = {16: 7.0, 10: 5.0, 8: 4.0}


def default_gamma(block_size: int) -> float:
    """Loss decay of the paper (7 for B=16, 5 for B=10, 4 for B=8; about B/2 otherwise)."""
    return GAMMA_BY_BLOCK.get(block_size, max(1.0, round(block_size * 0.45, 1)))


def position_weights(block_size: int, gamma: float | None = None) -> torch.Tensor:
    """Weights of block positions 1..B-1: exp(-(k-1)/gamma)."""
    gamma = gamma or default_gamma(block_size)
    k = torch.arange(1, block_size, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma)


def sample_anchors(eligible: torch.Tensor, num_anchors: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Up to `num_anchors` distinct anchor positions per row among `eligible [b, S]`; -1 pads."""
    scores = torch.rand(eligible.shape, generator=generator, device=eligible.device)
    scores = scores.masked_fill(~eligible, -1.0)
    count = min(num_anchors, eligible.shape[1])
    top = scores.topk(count, dim=1)
    return torch.where(top.values >= 0, top.indices, torch.full_like(top.indices, -1))


@dataclasses.dataclass
class BlockBatch:
    """Blocks of a batch of sequences, flattened to `[b, A*B]`."""

    block_size: int
    block_tokens: torch.Tensor  # [b, A*B]: anchor token then MASK
    block_positions: torch.Tensor  # [b, A*B]: absolute positions a + k
    labels: torch.Tensor  # [b, A*(B-1)]: token at a + k for k >= 1, IGNORE where none
    weights: torch.Tensor  # [b, A*(B-1)]
    masks: dict[DraftWindow, torch.Tensor]  # layer window -> [b, 1, A*B, S + A*B] visibility
    previous: torch.Tensor | None = None  # [b, A*(B-1)]: the true token at a + k - 1 (the anchor for k = 1)


def make_block_batch(
    input_ids: torch.Tensor,
    anchors: torch.Tensor,
    loss_mask: torch.Tensor,
    block_size: int,
    mask_token_id: int,
    windows: Sequence[DraftWindow] = (DraftWindow(),),
    gamma: float | None = None,
    history: int = 0,
) -> BlockBatch:
    """Build the blocks for anchors `[b, A]` (-1 = unused) over sequences `input_ids [b, S]`.

    `windows` are the drafter's layer windows (`DrafterConfig.attentions`), one mask each, by the
    rule the decoding step uses (`draft_window`). `history` > 0 (a drafter's `sliding_window_size`)
    limits every layer's context to the last `history` positions before the anchor, as the
    decoding step does.
    """
    batch, seq_len = input_ids.shape
    num_anchors = anchors.shape[1]
    device = input_ids.device
    offsets = torch.arange(block_size, device=device)
    valid_anchor = anchors >= 0
    safe_anchor = anchors.clamp_min(0)
    positions = safe_anchor.unsqueeze(-1) + offsets  # [b, A, B]

    tokens = torch.full((batch, num_anchors, block_size), mask_token_id, dtype=torch.long, device=device)
    tokens[..., 0] = input_ids.gather(1, safe_anchor)

    label_pos = positions[..., 1:]
    in_range = label_pos < seq_len
    gathered = input_ids.gather(1, label_pos.clamp_max(seq_len - 1).flatten(1)).view_as(label_pos)
    trained = loss_mask.gather(1, label_pos.clamp_max(seq_len - 1).flatten(1)).view_as(label_pos).bool()
    ok = in_range & trained & valid_anchor.unsqueeze(-1)
    labels = torch.where(ok, gathered, torch.full_like(gathered, IGNORE))
    weights = position_weights(block_size, gamma).to(device).expand_as(labels) * ok
    previous = input_ids.gather(1, (label_pos - 1).clamp_max(seq_len - 1).flatten(1)).view_as(label_pos)

    # visibility: queries are (anchor j, offset k); keys are context slots then all block slots
    q_anchor = safe_anchor.unsqueeze(-1).expand(-1, -1, block_size).flatten(1)  # [b, Q]
    q_pos = positions.flatten(1)
    q_block = torch.arange(num_anchors, device=device).repeat_interleave(block_size)
    ctx_pos = torch.arange(seq_len, device=device)
    ctx_visible = ctx_pos.view(1, 1, -1) < q_anchor.unsqueeze(-1)  # strictly before the anchor
    if history > 0:
        ctx_visible = ctx_visible & (ctx_pos.view(1, 1, -1) >= q_anchor.unsqueeze(-1) - history)
    same_block = q_block.view(-1, 1) == q_block.view(1, -1)  # [Q, Q]
    masks = {}
    for window in windows:
        ctx_ok = ctx_visible & window.visible(q_pos.unsqueeze(-1), ctx_pos.view(1, 1, -1))
        blk_ok = same_block.unsqueeze(0) & window.visible(q_pos.unsqueeze(-1), q_pos.unsqueeze(1))
        masks[window] = torch.cat([ctx_ok, blk_ok], dim=-1).unsqueeze(1)
    return BlockBatch(
        block_size=block_size,
        block_tokens=tokens.flatten(1),
        block_positions=q_pos,
        labels=labels.flatten(1),
        weights=weights.flatten(1),
        masks=masks,
        previous=previous.flatten(1),
    )


def dflash_loss(
    drafter, embedding, lm_head, features: torch.Tensor, batch: BlockBatch, selector_loss_weight: float = 1.0
) -> tuple[torch.Tensor, dict]:
    """Weighted cross-entropy of the drafter's block predictions; also per-position accuracy.

    A V2 drafter (one with a `candidate_selector`) adds `selector_loss_weight` times its selector
    loss (`selector_loss`); its metrics then also hold the base and selector terms."""
    b, q = batch.block_tokens.shape
    block_size, num_blocks = batch.block_size, q // batch.block_size
    seq_len = features.shape[1]
    ctx_positions = torch.arange(seq_len, device=features.device).expand(b, -1)
    embeds = drafter.embed(batch.block_tokens, embedding)
    hidden = drafter.forward_train(embeds, batch.block_positions, features, ctx_positions, batch.masks, block_size=block_size)
    # position k of a block predicts the token AT a + k (no shift); the anchor is not scored
    hidden = hidden.view(b, num_blocks, block_size, -1)[:, :, 1:].reshape(b, num_blocks * (block_size - 1), -1)
    logits = drafter.logits(hidden, lm_head).float()
    ce = F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=IGNORE, reduction="none")
    total_weight = batch.weights.sum()
    loss = (ce * batch.weights.flatten()).sum() / total_weight.clamp_min(1e-6)
    with torch.no_grad():
        valid = batch.labels != IGNORE
        correct = (logits.argmax(-1) == batch.labels) & valid
        accuracy = correct.sum().float() / valid.sum().clamp_min(1)
    metrics = {"loss": float(loss.detach()), "accuracy": float(accuracy), "weight": float(total_weight)}
    selector = getattr(drafter, "candidate_selector", None)
    if selector is None:
        return loss, metrics
    sel_loss, sel_metrics = selector_loss(selector, hidden, logits, batch)
    base = loss
    loss = base + selector_loss_weight * sel_loss
    metrics.update(sel_metrics, loss=float(loss.detach()), base_loss=float(base.detach()))
    return loss, metrics


def selector_loss(selector, hidden: torch.Tensor, unary: torch.Tensor, batch: BlockBatch) -> tuple[torch.Tensor, dict]:
    """CE of the V2 candidate selector over its top-k candidates, teacher-forced.

    hidden `[b, N, H]` (final-normed, anchors dropped) and unary `[b, N, V]` (the drafter's logits)
    of the draft positions; candidate ids come from the logits without gradient, the candidates'
    logits keep theirs. score[c] = unary[c] + <successor[c], predecessor[prev] * hidden_projection(h)>
    with prev the true previous token; the label is the true token's index among the candidates.
    """
    from trtllm_dflash.ops.reference_dflash2 import candidates

    if batch.previous is None:
        raise ValueError("the block batch has no previous tokens (build it with make_block_batch)")
    with torch.no_grad():
        cand = candidates(unary.detach(), selector.top_k)  # [b, N, k]
    z = F.linear(hidden, selector.hidden_projection.weight).float()  # [b, N, R]
    u = selector.predecessor_codebook[batch.previous].float() * z
    score = unary.gather(-1, cand) + (selector.successor_codebook[cand].float() * u.unsqueeze(-2)).sum(-1)
    labels = batch.labels.unsqueeze(-1)
    hit = cand == labels  # [b, N, k]; no row is a hit where the label is IGNORE
    included = hit.any(-1)
    index = torch.where(included, hit.float().argmax(-1), torch.full_like(batch.labels, IGNORE))
    ce = F.cross_entropy(score.flatten(0, 1), index.flatten(), ignore_index=IGNORE, reduction="none")
    weights = batch.weights.flatten() * included.flatten()
    loss = (ce * weights).sum() / weights.sum().clamp_min(1e-6)
    with torch.no_grad():
        valid = batch.labels != IGNORE
        count = valid.sum().clamp_min(1)
        pick = cand.gather(-1, score.argmax(-1, keepdim=True)).squeeze(-1)
        metrics = {
            "selector_loss": float(loss.detach()),
            "candidate_recall": float(included.sum() / count),
            "selector_accuracy": float(((pick == batch.labels) & valid).sum() / count),
        }
    return loss, metrics


def cosine_lr(step: int, total: int, base_lr: float, warmup_fraction: float = 0.04) -> float:
    """Linear warmup then cosine decay to 0 (the paper's schedule)."""
    warmup = max(1, int(total * warmup_fraction))
    if step < warmup:
        return base_lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return base_lr * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

"""The V2 drafter's head over a drafter graph's outputs, shared by the ONNX and TensorRT runtimes.

A native V2 graph ends at the candidate selector's inputs (drafters/dflash2/graph.py): candidates and a
`[b, B-1, k, k]` table of scores (candidate i after candidate j of the position before). The
walk over that table is O(B k) per row and runs here, one `reference_dflash2.select_step` per
position, so it draws exactly what the torch runtime's selector draws. A plugin graph walks
inside; its candidates' q is scattered over the vocabulary for verification.
"""

from __future__ import annotations

import torch

from trtllm_dflash.contracts import names
from trtllm_dflash.drafters import kind_of
from trtllm_dflash.drafters.dflash2.graph import HEAD_PLUGIN, HEAD_SCORES
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.graphs.drafter import HEAD_LOGITS
from trtllm_dflash.ops import reference_dflash2
from trtllm_dflash.runtime.base import Proposal, SamplingTensors, contiguous_slots, draft_positions


def walk_scores(
    cand: torch.Tensor, scores: torch.Tensor, sampling: SamplingTensors, positions: torch.Tensor, vocab: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens `[b, T]`, q over the candidates `[b, T, k]`) of the walk over `scores [b, T, k, k]`."""
    batch, steps, k = cand.shape
    previous = torch.zeros(batch, dtype=torch.long, device=cand.device)  # at t = 0 every row j is the anchor's
    tokens, probs = [], []
    for t in range(steps):
        score = scores[:, t].gather(1, previous.view(-1, 1, 1).expand(-1, 1, k)).squeeze(1)  # [b, k]
        pick, q = reference_dflash2.select_step(score, cand[:, t], sampling.temperature, sampling.seed, positions[:, t], vocab)
        previous = (cand[:, t] == pick.view(-1, 1)).long().argmax(dim=-1)
        tokens.append(pick)
        probs.append(q)
    return torch.stack(tokens, dim=1), torch.stack(probs, dim=1)


def proposal(
    head: str, outputs: dict[str, torch.Tensor], sampling: SamplingTensors, anchor_positions: torch.Tensor, vocab: int
) -> Proposal:
    """The drafted block from a V2 drafter graph's `outputs` (by name); the anchors sit at
    `anchor_positions [b]`. q is None when every row is greedy, as in the torch runtime."""
    cand = outputs[names.CANDIDATES].long()
    if head == HEAD_SCORES:
        positions = draft_positions(anchor_positions, cand.shape[1])
        tokens, cand_probs = walk_scores(cand, outputs[names.SELECTOR_SCORES].float(), sampling, positions, vocab)
    elif head == HEAD_PLUGIN:
        tokens, cand_probs = outputs[names.DRAFT_TOKENS].long(), outputs[names.CANDIDATE_PROBS].float()
    else:
        raise DFlashError(f"a drafter graph with head {head!r} has no candidate selector", "re-export the build's graphs")
    if sampling.all_greedy:
        return Proposal(tokens, None)
    return Proposal(tokens, reference_dflash2.scatter_draft_probs(cand, cand_probs, vocab))


def draft_logits(head: str, outputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The (unary) draft logits of a drafter graph, which every head but the plugin walk returns."""
    if head == HEAD_PLUGIN:
        raise DFlashError("the V2 plugin drafter graph returns draft tokens, not logits", "call propose")
    return outputs[names.LOGITS]


class GraphDrafterHead:
    """`propose` and `drafter_head` of a runtime that runs exported drafter graphs (ONNX Runtime, TensorRT).

    Mixed in before CachedRuntime: V1 drafters keep the base class's head; V2 drafters are walked
    here over `_draft_outputs` (one drafter graph call, given the sampling inputs a plugin graph
    takes, as `_sampling_feed` shapes them for its engine).
    """

    @property
    def drafter_head(self) -> str:
        return self.drafter.get("head") or HEAD_LOGITS

    def _sampling_feed(self, sampling: SamplingTensors) -> dict:
        raise NotImplementedError

    @torch.inference_mode()
    @contiguous_slots
    def propose(self, rows, block, ctx_features, new_counts, cache_lens, sampling: SamplingTensors, constrain=None) -> Proposal:
        """A candidate selector's drafts: the graph's selector inputs walked here (native), or the graph's walk (plugin)."""
        if not kind_of(self.drafter_config).candidate_selector:
            return super().propose(rows, block, ctx_features, new_counts, cache_lens, sampling, constrain)
        out = self._draft_outputs(rows, block, ctx_features, new_counts, cache_lens, self._sampling_feed(sampling))
        return proposal(self.drafter_head, out, sampling, cache_lens + new_counts, self.vocab_size)

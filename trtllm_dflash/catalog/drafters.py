"""A DFlash drafter's published shape: its layers' KV caches and its parameters, V1 and V2.

The planner and the closed-form traffic model need the drafter's weights split by how they are
read: the decoder layers, `fc` and norms (read whole by every call) and, for DFlash V2
(DFlash2DraftModel), the grouped dynamic convolutions around every sublayer and the candidate
selector, whose two codebooks `[V, R]` are only gathered row by row.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from trtllm_dflash.contracts.drafter_kinds import DFLASH, DFLASH2

FULL = "full_attention"
SLIDING = "sliding_attention"


@dataclasses.dataclass(frozen=True)
class AttentionShape:
    """The KV-cache-relevant shape of one attention layer."""

    num_kv_heads: int
    head_dim: int
    window: int = 0  # 0: full attention (the cache grows with the context)
    k_eq_v: bool = False  # the layer has no V projection (Gemma 4 global layers)


@dataclasses.dataclass(frozen=True)
class DrafterSpec:
    """A DFlash drafter's published shape (a stack of Qwen3-style decoder layers, no embedding/LM head).

    The V2 fields are 0 for a V1 drafter; `vocab_size` is the rows of V2's two codebooks (the
    target's vocabulary).
    """

    checkpoint: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    target_layer_ids: tuple[int, ...]
    layer_types: tuple[str, ...] = ()  # empty: every layer full (non-causal) attention
    sliding_window: int = 0
    mask_token_id: int | None = None  # None: not verified; read from the drafter's config.json
    published_size_gib: float | None = None
    source: str = ""
    conv_kernel_size: int = 0
    conv_group_size: int = 0
    selector_rank: int = 0
    selector_top_k: int = 0
    vocab_size: int = 0

    @property
    def kind(self) -> str:
        """The drafter kind's name (`trtllm_dflash.drafters.kind_of`): DFLASH2 with V2 convolutions."""
        return DFLASH2 if self.conv_kernel_size > 0 else DFLASH

    def attention(self, layer: int) -> AttentionShape:
        sliding = bool(self.layer_types) and self.layer_types[layer] == SLIDING
        return AttentionShape(self.num_kv_heads, self.head_dim, self.sliding_window if sliding else 0)

    def conv_params(self) -> int:
        """V2: per layer two convolutions (attention, MLP), each kernel_projection [2*K*G, H] + base_kernel [2, K, H]."""
        if not self.conv_kernel_size:
            return 0
        d, k = self.hidden_size, self.conv_kernel_size
        groups = d // self.conv_group_size
        return self.num_layers * 2 * (2 * k * groups * d + 2 * k * d)

    def selector_projection_params(self) -> int:
        """V2: candidate_selector.hidden_projection [R, H]."""
        return self.selector_rank * self.hidden_size  # 0 without a selector

    def codebook_params(self) -> int:
        """V2: the predecessor and successor codebooks, [V, R] each (gathered by row, never read whole)."""
        return 2 * self.vocab_size * self.selector_rank  # 0 without a selector

    def dense_params(self) -> int:
        """Parameters every drafter call reads whole: decoder layers, fc, norms (+ V2 convs and projection)."""
        d, h, kv, hd, ffn = self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim, self.intermediate_size
        attention = d * h * hd + 2 * d * kv * hd + h * hd * d
        per_layer = attention + 3 * d * ffn + 2 * d + 2 * hd  # + input/post-attention norms, q/k norms
        v1 = self.num_layers * per_layer + len(self.target_layer_ids) * d * d + 2 * d
        return v1 + self.conv_params() + self.selector_projection_params()

    def num_params(self) -> int:
        """Every stored parameter (embedding and LM head are the target's)."""
        return self.dense_params() + self.codebook_params()


def drafter_from_config_file(path: Path, checkpoint: str) -> DrafterSpec:
    """A DrafterSpec from a z-lab style config.json (through the project's DrafterConfig reader)."""
    from trtllm_dflash.config import DrafterConfig  # torch: imported only when a config file is read

    cfg = DrafterConfig.from_dict(json.loads(path.read_text()), source=str(path))
    return DrafterSpec(
        checkpoint=checkpoint,
        num_layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_heads=cfg.num_attention_heads,
        num_kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        block_size=cfg.block_size,
        target_layer_ids=tuple(cfg.target_layer_ids),
        layer_types=tuple(cfg.layer_types),
        sliding_window=int(cfg.sliding_window or 0),
        mask_token_id=cfg.mask_token_id,
        source=f"read from {path}",
        conv_kernel_size=cfg.conv_kernel_size,
        conv_group_size=cfg.conv_group_size,
        selector_rank=cfg.selector_rank,
        selector_top_k=cfg.selector_top_k,
        vocab_size=int(cfg.vocab_size or 0) if cfg.selector_rank else 0,  # the codebooks' rows
    )

"""Published shapes of the targets and DFlash drafters that the recipes name.

The planner needs shapes, not weights: parameter counts per kind of tensor (what gets quantized,
what stays BF16) and the KV-cache layout per layer (KV heads, head dim, sliding window). Every
entry says where its numbers come from. "Verified" means checked through the project's search
tool against the published config.json or model card; "derived" means computed from verified
figures (for example a head_dim that is the only value consistent with a published file size).

Targets
- gpt-oss-120b / gpt-oss-20b: transformers' GptOssConfig defaults are the 120b shape (36 layers,
  hidden 2880, 64 q heads, 8 KV heads, head_dim 64, 128 experts, top-4, expert inner size 2880,
  sliding window 128 on even layers, vocab 201088, untied, attention bias). OpenAI's model card:
  116.83B total / 5.13B active, checkpoint 60.8 GiB (120b); 20.91B, 12.8 GiB, 24 layers,
  32 experts (20b). Verified (both sources); the counts below reproduce both totals.
- Qwen3-8B: 36 layers, hidden 4096, 32 heads, 8 KV, head_dim 128, intermediate 12288,
  vocab 151936, untied (DFLASH.md drafter config echoes the target shape; Qwen3 model card 8.2B).
- Llama-3.1-8B-Instruct: 32 layers, hidden 4096, 32 heads, 8 KV, head_dim 128, intermediate
  14336, vocab 128256, untied (Meta model card, 8.03B).
- Gemma 4 31B (google/gemma-4-31B-it, text part): 60 layers, hidden 5376, intermediate 21504,
  32 heads; sliding layers 16 KV heads x head_dim 256, window 1024; every 6th layer global with
  4 KV heads x head_dim 512 and K = V (attention_k_eq_v, no v_proj); vocab 262144, tied. Verified
  from three independent copies of its config.json; total 30.7B matches the model card.
  The vision tower (~0.55B) is not counted: DFlash serves the text path.
- Qwen3-Coder-30B-A3B-Instruct: 48 layers, hidden 2048, 32 heads, 4 KV, head_dim 128,
  128 experts, top-8, expert inner size 768, vocab 151936, untied (Qwen3 MoE config; 30.5B
  total / 3.3B active in the model card; the count below gives 30.53B).

Drafters (z-lab checkpoints; names verified in z-lab/dflash README.md; shapes from a published
table of their config.json files, cross-checked against the published file sizes)
- z-lab/Qwen3-8B-DFlash-b16: 5 layers, 4096, FFN 12288, 32/8 heads, block 16, taps
  [1, 9, 17, 25, 33], mask 151669 (DFLASH.md), 1.95 GiB.
- z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat: 5 layers, 4096, FFN 12288, 32/8, block 10,
  taps [1, 8, 15, 22, 29], 1.95 GiB.
- z-lab/gpt-oss-120b-DFlash: 8 layers, 2880, FFN 7680, 64/8, block 10, taps [1, 9, 17, 25, 33],
  0.78B / 1.46 GiB (model card: "0.8B parameters", trained with block size 10).
  head_dim 64 is derived (the only value that gives 1.46 GiB).
- z-lab/gpt-oss-20b-DFlash: 8 layers, 2880, FFN 7680, 64/8, block 8, taps [1, 6, 11, 16, 21].
- z-lab/Qwen3-Coder-30B-A3B-DFlash: 8 layers, 2048, FFN 6144, 32/4, block 16,
  taps [1, 12, 23, 34, 45], 0.47B / 0.88 GiB.
- z-lab/gemma-4-31B-it-DFlash: 5 layers (4 sliding with window 2048, then 1 full), 5376,
  FFN 10752, 64/8, block 16, taps [1, 12, 23, 35, 46, 57], 2.86 GiB; head_dim 128 derived.
Hybrid Gated DeltaNet and MLA targets (issue 10; the family and runtime per model_type are in families.py)
- Qwen3.5-27B (qwen3_5): 64 layers = 16 x (3 linear + 1 full), hidden 5120, 24 q / 4 KV heads x 256,
  MLP 17408, vocab 248320, 262144 positions: verified (model card and two config.json write-ups).
  Linear heads 16 key / 48 value x 128, conv kernel 4: derived (transformers Qwen3_5 field names; 48
  value heads gives 26.4B text parameters against the published ~27B, the q gate not counted).
- Qwen3.6-27B: same model_type and shape as Qwen3.5-27B (verified: config write-up, 55.56 GB BF16).
- Qwen3.5-35B-A3B (qwen3_5_moe): transformers' Qwen3_5MoeTextConfig defaults (40 layers, 2048, 16/2 x 256,
  256 experts top-8 + shared 512, expert inner 512); transformers docs: 35B total / 3B active. Derived.
- Qwen3-Coder-Next (qwen3_next): transformers' Qwen3NextConfig defaults (the 80B-A3B shape, 512 experts
  top-10, vocab 151936); that Coder-Next shares it is derived, not verified.
- Kimi-K2.5 (kimi_k25): DeepSeek-V3 text architecture as in the Kimi-K2 model card (61 layers, 7168,
  64 MLA heads, kv_lora 512, q_lora 1536, rope 64 / nope 128 / v 128, 384 experts top-8 + 1 shared,
  first layer dense, vocab 163840; 1.04T): derived (not verified here); the count gives 1.026T.
- Drafters: z-lab/Qwen3.5-27B-DFlash block 16 verified (15 speculative tokens in published serving
  configs); z-lab/Qwen3.6-27B-DFlash 5 layers [S,S,S,S,F] window 2048 verified (GGUF conversion notes),
  mask 248070 published (unverified; it appears in several Qwen3.5/3.6-family DFlash configs with
  vocab 248320); z-lab/Kimi-K2.5-DFlash block 8, taps [1,12,24,35,47,58], 6 layers and mask
  163838 agree in two independent third-party sources (unverified against the drafter's own file).
  Every other drafter width, layer count and tap list of these five is derived (the DFLASH.md
  default taps) and is unknown offline: the recipes leave taps and mask out
  and `build --drafter DIR` reads them from the drafter's config.json.
- gpt-oss-120b drafter block 10, 8 layers, taps [1,9,17,25,33]: as above (z-lab model card).
DFlash V2 drafters (DFlash2DraftModel): z-lab/Qwen3.8-27B-DFlash2 and incoai/Muse-Glimmer-30B-DFlash2, with
their sources, in drafters_dflash2.py; their targets' shapes are derived from the drafters' configs (unverified).
Not verified: the mask token ids of the drafters other than Qwen3-8B (the builder reads them
from the drafter's config.json), and the per-layer norm counts of Gemma 4 (a few MB at most).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
from pathlib import Path
from typing import Any

from trtllm_dflash.catalog.drafters import FULL, SLIDING, AttentionShape, DrafterSpec, drafter_from_config_file  # noqa: F401 (re-exported)
from trtllm_dflash.catalog.drafters_dflash2 import V2_DRAFTERS
from trtllm_dflash.errors import CheckpointError, UnknownNameError

LINEAR = "linear_attention"  # Gated DeltaNet layers of Qwen3.5 / Qwen3-Next: a recurrent state, no KV cache
GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class ParamBreakdown:
    """Parameter counts by how they are stored after quantization.

    attention_linear + mlp_linear are the dense linear layers that FP8/NVFP4 quantize;
    expert_linear are the MoE expert matrices (MXFP4 in gpt-oss checkpoints); embedding,
    lm_head and `other` (norms, biases, routers, attention sinks) stay BF16.
    """

    embedding: int
    lm_head: int
    attention_linear: int
    mlp_linear: int
    expert_linear: int
    other: int

    @property
    def total(self) -> int:
        return self.embedding + self.lm_head + self.attention_linear + self.mlp_linear + self.expert_linear + self.other


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A target model's published shape, enough to budget its memory on a GPU."""

    name: str  # canonical catalog key, also the folder name under engine_recipes/
    checkpoint: str  # Hugging Face id (or a local path for models read from disk)
    family: str  # "gpt_oss", "qwen3", "qwen3_moe", "llama", "gemma4", ...
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # dense MLP inner size; 0 when every layer is MoE
    vocab_size: int
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 131072
    layer_types: tuple[str, ...] = ()  # empty: every layer full attention
    sliding_window: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    attention_bias: bool = False
    expert_bias: bool = False
    attention_sinks: bool = False
    qk_norm: bool = False
    norms_per_layer: int = 2
    global_num_kv_heads: int | None = None  # Gemma 4: KV heads of the full-attention layers
    global_head_dim: int | None = None
    global_k_eq_v: bool = False
    native_expert_precision: str = "bf16"  # "mxfp4" for gpt-oss checkpoints
    shared_expert_intermediate_size: int = 0  # Qwen3.5-MoE / Qwen3-Next / DeepSeek shared expert(s), summed
    first_dense_layers: int = 0  # DeepSeek-V3 / Kimi: the first k layers have a dense MLP instead of experts
    # Gated DeltaNet (layer_types == "linear_attention"); transformers Qwen3NextConfig field names
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    # Multi-head latent attention (DeepSeek-V3 / Kimi); 0 when the model has none
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    published_params: float | None = None
    published_checkpoint_gib: float | None = None
    drafter: DrafterSpec | None = None
    aliases: tuple[str, ...] = ()
    placeholder: bool = False  # True: an invented shape standing in for a checkpoint that is not there yet
    source: str = ""

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def linear_layers(self) -> int:
        return sum(1 for t in self.layer_types if t == LINEAR)

    @property
    def attention_kind(self) -> str:
        """dense / sliding / sinks / hybrid-linear / mla (the family catalog's vocabulary)."""
        if self.is_mla:
            return "mla"
        if self.linear_layers:
            return "hybrid-linear"
        if self.attention_sinks:
            return "sinks"
        return "sliding" if SLIDING in self.layer_types else "dense"

    def linear_state_elements(self) -> tuple[int, int]:
        """(recurrent, conv) state elements of ONE Gated DeltaNet layer for one sequence.

        recurrent: num_v_heads x k_head_dim x v_head_dim; conv: (kernel - 1) x conv_dim with
        conv_dim = 2 x key_dim + value_dim (q, k, v go through the causal conv). Neither grows
        with the context.
        """
        key_dim = self.linear_num_key_heads * self.linear_key_head_dim
        value_dim = self.linear_num_value_heads * self.linear_value_head_dim
        recurrent = self.linear_num_value_heads * self.linear_key_head_dim * self.linear_value_head_dim
        conv = max(0, self.linear_conv_kernel_dim - 1) * (2 * key_dim + value_dim)
        return recurrent, conv

    def mla_kv_per_token(self) -> int:
        """Latent KV elements per token per MLA layer: kv_lora_rank + qk_rope_head_dim (no per-head K/V)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def layer_type(self, layer: int) -> str:
        return self.layer_types[layer] if self.layer_types else FULL

    def attention(self, layer: int) -> AttentionShape:
        if self.layer_type(layer) == LINEAR:
            return AttentionShape(0, 0, 0)  # no KV cache: a fixed-size recurrent state (linear_state_elements)
        if self.layer_type(layer) == SLIDING:
            return AttentionShape(self.num_kv_heads, self.head_dim, self.sliding_window)
        if self.global_num_kv_heads is not None or self.global_head_dim is not None:
            return AttentionShape(
                self.global_num_kv_heads or self.num_kv_heads,
                self.global_head_dim or self.head_dim,
                0,
                self.global_k_eq_v,
            )
        return AttentionShape(self.num_kv_heads, self.head_dim, 0)

    def params(self) -> ParamBreakdown:
        d, h = self.hidden_size, self.num_heads
        embedding = self.vocab_size * d
        lm_head = 0 if self.tie_word_embeddings else self.vocab_size * d
        attention_linear = mlp_linear = expert_linear = 0
        other = d  # final norm
        for layer in range(self.num_layers):
            other += self.norms_per_layer * d
            if self.layer_type(layer) == LINEAR:
                # in_proj_qkvz (q, k, v, gate z), in_proj_ba (per value head), out_proj; conv1d, A_log, dt_bias, norm
                key_dim = self.linear_num_key_heads * self.linear_key_head_dim
                value_dim = self.linear_num_value_heads * self.linear_value_head_dim
                attention_linear += d * (2 * key_dim + 2 * value_dim) + d * 2 * self.linear_num_value_heads + value_dim * d
                other += (2 * key_dim + value_dim) * self.linear_conv_kernel_dim + 2 * self.linear_num_value_heads
                other += self.linear_value_head_dim
            elif self.is_mla:
                q_head = self.qk_nope_head_dim + self.qk_rope_head_dim
                q = d * self.q_lora_rank + self.q_lora_rank * h * q_head if self.q_lora_rank else d * h * q_head
                attention_linear += q + d * (self.kv_lora_rank + self.qk_rope_head_dim)
                attention_linear += self.kv_lora_rank * h * (self.qk_nope_head_dim + self.v_head_dim) + h * self.v_head_dim * d
                other += self.q_lora_rank + self.kv_lora_rank
            else:
                shape = self.attention(layer)
                q, kv = h * shape.head_dim, shape.num_kv_heads * shape.head_dim
                kv_projections = 1 if shape.k_eq_v else 2
                attention_linear += d * q + kv_projections * d * kv + q * d
                if self.qk_norm:
                    other += 2 * shape.head_dim
                if self.attention_bias:
                    other += q + kv_projections * kv + d
                if self.attention_sinks:
                    other += h
            dense_layer = layer < self.first_dense_layers
            if self.is_moe and not dense_layer:
                inner = self.moe_intermediate_size
                expert_linear += self.num_experts * 3 * d * inner  # gate, up (fused or not) and down
                other += d * self.num_experts + (self.num_experts if self.expert_bias else 0)  # router
                if self.expert_bias:
                    other += self.num_experts * (2 * inner + d)
                mlp_linear += 3 * d * self.shared_expert_intermediate_size
            if self.intermediate_size and (not self.is_moe or dense_layer):
                mlp_linear += 3 * d * self.intermediate_size
        return ParamBreakdown(embedding, lm_head, attention_linear, mlp_linear, expert_linear, other)


def _alternating(num_layers: int, first: str, second: str) -> tuple[str, ...]:
    return tuple(first if layer % 2 == 0 else second for layer in range(num_layers))


def _every_fourth_full(num_layers: int) -> tuple[str, ...]:
    """Qwen3.5 / Qwen3-Next: three Gated DeltaNet layers, then one full-attention layer."""
    return tuple(FULL if (layer + 1) % 4 == 0 else LINEAR for layer in range(num_layers))


def _default_taps(num_target_layers: int, n: int = 5) -> tuple[int, ...]:
    """DFLASH.md default target_layer_ids (start 1, end L-3, evenly spaced): used only where unpublished."""
    start, end = 1, num_target_layers - 3
    return tuple(round(start + k * (end - start) / (n - 1)) for k in range(n))


def _hybrid(
    name: str,
    checkpoint: str,
    family: str,
    layers: int,
    hidden: int,
    heads: int,
    kv: int,
    inner: int,
    value_heads: int,
    drafter: "DrafterSpec",
    source: str,
    aliases: tuple[str, ...],
    **moe,
) -> "ModelSpec":
    return ModelSpec(
        name=name,
        checkpoint=checkpoint,
        family=family,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=256,
        intermediate_size=inner,
        vocab_size=moe.pop("vocab", 248320),
        max_position_embeddings=262144,
        layer_types=_every_fourth_full(layers),
        qk_norm=True,
        linear_num_key_heads=16,
        linear_num_value_heads=value_heads,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        drafter=drafter,
        aliases=aliases,
        source=source,
        **moe,
    )


def _every_sixth_global(num_layers: int) -> tuple[str, ...]:
    return tuple(FULL if (layer + 1) % 6 == 0 else SLIDING for layer in range(num_layers))


def _gpt_oss(
    name: str,
    layers: int,
    experts: int,
    params: float,
    checkpoint_gib: float,
    drafter: "DrafterSpec",
    aliases: tuple[str, ...],
    source: str,
) -> "ModelSpec":
    """A gpt-oss size: the family's widths, alternating sliding (128) / full layers, MXFP4 experts with biases, sinks."""
    return ModelSpec(
        name=name,
        checkpoint=f"openai/{name}",
        family="gpt_oss",
        num_layers=layers,
        hidden_size=2880,
        num_heads=64,
        num_kv_heads=8,
        head_dim=64,
        intermediate_size=0,
        vocab_size=201088,
        max_position_embeddings=131072,
        layer_types=_alternating(layers, SLIDING, FULL),
        sliding_window=128,
        num_experts=experts,
        experts_per_token=4,
        moe_intermediate_size=2880,
        attention_bias=True,
        expert_bias=True,
        attention_sinks=True,
        native_expert_precision="mxfp4",
        published_params=params,
        published_checkpoint_gib=checkpoint_gib,
        drafter=drafter,
        aliases=aliases,
        source=source,
    )


# fmt: off
# (a table: one model per entry, its shape in a few lines, as the sources above list it)
MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        _gpt_oss(
            "gpt-oss-120b", 36, 128, 116.83e9, 60.8,
            DrafterSpec(
                "z-lab/gpt-oss-120b-DFlash", 8, 2880, 7680, 64, 8, 64, 10, (1, 9, 17, 25, 33),
                published_size_gib=1.46, source="z-lab model card (0.8B, block 10); config table; head_dim derived",
            ),
            ("openai/gpt-oss-120b", "gpt-oss", "gptoss-120b"),
            "transformers GptOssConfig defaults; OpenAI model card (116.83B, 60.8 GiB)",
        ),
        _gpt_oss(
            "gpt-oss-20b", 24, 32, 20.91e9, 12.8,
            DrafterSpec(
                "z-lab/gpt-oss-20b-DFlash", 8, 2880, 7680, 64, 8, 64, 8, (1, 6, 11, 16, 21),
                published_size_gib=1.46, source="config table; head_dim derived",
            ),
            ("openai/gpt-oss-20b",), "OpenAI model card (24 layers, 32 experts, 20.91B, 12.8 GiB)",
        ),
        ModelSpec(
            name="qwen3-8b", checkpoint="Qwen/Qwen3-8B", family="qwen3",
            num_layers=36, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=12288,
            vocab_size=151936, max_position_embeddings=40960, qk_norm=True, published_params=8.2e9,
            drafter=DrafterSpec(
                "z-lab/Qwen3-8B-DFlash-b16", 5, 4096, 12288, 32, 8, 128, 16, (1, 9, 17, 25, 33),
                mask_token_id=151669, published_size_gib=1.95, source="DFLASH.md config.json; z-lab README",
            ),
            aliases=("qwen/qwen3-8b", "qwen3-8B"),
            source="Qwen3-8B config.json (mirrored in DFLASH.md); model card 8.2B",
        ),
        ModelSpec(
            name="llama-3.1-8b-instruct", checkpoint="meta-llama/Llama-3.1-8B-Instruct", family="llama",
            num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=14336,
            vocab_size=128256, max_position_embeddings=131072, published_params=8.03e9,
            drafter=DrafterSpec(
                "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat", 5, 4096, 12288, 32, 8, 128, 10, (1, 8, 15, 22, 29),
                published_size_gib=1.95, source="z-lab README; config table (block 10)",
            ),
            aliases=("meta-llama/llama-3.1-8b-instruct", "llama-3.1-8b", "llama3.1-8b", "llama-3.1-8b-it"),
            source="Llama-3.1-8B config.json; Meta model card 8.03B",
        ),
        ModelSpec(
            name="gemma-4-31b-it", checkpoint="google/gemma-4-31B-it", family="gemma4",
            num_layers=60, hidden_size=5376, num_heads=32, num_kv_heads=16, head_dim=256, intermediate_size=21504,
            vocab_size=262144, tie_word_embeddings=True, max_position_embeddings=262144,
            layer_types=_every_sixth_global(60), sliding_window=1024,
            global_num_kv_heads=4, global_head_dim=512, global_k_eq_v=True, qk_norm=True, norms_per_layer=4,
            published_params=30.7e9,
            drafter=DrafterSpec(
                "z-lab/gemma-4-31B-it-DFlash", 5, 5376, 10752, 64, 8, 128, 16, (1, 12, 23, 35, 46, 57),
                layer_types=(SLIDING,) * 4 + (FULL,), sliding_window=2048, published_size_gib=2.86,
                source="z-lab model card (block 16, B300 5.8x); config table; head_dim derived",
            ),
            aliases=("google/gemma-4-31b-it", "gemma-4-31b", "gemma4-31b"),
            source="gemma-4-31B-it config.json (text_config); model card 30.7B",
        ),
        ModelSpec(
            name="qwen3-coder-30b-a3b", checkpoint="Qwen/Qwen3-Coder-30B-A3B-Instruct", family="qwen3_moe",
            num_layers=48, hidden_size=2048, num_heads=32, num_kv_heads=4, head_dim=128, intermediate_size=0,
            vocab_size=151936, max_position_embeddings=262144, num_experts=128, experts_per_token=8,
            moe_intermediate_size=768, qk_norm=True, published_params=30.5e9,
            drafter=DrafterSpec(
                "z-lab/Qwen3-Coder-30B-A3B-DFlash", 8, 2048, 6144, 32, 4, 128, 16, (1, 12, 23, 34, 45),
                published_size_gib=0.88, source="z-lab README; config table (8 layers)",
            ),
            aliases=("qwen/qwen3-coder-30b-a3b-instruct", "qwen3-coder-30b-a3b-instruct", "qwen3-coder"),
            source="Qwen3-Coder-30B-A3B-Instruct config.json; model card 30.5B / 3.3B active",
        ),
        _hybrid(
            "qwen3.5-27b", "Qwen/Qwen3.5-27B", "qwen3_5", 64, 5120, 24, 4, 17408, 48,
            DrafterSpec("z-lab/Qwen3.5-27B-DFlash", 5, 5120, 17408, 32, 8, 128, 16, _default_taps(64),
                        source="block 16 verified (15 speculative tokens in published serving configs); layers, "
                               "widths and taps derived (z-lab default 5 layers); read the real ones with --drafter DIR"),
            "Qwen3.5-27B model card (64 layers = 16 x (3 Gated DeltaNet + 1 full), hidden 5120, 24 q / 4 KV x 256, "
            "MLP 17408, vocab 248320, 262144 positions); linear heads 16 k / 48 v x 128 derived",
            ("qwen/qwen3.5-27b",), published_params=27.0e9,
        ),
        _hybrid(
            "qwen3.6-27b", "Qwen/Qwen3.6-27B", "qwen3_5", 64, 5120, 24, 4, 17408, 48,
            DrafterSpec("z-lab/Qwen3.6-27B-DFlash", 5, 5120, 17408, 32, 8, 128, 16, _default_taps(64),
                        layer_types=(SLIDING,) * 4 + (FULL,), sliding_window=2048, mask_token_id=248070,
                        source="5 layers [S,S,S,S,F] window 2048 verified (GGUF conversion notes); mask 248070 published, "
                               "unverified; widths and taps derived"),
            "Qwen3.6-27B: same model_type (qwen3_5) and shape as Qwen3.5-27B (model card: 64 layers, 5120, "
            "vocab 248320, 55.56 GB BF16)",
            ("qwen/qwen3.6-27b",), published_params=27.0e9,
        ),
        _hybrid(
            "qwen3.5-35b-a3b", "Qwen/Qwen3.5-35B-A3B", "qwen3_5_moe", 40, 2048, 16, 2, 0, 32,
            DrafterSpec("z-lab/Qwen3.5-35B-A3B-DFlash", 5, 2048, 6144, 32, 4, 128, 16, _default_taps(40),
                        source="block 16 assumed like the other Qwen3.5 drafters; shape derived; read with --drafter DIR"),
            "transformers Qwen3_5MoeTextConfig defaults = the 35B-A3B shape (40 layers, 2048, 16 q / 2 KV x 256, "
            "256 experts top-8, expert inner 512, shared expert 512); docs: 35B total / 3B active",
            ("qwen/qwen3.5-35b-a3b",), num_experts=256, experts_per_token=8, moe_intermediate_size=512,
            shared_expert_intermediate_size=512, published_params=35.0e9,
        ),
        _hybrid(
            "qwen3-coder-next", "Qwen/Qwen3-Coder-Next", "qwen3_next", 48, 2048, 16, 2, 0, 32,
            DrafterSpec("z-lab/Qwen3-Coder-Next-DFlash", 8, 2048, 6144, 32, 4, 128, 16, _default_taps(48),
                        source="8 layers like the Qwen3-Coder drafter (derived); block 16 assumed; read with --drafter DIR"),
            "transformers Qwen3NextConfig defaults (the Qwen3-Next-80B-A3B shape: 48 layers, 2048, 16 q / 2 KV x 256, "
            "512 experts top-10, expert inner 512, shared 512, vocab 151936); Coder-Next assumed to share it (derived)",
            ("qwen/qwen3-coder-next",), num_experts=512, experts_per_token=10, moe_intermediate_size=512,
            shared_expert_intermediate_size=512, vocab=151936, published_params=80.0e9,
        ),
        ModelSpec(
            name="kimi-k2.5", checkpoint="moonshotai/Kimi-K2.5", family="kimi_k25",
            num_layers=61, hidden_size=7168, num_heads=64, num_kv_heads=64, head_dim=192, intermediate_size=18432,
            vocab_size=163840, max_position_embeddings=262144, num_experts=384, experts_per_token=8,
            moe_intermediate_size=2048, shared_expert_intermediate_size=2048, first_dense_layers=1,
            kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
            published_params=1.04e12,
            drafter=DrafterSpec(
                "z-lab/Kimi-K2.5-DFlash", 6, 7168, 18432, 64, 8, 128, 8, (1, 12, 24, 35, 47, 58), mask_token_id=163838,
                source="block 8, taps [1, 12, 24, 35, 47, 58], 6 layers and mask 163838 from two third-party sources "
                       "(a serving integration's constants and deployment notes), not the drafter's own config.json; widths derived",
            ),
            aliases=("moonshotai/kimi-k2.5", "kimi-k2.5", "kimi"),
            source="Kimi-K2 model card (DeepSeek-V3 architecture: 61 layers, 7168, 64 MLA heads, kv_lora 512, "
                   "q_lora 1536, rope 64, 384 experts top-8 + 1 shared, first layer dense, vocab 163840; 1.04T total / "
                   "32B active); derived for K2.5's text tower, not verified here",
        ),
        # DFlash V2 pairs: the drafters and their sources are in drafters_dflash2.py; the targets' shapes are derived.
        _hybrid(
            "qwen3.8-27b", "Qwen/Qwen3.8-27B", "qwen3_5", 64, 5120, 24, 4, 17408, 48, V2_DRAFTERS["qwen3.8-27b"],
            "derived, unverified: the Qwen3.5/3.6-27B shape (64 layers, hidden 5120, vocab 248320); its DFlash2 drafter "
            "records 64 target layers, vocab 248320 and the family's mask 248070, and MLX quantization configs of it "
            "name Gated DeltaNet (linear_attn) layers",
            ("qwen/qwen3.8-27b",), published_params=27.0e9,
        ),
        ModelSpec(
            name="muse-glimmer-30b", checkpoint="meta-models/Muse-Glimmer-30B", family="muse_glimmer",
            num_layers=52, hidden_size=6656, num_heads=52, num_kv_heads=8, head_dim=128, intermediate_size=19968,
            vocab_size=202048, max_position_embeddings=131072, published_params=30.0e9,
            drafter=V2_DRAFTERS["muse-glimmer-30b"], aliases=("meta-models/muse-glimmer-30b", "muse-glimmer"),
            source="derived, unverified: layers, width, KV heads, FFN, vocab and positions from its DFlash2 drafter's "
                   "config.json (z-lab drafters echo the target's widths); 52 x 128 query heads assumed; 28.7B counted "
                   "against the published 30B (the vision tower is not counted)",
        ),
    )
}
# fmt: on

DEMO = "demo"

# Stand-in for the embedded demo pair until its checkpoint ships (the demo issue decides the shape).
_DEMO_PLACEHOLDER = ModelSpec(
    name=DEMO,
    checkpoint=DEMO,
    family="qwen3",
    num_layers=4,
    hidden_size=256,
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
    intermediate_size=768,
    vocab_size=1024,
    tie_word_embeddings=True,
    max_position_embeddings=4096,
    qk_norm=True,
    drafter=DrafterSpec(DEMO, 2, 256, 768, 4, 2, 64, 8, (1, 2)),
    placeholder=True,
    source="placeholder: trtllm_dflash/demo/target/config.json is not there yet",
)


def _key(name: str) -> str:
    return name.strip().lower()


def model_names() -> list[str]:
    return [*MODELS, DEMO]


def resolve_model(name_or_path: str | Path) -> ModelSpec:
    """A model's shape from its catalog name, alias, Hugging Face id, 'demo', or a local directory.

    A local directory is read from its config.json (and a DFlash drafter beside it is not
    guessed: the spec's drafter is None).
    """
    text = str(name_or_path)
    check_model_link(text)
    key = _key(text)
    if key == DEMO:
        return demo_model()
    for spec in MODELS.values():
        if key == spec.name or key == spec.checkpoint.lower() or key in spec.aliases:
            return spec
    path = Path(text).expanduser()
    if (path / "config.json").is_file():
        return model_from_config_file(path / "config.json", name=path.name, checkpoint=str(path))
    raise UnknownNameError(
        f"unknown model {text!r}",
        f"use one of: {', '.join(model_names())}, or a Hugging Face model directory with a config.json",
    )


def check_model_link(model: str) -> None:
    """CheckpointError for a --model that is a broken symbolic link (a loop, or pointing nowhere).

    Neither a file nor a directory, it would otherwise be taken for a recipe name ("no recipe for
    PATH"), which hides what is wrong with the path.
    """
    path = Path(model).expanduser()
    if not os.path.lexists(path) or os.path.exists(path):
        return
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CheckpointError(
                f"--model {model} is a symbolic link loop (it leads back to itself)",
                "point the link at a Hugging Face model directory, or pass a model name",
            ) from None
    target = Path(os.readlink(path)) if path.is_symlink() else path
    raise CheckpointError(
        f"--model {model} is a symbolic link to {path.parent / target}, which does not exist",
        "fix the link, or pass the checkpoint directory itself",
    )


def demo_model() -> ModelSpec:
    """The embedded demo pair's shape, read from the shipped config.json (a placeholder until it ships)."""
    from trtllm_dflash.demo import DEMO_DIR

    target = DEMO_DIR / "target" / "config.json"
    if not target.is_file():
        return _DEMO_PLACEHOLDER
    spec = model_from_config_file(target, name=DEMO, checkpoint=DEMO)
    drafter = None
    drafter_config = DEMO_DIR / "drafter" / "config.json"
    if drafter_config.is_file():
        drafter = drafter_from_config_file(drafter_config, checkpoint=DEMO)
    return dataclasses.replace(spec, drafter=drafter, source=f"read from {target}")


def with_local_drafter(spec: ModelSpec, drafter: str | Path | None) -> ModelSpec:
    """`spec` with the drafter read from a local drafter directory's config.json, where `drafter` is one
    (the drafter a build or a plan was given); a catalog name or None leaves the catalog's drafter."""
    if drafter is None or not (Path(drafter).expanduser() / "config.json").is_file():
        return spec
    path = Path(drafter).expanduser().resolve()
    return dataclasses.replace(spec, drafter=drafter_from_config_file(path / "config.json", checkpoint=str(path)))


def model_from_config_file(path: Path, name: str, checkpoint: str) -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json (Qwen3, Llama, Qwen3-MoE, gpt-oss, Gemma 4 text)."""
    raw: dict[str, Any] = json.loads(Path(path).read_text())
    cfg = raw.get("text_config") or raw
    family = str(cfg.get("model_type", raw.get("model_type", "unknown")))
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    num_experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or 0)
    moe_inner = int(cfg.get("moe_intermediate_size") or 0)
    dense_inner = int(cfg.get("intermediate_size") or 0)
    if family == "gpt_oss":  # gpt-oss has no dense MLP; intermediate_size is the experts' inner size
        moe_inner, dense_inner = dense_inner, 0
    elif num_experts and family.endswith("_moe"):
        dense_inner = 0
    layers = int(cfg["num_hidden_layers"])
    return ModelSpec(
        name=name,
        checkpoint=checkpoint,
        family=family,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate_size=dense_inner,
        vocab_size=int(cfg["vocab_size"]),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))),
        max_position_embeddings=int(cfg.get("max_position_embeddings") or 4096),
        layer_types=tuple(cfg.get("layer_types") or ()),
        sliding_window=int(cfg.get("sliding_window") or 0),
        num_experts=num_experts,
        experts_per_token=int(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or cfg.get("top_k_experts") or 0),
        moe_intermediate_size=moe_inner,
        attention_bias=bool(cfg.get("attention_bias", False)),
        qk_norm=family.startswith("qwen3") or family.startswith("gemma"),
        global_num_kv_heads=cfg.get("num_global_key_value_heads"),
        global_head_dim=cfg.get("global_head_dim"),
        global_k_eq_v=bool(cfg.get("attention_k_eq_v", False)),
        native_expert_precision="mxfp4" if family == "gpt_oss" else "bf16",
        source=f"read from {path}",
    )

"""Which backend can serve which target family, and why: decided at plan time, not at load time.

A family is a transformers `model_type`. For each one the catalog records its attention kind
(dense / sliding / sinks / hybrid-linear / MLA), whether it is MoE, and for each of the three
backends whether it can serve the family and the reason. `plan` and `build` print the chosen
backend with its reason and refuse an impossible choice naming the backend that works
(trtllm_dflash.backends.choice decides, from these columns).

Sources for the `trtllm` column (TensorRT-LLM's PyTorch-backend DFlash; see
trtllm_dflash/backends/trtllm/llm_args.json for the pinned source commit):
- PR NVIDIA/TensorRT-LLM#12794 ("Support DFlash in one-model spec dec", merged 2026-04):
  accuracy tests on Llama 3.1 8B, Qwen3 8B and GPT-OSS 20B.
- tensorrt_llm/_torch/speculative/dflash.py (main, commit 00679c66): the DFlash worker uses the
  MambaHybridCacheManager (hybrid Gated DeltaNet / Mamba targets roll their state back) and has
  an MLA path that writes the block's latents (DeepSeek-V3 / Kimi MLA targets).
- Gemma 3 / Gemma 4 targets: no evidence found either way; allowed with a note ("unverified").
Our `trt` engines export GQA decoder layers (full, sliding-window, attention sinks, per-layer
head dims, shared KV) and MoE experts as a dense graph (every expert, unselected ones weighted 0:
exact, num_experts / top_k times the routed compute, so TensorRT-LLM stays the choice for MoE);
they have no linear-attention (recurrent) state and no MLA latent cache (graphs/target.py).
"""

from __future__ import annotations

import dataclasses

BACKENDS = ("trt", "trtllm", "torch")


@dataclasses.dataclass(frozen=True)
class Support:
    """Whether one backend serves a family: 'yes', 'unverified' (allowed, with a note) or 'no'."""

    status: str
    reason: str

    @property
    def ok(self) -> bool:
        return self.status != "no"


@dataclasses.dataclass(frozen=True)
class FamilySpec:
    """A target family (transformers model_type) and what serves it."""

    model_type: str
    attention: str  # "dense", "sliding", "sinks", "hybrid-linear", "mla"
    moe: bool
    backends: dict[str, Support]
    preferred: str  # the backend `plan` picks when none is asked for (one GPU)
    description: str = ""

    def support(self, backend: str) -> Support:
        return self.backends[backend]


_TORCH = Support("yes", "the torch runtime runs any transformers model (for validation; slow)")
_TRT_DENSE = Support("yes", "dense GQA attention: our TensorRT engines export it")
_TRTLLM_TESTED = Support("yes", "TensorRT-LLM DFlash (PR #12794 tests Llama 3.1, Qwen3 and GPT-OSS targets)")
_MOE_TRT = Support(
    "yes",
    "our engines run the experts as a dense graph (exact; num_experts / top_k times the routed compute): "
    "fine on one GPU for validation and small deployments, TensorRT-LLM's MoE kernels are the choice at scale",
)
_NO_LINEAR_TRT = Support(
    "no", "{name} is a hybrid Gated DeltaNet model; our engines have no linear-attention state (nor its rollback after rejected drafts)"
)
_NO_MLA_TRT = Support("no", "{name} uses multi-head latent attention (MLA); our engines have no latent KV cache")
_HYBRID_MOE_TRTLLM = Support(
    "yes", "hybrid Gated DeltaNet MoE: TensorRT-LLM DFlash rolls the recurrent state back (MambaHybridCacheManager)"
)


def _family(model_type: str, attention: str, moe: bool, trt: Support, trtllm: Support, preferred: str, description: str) -> FamilySpec:
    return FamilySpec(model_type, attention, moe, {"trt": trt, "trtllm": trtllm, "torch": _TORCH}, preferred, description)


FAMILIES: dict[str, FamilySpec] = {
    f.model_type: f
    for f in (
        _family("qwen3", "dense", False, _TRT_DENSE, _TRTLLM_TESTED, "trt", "Qwen3 dense, GQA with q/k norms"),
        _family("llama", "dense", False, _TRT_DENSE, _TRTLLM_TESTED, "trt", "Llama 3.x dense, GQA"),
        _family(
            "gemma3_text",
            "sliding",
            False,
            Support("yes", "sliding-window + global GQA layers: our engines export them"),
            Support("unverified", "no TensorRT-LLM DFlash test names a Gemma 3 target"),
            "trt",
            "Gemma 3 text: 5 sliding layers per global layer",
        ),
        _family(
            "gemma4",
            "sliding",
            False,
            Support("yes", "sliding-window + global layers with per-layer head dims: dense attention"),
            Support("unverified", "no TensorRT-LLM DFlash test names a Gemma 4 target; the drafter has sliding layers"),
            "trt",
            "Gemma 4 text (gemma4_text): sliding + global layers",
        ),
        _family(
            "gpt_oss",
            "sinks",
            True,
            _MOE_TRT,
            _TRTLLM_TESTED,
            "trtllm",
            "attention sinks, alternating sliding/full layers; MoE with MXFP4 experts",
        ),
        _family(
            "qwen3_moe",
            "dense",
            True,
            _MOE_TRT,
            Support("yes", "dense-attention MoE: TensorRT-LLM's Qwen3-MoE model with the DFlash hidden-state taps"),
            "trtllm",
            "Qwen3 MoE (Qwen3-Coder-30B-A3B)",
        ),
        _family(
            "qwen3_5",
            "hybrid-linear",
            False,
            _NO_LINEAR_TRT,
            Support(
                "yes",
                "hybrid Gated DeltaNet: TensorRT-LLM DFlash rolls the recurrent state back after acceptance (MambaHybridCacheManager)",
            ),
            "trtllm",
            "Qwen3.5/3.6 dense: Gated DeltaNet linear attention, full attention every 4th layer",
        ),
        _family(
            "qwen3_5_moe",
            "hybrid-linear",
            True,
            _NO_LINEAR_TRT,
            _HYBRID_MOE_TRTLLM,
            "trtllm",
            "Qwen3.5/3.6 MoE: hybrid linear attention + 256 experts",
        ),
        _family(
            "qwen3_next",
            "hybrid-linear",
            True,
            _NO_LINEAR_TRT,
            _HYBRID_MOE_TRTLLM,
            "trtllm",
            "Qwen3-Next / Qwen3-Coder-Next: hybrid linear attention + 512 experts",
        ),
        _family(
            "deepseek_v3",
            "mla",
            True,
            _NO_MLA_TRT,
            Support("yes", "MLA + MoE: TensorRT-LLM DFlash has an MLA path (block latents in the paged cache)"),
            "trtllm",
            "DeepSeek-V3: MLA + MoE",
        ),
        _family(
            "kimi_k25",
            "mla",
            True,
            _NO_MLA_TRT,
            Support("yes", "MLA + MoE (DeepSeek-V3 text architecture): TensorRT-LLM DFlash MLA path"),
            "trtllm",
            "Kimi-K2.5: DeepSeek-V3 text architecture (MLA + MoE) with a vision tower",
        ),
    )
}

# model_type spellings that share a family entry
_ALIASES = {"gemma4_text": "gemma4", "qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe", "kimi_k2": "kimi_k25"}


def family_spec(model_type: str) -> FamilySpec | None:
    """The catalog entry of a model_type, or None for a family the catalog does not know."""
    return FAMILIES.get(_ALIASES.get(model_type, model_type))

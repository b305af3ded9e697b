"""What a deployment quantizes and how, decided once: the `Precision` every stage, check and export asks.

A recipe's `quantization:` section (weights, moe_experts, kv_cache, drafter; recipes/schema.py) or
the planner's defaults and `--quant/--kv-cache` flags (planning/gpu_precision.py) make ONE value; the
planner sizes memory and refuses with it, the backends list their build steps from it, and the
builder's stages (quantize, export, engines) and its stage plan (`--dry-run`) ask its properties
instead of comparing precision strings themselves. The fields keep the recipe's names.

It lives with the recipes (below the builder, beside the planner); the backends, one layer lower,
receive it on the planner's candidate and only read it. Plain strings: the names of contracts/dtypes.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trtllm_dflash.contracts.dtypes import FLOATS as FLOAT_DTYPES  # unquantized: cast, never calibrated

PTQ_FORMATS = ("fp8", "nvfp4")  # what ModelOpt post-training quantization writes for the target's weights


@dataclasses.dataclass(frozen=True)
class Precision:
    """Target weights, MoE experts, KV cache and drafter, as the recipe's `quantization:` names them.

    `moe_experts` left None means "same as weights" (a dense model, or a recipe that does not set it)
    and is resolved at construction, so it always holds the experts' precision. `native_experts` is
    not a choice but a fact of the checkpoint (the catalog's native_expert_precision: gpt-oss ships
    MXFP4 experts); it tells converting published experts apart from quantizing 16-bit ones.
    """

    weights: str = "bf16"  # the target's decoder linear layers (embedding and LM head stay 16-bit)
    moe_experts: str | None = None  # MoE expert matrices; None: = weights
    kv_cache: str = "bf16"
    drafter: str = "bf16"
    native_experts: str = "bf16"  # the experts as published

    def __post_init__(self) -> None:
        if self.moe_experts is None:
            object.__setattr__(self, "moe_experts", self.weights)

    @classmethod
    def from_quantization(cls, quantization: Any, native_experts: str = "bf16") -> "Precision":
        """From a recipe's QuantizationSection (its field names are this value's)."""
        q = quantization
        return cls(q.weights, q.moe_experts, q.kv_cache, q.drafter, native_experts)

    @classmethod
    def from_recipe(cls, recipe: Any) -> "Precision":
        """From a Recipe: its quantization section and its model's published expert format."""
        return cls.from_quantization(recipe.quantization, recipe.model_spec().native_expert_precision)

    # ---- what is quantized, and how

    @property
    def quantized(self) -> bool:
        """The target's weights are FP8/NVFP4: ModelOpt PTQ of the target (its experts with it)."""
        return self.weights in PTQ_FORMATS

    @property
    def fp8_weights(self) -> bool:
        """FP8 target weights: the graphs hold them as Q/DQ (FP8 layers), the engines run FP8 GEMMs."""
        return self.weights == "fp8"

    @property
    def converts_experts(self) -> bool:
        """Published MXFP4 experts asked for as NVFP4 over 16-bit weights: ModelOpt casts the expert
        weights and calibrates their activation scales (a CUDA GPU; builder/nvfp4.py)."""
        return self.native_experts == "mxfp4" and self.moe_experts == "nvfp4" and not self.quantized

    @property
    def quantizes_drafter(self) -> bool:
        """`drafter: nvfp4`: the quantize stage also calibrates the drafter (fc kept BF16)."""
        return self.drafter == "nvfp4"

    @property
    def needs_modelopt(self) -> bool:
        """Whether the quantize stage runs ModelOpt at all (else it records that nothing was needed)."""
        return self.quantized or self.converts_experts or self.quantizes_drafter

    @property
    def ptq_formats(self) -> set[str]:
        """The formats the target's weights and experts are quantized to (neither 16-bit nor as published)."""
        return {self.weights, self.moe_experts} - {*FLOAT_DTYPES, self.native_experts}

    @property
    def nvfp4_target(self) -> bool:
        """NVFP4 anywhere in the target (weights or experts): NVFP4 calibration, which needs CUDA."""
        return "nvfp4" in (self.weights, self.moe_experts)

    @property
    def fp8_kv_cache(self) -> bool:
        return self.kv_cache == "fp8"

    @property
    def compute_dtype(self) -> str:
        """Dtype of the graphs' unquantized tensors (activations, norms, caches)."""
        if self.weights in FLOAT_DTYPES:
            return self.weights
        return self.drafter if self.drafter in ("bf16", "fp16") else "bf16"

    @property
    def nvfp4_export_gap(self) -> str | None:
        """Which graph the ONNX export has no NVFP4 form for ('target' or 'drafter'), or None."""
        return "target" if self.weights == "nvfp4" else "drafter" if self.drafter == "nvfp4" else None

    def to_dict(self) -> dict[str, str]:
        """The plan's JSON form (`dflash-trt plan --json`, `build --dry-run --json`): `experts`, as it always was."""
        return {"weights": self.weights, "experts": str(self.moe_experts), "kv_cache": self.kv_cache, "drafter": self.drafter}

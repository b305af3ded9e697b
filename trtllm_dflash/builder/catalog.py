"""The GPUs and models the build planner knows by name.

This is the build's minimal catalog: enough to plan and refuse correctly without downloading
anything. The recipes issue owns the full catalog (and the YAML recipes in `engine_recipes/`);
`spec.py` prefers it when it is installed and falls back to these entries otherwise.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class GpuInfo:
    """One GPU model: what it computes in and which TensorRT flavour builds engines for it."""

    name: str
    label: str
    compute_capability: tuple[int, int]
    memory_gib: float
    trt_flavour: str  # "tensorrt" (datacenter) or "tensorrt-rtx" (RTX)
    aliases: tuple[str, ...] = ()

    @property
    def sm(self) -> int:
        return self.compute_capability[0] * 10 + self.compute_capability[1]

    @property
    def supports_fp8(self) -> bool:
        return self.sm >= 89

    @property
    def supports_nvfp4(self) -> bool:
        return self.sm >= 100

    @property
    def cc_text(self) -> str:
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"


GPUS: tuple[GpuInfo, ...] = (
    GpuInfo("a100", "NVIDIA A100 80GB", (8, 0), 80, "tensorrt"),
    GpuInfo("l40s", "NVIDIA L40S", (8, 9), 48, "tensorrt"),
    GpuInfo("h100", "NVIDIA H100 80GB", (9, 0), 80, "tensorrt", ("h100-sxm",)),
    GpuInfo("h200", "NVIDIA H200 141GB", (9, 0), 141, "tensorrt"),
    GpuInfo("b200", "NVIDIA B200", (10, 0), 180, "tensorrt"),
    GpuInfo("gb200", "NVIDIA GB200 (per GPU)", (10, 0), 186, "tensorrt"),
    GpuInfo("b300", "NVIDIA B300 (Blackwell Ultra)", (10, 3), 288, "tensorrt"),
    GpuInfo("gb300", "NVIDIA GB300 (per GPU)", (10, 3), 288, "tensorrt"),
    GpuInfo("rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell", (12, 0), 96, "tensorrt-rtx", ("rtx-pro-6000-blackwell",)),
)


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """Published shape of a target, for sizes and memory in the plan (no download needed)."""

    num_layers: int
    hidden_size: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    params_b: float  # billions of parameters
    checkpoint_gb: float  # size of the published checkpoint


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """A named target + DFlash drafter pair and how the build deploys it by default."""

    name: str
    target: str  # Hugging Face repository id, or "demo"
    drafter: str
    block_size: int
    runtime: str  # "trt" (our engines) or "trtllm" (TensorRT-LLM's PyTorch backend)
    shape: ModelShape | None = None
    drafter_params_b: float = 0.0
    published_quant: str = "bf16"  # how the checkpoint is stored
    num_gpus: int = 1
    max_batch: int = 32
    max_input_len: int = 4096
    max_seq_len: int = 8192
    trtllm: tuple[tuple[str, object], ...] = ()
    aliases: tuple[str, ...] = ()


MODELS: tuple[ModelInfo, ...] = (
    ModelInfo(
        "demo", "demo", "demo", block_size=8, runtime="trt", max_batch=8, max_input_len=256, max_seq_len=512,
    ),
    ModelInfo(
        "qwen3-8b", "Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", block_size=16, runtime="trt",
        shape=ModelShape(36, 4096, 8, 128, 151936, 8.19, 16.4), drafter_params_b=1.0,
        max_batch=32, max_input_len=4096, max_seq_len=8192, aliases=("qwen3-8B",),
    ),
    ModelInfo(
        "gpt-oss-120b", "openai/gpt-oss-120b", "z-lab/gpt-oss-120b-DFlash", block_size=16, runtime="trtllm",
        shape=ModelShape(36, 2880, 8, 64, 201088, 116.8, 65.2), drafter_params_b=0.6,
        published_quant="mxfp4", num_gpus=8, max_batch=256, max_input_len=8192, max_seq_len=16384,
        trtllm=(("tensor_parallel_size", 8), ("moe_expert_parallel_size", 8)),
    ),
)


def find_gpu(name: str) -> GpuInfo | None:
    key = name.strip().lower()
    return next((g for g in GPUS if key == g.name or key in g.aliases), None)


def find_model(name: str) -> ModelInfo | None:
    key = name.strip().lower()
    return next((m for m in MODELS if key == m.name or key in (a.lower() for a in m.aliases)), None)


def gpus_supporting(feature: str) -> list[str]:
    """Names of the catalog GPUs with `supports_<feature>` (for refusal messages)."""
    return [g.name for g in GPUS if getattr(g, f"supports_{feature}")]

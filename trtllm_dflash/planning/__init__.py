"""Memory planning: will a model + drafter fit on N GPUs of a kind, at which precision, for how many users?

The budget per GPU is computed from published shapes (catalog/models.py) and datasheet memory
(catalog/gpus.py), with no torch import, so `dflash-trt plan` and `build --dry-run` answer in
well under a second. Every figure is an explicit formula (see the docstrings and docs/recipes.md);
the estimates (activations, CUDA graphs, runtime reserve) use named constants (memory.py).

Combinations that cannot work are refused with the reason and the nearest combination that
does: NVFP4 on Hopper, FP8 below SM 8.9, too few GPUs, or a model that does not fit at all.

    records.py       the plan's values: Layout, MemoryBudget, BuildStep, Refusal, Plan (its Precision: recipes/precision.py)
    candidate.py     one deployment under consideration (model, GPU, backend, precision, layout, limits)
    memory.py        bytes per GPU: weights, KV cache, linear-attention state, activations, CUDA graphs
    gpu_precision.py default precisions per GPU, and refusals of those a GPU cannot run
    layout.py        tp / ep over the GPUs of a node, and refusals of layouts that cannot work
    alternatives.py  the nearest combination that works, named in a refusal
    steps.py         the build steps listed by `dflash-trt plan`
    deployment.py    plan_deployment: all of the above for one model x GPU (x recipe)
"""

from trtllm_dflash.planning.deployment import plan_deployment
from trtllm_dflash.planning.memory import (
    ACTIVATION_BYTES,
    CUDA_GRAPH_BYTES,
    DEFAULT_CONTEXT,
    DEFAULT_KV_FRACTION,
    DEFAULT_MAX_BATCH,
    GIB,
    GPU_COUNTS,
    LINEAR_CONV_PRECISION,
    LINEAR_STATE_PRECISION,
    LOGIT_BYTES,
    MIB,
    NCCL_RESERVE_BYTES,
    RUNTIME_RESERVE_BYTES,
    WORKSPACE_BYTES,
    activation_bytes,
    bytes_of,
    cuda_graph_batch_sizes,
    cuda_graph_bytes,
    drafter_kv_bytes_per_sequence,
    host_memory_bytes,
    kv_bytes_per_sequence,
    kv_heads_per_gpu,
    linear_state_bytes_per_sequence,
    target_weight_bytes,
)
from trtllm_dflash.planning.records import BuildStep, Layout, MemoryBudget, Plan, Refusal
from trtllm_dflash.recipes.precision import Precision

__all__ = [
    "ACTIVATION_BYTES",
    "CUDA_GRAPH_BYTES",
    "DEFAULT_CONTEXT",
    "DEFAULT_KV_FRACTION",
    "DEFAULT_MAX_BATCH",
    "GIB",
    "GPU_COUNTS",
    "LINEAR_CONV_PRECISION",
    "LINEAR_STATE_PRECISION",
    "LOGIT_BYTES",
    "MIB",
    "NCCL_RESERVE_BYTES",
    "RUNTIME_RESERVE_BYTES",
    "WORKSPACE_BYTES",
    "BuildStep",
    "Layout",
    "MemoryBudget",
    "Plan",
    "Precision",
    "Refusal",
    "activation_bytes",
    "bytes_of",
    "cuda_graph_batch_sizes",
    "cuda_graph_bytes",
    "drafter_kv_bytes_per_sequence",
    "host_memory_bytes",
    "kv_bytes_per_sequence",
    "kv_heads_per_gpu",
    "linear_state_bytes_per_sequence",
    "plan_deployment",
    "target_weight_bytes",
]

"""How a model spreads over the GPUs of a node (tp / ep), and the layouts that cannot work."""

from __future__ import annotations

from trtllm_dflash.backends import get_backend
from trtllm_dflash.catalog.models import ModelSpec
from trtllm_dflash.planning.candidate import Candidate
from trtllm_dflash.planning.records import Layout, Refusal


def default_layout(model: ModelSpec, num_gpus: int) -> Layout:
    ep = num_gpus if model.is_moe and model.num_experts % num_gpus == 0 else 1
    return Layout(num_gpus, num_gpus, ep)


def layout_refusals(cfg: Candidate) -> list[Refusal]:
    model, layout = cfg.model, cfg.layout
    out = []
    if cfg.gpu is None:
        if layout.num_gpus != 1:
            out.append(Refusal("layout", "the CPU (torch) runtime runs on one device", "drop --num-gpus"))
        return out
    if layout.num_gpus > cfg.gpu.max_gpus_per_node:
        out.append(
            Refusal(
                "layout",
                f"{layout.num_gpus} GPUs exceed one {cfg.gpu.name} node ({cfg.gpu.max_gpus_per_node})",
                f"use --num-gpus {cfg.gpu.max_gpus_per_node} or fewer (multi-node is not planned)",
            )
        )
    if not get_backend(cfg.backend).multi_gpu and layout.num_gpus > 1:
        out.append(
            Refusal(
                "layout",
                f"backend {cfg.backend} runs on one GPU, not {layout.num_gpus}",
                "use --num-gpus 1, or --backend trtllm (TensorRT-LLM) for tensor/expert parallelism",
            )
        )
    if model.num_heads % (1 if layout.attention_dp else layout.tp):
        out.append(
            Refusal("layout", f"tp={layout.tp} does not divide {model.num_heads} attention heads", "use a tp that divides the head count")
        )
    if model.is_moe and model.num_experts % layout.ep:
        out.append(
            Refusal("layout", f"ep={layout.ep} does not divide {model.num_experts} experts", "use an ep that divides the expert count")
        )
    if not model.is_moe and layout.ep != 1:
        out.append(Refusal("layout", f"{model.name} has no experts; ep must be 1", "drop ep from the recipe"))
    return out

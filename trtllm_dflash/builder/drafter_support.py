"""Which drafter variants each backend runs, from the code's own checks (docs/drafters.md's table).

Every row is a drafter config.json (a published variant, shrunk); every cell asks the check the
backend itself applies: loading (`DrafterConfig.from_dict`, all backends), the drafter graphs of the
`trt` backend (`export.drafter_graph_refusal`), TensorRT-LLM's DFlash mode for `trtllm`
(`backends.trtllm.drafters.drafter_support`, with its default VANILLA drafter attention and with TRTLLM).
`python -m trtllm_dflash.builder.drafter_support docs/drafters.md` rewrites the table in place;
tests/test_drafter_support.py fails when the page and the code disagree.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from pathlib import Path
from typing import Any

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.recipes.doc_table import rewrite_between

SLIDING, FULL = "sliding_attention", "full_attention"
BEGIN, END = "<!-- drafter-support:begin -->", "<!-- drafter-support:end -->"

# A z-lab V1 drafter (Qwen3-8B-DFlash-b16's layout, 3 layers): the rows change it.
BASE: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_target_layers": 12,
    "block_size": 16,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1e6,
    "vocab_size": 1000,
    "dflash_config": {"mask_token_id": 999, "target_layer_ids": [1, 5, 9]},
    "layer_types": [FULL] * 3,
}
V2 = {
    "architectures": ["DFlash2DraftModel"],
    "dflash_config": {"block_size": 16, "conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 32, "selector_top_k": 16},
}


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    source: str  # who publishes or exports it
    changes: dict[str, Any]  # merged into BASE (dicts one level deep; None deletes a key)

    def config(self) -> dict[str, Any]:
        raw = copy.deepcopy(BASE)
        for key, value in self.changes.items():
            if value is None:
                raw.pop(key, None)
            elif isinstance(value, dict) and isinstance(raw.get(key), dict):
                raw[key] = {**raw[key], **value}
            else:
                raw[key] = value
        return raw


VARIANTS = (
    Variant("DFlash V1, full attention", "z-lab (Qwen3, Llama-3.1, gpt-oss drafters)", {}),
    Variant(
        "DFlash V1, sliding layers (layer_types + sliding_window)",
        "z-lab (Gemma 4, Qwen3.5 drafters)",
        {"layer_types": [SLIDING, SLIDING, FULL], "sliding_window": 2048},
    ),
    Variant(
        "use_swa + swa_window_size, with layer_types",
        "ModelOpt `dflash_swa_window_size`, DeepSpec",
        {"layer_types": [SLIDING, FULL, SLIDING], "dflash_config": {"use_swa": True, "swa_window_size": 1024}},
    ),
    Variant(
        "use_swa + swa_window_size, no layer_types",
        "ModelOpt, DeepSpec",
        {"layer_types": None, "dflash_config": {"use_swa": True, "swa_window_size": 1024}},
    ),
    Variant("causal block attention (`causal: true`)", "ModelOpt export option", {"dflash_config": {"causal": True}}),
    Variant("bounded draft history (`sliding_window_size`)", "z-lab (long contexts)", {"sliding_window_size": 4096}),
    Variant("DFlash V2, sliding layers", "inco.ai / z-lab DFlash2DraftModel", {**V2, "layer_types": [SLIDING] * 3, "sliding_window": 2048}),
    Variant("DFlash V2, full attention", "DFlash2DraftModel", V2),
    Variant("draft attention sinks (`attention_sink_bias`)", "ModelOpt", {"dflash_config": {"attention_sink_bias": True}}),
    Variant("Laguna drafter (causal sliding layers, gates)", "Laguna", {"architectures": ["LagunaDFlashDraftModel"]}),
    Variant(
        "DSpark heads (`projector_type: dspark`, markov_rank, ...)",
        "deepseek-ai/DeepSpec",
        {"dflash_config": {"projector_type": "dspark", "markov_rank": 8}},
    ),
    Variant("Domino head (`projector_type: domino`)", "ModelOpt", {"dflash_config": {"projector_type": "domino"}}),
    Variant("Speculators `dflash2`", "vLLM Speculators (experimental)", {"speculators_config": {"algorithm": "dflash2"}}),
)

BACKENDS = ("torch", "trt", "trtllm (VANILLA attention)", "trtllm (TRTLLM attention)")


def support(variant: Variant) -> dict[str, str]:
    """One cell per backend: "runs", "runs differently: ..." or "refused: ..."."""
    from trtllm_dflash.backends.trtllm.drafters import DrafterNote, drafter_support
    from trtllm_dflash.builder.export import drafter_graph_refusal
    from trtllm_dflash.config import DrafterConfig

    try:
        config = DrafterConfig.from_dict(variant.config(), source="config.json")
    except DFlashError as exc:
        return {backend: f"refused: {exc.problem}" for backend in BACKENDS}

    def cell(answer) -> str:
        if answer is None:
            return "runs"
        if isinstance(answer, DrafterNote):
            return f"runs differently: {answer[0]}"
        return f"refused: {answer[0]}"

    return {
        "torch": "runs",
        "trt": cell(drafter_graph_refusal(config)),
        "trtllm (VANILLA attention)": cell(drafter_support(config, "VANILLA")),
        "trtllm (TRTLLM attention)": cell(drafter_support(config, "TRTLLM")),
    }


def table() -> str:
    """The markdown table, one row per variant, then the numbered reasons its cells point to."""
    lines = ["| drafter | from | " + " | ".join(BACKENDS) + " |", "|---|---|" + "---|" * len(BACKENDS)]
    reasons: list[str] = []
    for variant in VARIANTS:
        cells = []
        for backend, answer in support(variant).items():
            status, _, why = answer.partition(": ")
            if why:
                if why not in reasons:
                    reasons.append(why)
                status = f"{status} [{reasons.index(why) + 1}]"
            cells.append(status)
        lines.append(f"| {variant.name} | {variant.source} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"{i}. {_escape(why)}" for i, why in enumerate(reasons, 1)]
    return "\n".join(lines)


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def rewrite(page: Path) -> bool:
    """Put the current table between the markers of `page`; True when it changed."""
    return rewrite_between(page, BEGIN, END, table())


if __name__ == "__main__":
    for path in sys.argv[1:] or ["docs/drafters.md"]:
        print(f"{path}: {'rewritten' if rewrite(Path(path)) else 'up to date'}")

"""docs/recipes.md's table of shipped recipes, written from the recipes themselves.

A table typed by hand said NVFP4 where the recipes say MXFP4 experts and FP8 weights; this one
cannot. `python -m trtllm_dflash.recipes.doc_table docs/recipes.md` rewrites the table between
its markers; tests/test_recipes_doc.py fails when the page and the recipes disagree.
"""

from __future__ import annotations

import sys
from pathlib import Path

from trtllm_dflash.errors import DFlashError

BEGIN, END = "<!-- recipes-table:begin -->", "<!-- recipes-table:end -->"
FLAVOURS = {"tensorrt": "TensorRT", "tensorrt-rtx": "TensorRT-RTX"}


def _gpus(recipe) -> str:
    """'8x B300, TP8 / EP8', '1x RTX PRO 6000', 'CPU'."""
    if recipe.gpu == "cpu":
        return "CPU"
    par = recipe.parallelism
    text = f"{par.num_gpus}x {recipe.gpu.replace('-', ' ').upper()}"
    if par.tp > 1 or par.ep > 1:
        text += f", TP{par.tp} / EP{par.ep}"
    return text + (", attention DP" if par.attention_dp else "")


def _backend(recipe) -> str:
    """The backend and what the recipe sets about it: MoE backend, TensorRT flavour, plugin-free graphs."""
    parts = [recipe.backend]
    if recipe.trtllm is not None and recipe.trtllm.moe_backend:
        parts.append(f"MoE backend {recipe.trtllm.moe_backend}")
    if recipe.trt is not None:
        parts.append(FLAVOURS.get(recipe.trt_flavour() or "", str(recipe.trt_flavour())))
        if not recipe.trt.use_plugins:
            parts.append("plugin-free")
    return ", ".join(parts)


def _precision(recipe) -> str:
    """'experts MXFP4, rest BF16, KV FP8' or 'FP8 weights, KV FP8' (and the drafter's when not BF16)."""
    q = recipe.quantization
    if q.moe_experts and q.moe_experts != q.weights:
        text = f"experts {q.moe_experts.upper()}, rest {q.weights.upper()}, KV {q.kv_cache.upper()}"
    else:
        text = f"{q.weights.upper()} weights, KV {q.kv_cache.upper()}"
    return text + (f", drafter {q.drafter.upper()}" if q.drafter != "bf16" else "")


def table() -> str:
    """The markdown table, one row per shipped recipe, in `dflash-trt recipes list` order."""
    from trtllm_dflash.recipes import list_recipes

    lines = ["| recipe | GPUs | backend | precision | drafter (block) |", "|---|---|---|---|---|"]
    for recipe in list_recipes():
        drafter = "embedded demo drafter" if recipe.drafter.checkpoint == "demo" else recipe.drafter.checkpoint
        lines.append(
            f"| `{recipe.name}` | {_gpus(recipe)} | {_backend(recipe)} | {_precision(recipe)} | {drafter} ({recipe.drafter.block_size}) |"
        )
    return "\n".join(lines)


def rewrite(page: Path) -> bool:
    """Put the current table between the markers of `page`; True when it changed."""
    return rewrite_between(page, BEGIN, END, table())


def rewrite_between(page: Path, begin: str, end: str, body: str) -> bool:
    """Put `body` between the markers `begin` and `end` of `page` (the generated tables of the docs:
    this one and builder/drafter_support.py's); True when the page changed."""
    text = page.read_text()
    if begin not in text or end not in text:
        raise DFlashError(f"{page} has no {begin} ... {end} markers", "add them where the table belongs")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    new = f"{head}{begin}\n{body}\n{end}{tail}"
    if new != text:
        page.write_text(new)
    return new != text


if __name__ == "__main__":
    for path in sys.argv[1:] or ["docs/recipes.md"]:
        print(f"{path}: {'rewritten' if rewrite(Path(path)) else 'up to date'}")

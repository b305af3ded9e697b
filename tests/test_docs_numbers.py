"""Numbers in the docs come from the code (issue 41, item 4): the recipe table from the recipes, the
request limits from trtllm_dflash/contracts/request_limits.py, the README's demo figures from
benchmarks/RESULTS.md with their date."""

from __future__ import annotations

import re
from pathlib import Path

from trtllm_dflash.contracts import request_limits
from trtllm_dflash.recipes.doc_table import BEGIN, END, table

ROOT = Path(__file__).resolve().parents[1]


def _rows() -> dict[str, list[str]]:
    """The generated table's rows by recipe name: [GPUs, backend, precision, drafter]."""
    rows = {}
    for line in table().splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_the_recipes_page_shows_the_table_of_the_recipes():
    text = (ROOT / "docs" / "recipes.md").read_text()
    shown = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert shown == table(), "rerun: python -m trtllm_dflash.recipes.doc_table docs/recipes.md"


def test_the_table_says_what_the_recipes_say():
    from trtllm_dflash.recipes import list_recipes

    rows = _rows()
    assert sorted(rows) == sorted(recipe.name for recipe in list_recipes())
    for name in ("gpt-oss-120b/b300", "gpt-oss-120b/b200"):  # the hand-written table said NVFP4 here
        assert rows[name][2] == "experts MXFP4, rest BF16, KV FP8", rows[name]
    for name in ("qwen3-8b/b200", "qwen3-8b/b300", "llama-3.1-8b-instruct/b200"):
        assert rows[name][2] == "FP8 weights, KV FP8", rows[name]
    assert rows["gpt-oss-120b/b300"][0] == "8x B300, TP8 / EP8"
    assert rows["demo/rtx-pro-6000"][1] == "trt, TensorRT-RTX, plugin-free"
    assert rows["qwen3-8b/h100"][3] == "z-lab/Qwen3-8B-DFlash-b16 (16)"


def _serving_lines(word: str) -> list[str]:
    text = (ROOT / "docs" / "serving.md").read_text()
    return [line for line in text.splitlines() if word in line]


def test_the_stop_string_limits_the_serving_page_states_are_the_enforced_ones():
    lines = _serving_lines("stop")
    counts = [int(n) for line in lines for n in re.findall(r"(?:at most|more than) (\d+)(?:,| stop strings| strings)", line)]
    chars = [int(n) for line in lines for n in re.findall(r"(?:at most|longer than) (\d+) characters", line)]
    assert counts and chars, "docs/serving.md no longer states the stop-string limits in a form this test reads"
    assert set(counts) == {request_limits.MAX_STOP_STRINGS}, counts
    assert set(chars) == {request_limits.MAX_STOP_CHARS}, chars


def test_the_salt_length_the_serving_page_states_is_the_enforced_one():
    lengths = [int(n) for line in _serving_lines("salt") for n in re.findall(r"1 to (\d+) characters", line)]
    assert lengths and set(lengths) == {request_limits.MAX_SALT_CHARS}, lengths


def _readme_demo_bullets() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Measured so far", 1)[1].split("\n## ", 1)[0]
    bullets = re.split(r"\n- ", section)
    return [b for b in bullets if b.startswith(("Demo pair", "Served through tritonserver", "`make demo`"))]


def test_the_readme_demo_figures_are_dated_figures_of_results_md():
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    sections = results.split("\n## ")
    bullets = _readme_demo_bullets()
    assert len(bullets) == 3, bullets
    for bullet in bullets:
        dates = re.findall(r"\d{4}-\d{2}-\d{2}", bullet)
        figures = re.findall(r"\d+\.\d+x", bullet)
        assert dates and figures, f"a README demo figure without its date: {bullet!r}"
        assert "machine" in bullet, f"a README demo figure without its machine: {bullet!r}"
        # one RESULTS.md section holds the date and every figure of the bullet
        assert any(all(f in section for f in figures + dates) for section in sections), (figures, dates)

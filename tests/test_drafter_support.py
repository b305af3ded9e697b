"""docs/drafters.md's backend table is the code's own checks, and the checks say what they should."""

from __future__ import annotations

from pathlib import Path

from trtllm_dflash.builder import drafter_support
from trtllm_dflash.builder.drafter_support import BEGIN, END, VARIANTS, support

PAGE = Path(__file__).resolve().parents[1] / "docs" / "drafters.md"


def test_the_page_shows_the_current_table():
    text = PAGE.read_text()
    shown = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert shown == drafter_support.table(), "rerun: python -m trtllm_dflash.builder.drafter_support docs/drafters.md"


def _row(name: str) -> dict[str, str]:
    return support(next(v for v in VARIANTS if v.name.startswith(name)))


def test_published_sliding_drafters_run_as_published_on_our_backends_and_tensorrt_llm_vanilla():
    for name in ("DFlash V1, sliding", "use_swa + swa_window_size, with", "use_swa + swa_window_size, no", "DFlash V2, sliding"):
        row = _row(name)
        assert row["torch"] == row["trt"] == row["trtllm (VANILLA attention)"] == "runs", (name, row)
    assert _row("DFlash V2, sliding")["trtllm (TRTLLM attention)"].startswith("refused")  # PR #19159


def test_variants_nobody_here_runs_are_refused_everywhere_naming_what_runs_them():
    for name, runner in (("Laguna", "TensorRT-LLM"), ("DSpark", "DSpark"), ("Domino", "Domino")):
        row = _row(name)
        assert all(cell.startswith("refused") for cell in row.values()), row
        assert runner in row["torch"]
    assert _row("bounded draft history")["trt"].startswith("refused")

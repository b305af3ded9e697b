"""The modelled kernel table in docs/plugins.md is the one `bench.kernel_model` computes from the
launches' own grid functions, and the model says what the KV splits are for."""

from __future__ import annotations

from pathlib import Path

from trtllm_dflash.bench import kernel_model

DOCS = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"


def test_docs_table_is_the_computed_one():
    assert kernel_model.markdown_table() in DOCS.read_text(), (
        "regenerate the table: python -c 'from trtllm_dflash.bench import kernel_model; print(kernel_model.markdown_table())'"
    )


def test_small_batches_split_the_kv_and_fill_the_gpu():
    one = {row.kernel.split(" (")[0]: row for row in kernel_model.qwen3_8b_rows(1)}
    unsplit, split = one["target attention, one program per tile"], one["target attention, KV split"]
    assert unsplit.programs == 8 and split.programs >= kernel_model.H100_SMS * 0.9
    assert split.modelled_us() < unsplit.modelled_us() / 5
    assert one["verify partials"].programs >= 4 * kernel_model.H100_SMS
    full = {row.kernel.split(" (")[0]: row for row in kernel_model.qwen3_8b_rows(64)}
    assert "target attention, KV split" not in full  # batch 64 fills the GPU without one

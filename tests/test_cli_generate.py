"""`dflash-trt generate`: JSON output, autoregressive mode, and one-line errors for bad input."""

from __future__ import annotations

import json

import pytest

from trtllm_dflash.testing.tiny import make_tiny_drafter, make_tiny_target


@pytest.fixture(scope="module")
def text_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("text-pair")
    target = make_tiny_target(root / "target", "qwen3", seed=4, tokenizer=True)
    drafter = make_tiny_drafter(root / "drafter", target, seed=5, block_size=4, mask_token_id=2)
    return str(target), str(drafter)


def test_json_output_has_one_object_per_prompt(text_pair, run_main):
    target, drafter = text_pair
    code, out, err = run_main(
        "generate",
        "--target",
        target,
        "--drafter",
        drafter,
        "--prompt",
        "def f(x):",
        "--prompt",
        "import os",
        "--max-new-tokens",
        "12",
        "--json",
    )
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["prompt"] for r in rows] == ["def f(x):", "import os"]
    from trtllm_dflash import DFlashPipeline

    expected = DFlashPipeline.load(target, None).generate(["def f(x):", "import os"], max_new_tokens=12)
    for row, reference in zip(rows, expected):
        assert {"text", "token_ids", "acceptance_lengths", "mean_acceptance_length", "num_target_forwards", "tokens_per_second"} <= set(row)
        assert row["token_ids"] == reference.token_ids  # lossless against the autoregressive target
        assert row["text"] == reference.text
        assert len(row["token_ids"]) == 1 + sum(row["acceptance_lengths"])
        assert row["num_target_forwards"] == 1 + len(row["acceptance_lengths"])


def test_without_drafter_decodes_autoregressively(text_pair, run_main, tmp_path):
    target, _ = text_pair
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "class A:"}) + "\n")
    code, out, err = run_main("generate", "--target", target, "--prompt-file", str(prompts), "-n", "6", "--json")
    assert code == 0, err
    row = json.loads(out)
    assert row["acceptance_lengths"] == [1] * 5 and row["num_target_forwards"] == 6


def test_human_output_reports_tau(text_pair, run_main):
    target, drafter = text_pair
    code, out, _ = run_main("generate", "--target", target, "--drafter", drafter, "-p", "x = 1", "-n", "5")
    assert code == 0 and "tau" in out and "tokens" in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-new-tokens", "0"], "--max-new-tokens must be > 0"),
        (["--temperature", "-0.5"], "--temperature must be >= 0"),
        (["--top-p", "0"], r"--top-p must be in \(0, 1\]"),
        (["--top-p", "1.5"], r"--top-p must be in \(0, 1\]"),
        (["--top-k", "-1"], r"--top-k must be in \[0, "),  # the range SamplingParams checks, as served models say it
        (["--block-size", "1"], "--block-size must be >= 2"),
        (["--device", "tpu"], "unknown device"),
        (["--chat"], "the target's tokenizer has no chat template; use plain completions"),  # the tiny target has none
        (["--chat", "--chat-template-kwargs", "[1]"], "is not a JSON object"),
        (["--chat-template-kwargs", "{}"], "--chat-template-kwargs needs --chat"),
    ],
)
def test_bad_options_fail_with_one_line(text_pair, run_main, extra, message):
    target, drafter = text_pair
    code, out, err = run_main("generate", "--target", target, "--drafter", drafter, "-p", "hi", *extra)
    assert code == 2
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    import re

    assert re.search(message, err)


def test_missing_directory_and_empty_prompt(text_pair, run_main, tmp_path):
    target, _ = text_pair
    code, _, err = run_main("generate", "--target", str(tmp_path / "missing"), "-p", "hi")
    assert code == 2 and "does not exist" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_main("generate", "--target", target, "-p", "  ")
    assert code == 2 and "empty prompt" in err
    code, _, err = run_main("generate", "--target", target)
    assert code == 2 and "no prompt given" in err


def test_cuda_request_without_a_gpu_is_refused(text_pair, run_main):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    target, drafter = text_pair
    code, _, err = run_main("generate", "--target", target, "-p", "hi", "--device", "cuda")
    assert code == 2 and "no CUDA GPU" in err


def test_chat_applies_the_target_template(text_pair, run_main, tmp_path):
    """--chat generates from the templated prompt: the same tokens as that text given plainly."""
    import json
    import shutil

    target, drafter = text_pair
    templated = tmp_path / "target"
    shutil.copytree(target, templated)
    (templated / "chat_template.jinja").write_text("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}>")
    code, out, _ = run_main("generate", "--target", str(templated), "--drafter", drafter, "--chat", "-p", "hi", "-n", "6", "--json")
    code2, out2, _ = run_main("generate", "--target", str(templated), "--drafter", drafter, "-p", "<user>hi>", "-n", "6", "--json")
    assert code == code2 == 0
    chat, plain = json.loads(out.strip().splitlines()[-1]), json.loads(out2.strip().splitlines()[-1])
    assert chat["token_ids"] == plain["token_ids"] and chat["num_prompt_tokens"] == plain["num_prompt_tokens"]

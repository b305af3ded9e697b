"""`dflash-trt generate` on a tiny Qwen3.5 hybrid (Gated DeltaNet) target, as a user runs it:
speculative tokens equal autoregressive ones on the installed transformers (the lock's; 5.24 broke
this through a renamed cache argument before hf_compat)."""

from __future__ import annotations

import json

import transformers

from trtllm_dflash.testing.tiny import make_tiny_drafter, make_tiny_target


def test_generate_on_a_hybrid_target_is_lossless(run_main, tmp_path):
    target = make_tiny_target(tmp_path / "target", "qwen3_5", tokenizer=True)
    drafter = make_tiny_drafter(tmp_path / "drafter", target)
    prompts = ["def f(x):", "import os\n", "a = [1, 2"]
    args = [arg for p in prompts for arg in ("--prompt", p)] + ["--target", str(target), "--max-new-tokens", "24", "--json"]
    code, ar_out, err = run_main("generate", *args)
    assert code == 0, err
    code, spec_out, err = run_main("generate", *args, "--drafter", str(drafter), "--block-size", "4")
    assert code == 0, err
    autoregressive = [json.loads(line) for line in ar_out.splitlines()]
    speculative = [json.loads(line) for line in spec_out.splitlines()]
    assert [o["token_ids"] for o in speculative] == [o["token_ids"] for o in autoregressive], transformers.__version__
    assert all(len(o["token_ids"]) == 24 for o in speculative)

"""The embedded demo pair: shipped, loadable by name, fast to draft for, and lossless."""

from __future__ import annotations

import json

import pytest

from trtllm_dflash.api import DFlashPipeline
from trtllm_dflash.bench.prompts import load_prompt_set
from trtllm_dflash.checkpoints import load_drafter, load_target
from trtllm_dflash.demo import DEMO_DIR, drafter_dir, target_dir

NUM_PROMPTS = 8
NEW_TOKENS = 64


def test_demo_pair_is_shipped_and_small():
    target, drafter = target_dir(), drafter_dir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (target / name).is_file(), name
    for name in ("config.json", "model.safetensors"):
        assert (drafter / name).is_file(), name
    size = sum(f.stat().st_size for d in (target, drafter) for f in d.iterdir())
    assert size < 10 * 2**20, f"the demo pair is {size / 2**20:.1f} MiB; keep it a few MB"
    card = json.loads((DEMO_DIR / "demo_card.json").read_text())
    assert card["target"]["final_heldout_loss"] > 0 and card["drafter"]["final"]["loss"] > 0


def test_demo_pair_fits_and_names_its_tokens():
    target = load_target("demo", require_tokenizer=True)
    drafter = load_drafter("demo", target=target)  # validate_pair inside
    tok = target.tokenizer
    assert drafter.config.mask_token_id == tok.mask_token_id
    assert tok.eos_token_id in target.stop_token_ids()
    assert drafter.config.block_size >= 8
    assert target.model.config.architectures == ["Qwen3ForCausalLM"]


def test_a_context_past_the_target_s_positions_is_capped_at_them():
    """The demo target has 1,024 positions: asking for more gets 1,024 (the engine backends cap at
    what their engines hold the same way); asking for less gets what was asked."""
    assert DFlashPipeline.load("demo", max_context=5000).max_context == 1024
    assert DFlashPipeline.load("demo", max_context=300).max_context == 300


@pytest.fixture(scope="module")
def held_out():
    prompts = load_prompt_set("stdlib", NUM_PROMPTS)
    reference = DFlashPipeline.load("demo").generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=(), max_batch=1)
    return prompts, [r.token_ids for r in reference]


def test_demo_tau_on_held_out_code_and_lossless(held_out):
    """Issue 6's bar: mean tau >= 3 on held-out code at the shipped block size (>= 8), greedy, lossless."""
    prompts, reference = held_out
    pipe = DFlashPipeline.load("demo", "demo")
    block_size = pipe.runtime.drafter_config.block_size
    assert block_size >= 8
    outputs = pipe.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=(), max_batch=1)
    lengths = [a for o in outputs for a in o.acceptance_lengths]
    tau = sum(lengths) / len(lengths)
    assert tau >= 3.0, f"mean tau {tau:.2f} at block size {block_size} on held-out stdlib prompts"
    assert [o.token_ids for o in outputs] == reference  # token for token the target's greedy output


def test_demo_is_lossless_batched_at_a_shorter_block(held_out):
    prompts, reference = held_out
    outputs = DFlashPipeline.load("demo", "demo").generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=(), block_size=4, max_batch=3)
    assert [o.token_ids for o in outputs] == reference
    assert max(a for o in outputs for a in o.acceptance_lengths) == 4

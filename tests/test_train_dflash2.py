"""Training DFlash V2 drafters: the loss learns, the selector term leaves out positions whose true
token is not a candidate, and a freshly converted V2 drafter has exactly its V1's base loss."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from trtllm_dflash.checkpoints import load_target
from trtllm_dflash.drafters.dflash2.modeling import CandidateSelector, DFlash2Drafter
from trtllm_dflash.modeling.drafter import DFlashDrafter
from trtllm_dflash.testing.tiny import make_tiny_target, tiny_drafter_config
from trtllm_dflash.training.objective import IGNORE, dflash_loss, make_block_batch, selector_loss
from trtllm_dflash.training.trainer import DrafterTrainer, TrainConfig

BLOCK = 4


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny float32 target, a random V1 drafter and a batch of token windows with its features."""
    target = load_target(make_tiny_target(tmp_path_factory.mktemp("v2-train") / "target", "qwen3", seed=4))
    torch.manual_seed(0)
    v1 = DFlashDrafter(tiny_drafter_config(target.config, num_layers=1, block_size=BLOCK)).eval()
    input_ids = torch.randint(0, int(target.config.vocab_size) - 1, (2, 20), generator=torch.Generator().manual_seed(1))
    loss_mask = torch.ones_like(input_ids)
    loss_mask[:, :4] = 0
    return target, v1, input_ids, loss_mask


def fixed_batch(drafter, input_ids, loss_mask):
    anchors = torch.tensor([[4, 7, 10, 13], [5, 9, 12, -1]])
    return make_block_batch(input_ids, anchors, loss_mask, BLOCK, drafter.config.mask_token_id)


def test_a_converted_v2_drafter_has_its_v1_base_loss(pair):
    target, v1, input_ids, loss_mask = pair
    v2 = DFlash2Drafter.from_v1(v1, int(target.config.vocab_size), selector_rank=8, selector_top_k=32)
    trainer = DrafterTrainer(target.model, v1, TrainConfig(steps=1))
    features = trainer.target_features(input_ids)
    trainer.close()
    batch = fixed_batch(v1, input_ids, loss_mask)
    embedding, lm_head = target.model.get_input_embeddings(), target.model.get_output_embeddings()
    with torch.no_grad():
        loss_v1, _ = dflash_loss(v1, embedding, lm_head, features, batch)
        loss_v2, metrics = dflash_loss(v2, embedding, lm_head, features, batch, selector_loss_weight=0.0)
    torch.testing.assert_close(loss_v2, loss_v1, rtol=1e-5, atol=1e-6)
    assert metrics["base_loss"] == pytest.approx(float(loss_v1), rel=1e-5)
    # zero codebooks: the selector scores are the unary logits, so its top-1 is the base argmax
    assert metrics["selector_accuracy"] == pytest.approx(metrics["accuracy"])
    assert 0 < metrics["candidate_recall"] < 1


def test_the_v2_loss_decreases_in_a_few_steps(pair):
    target, v1, input_ids, loss_mask = pair
    v2 = DFlash2Drafter.from_v1(v1, int(target.config.vocab_size), selector_rank=8, selector_top_k=8).train()
    # every eligible position is an anchor at every step: the same blocks each time
    trainer = DrafterTrainer(target.model, v2, TrainConfig(steps=10, lr=1e-2, warmup_fraction=0.0, anchors=32, block_size=BLOCK))
    assert v2.candidate_selector.predecessor_codebook.any()  # unstuck: a zero/zero bilinear term gets no gradient
    assert not v2.candidate_selector.successor_codebook.any()  # ... and drafts as V1 until trained
    features = trainer.target_features(input_ids)
    history = [trainer.train_step(input_ids, loss_mask, features) for _ in range(10)]
    trainer.close()
    first, last = history[0], history[-1]
    assert last["loss"] < 0.9 * first["loss"] and last["base_loss"] < first["base_loss"], [round(m["loss"], 3) for m in history]
    assert last["selector_loss"] < first["selector_loss"]
    assert last["loss"] == pytest.approx(last["base_loss"] + last["selector_loss"], rel=1e-5)
    assert v2.candidate_selector.successor_codebook.any()
    assert any(layer.attention_conv.kernel_projection.weight.any() for layer in v2.layers)


def test_the_selector_loss_leaves_out_positions_whose_token_is_not_a_candidate():
    """Two positions, top-2 candidates each; the true token is a candidate only at the first."""
    config = SimpleNamespace(hidden_size=2, selector_rank=2, selector_top_k=2)
    selector = CandidateSelector(config, vocab_size=5)
    with torch.no_grad():
        selector.hidden_projection.weight.copy_(torch.eye(2))
        selector.predecessor_codebook.copy_(torch.tensor([[1.0, 2.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0], [1.0, 0.0]]))
        selector.successor_codebook.copy_(torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.5, 0.5]]))
    hidden = torch.tensor([[[1.0, -1.0], [0.5, 2.0]]])
    unary = torch.tensor([[[0.0, 3.0, 2.5, 0.0, 0.0], [4.0, 1.0, 0.0, 3.0, 0.0]]])  # candidates {1, 2} and {0, 3}
    batch = SimpleNamespace(
        labels=torch.tensor([[2, 4]]),  # 2 is a candidate at position 0; 4 is not at position 1
        previous=torch.tensor([[0, 2]]),  # the anchor, then the true token before position 1
        weights=torch.tensor([[1.0, 0.7]]),
    )
    loss, metrics = selector_loss(selector, hidden, unary, batch)
    # position 0 by hand: u = P[0] * h = [1, -2]; scores 3 + <S[1], u> = 4 and 2.5 + <S[2], u> = 0.5
    expected = F.cross_entropy(torch.tensor([[4.0, 0.5]]), torch.tensor([1]))
    torch.testing.assert_close(loss, expected)
    assert metrics["candidate_recall"] == 0.5 and metrics["selector_accuracy"] == 0.0
    # the excluded position's scores do not matter, and give no gradient
    unary.requires_grad_(True)
    loss, _ = selector_loss(selector, hidden, unary, batch)
    loss.backward()
    assert not unary.grad[0, 1].any() and unary.grad[0, 0].any()
    # an IGNORE label is left out the same way, and does not count against recall
    ignored = SimpleNamespace(labels=torch.tensor([[2, IGNORE]]), previous=batch.previous, weights=torch.tensor([[1.0, 0.0]]))
    loss, metrics = selector_loss(selector, hidden, unary.detach(), ignored)
    assert math.isclose(float(loss), float(expected), rel_tol=1e-6) and metrics["candidate_recall"] == 1.0


def test_the_shipped_demo_v2_drafter_is_lossless_on_held_out_prompts():
    """The demo V2 drafter (trained from the V1 one) decodes token for token what the target does."""
    from trtllm_dflash.api import DFlashPipeline
    from trtllm_dflash.bench.prompts import load_prompt_set
    from trtllm_dflash.demo import drafter_v2_dir

    prompts = load_prompt_set("stdlib", 2)
    pipe = DFlashPipeline.load("demo", drafter_v2_dir())
    assert pipe.runtime.drafter.config.kind == "dflash2" and pipe.runtime.drafter.candidate_selector.successor_codebook.any()
    reference = DFlashPipeline.load("demo").generate(prompts, max_new_tokens=32, stop_token_ids=(), max_batch=1)
    outputs = pipe.generate(prompts, max_new_tokens=32, stop_token_ids=(), max_batch=1)
    assert [o.token_ids for o in outputs] == [r.token_ids for r in reference]
    assert all(a >= 1 for o in outputs for a in o.acceptance_lengths)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"init_from": "demo"}, "--init-from starts a V2 drafter"),
        ({"v2": True, "block_size": 32}, "DFlash V2 blocks are 2..16"),
        ({"v2": True, "selector_rank": 0}, "--selector-rank and --selector-top-k must be >= 1"),
    ],
)
def test_bad_v2_options_fail_before_anything_loads(tmp_path, change, message):
    from trtllm_dflash.errors import DFlashError
    from trtllm_dflash.training.run import TrainDrafterOptions, check_options

    options = TrainDrafterOptions(target=tmp_path / "missing", data=[tmp_path / "missing.txt"], out=tmp_path / "out", **change)
    with pytest.raises(DFlashError, match=message):
        check_options(options)


def test_train_drafter_v2_from_a_v1_drafter_writes_a_loadable_v2(tmp_path):
    from typer.testing import CliRunner

    from trtllm_dflash.checkpoints import load_drafter
    from trtllm_dflash.cli.app import app
    from trtllm_dflash.testing.tiny import make_tiny_drafter

    target = make_tiny_target(tmp_path / "target", "qwen3", seed=6, tokenizer=True)
    v1 = make_tiny_drafter(tmp_path / "v1", target, seed=7, num_layers=1, block_size=4, mask_token_id=1)
    (tmp_path / "data.txt").write_text("\n".join("abcabcabd" * 4 for _ in range(8)))
    out = tmp_path / "v2"
    result = CliRunner().invoke(
        app,
        [
            "train-drafter",
            "--target",
            str(target),
            "--data",
            str(tmp_path / "data.txt"),
            "--out",
            str(out),
            "--v2",
            "--init-from",
            str(v1),
            "--block-size",
            "4",
            "--steps",
            "3",
            "--batch-size",
            "2",
            "--seq-len",
            "24",
            "--anchors",
            "4",
            "--selector-rank",
            "8",
            "--selector-top-k",
            "8",
            "--mask-token-id",
            "1",
            "--threads",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    history = json.loads((out / "training.json").read_text())["history"]
    assert {"base_loss", "selector_loss", "candidate_recall", "selector_accuracy"} <= set(history[-1])
    drafter = load_drafter(out, target=load_target(target))
    assert drafter.config.kind == "dflash2" and drafter.config.selector_rank == 8 and drafter.config.num_hidden_layers == 1
    assert drafter.candidate_selector.successor_codebook.any()

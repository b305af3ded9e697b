"""Attention over the live span (modeling/cache_attention.py): the same results as the masked
attention over the longest row's span, no mask where none is needed, windows that bite still
masked, and a row's tokens independent of the other rows' lengths."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trtllm_dflash import DFlashPipeline, hf_compat
from trtllm_dflash.checkpoints import load_drafter, load_target
from trtllm_dflash.decoding import Decoder, Request, SamplingParams
from trtllm_dflash.modeling.cache_attention import AttentionPlan
from trtllm_dflash.runtime.torch_runtime import TorchRuntime, causal_mask
from trtllm_dflash.testing import tiny


def masked_reference(q, keys, values, starts, count, window, scale):
    """The old form: every row over the longest row's span through a boolean mask."""
    positions = torch.tensor(starts).view(-1, 1) + torch.arange(count)
    span = max(starts) + count
    mask = causal_mask(positions, span, window)
    out = F.scaled_dot_product_attention(
        q, keys[:, :span].transpose(1, 2), values[:, :span].transpose(1, 2), attn_mask=mask, scale=scale, enable_gqa=True
    )
    return out.transpose(1, 2)


SPLIT = [(0, 2), (2, 3), (3, 4)]  # one group per start


@pytest.mark.parametrize("count", [1, 4, 9])
@pytest.mark.parametrize("window", [0, 6, 64])
@pytest.mark.parametrize(
    "starts,groups",
    [
        ([3, 3, 66, 17], SPLIT),  # level rows, a long one, a short one: one call would read 2.2x the keys they need
        ([30, 30, 40, 37], [(0, 4)]),  # close starts: one call under a per-row mask
        ([0, 0], [(0, 2)]),  # a prefill
    ],
)
def test_plan_equals_the_masked_attention_over_the_longest_span(count, window, starts, groups):
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(len(starts), 4, count, 8, generator=generator, dtype=torch.float64)
    keys = torch.randn(len(starts), 80, 2, 8, generator=generator, dtype=torch.float64)
    values = torch.randn(len(starts), 80, 2, 8, generator=generator, dtype=torch.float64)
    plan = AttentionPlan.make(starts, count, {window}, torch.float64, torch.device("cpu"))
    if window != 6:  # a biting window reads fewer keys per row, so merging pays less often
        assert [(g.rows.start, g.rows.stop) for g in plan.groups] == groups
    got = plan.attend(q, keys, values, window, 0.35)
    want = masked_reference(q, keys, values, starts, count, window, 0.35)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_plan_masks_only_where_needed_and_reads_only_the_live_slots():
    level = AttentionPlan.make([100, 100], 1, {0, 16}, torch.float32, torch.device("cpu"))
    (group,) = level.groups
    assert group.masks == {0: None, 16: None}  # one query row sees every key it reads
    assert group.reads == {0: (0, 101), 16: (85, 101)}  # the biting window reads only its own slots
    block = AttentionPlan.make([100], 8, {0, 16}, torch.float32, torch.device("cpu")).groups[0]
    assert block.reads == {0: (0, 108), 16: (85, 108)}
    full, sliding = block.masks[0], block.masks[16]
    assert full.shape == (1, 1, 8, 108) and sliding.shape == (1, 1, 8, 23)
    assert bool((full[0, 0, 0, :101] == 0).all()) and bool((full[0, 0, 0, 101:] < 0).all())  # causal in the block
    # the window bites: query 7 (position 107) no longer sees slot 85 (position 85 <= 107 - 16)
    assert float(sliding[0, 0, 7, 0]) < 0 and float(sliding[0, 0, 0, 0]) == 0
    short = AttentionPlan.make([3], 4, {16}, torch.float32, torch.device("cpu")).groups[0]
    assert short.reads == {16: (0, 7)}  # a window that does not bite reads from slot 0
    prefill = AttentionPlan.make([0, 0], 20, {0, 16}, torch.float32, torch.device("cpu")).groups[0]
    assert prefill.causal == {0: True, 16: False} and prefill.masks[0] is None  # SDPA's is_causal, no mask
    assert prefill.masks[16].shape == (1, 1, 20, 20)  # the window bites inside the prompt: masked
    eager = AttentionPlan.make([0], 20, {0}, torch.float32, torch.device("cpu"), sdpa=False).groups[0]
    assert eager.causal == {0: False} and eager.masks[0].shape == (1, 1, 20, 20)


def sliding_qwen3(root, window: int):
    """A tiny Qwen3 whose layers alternate sliding (window `window`) and full attention."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(4)
    config = tiny.tiny_target_config("qwen3", num_layers=4)
    config.sliding_window, config.use_sliding_window, config.max_window_layers = window, True, 0
    config.layer_types = ["sliding_attention", "full_attention"] * 2
    model = AutoModelForCausalLM.from_config(config)
    tiny.spread_logits(model)
    model.save_pretrained(root, safe_serialization=True)
    return root


@pytest.mark.parametrize("window,attention", [(0, "sdpa"), (6, "sdpa"), (6, "eager")])
def test_fast_path_gives_the_masked_paths_tokens(tmp_path, window, attention):
    """The fused pass (plan: no mask for level single rows, is_causal prefills, live slots only)
    against transformers' own attention over the longest span with our masks; window 6 bites in
    every prompt; eager runs the model's attention function with the plan's explicit masks."""
    if window:
        target_dir = sliding_qwen3(tmp_path / "target", window)
    else:
        target_dir = tiny.make_tiny_target(tmp_path / "target", "qwen3", seed=5)
    drafter_dir = tiny.make_tiny_drafter(tmp_path / "drafter", target_dir, seed=6, block_size=4)
    prompts = [[5, 9, 14, 3, 8, 21, 40, 2, 7], list(range(3, 60)), [4, 6, 8, 10]]
    results = {}
    for fused in (True, False):
        for drafter in (drafter_dir, None):
            target = load_target(target_dir)
            hf_compat.set_attention_implementation(target.model.config, attention)
            runtime = TorchRuntime(target.model, load_drafter(drafter, target=target) if drafter else None, fused=fused)
            outputs = DFlashPipeline(runtime).generate(prompts, max_new_tokens=20, stop_token_ids=())
            assert (runtime.fused is not None) == fused
            results[fused, drafter is None] = [(o.token_ids, o.acceptance_lengths) for o in outputs]
            if window:
                assert runtime.windows == [window, 0, window, 0]
            assert runtime.additive_masks == (attention == "eager")
    assert results[True, False] == results[False, False]
    assert results[True, True] == results[False, True]
    assert [tokens for tokens, _ in results[True, False]] == [tokens for tokens, _ in results[True, True]]


def test_a_rows_result_does_not_depend_on_the_other_rows_lengths(trained_pair):
    target_dir, drafter_dir, prompts = trained_pair
    long_prompt = tiny.cycle_sequences(1, 400, torch.Generator().manual_seed(9)).tolist()[0]
    batch = [prompts[0], long_prompt, prompts[1]]
    pipe = DFlashPipeline.load(target_dir, drafter_dir)
    together = pipe.generate(batch, max_new_tokens=40, stop_token_ids=())
    alone = [pipe.generate([p], max_new_tokens=40, stop_token_ids=(), max_batch=1)[0] for p in batch]
    for joint, single in zip(together, alone):
        assert joint.token_ids == single.token_ids
        assert joint.acceptance_lengths == single.acceptance_lengths
    assert max(len(o.acceptance_lengths) for o in together) < 40  # the drafter is accepted: steps of several tokens


# gpt_oss: attention sinks, eager attention (transformers' own causal mask there went wrong: no shortcut)
@pytest.mark.parametrize("family,window", [("qwen3", 0), ("qwen3", 6), ("qwen3_5", 0), ("gemma3", 0), ("gpt_oss", 0)])
@pytest.mark.parametrize("chunk", [0, 16])
def test_transformers_path_prefills_from_zero_without_a_mask(tmp_path, monkeypatch, family, window, chunk):
    """Transformers' own forward (the path of hybrid, sliding and GPU targets, where the fused pass
    does not run): a prefill from position 0 passes no mask, so SDPA runs `is_causal`, and decodes
    the tokens and acceptance lengths of the masked prefill. A biting window (6) and the chunks
    after the first still get masks."""
    if window:
        target_dir = sliding_qwen3(tmp_path / "target", window)
    else:
        target_dir = tiny.make_tiny_target(tmp_path / "target", family, seed=5)
    drafter_dir = tiny.make_tiny_drafter(tmp_path / "drafter", target_dir, seed=6, block_size=4)
    target = load_target(target_dir, dtype=torch.float32)
    runtime = TorchRuntime(target.model, load_drafter(drafter_dir, target=target), fused=False)
    prompts = [[5, 9, 14, 3, 8, 21, 40, 2, 7], list(range(3, 60)), [4, 6, 8, 10]]
    taken, plain = [], TorchRuntime._plain_causal
    monkeypatch.setattr(TorchRuntime, "_plain_causal", lambda *a: taken.append((a[1].shape[1], plain(*a))) or taken[-1][1])

    def decode():
        decoder = Decoder(runtime, max_batch=2, max_context=160, prefill_chunk=chunk)
        outputs = decoder.generate([Request(p, SamplingParams(max_new_tokens=20, stop_token_ids=())) for p in prompts])
        return [(o.token_ids, o.acceptance_lengths) for o in outputs]

    fast = decode()
    if not runtime.sdpa_attention:  # the shortcut is SDPA's is_causal: other attention functions keep our masks
        assert not any(fast_path for _, fast_path in taken)
        return
    assert any(fast_path for _, fast_path in taken)
    assert not all(fast_path for _, fast_path in taken)  # verify passes (and chunks after the first) keep their masks
    if window:
        assert not any(fast_path for width, fast_path in taken if width > window)
    monkeypatch.setattr(TorchRuntime, "_plain_causal", lambda *a: False)
    assert fast == decode()

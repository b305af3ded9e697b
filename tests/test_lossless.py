"""Lossless at temperature 0: speculative output == the target's own greedy output (Hugging Face
`generate`), token for token, for random and trained pairs, saved to disk and loaded back."""

from __future__ import annotations

import functools

import pytest
import torch
from support import hf_greedy

from trtllm_dflash import DFlashPipeline
from trtllm_dflash.checkpoints import load_target
from trtllm_dflash.testing.tiny import make_tiny_drafter, make_tiny_target

NEW_TOKENS = 20


@functools.lru_cache(maxsize=None)
def _target_dir(family: str, seed: int, root: str):
    from pathlib import Path

    return make_tiny_target(Path(root) / f"{family}-{seed}", family, seed=seed)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("lossless"))


def _prompts(batch: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = [3 + (7 * i + seed) % 13 for i in range(batch)]  # different lengths in a batch
    return [torch.randint(3, 120, (n,), generator=generator).tolist() for n in lengths]


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("block_size", [2, 8, 10, 16])
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_random_pairs_equal_target_greedy(tmp_path, root, family, block_size, batch):
    seed = block_size + batch  # a different target, drafter and prompt set per combination
    target_dir = _target_dir(family, seed % 3, root)
    drafter_dir = make_tiny_drafter(tmp_path / "drafter", target_dir, seed=seed, block_size=block_size)
    pipe = DFlashPipeline.load(target_dir, drafter_dir, dtype=torch.float64)
    prompts = _prompts(batch, seed)
    outputs = pipe.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=())
    reference = load_target(target_dir, dtype=torch.float64).model
    for prompt, out in zip(prompts, outputs):
        assert out.token_ids == hf_greedy(reference, prompt, NEW_TOKENS)
        assert len(out.token_ids) == 1 + sum(out.acceptance_lengths)
        assert out.num_target_forwards == 1 + len(out.acceptance_lengths)
        assert out.finish_reason == "length"


def test_autoregressive_baseline_equals_target_greedy(root):
    target_dir = _target_dir("qwen3", 0, root)
    pipe = DFlashPipeline.load(target_dir, None, dtype=torch.float64)
    prompts = _prompts(3, 0)
    outputs = pipe.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=())
    reference = load_target(target_dir, dtype=torch.float64).model
    for prompt, out in zip(prompts, outputs):
        assert out.token_ids == hf_greedy(reference, prompt, NEW_TOKENS)
        assert out.acceptance_lengths == [1] * (NEW_TOKENS - 1)


def test_float32_default_dtype_is_lossless(tmp_path, root):
    target_dir = _target_dir("llama", 1, root)
    drafter_dir = make_tiny_drafter(tmp_path / "drafter", target_dir, seed=5, block_size=8)
    pipe = DFlashPipeline.load(target_dir, drafter_dir)
    ar = DFlashPipeline.load(target_dir, None)
    prompts = _prompts(4, 1)
    spec = pipe.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=())
    base = ar.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=())
    assert [o.token_ids for o in spec] == [o.token_ids for o in base]


# ----------------------------------------------------------------------------- a trained pair


def test_trained_pair_accepts_long_runs_and_stays_lossless(trained_pair):
    target_dir, drafter_dir, prompts = trained_pair
    pipe = DFlashPipeline.load(target_dir, drafter_dir, dtype=torch.float64)
    outputs = pipe.generate(prompts, max_new_tokens=48, stop_token_ids=())
    reference = load_target(target_dir, dtype=torch.float64).model
    taus = []
    for prompt, out in zip(prompts, outputs):
        assert out.token_ids == hf_greedy(reference, prompt, 48)
        taus.append(out.mean_acceptance_length)
    block = pipe.runtime.drafter_config.block_size
    assert sum(taus) / len(taus) >= 0.6 * block, taus  # a drafter that proposes the target's own tokens


def test_stop_token_inside_an_accepted_run(trained_pair):
    target_dir, drafter_dir, prompts = trained_pair
    pipe = DFlashPipeline.load(target_dir, drafter_dir, dtype=torch.float64)
    free = pipe.generate(prompts[:1], max_new_tokens=48, stop_token_ids=())[0]
    # a step that committed >= 3 tokens; take its second token as the stop token
    offset, cut = 1, None
    for tau in free.acceptance_lengths:
        if tau >= 3:
            cut = offset + 1
            break
        offset += tau
    assert cut is not None, free.acceptance_lengths
    stop = free.token_ids[cut]
    first = free.token_ids.index(stop)
    out = pipe.generate(prompts[:1], max_new_tokens=48, stop_token_ids=(stop,))[0]
    assert out.token_ids == free.token_ids[: first + 1]
    assert out.finish_reason == "stop"
    assert len(out.token_ids) == 1 + sum(out.acceptance_lengths)


def test_max_new_tokens_cuts_inside_a_block(trained_pair):
    target_dir, drafter_dir, prompts = trained_pair
    pipe = DFlashPipeline.load(target_dir, drafter_dir, dtype=torch.float64)
    free = pipe.generate(prompts, max_new_tokens=48, stop_token_ids=())
    cut_inside_a_run = []
    for limit in (2, 7, 13):
        cut = pipe.generate(prompts, max_new_tokens=limit, stop_token_ids=())
        for full, out in zip(free, cut):
            assert out.token_ids == full.token_ids[:limit]
            assert out.finish_reason == "length"
            steps = len(out.acceptance_lengths)
            cut_inside_a_run.append(steps > 0 and out.acceptance_lengths[-1] < full.acceptance_lengths[steps - 1])
    assert any(cut_inside_a_run)  # the limit fell inside an accepted run at least once


def test_max_context_stops_generation(trained_pair):
    target_dir, drafter_dir, prompts = trained_pair
    pipe = DFlashPipeline.load(target_dir, drafter_dir, dtype=torch.float64, max_context=40)
    free = DFlashPipeline.load(target_dir, None, dtype=torch.float64).generate(prompts, max_new_tokens=60, stop_token_ids=())
    outputs = pipe.generate(prompts, max_new_tokens=60, stop_token_ids=())
    for prompt, out, ref in zip(prompts, outputs, free):
        assert len(prompt) + len(out.token_ids) == 40
        assert out.token_ids == ref.token_ids[: len(out.token_ids)]
        assert out.finish_reason == "context"


def test_requests_joining_a_running_batch(trained_pair):
    """In-flight batching: a request that joins mid-way decodes exactly as it would alone."""
    from trtllm_dflash.decoding import Decoder, Request, SamplingParams

    target_dir, drafter_dir, prompts = trained_pair
    pipe = DFlashPipeline.load(target_dir, drafter_dir, dtype=torch.float64)
    alone = pipe.generate(prompts, max_new_tokens=30, stop_token_ids=())
    decoder = Decoder(pipe.runtime, max_batch=2, max_context=256)
    params = SamplingParams(max_new_tokens=30)
    results = {}
    decoder.submit(Request(prompts[0], params, request_id=0))
    for step in range(200):
        if step == 2:
            for i in range(1, len(prompts)):  # more requests than free rows: they queue
                decoder.submit(Request(prompts[i], params, request_id=i))
        for event in decoder.step():
            if event.finished:
                results[event.request_id] = event.result
        if not decoder.has_work:
            break
    assert [results[i].token_ids for i in range(len(prompts))] == [o.token_ids for o in alone]


def test_draft_length_schedule_shortens_blocks_as_rows_join_and_stays_lossless(trained_pair):
    """{rows from: draft tokens}: fewer drafts with more live rows, 0 = verify the anchor alone."""
    from trtllm_dflash.decoding import Decoder, Request, SamplingParams
    from trtllm_dflash.errors import DFlashError

    target_dir, drafter_dir, prompts = trained_pair
    pipe = DFlashPipeline.load(target_dir, drafter_dir, dtype=torch.float64)
    block = pipe.runtime.drafter_config.block_size
    schedule = {1: block - 1, 2: 2, 3: 0}
    free = pipe.generate(prompts, max_new_tokens=40, stop_token_ids=())
    decoder = Decoder(pipe.runtime, max_batch=3, max_context=256, draft_len_schedule=schedule)
    assert [decoder.draft_len(n) for n in (1, 2, 3, 8)] == [block - 1, 2, 0, 0]
    limits = [12, 24, 40]  # rows finish at different times: the batch shrinks through the schedule
    results = decoder.generate([Request(p, SamplingParams(max_new_tokens=n)) for p, n in zip(prompts, limits)])
    for out, full, n in zip(results, free, limits):
        assert out.token_ids == full.token_ids[:n]
    # per-step acceptance bounded by the schedule at that step's live rows
    rows_per_step = [s.batch_size for s in decoder.stats]
    assert {3, 2, 1} <= set(rows_per_step)
    last = results[-1].acceptance_lengths
    assert max(last[: rows_per_step.count(3)]) == 1  # 3 rows: anchor-only verification
    assert max(last[-5:]) > 3  # alone again: long runs accepted, so the drafter's context stayed complete
    # what each step verified, as served statistics count it: the schedule's length at that step's rows
    assert results[-1].draft_lengths == [decoder.draft_len(n) for n in rows_per_step]
    assert all(a <= d + 1 for r in results for a, d in zip(r.acceptance_lengths, r.draft_lengths))

    # sampling, drafts of length 0 only: exactly the autoregressive sampler (same seed, same RNG streams)
    sampled = Decoder(pipe.runtime, max_batch=3, max_context=256, draft_len_schedule={1: 0}).generate(
        [Request(p, SamplingParams(max_new_tokens=20, temperature=1.0, seed=5)) for p in prompts]
    )
    ar = DFlashPipeline.load(target_dir, None, dtype=torch.float64).generate(
        prompts, max_new_tokens=20, temperature=1.0, seed=5, stop_token_ids=()
    )
    assert [r.token_ids for r in sampled] == [r.token_ids for r in ar]

    with pytest.raises(DFlashError, match="drafts more than block size"):
        Decoder(pipe.runtime, max_batch=1, max_context=64, draft_len_schedule={1: block})

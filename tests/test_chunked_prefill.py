"""Chunked prefill (Decoder(prefill_chunk=N)): a long prompt joins over several steps while live rows decode.

A chunked prefill must decode exactly what a whole one does: the same tokens and the same
acceptance lengths (dense and hybrid targets, a sliding-window target, greedy and seeded
sampling, chunk sizes that do and do not divide the prompts, rows joining a running batch). And
the point of it: live rows produce tokens in every step while a long prompt is chunked in
(counted in steps, never timed).
"""

from __future__ import annotations

import functools

import pytest
import torch

from trtllm_dflash.checkpoints import load_drafter, load_target
from trtllm_dflash.decoding import Decoder, Request, SamplingParams
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.runtime.torch_runtime import TorchRuntime
from trtllm_dflash.served_model.model_parameters import ServingConfig
from trtllm_dflash.testing.tiny import cycle_sequences, make_tiny_drafter, make_tiny_target

GREEDY = SamplingParams(max_new_tokens=24)
SEEDED = SamplingParams(max_new_tokens=24, temperature=0.8, top_p=0.95, seed=5)


def _decode(runtime, prompts: list[list[int]], params: SamplingParams, chunk: int, max_batch: int = 2):
    """Tokens and acceptance lengths per prompt; more prompts than rows, so some join a running batch."""
    decoder = Decoder(runtime, max_batch=max_batch, max_context=160, prefill_chunk=chunk)
    requests = [Request(p, params) for p in prompts]
    return [(r.token_ids, r.acceptance_lengths) for r in decoder.generate(requests)]


@functools.lru_cache(maxsize=None)
def _pair_runtime(target_dir, drafter_dir) -> TorchRuntime:
    target = load_target(target_dir, dtype=torch.float32)
    return TorchRuntime(target.model, load_drafter(drafter_dir, target))


@pytest.fixture(scope="module")
def trained(trained_pair):
    """The trained cycle pair (drafts are accepted in long runs) and prompts of 9 to 57 tokens."""
    target_dir, drafter_dir, _ = trained_pair
    generator = torch.Generator().manual_seed(4)
    prompts = [cycle_sequences(1, n, generator)[0].tolist() for n in (41, 9, 57, 23)]
    runtime = _pair_runtime(target_dir, drafter_dir)
    whole = {name: _decode(runtime, prompts, params, chunk=0) for name, params in (("greedy", GREEDY), ("seeded", SEEDED))}
    return runtime, prompts, whole


@pytest.mark.parametrize("chunk", [5, 16, 64])  # 5 and 16 divide no prompt; 64 holds any prompt whole
@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
def test_chunked_prefill_decodes_exactly_what_a_whole_one_does(trained, chunk, sampling):
    runtime, prompts, whole = trained
    chunked = _decode(runtime, prompts, GREEDY if sampling == "greedy" else SEEDED, chunk=chunk)
    assert chunked == whole[sampling]
    assert max(max(lengths) for _, lengths in chunked) > 2  # real acceptance, not a drafter that is always rejected


@functools.lru_cache(maxsize=None)
def _family_runtime(family: str, root: str) -> TorchRuntime:
    from pathlib import Path

    target_dir = make_tiny_target(Path(root) / family, family, seed=7)
    drafter_dir = make_tiny_drafter(Path(root) / f"{family}-drafter", target_dir, seed=3, block_size=4, target_layer_ids=(1, 2))
    target = load_target(target_dir, dtype=torch.float32)
    return TorchRuntime(target.model, load_drafter(drafter_dir, target))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("chunked-families"))


# qwen3_5: Gated DeltaNet layers carry their recurrent and conv state from chunk to chunk;
# gemma3: sliding-window layers (window 8) whose window spans chunks
@pytest.mark.parametrize("family", ["qwen3_5", "gemma3"])
def test_recurrent_state_and_sliding_windows_carry_across_chunks(root, family):
    runtime = _family_runtime(family, root)
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 120, (n,), generator=generator).tolist() for n in (23, 6, 16)]
    for params in (SamplingParams(max_new_tokens=12), SamplingParams(max_new_tokens=12, temperature=0.8, seed=5)):
        assert _decode(runtime, prompts, params, chunk=7) == _decode(runtime, prompts, params, chunk=0)


class _CountingRuntime:
    """A runtime wrapper that records the widths of the prefill passes (logits_at given)."""

    def __init__(self, runtime) -> None:
        self.runtime = runtime
        self.prefill_tokens: list[int] = []

    def __getattr__(self, name):
        return getattr(self.runtime, name)

    def target_verify(self, rows, tokens, starts, span, draft_probs, sampling, logits_at=None):
        if logits_at is not None:
            self.prefill_tokens.append(int((logits_at + 1).sum()))
        return self.runtime.target_verify(rows, tokens, starts, span, draft_probs, sampling, logits_at)


def test_live_rows_decode_in_every_step_while_a_long_prompt_is_chunked_in(trained):
    runtime, _, _ = trained
    counting = _CountingRuntime(runtime)
    generator = torch.Generator().manual_seed(2)
    decoder = Decoder(counting, max_batch=3, max_context=160, prefill_chunk=8)
    short = [decoder.submit(Request(cycle_sequences(1, 4, generator)[0].tolist(), SamplingParams(max_new_tokens=100))) for _ in range(2)]
    assert {e.request_id for e in decoder.step()} == set(short)  # 4 + 4 tokens: both prompts in one chunk, live at once
    long_id = decoder.submit(Request(cycle_sequences(1, 60, generator)[0].tolist(), SamplingParams(max_new_tokens=4)))
    for step in range(1, 9):  # 60 tokens in chunks of 8: complete in the 8th step
        events = {e.request_id: e for e in decoder.step()}
        assert all(events[i].new_token_ids for i in short)  # every live row advanced in this step
        assert (long_id in events) == (step == 8)
        assert len(decoder.prefilling) == (0 if step == 8 else 1)
    assert max(counting.prefill_tokens) <= 8 and sum(counting.prefill_tokens) == 4 + 4 + 60
    result = events[long_id].result
    assert result.num_target_forwards == 8 + len(result.acceptance_lengths)  # 8 chunks, then its decoding steps

    whole = Decoder(runtime, max_batch=3, max_context=160, prefill_chunk=0)  # without chunks it joins in its first step
    whole.submit(Request(cycle_sequences(1, 60, generator)[0].tolist(), SamplingParams(max_new_tokens=4)))
    assert whole.step()


def test_a_chunk_padded_past_a_rows_cache_waits_for_the_next_step(trained):
    """The oldest prompt's last 2 tokens share a pass with another prompt's 27: padded to 27 at its
    own positions (58..85) it would write past its cache row (capacity 64 + 8), which crashed."""
    runtime, _, _ = trained
    generator = torch.Generator().manual_seed(9)
    long, short = (cycle_sequences(1, n, generator)[0].tolist() for n in (60, 40))
    params = SamplingParams(max_new_tokens=4)
    alone = [Decoder(runtime, max_batch=1, max_context=64, prefill_chunk=0).generate([Request(p, params)])[0] for p in (long, short)]
    decoder = Decoder(runtime, max_batch=2, max_context=64, prefill_chunk=29)
    decoder.submit(Request(long, params))
    for _ in range(2):  # 58 of its 60 tokens in
        decoder.step()
    decoder.submit(Request(short, params))
    done = {}
    while decoder.has_work:
        done.update({len(e.result.prompt_ids): e.result for e in decoder.step() if e.finished})
    for result, reference in zip((done[60], done[40]), alone):
        assert (result.token_ids, result.acceptance_lengths) == (reference.token_ids, reference.acceptance_lengths)


def test_a_cancelled_prefill_frees_its_row_and_leaves_the_others_exact(trained):
    runtime, prompts, _ = trained
    decoder = Decoder(runtime, max_batch=3, max_context=160, prefill_chunk=6)
    ids = [decoder.submit(Request(p, GREEDY)) for p in prompts[:3]]
    decoder.step()
    decoder.step()  # 12 of the first prompt's 41 tokens prefilled
    assert decoder.cancel(ids[0]) is None and len(decoder.prefilling) == 2
    done = {}
    while decoder.has_work:
        done.update({e.request_id: e.result for e in decoder.step() if e.finished})
    alone = _decode(runtime, prompts[1:3], GREEDY, chunk=0)
    assert [(done[i].token_ids, done[i].acceptance_lengths) for i in ids[1:]] == alone


def test_prefill_chunk_is_a_serving_option_with_a_default():
    assert ServingConfig(target="demo").prefill_chunk == 512
    assert ServingConfig(target="demo").prefill_share == 0.3
    assert ServingConfig.from_parameters({"target": "demo", "prefill_share": "0"}).prefill_share == 0  # off: prefill_chunk tokens
    assert ServingConfig.from_parameters({"target": "demo", "prefill_chunk": "0"}).prefill_chunk == 0
    with pytest.raises(DFlashError, match="prefill_chunk"):
        ServingConfig.from_parameters({"target": "demo", "prefill_chunk": "-1"})


def test_a_negative_chunk_is_refused_in_one_line(trained):
    with pytest.raises(DFlashError) as error:
        Decoder(trained[0], max_batch=1, max_context=64, prefill_chunk=-1)
    assert "prefill_chunk must be >= 0" in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(DFlashError, match="prefill_share must be > 0"):
        Decoder(trained[0], max_batch=1, max_context=64, prefill_share=0)


def test_with_a_prefill_share_a_short_prompt_is_not_queued_behind_a_long_one(trained):
    """Shortest remaining first: the 9-token prompt submitted after the 57-token one goes live in the
    first step (the rows trade places), and both decode exactly as when prefilled whole."""
    runtime, prompts, whole = trained
    long_prompt, short_prompt = prompts[2], prompts[1]
    decoder = Decoder(runtime, max_batch=3, max_context=160, prefill_chunk=16, prefill_share=0.5)
    ids = [decoder.submit(Request(p, GREEDY)) for p in (long_prompt, short_prompt)]
    decoder.step()
    assert [live.request.request_id for live in decoder.live] == [ids[1]]
    assert decoder.prefilling[0].done == 7  # the long prompt took the rest of the step's 16 tokens
    done = {}
    while decoder.has_work:
        done.update({e.request_id: e.result for e in decoder.step() if e.finished})
    assert [(done[i].token_ids, done[i].acceptance_lengths) for i in ids] == [whole["greedy"][2], whole["greedy"][1]]


def test_cancelling_a_reordered_prefill_leaves_the_others_exact(trained):
    """Shortest first moves rows; cancelling the half-prefilled middle one afterwards frees its row
    and the others (live and still prefilling) decode as when prefilled whole."""
    runtime, prompts, whole = trained
    decoder = Decoder(runtime, max_batch=3, max_context=160, prefill_chunk=16, prefill_share=0.5)
    ids = [decoder.submit(Request(p, GREEDY)) for p in (prompts[2], prompts[0], prompts[1])]  # 57, 41, 9 tokens
    decoder.step()  # the 9-token prompt goes live, the 41-token one gets 7 tokens, the 57-token one waits
    assert [p.request.request_id for p in decoder.prefilling] == [ids[1], ids[0]] and decoder.prefilling[0].done == 7
    assert decoder.cancel(ids[1]) is None and len(decoder.prefilling) == 1
    done = {}
    while decoder.has_work:
        done.update({e.request_id: e.result for e in decoder.step() if e.finished})
    assert sorted(done) == sorted([ids[0], ids[2]])
    assert [(done[i].token_ids, done[i].acceptance_lengths) for i in (ids[0], ids[2])] == [whole["greedy"][2], whole["greedy"][1]]


@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
def test_chunks_sized_by_time_decode_exactly_what_a_whole_prefill_does(trained, monkeypatch, sampling):
    """prefill_share: chunk sizes follow the measured step times (so they vary from run to run);
    the tokens and acceptance lengths do not. A tiny share forces small chunks beside decoding rows."""
    from trtllm_dflash.runtime import step_schedule

    runtime, prompts, whole = trained
    sizes = []
    tokens = step_schedule.PrefillBudget.tokens
    monkeypatch.setattr(step_schedule.PrefillBudget, "tokens", lambda self, decoding: sizes.append(tokens(self, decoding)) or sizes[-1])
    decoder = Decoder(runtime, max_batch=2, max_context=160, prefill_chunk=64, prefill_share=0.01)
    decoder.prefill_budget.floor = 3  # this pair's prompts are short: let the budget bite
    requests = [Request(p, GREEDY if sampling == "greedy" else SEEDED) for p in prompts]
    assert [(r.token_ids, r.acceptance_lengths) for r in decoder.generate(requests)] == whole[sampling]
    assert 64 in sizes and min(sizes) < 64  # whole chunks with no row decoding, smaller ones beside decoding rows


def _prefilled_keys(decoder: Decoder, runtime: TorchRuntime) -> list[torch.Tensor]:
    """The target keys of every prefilling row at the positions already prefilled, layer by layer."""
    first = len(decoder.live)
    layers = [layer for layer in runtime.target_cache.layers if layer.keys is not None]
    return [layer.keys[first + j, : p.done].clone() for j, p in enumerate(decoder.prefilling) for layer in layers]


@pytest.mark.parametrize("attention", ["hf", "dflash"])
def test_graph_padding_rows_leave_a_half_prefilled_prompt_intact(rerun_graphs, tiny_qwen3, tiny_qwen3_drafter, attention):
    """With CUDA graphs the verify pass pads 3 live rows to a bucket of 4: the padding row is the row
    a long prompt is being prefilled into, and must not write over what is prefilled there (on the
    model's attention it writes at the row's last slots, on the op nowhere)."""
    target = load_target(tiny_qwen3, dtype=torch.float32)
    drafter = load_drafter(tiny_qwen3_drafter, target=target)
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 100, (n,), generator=generator).tolist() for n in (5, 6, 7, 70)]
    eager_runtime = TorchRuntime(target.model, drafter, attention=attention)
    runtime = TorchRuntime(target.model, drafter, attention=attention, cuda_graphs=True)
    eager, replayed = (Decoder(r, max_batch=4, max_context=160, prefill_chunk=18) for r in (eager_runtime, runtime))
    for decoder in (eager, replayed):
        for prompt, new_tokens in zip(prompts, (30, 30, 30, 6)):
            decoder.submit(Request(prompt, SamplingParams(max_new_tokens=new_tokens)))
    tokens: dict = {}
    while eager.has_work:  # in lockstep: after each step the prefilled keys are the eager ones
        for event in eager.step():
            tokens.setdefault(("eager", event.request_id), []).extend(event.new_token_ids)
        for event in replayed.step():
            tokens.setdefault(("graphs", event.request_id), []).extend(event.new_token_ids)
        expected, got = _prefilled_keys(eager, eager_runtime), _prefilled_keys(replayed, runtime)
        assert len(expected) == len(got) and all(torch.equal(a, b) for a, b in zip(expected, got))
    assert not replayed.has_work
    assert all(tokens[("graphs", request_id)] == t for (kind, request_id), t in tokens.items() if kind == "eager")
    assert runtime.cuda_graphs.counts["padded"] > 0


def test_first_tokens_are_emitted_before_the_step_decodes(trained):
    """`step(emit=...)` hands a completed prefill's first tokens out before the speculative step runs
    (a server sends them at once), and leaves them out of what it returns; the tokens are unchanged."""
    runtime, prompts, whole = trained
    passes = []

    class Counting:
        def __getattr__(self, name):
            return getattr(runtime, name)

        def target_verify(self, *args, **kwargs):
            passes.append("prefill" if kwargs.get("logits_at") is not None else "verify")
            return runtime.target_verify(*args, **kwargs)

    decoder = Decoder(Counting(), max_batch=2, max_context=160, prefill_chunk=0)
    ids = [decoder.submit(Request(p, GREEDY)) for p in prompts[:3]]  # the third joins when a slot frees
    emitted, order, done = [], [], {}  # order: (request, "emit" or "step") of each event as it came

    def emit(events):
        emitted.append((list(passes), events))
        order.extend((e.request_id, "emit") for e in events)

    while decoder.has_work:
        for event in decoder.step(emit=emit):
            order.append((event.request_id, "step"))
            if event.finished:
                done[event.request_id] = event.result
    first = emitted[0]
    assert first[0] == ["prefill"] and sorted(e.request_id for e in first[1]) == ids[:2]  # before any verify pass
    assert len(emitted) == 2 and emitted[1][0][-1] == "prefill"  # the third prompt's: before its step's verify pass too
    assert all(len(e.new_token_ids) == 1 for _, events in emitted for e in events)
    assert [next(how for r, how in order if r == i) for i in ids] == ["emit"] * 3  # every request's first event
    assert [done[i].token_ids for i in ids] == [whole["greedy"][i][0] for i in range(3)]

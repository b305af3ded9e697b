"""Incremental detokenization in the serving loop (served_model/detokenizer.py, issue 38): the text of a
whole decode however the tokens arrive (multi-byte characters split across steps), only a few
tokens decoded per step, and stop strings split across steps cut exactly where the whole-text
search cuts them, min_tokens included."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from trtllm_dflash import demo
from trtllm_dflash.decoding import Request, SequenceResult
from trtllm_dflash.sampling_params import SamplingParams
from trtllm_dflash.served_model.batching_loop import BatchingLoop, Job
from trtllm_dflash.served_model.detokenizer import REPLACEMENT, IncrementalDetokenizer

TEXT = 'def héllo(): return "wörld ✓ 日本語 🎉"  # done\n    x = 1  # ünïcödé — 终\n'


class CountingTokenizer:
    """The demo tokenizer, counting the ids each decode call reads."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.lengths = tokenizer, []

    def decode(self, ids, skip_special_tokens=True):
        self.lengths.append(len(ids))
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(demo.target_dir())


def chunks(ids: list[int], sizes: list[int]):
    """`ids` arriving in steps of the given sizes (cycled), as the growing list a request holds."""
    grown, k = [], 0
    while len(grown) < len(ids):
        grown.extend(ids[len(grown) : len(grown) + sizes[k % len(sizes)]])
        k += 1
        yield grown


@pytest.mark.parametrize("sizes", [[1], [3], [1, 4, 2, 7], [16]])
def test_the_text_is_the_whole_decode_however_the_tokens_arrive(tokenizer, sizes):
    ids = tokenizer.encode(TEXT, add_special_tokens=False) * 3
    counting = CountingTokenizer(tokenizer)
    detokenizer = IncrementalDetokenizer(counting)
    texts = [detokenizer.decode(grown) for grown in chunks(ids, sizes)]
    assert texts[-1] == tokenizer.decode(ids, skip_special_tokens=True) == TEXT * 3
    for grown, text in zip(chunks(ids, sizes), texts):  # after every step: the whole decode of what has arrived
        assert text == tokenizer.decode(grown, skip_special_tokens=True)
    if sizes == [1]:
        assert any(text.endswith(REPLACEMENT) for text in texts)  # characters were split across steps
    # each step decodes the ids since the last complete character and one chunk of context, never the output
    assert max(counting.lengths) <= 4 * max(sizes) + 8
    assert sum(counting.lengths) < 6 * len(ids) + 16 * len(texts)


def loop_for(tokenizer) -> BatchingLoop:
    loop = BatchingLoop.__new__(BatchingLoop)  # only _text_of is exercised: no model behind it
    loop.tokenizer = tokenizer
    return loop


def serve_steps(tokenizer, ids: list[int], sizes: list[int], params: SamplingParams):
    """Feed `ids` to the loop's text logic step by step, as `_deliver` does, until a stop string ends it."""
    loop, request = loop_for(tokenizer), Request([1, 2], params)
    job = Job(request, None, None, tokenizer)
    result = SequenceResult(request_id=None, prompt_ids=[1, 2])
    for grown in chunks(ids, sizes):
        result.token_ids = list(grown)
        finished = len(grown) == len(ids)
        text, kept = loop._text_of(job, result, finished)
        if text is None:
            return job.final_text, job.final_ids
        assert TEXT.startswith(text) or finished  # what may be sent is always a prefix of the answer
        job.text = text
    return text, kept


def whole_text_cut(tokenizer, ids: list[int], stop: str | list[str], min_tokens: int = 0) -> tuple[str, list[int]]:
    """The definition: of the stops that end past the text of the first min_tokens tokens, the one
    that ends first (ties: the longer); the text before it, and the shortest prefix of ids whose
    text completes it: what a target decoding one token at a time would stop at."""
    stops = [stop] if isinstance(stop, str) else stop
    floor = len(tokenizer.decode(ids[:min_tokens], skip_special_tokens=True)) if min_tokens else 0
    full = tokenizer.decode(ids, skip_special_tokens=True)
    starts = {s: max(0, floor - len(s) + 1) for s in stops}
    _, cut = min((hit + len(s), hit) for s in stops if (hit := full.find(s, starts[s])) >= 0)
    keep = next(
        k
        for k in range(max(1, min_tokens + 1), len(ids) + 1)
        if any(tokenizer.decode(ids[:k], skip_special_tokens=True).find(s, starts[s]) >= 0 for s in stops)
    )
    return full[:cut], ids[:keep]


@pytest.mark.parametrize("stop", ["wörld ✓", '語 🎉"', "#", "\n    x"])
@pytest.mark.parametrize("sizes", [[1], [2, 5], [16]])
def test_stop_strings_split_across_steps_cut_where_the_whole_text_does(tokenizer, stop, sizes):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert serve_steps(tokenizer, ids, sizes, SamplingParams(max_new_tokens=64, stop=[stop])) == whole_text_cut(tokenizer, ids, stop)


@pytest.mark.parametrize("stops", [["wörld ✓ 日本語", "ld"], ['return "w', "rn"], ["日本語 🎉", "本"], ["x = 1", "  x = 1"]])
@pytest.mark.parametrize("sizes", [[1], [2, 5], [16], [64]])
def test_overlapping_stops_cut_where_the_stop_that_ends_first_does_whatever_the_steps(tokenizer, stops, sizes):
    """Issue 40 item 6: two stops that complete in one speculative step (the longer starting first)
    cut where one token at a time would: at the stop that ends first, text and ids alike."""
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    expected = whole_text_cut(tokenizer, ids, stops)
    assert serve_steps(tokenizer, ids, sizes, SamplingParams(max_new_tokens=64, stop=stops)) == expected
    assert serve_steps(tokenizer, ids, [1], SamplingParams(max_new_tokens=64, stop=stops)) == expected
    if stops[1] == "ld":  # the case of issue 40: the longer stop starts first, the shorter ends first
        assert expected[0] == 'def héllo(): return "wör'


@pytest.mark.parametrize("min_tokens", [3, 20, 36])
def test_a_stop_string_counts_only_past_min_tokens(tokenizer, min_tokens):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    params = SamplingParams(max_new_tokens=64, stop=["#"], min_tokens=min_tokens)
    expected = whole_text_cut(tokenizer, ids, "#", min_tokens)
    assert serve_steps(tokenizer, ids, [3], params) == expected
    if min_tokens == 36:  # past the first '#': the stop is the second one
        assert expected[0].count("#") == 1


def test_without_a_stop_the_finished_text_is_the_whole_decode(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    text, kept = serve_steps(tokenizer, ids, [1], SamplingParams(max_new_tokens=64, stop=["never there"]))
    assert text == TEXT and kept == ids

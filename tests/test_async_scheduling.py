"""Async scheduling (issue 39, item 2): the host launches each step before reading the one before it.

On a CPU the device work runs as it is launched, so these tests check the bookkeeping that a GPU
relies on: every request decodes exactly what reading each step at once decodes (tokens,
acceptance lengths, finish reasons), greedy and seeded sampling; the host really is one step
behind; a request that ends while a step is in flight loses nothing and leaks nothing of that step;
no step is launched whose positions could pass the end of its cache slot.
"""

from __future__ import annotations

import pytest
import torch

from trtllm_dflash import DFlashPipeline, decoding
from trtllm_dflash.decoding import Decoder, Request, SamplingParams
from trtllm_dflash.runtime.prefix_cache import PrefixCache

LIMITS = [12, 40, 7, 60, 25, 33]  # rows finish at different steps, one by the context (max_context 60)


@pytest.fixture(scope="module")
def pair(trained_pair):
    target_dir, drafter_dir, prompts = trained_pair
    dflash = DFlashPipeline.load(target_dir, drafter_dir, dtype=torch.float64)
    more = [p[::-1] for p in prompts[:2]]  # six prompts for three slots: requests queue and join
    return dflash, target_dir, prompts + more


def _requests(prompts, temperature: float) -> list[Request]:
    return [Request(p, SamplingParams(max_new_tokens=n, temperature=temperature, seed=i)) for i, (p, n) in enumerate(zip(prompts, LIMITS))]


@pytest.fixture
def launches(monkeypatch):
    """Every step the decoding loop launches, each checked first: its span within the cache's capacity."""
    seen = []
    launch = decoding.launch_step

    def recording(runtime, batch, slots, span, *args):
        assert span <= runtime.capacity, (span, runtime.capacity)
        launched = launch(runtime, batch, slots, span, *args)
        seen.append(launched)
        return launched

    monkeypatch.setattr(decoding, "launch_step", recording)
    return seen


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_async_scheduling_decodes_what_reading_each_step_at_once_decodes(pair, launches, temperature):
    dflash, target_dir, prompts = pair
    results = {}
    for overlap in (False, True):
        decoder = Decoder(dflash.runtime, max_batch=3, max_context=60, prefill_chunk=8, async_scheduling=overlap)
        results[overlap] = decoder.generate(_requests(prompts, temperature))
        assert not decoder.has_work and not decoder.in_flight
    for at_once, overlapped in zip(results[False], results[True]):
        assert overlapped.token_ids == at_once.token_ids
        assert overlapped.acceptance_lengths == at_once.acceptance_lengths
        assert overlapped.draft_lengths == at_once.draft_lengths
        assert overlapped.finish_reason == at_once.finish_reason
        assert len(overlapped.token_ids) == 1 + sum(overlapped.acceptance_lengths)
    assert [r.finish_reason for r in results[True]] == ["length"] * 3 + ["context"] + ["length"] * 2
    assert max(a for r in results[True] for a in r.acceptance_lengths) > 3  # the drafts land: blocks are really verified
    if temperature == 0.0:  # and greedy is the target's own greedy output
        alone = DFlashPipeline.load(target_dir, None, dtype=torch.float64, max_context=60)
        expected = [e.token_ids[:n] for e, n in zip(alone.generate(prompts, max_new_tokens=60, stop_token_ids=()), LIMITS)]
        assert [r.token_ids for r in results[True]] == expected
        # and autoregressive decoding (a block of one) runs a step ahead just as well
        ar = Decoder(alone.runtime, max_batch=3, max_context=60, prefill_chunk=8, async_scheduling=True)
        assert [r.token_ids for r in ar.generate(_requests(prompts, 0.0))] == expected


def test_the_host_reads_each_step_one_step_later(pair, launches):
    dflash, _, prompts = pair
    decoder = Decoder(dflash.runtime, max_batch=2, max_context=128, async_scheduling=True)
    first, second = Request(prompts[0], SamplingParams(max_new_tokens=9)), Request(prompts[1], SamplingParams(max_new_tokens=40))
    for request in (first, second):
        decoder.submit(request)
    events = decoder.step()  # the prefill (both prompts) and the first step, launched and not read
    assert [len(e.new_token_ids) for e in events] == [1, 1] and decoder.in_flight and len(launches) == 1
    tokens = {event.request_id: list(event.new_token_ids) for event in events}  # the first tokens, from the prefill
    finished_at = None
    while decoder.has_work:
        read = launches[-1]  # the step this call reads is the one the call before launched
        events = decoder.step()
        expected = read.tokens()
        for event in events:
            row = [live.request.request_id for live in read.rows].index(event.request_id)
            assert expected[row][: len(event.new_token_ids)] == event.new_token_ids
            tokens[event.request_id] += event.new_token_ids
            if event.request_id == first.request_id and event.finished:
                finished_at = len(launches)
    # the first request finished in the step read by call k, after call k launched the next step with its row
    ids_per_launch = [[live.request.request_id for live in step.rows] for step in launches]
    assert first.request_id in ids_per_launch[finished_at - 1]
    assert all(first.request_id not in ids for ids in ids_per_launch[finished_at:])
    assert len(tokens[first.request_id]) == 9 and len(tokens[second.request_id]) == 40


def test_a_request_cancelled_while_its_step_is_in_flight_leaks_nothing_of_it(pair, launches):
    dflash, _, prompts = pair
    params = SamplingParams(max_new_tokens=40)
    free = Decoder(dflash.runtime, max_batch=2, max_context=128).generate([Request(p, params) for p in prompts[:2]])
    decoder = Decoder(dflash.runtime, max_batch=2, max_context=128, async_scheduling=True)
    ids = [decoder.submit(Request(p, params)) for p in prompts[:2]]
    delivered = {i: [] for i in ids}
    for _ in range(3):
        for event in decoder.step():
            delivered[event.request_id] += event.new_token_ids
    assert decoder.in_flight
    cancelled = decoder.cancel(ids[0])
    assert cancelled.finish_reason == "cancelled" and cancelled.token_ids == delivered[ids[0]]  # not the unread step's tokens
    assert free[0].token_ids[: len(cancelled.token_ids)] == cancelled.token_ids
    while decoder.has_work:
        for event in decoder.step():
            assert event.request_id == ids[1]  # the unread step's row of the cancelled request is dropped
            delivered[ids[1]] += event.new_token_ids
    assert delivered[ids[1]] == free[1].token_ids


def test_stop_tokens_and_the_prefix_cache_behave_as_reading_at_once(pair):
    dflash, _, prompts = pair
    free = dflash.generate(prompts[:1], max_new_tokens=48, stop_token_ids=())[0]
    stop = free.token_ids[len(free.token_ids) // 2]  # a token the request reaches mid-way
    params = SamplingParams(max_new_tokens=48, stop_token_ids=(stop,))
    outputs = {}
    for overlap in (False, True):
        cache = PrefixCache(1 << 30, block_tokens=4)
        decoder = Decoder(dflash.runtime, max_batch=2, max_context=128, prefix_cache=cache, async_scheduling=overlap)
        decoder.submit(Request(prompts[0], params, request_id="first"))
        # its prefill and first step: its prompt's blocks are stored once that step is read
        done = {e.request_id: e.result for e in decoder.step() if e.finished}
        # the same prompt joins: the step that prefills it reads the step in flight first, so it finds them
        decoder.submit(Request(prompts[0], params, request_id="second"))
        while decoder.has_work:
            done.update({e.request_id: e.result for e in decoder.step() if e.finished})
        outputs[overlap] = [done["first"], done["second"]]
    for at_once, overlapped in zip(outputs[False], outputs[True]):
        assert overlapped.token_ids == at_once.token_ids == free.token_ids[: free.token_ids.index(stop) + 1]
        assert overlapped.finish_reason == "stop"
        assert overlapped.cached_prompt_tokens == at_once.cached_prompt_tokens
    assert outputs[True][1].cached_prompt_tokens > 0


def test_grammar_rows_are_read_at_once_and_decode_as_without_async_scheduling():
    pytest.importorskip("xgrammar")
    from trtllm_dflash import demo
    from trtllm_dflash.contracts.grammar_spec import GrammarSpec

    dflash = DFlashPipeline.load(demo.target_dir(), demo.drafter_dir())
    spec = GrammarSpec("regex", r"[a-z_]+\(\d+\)")
    prompts = [dflash.encode(text) for text in ("def fib(n):", "class Stack:", "import os\n")]
    outputs = {}
    for overlap in (False, True):
        decoder = Decoder(dflash.runtime, max_batch=3, max_context=128, async_scheduling=overlap)
        free = SamplingParams(max_new_tokens=24, stop_token_ids=dflash.stop_token_ids)
        constrained = SamplingParams(max_new_tokens=24, stop_token_ids=dflash.stop_token_ids, grammar=spec)
        requests = [
            Request(prompts[0], free),
            Request(prompts[1], constrained, grammar=dflash.grammar_state(spec)),
            Request(prompts[2], free),
        ]
        outputs[overlap] = decoder.generate(requests)
    assert [r.token_ids for r in outputs[True]] == [r.token_ids for r in outputs[False]]
    assert [r.acceptance_lengths for r in outputs[True]] == [r.acceptance_lengths for r in outputs[False]]


def test_a_repository_written_with_async_scheduling_serves_streams_that_decode_the_same(tmp_path):
    """`dflash-trt repo --async-scheduling` reaches the served model's decoder, whose streams (one of
    them left by its client mid-way) carry the tokens that decoding alone gives."""
    import re

    from support import RecordingSink, cli, serve_until

    from trtllm_dflash.backends import open_served_pipeline
    from trtllm_dflash.served_model.batching_loop import BatchingLoop
    from trtllm_dflash.served_model.model_parameters import ServingConfig
    from trtllm_dflash.served_model.protocol import GenerateInputs

    out = tmp_path / "repo"
    cli("repo", "--model", "demo", "--out", str(out), "--async-scheduling", "--max-context", "128")
    parameters = dict(re.findall(r'key: "(\w+)"\s*value: \{\s*string_value: "([^"]*)"', (out / "dflash" / "config.pbtxt").read_text()))
    config = ServingConfig.from_parameters(parameters)
    assert config.async_scheduling is True and ServingConfig(target="x").async_scheduling is False
    engine = BatchingLoop(config, open_served_pipeline(config))
    assert engine.decoder.async_scheduling
    stays, leaves = RecordingSink(), RecordingSink(leave_after=2)
    params = SamplingParams(max_new_tokens=32)
    engine.accept(GenerateInputs("def fib(n):", params, streaming=True), stays)
    engine.accept(GenerateInputs("import os\n", params, streaming=True), leaves)
    serve_until(engine, lambda: stays.finished and bool(leaves.errors))
    reference = engine.pipeline.generate(["def fib(n):", "import os\n"], max_new_tokens=32)
    assert [int(t) for r in stays.responses for t in r[0]["output_ids"]] == reference[0].token_ids
    left = [int(t) for r in leaves.responses for t in r[0]["output_ids"]]
    assert left == reference[1].token_ids[: len(left)] and leaves.errors == ["request cancelled"]
    assert not engine.jobs


def test_a_launched_step_reads_nothing_back_outside_the_runtime_s_passes(pair, monkeypatch):
    """On a GPU any read of a tensor's value waits for the device and would stop the host from running
    ahead. The runtime's passes are graphs and kernels there (checked by their capture); everything
    else a step launches (the block, the draft head's sampling, the commit, the read-back, the batch's
    advance) must read nothing. Python's conversions of a tensor are trapped while a step is launched,
    except inside the passes, for greedy and sampled rows (top-k, top-p) decoding together."""
    dflash, _, prompts = pair
    runtime = dflash.runtime
    rows = [SamplingParams(max_new_tokens=40), SamplingParams(max_new_tokens=48, temperature=0.8, top_k=6, top_p=0.9, seed=3)]
    rows.append(SamplingParams(max_new_tokens=32, temperature=1.1, seed=4))
    expected = Decoder(runtime, max_batch=3, max_context=128).generate([Request(p, r) for p, r in zip(prompts, rows)])
    armed = [False]

    def trapped(original):
        def read(self, *args, **kwargs):
            if armed[0]:
                raise AssertionError("a launched step read a tensor's value on the host")
            return original(self, *args, **kwargs)

        return read

    def unarmed(method):
        def run(*args, **kwargs):
            was, armed[0] = armed[0], False
            try:
                return method(*args, **kwargs)
            finally:
                armed[0] = was

        return run

    launch = decoding.launch_step

    def armed_launch(*args, **kwargs):
        armed[0] = True
        try:
            return launch(*args, **kwargs)
        finally:
            armed[0] = False

    for name in ("__bool__", "__int__", "__index__", "__float__", "item", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, trapped(getattr(torch.Tensor, name)))
    for name in ("draft_forward", "target_forward", "verify"):
        monkeypatch.setattr(runtime, name, unarmed(getattr(runtime, name)))
    monkeypatch.setattr(decoding, "launch_step", armed_launch)
    decoder = Decoder(runtime, max_batch=3, max_context=128, async_scheduling=True)
    results = decoder.generate([Request(p, r) for p, r in zip(prompts, rows)])
    monkeypatch.undo()
    assert [r.token_ids for r in results] == [r.token_ids for r in expected]
    assert len(decoder.stats) > 4  # steps launched with the trap armed


def test_a_real_tritonserver_serves_an_async_scheduled_repository_with_the_offline_tokens(tmp_path):
    """As users run it: `dflash-trt repo --async-scheduling`, a real tritonserver, concurrent streams
    over HTTP and gRPC (more than the batch holds, of different lengths), each the offline tokens."""
    from support import cli, concurrent_completions, triton_server

    from trtllm_dflash import demo
    from trtllm_dflash.serving.client import DFlashClient

    out = tmp_path / "repo"
    repo_args = ["--out", str(out), "--async-scheduling", "--baseline", "", "--max-context", "256", "--max-batch", "4", "--threads", "1"]
    cli("repo", "--model", "demo", *repo_args)
    prompts = ["def fib(n):", "import os\n", "class Stack:", "for i in range(", "x = [", "while True:"]
    lengths = [8 + 9 * i for i in range(len(prompts))]  # six requests for four slots, leaving at different steps
    pipeline = DFlashPipeline.load(demo.target_dir(), demo.drafter_dir())
    expected = pipeline.generate(prompts, max_new_tokens=max(lengths))
    with triton_server(out) as server:
        client = DFlashClient(server.endpoints.http, model="dflash", grpc_url=server.endpoints.grpc, timeout=300)
        results = concurrent_completions(client, prompts, lengths)
    for i, reference in enumerate(expected):
        assert results[i].token_ids == reference.token_ids[: lengths[i]], f"request {i}"

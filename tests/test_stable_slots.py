"""Stable slots (runtime/base.py `Slots`): a request keeps one cache slot from admission to finish.

What is checked: a request's slot never changes; no pass writes into a slot outside its batch; a
finished, cancelled or reordered request moves no other request's cache (each live request's
committed positions stay bit-identical through every step); batches whose slots have gaps decode
exactly what each request decodes alone (dense and hybrid targets, greedy and seeded); and the
slot bookkeeping itself (runs, the lowest free slot first).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trtllm_dflash.checkpoints import load_drafter, load_target
from trtllm_dflash.decoding import Decoder, Request, SamplingParams
from trtllm_dflash.runtime.base import Slots
from trtllm_dflash.runtime.torch_runtime import TorchRuntime
from trtllm_dflash.testing.tiny import cycle_sequences

GREEDY = SamplingParams(max_new_tokens=24)
SEEDED = SamplingParams(max_new_tokens=24, temperature=0.8, top_p=0.95, seed=5)


def test_slots_runs_and_selection():
    slots = Slots.of([0, 1, 2, 5, 6, 3])
    assert slots.run is None and slots.index.tolist() == [0, 1, 2, 5, 6, 3]
    assert slots.runs() == [(slice(0, 3), slice(0, 3)), (slice(3, 5), slice(5, 7)), (slice(5, 6), slice(3, 4))]
    assert [part.ids for _, part in slots.parts()] == [(0, 1, 2), (5, 6), (3,)]
    assert Slots.of(slice(2, 5)).ids == (2, 3, 4) and Slots.of(slice(2, 5)).select == slice(2, 5)
    buffer = torch.zeros(7, 4)
    slots.write(buffer, torch.tensor([[1]] * 6), torch.arange(6.0).view(6, 1, 1).view(6, 1))
    assert buffer[:, 1].tolist() == [0.0, 1.0, 2.0, 5.0, 0.0, 3.0, 4.0]  # batch row r lands in slot ids[r]


@pytest.fixture(scope="module")
def pair(trained_pair):
    target_dir, drafter_dir, _ = trained_pair
    target = load_target(target_dir, dtype=torch.float32)
    runtime = TorchRuntime(target.model, load_drafter(drafter_dir, target))
    prompts = [cycle_sequences(1, n, torch.Generator().manual_seed(n))[0].tolist() for n in (21, 9, 33, 14, 17)]
    return runtime, prompts


class SlotWatch:
    """Wraps a runtime's passes: every slot outside a pass's batch must be bit-identical after it."""

    def __init__(self, runtime) -> None:
        self.runtime, self.passes, self.gapped = runtime, 0, 0
        for name in ("target_verify", "propose"):
            setattr(self, name, self._watched(getattr(runtime, name)))

    def __getattr__(self, name):
        return getattr(self.runtime, name)

    def _caches(self):
        caches = [self.runtime.target_cache, self.runtime.draft_cache]
        return [t for cache in caches for layer in cache.layers if layer.keys is not None for t in (layer.keys, layer.values)]

    def _watched(self, method):
        def run(slots, *args, **kwargs):
            slots = Slots.of(slots)
            others = [s for s in range(self.runtime.max_batch) if s not in slots.ids]
            before = [t[others].clone() for t in self._caches()]
            out = method(slots, *args, **kwargs)
            assert all(torch.equal(b, t[others]) for b, t in zip(before, self._caches())), f"a pass over {slots.ids} wrote elsewhere"
            self.passes += 1
            self.gapped += slots.run is None
            return out

        return run


def _alone(runtime, prompts, params) -> list[tuple[list[int], list[int]]]:
    """Tokens and acceptance lengths of each prompt decoded by itself."""
    results = [Decoder(runtime, max_batch=1, max_context=160).generate([Request(p, params)])[0] for p in prompts]
    return [(r.token_ids, r.acceptance_lengths) for r in results]


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_finishes_cancels_and_joins_move_no_other_requests_cache(pair, params):
    """Requests of different lengths finish at different times, one is cancelled mid-decode, new ones
    join the freed low slots while higher ones decode (batches with gaps): every request keeps its
    slot, its committed K/V never change while it lives, and it decodes exactly what it does alone."""
    runtime, prompts = pair
    watch = SlotWatch(runtime)
    decoder = Decoder(watch, max_batch=4, max_context=160)
    params = dataclasses.replace(params, max_new_tokens=40)
    limits = [40, 6, 40, 40]
    ids = [decoder.submit(Request(p, dataclasses.replace(params, max_new_tokens=n))) for p, n in zip(prompts[:4], limits)]
    slot_of, done, cancelled, step = {}, {}, None, 0
    while decoder.has_work:
        committed = {  # each live request's committed positions, in its slot, before the step
            live.request.request_id: (live.slot, live.start, int(drafted), _slot_kv(runtime, live.slot, live.start, int(drafted)))
            for live, drafted in zip(decoder.live, decoder.batch.starts - decoder.batch.ctx_counts)
        }
        for event in decoder.step():
            if event.finished:
                done[event.request_id] = event.result
        step += 1
        if step == 2:  # cancel the third request mid-decode, and a fifth one joins behind the second's finish
            cancelled = ids[2]
            assert decoder.cancel(cancelled) is not None
            ids.append(decoder.submit(Request(prompts[4], params)))
        for live in decoder.live:
            request_id = live.request.request_id
            assert slot_of.setdefault(request_id, live.slot) == live.slot  # a request keeps its slot
            if request_id in committed:
                slot, start, drafted, kv = committed[request_id]
                assert all(torch.equal(a, b) for a, b in zip(kv, _slot_kv(runtime, slot, start, drafted))), "a committed prefix changed"
        assert [live.slot for live in decoder.live] == sorted(live.slot for live in decoder.live)  # the batch in slot order
    assert watch.gapped > 0 and watch.passes > watch.gapped  # gapped batches happened, and contiguous ones
    assert slot_of[ids[4]] == 1  # the fifth request took the lowest freed slot (the second's)
    expected = _alone(runtime, [prompts[0], prompts[1], prompts[3], prompts[4]], params)
    got = [(done[i].token_ids, done[i].acceptance_lengths) for i in (ids[0], ids[1], ids[3], ids[4])]
    assert [tokens for tokens, _ in got] == [tokens[:n] for (tokens, _), n in zip(expected, (40, 6, 40, 40))]
    # the acceptance lengths too, but for the request cut at 6 tokens (its last step is cut)
    assert [got[i][1] for i in (0, 2, 3)] == [expected[i][1] for i in (0, 2, 3)]
    assert cancelled not in done


def _slot_kv(runtime, slot: int, length: int, drafted: int) -> list[torch.Tensor]:
    """A slot's committed K/V: the target's first `length` positions, the drafter's first `drafted`
    (the drafter's context lags: a step appends the previous step's accepted positions)."""
    target = [
        t[slot, :length].clone() for layer in runtime.target_cache.layers if layer.keys is not None for t in (layer.keys, layer.values)
    ]
    return target + [t[slot, :drafted].clone() for layer in runtime.draft_cache.layers for t in (layer.keys, layer.values)]


def test_shortest_first_reorders_requests_not_caches(pair):
    """With a prefill share a short prompt overtakes a long one: the order of the prefilling requests
    changes, their slots and what is already in them do not."""
    runtime, prompts = pair
    decoder = Decoder(SlotWatch(runtime), max_batch=3, max_context=160, prefill_chunk=16, prefill_share=0.5)
    long_id = decoder.submit(Request(prompts[2], GREEDY))
    decoder.step()  # 16 of the 33-token prompt's tokens, in slot 0
    written = _slot_kv(runtime, 0, 16, 0)
    short_id = decoder.submit(Request(prompts[1], GREEDY))
    decoder.step()  # the 9-token prompt overtakes it and goes live from slot 1; the long one keeps slot 0
    assert [(live.request.request_id, live.slot) for live in decoder.live] == [(short_id, 1)]
    assert [(p.request.request_id, p.slot, p.done) for p in decoder.prefilling] == [(long_id, 0, 23)]
    assert all(torch.equal(a, b) for a, b in zip(written, _slot_kv(runtime, 0, 16, 0)))
    done = {}
    while decoder.has_work:
        done.update({e.request_id: e.result for e in decoder.step() if e.finished})
    expected = _alone(runtime, [prompts[2], prompts[1]], GREEDY)
    assert [(done[i].token_ids, done[i].acceptance_lengths) for i in (long_id, short_id)] == expected


def test_a_hybrid_target_decodes_a_gapped_batch_exactly(hybrid_trained_pair):
    """Linear-attention states are per slot too: a batch with a gap commits each row's state into its own slot."""
    target_dir, drafter_dir = hybrid_trained_pair
    target = load_target(target_dir, dtype=torch.float32)
    runtime = TorchRuntime(target.model, load_drafter(drafter_dir, target))
    prompts = [cycle_sequences(1, n, torch.Generator().manual_seed(n))[0].tolist() for n in (12, 7, 15)]
    watch = SlotWatch(runtime)
    results = Decoder(watch, max_batch=3, max_context=96).generate(
        [Request(p, SamplingParams(max_new_tokens=n)) for p, n in zip(prompts, (16, 3, 16))]
    )
    assert watch.gapped > 0  # the middle request finished first: slots 0 and 2 decoded together
    expected = _alone(runtime, prompts, SamplingParams(max_new_tokens=16))
    assert [r.token_ids for r in results] == [expected[0][0], expected[1][0][:3], expected[2][0]]

"""Prefix caching (runtime/prefix_cache.py): a prompt that starts with a prefix seen before restores
its target K/V, drafter context K/V and (hybrid targets) recurrent state instead of prefilling it,
and decodes exactly what a cold prefill decodes: the same tokens and the same acceptance lengths,
greedy and seeded sampling, dense and hybrid targets, alone, in batches with other prefixes, with
requests joining between steps, and after its prefix was evicted. The cache stays within its bytes.

The pairs are trained on two token cycles (testing/tiny.py make_cycle_pair), so drafts are
accepted in long, ragged runs and the acceptance lengths are a real check on the drafter's context.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trtllm_dflash.checkpoints import load_drafter, load_target
from trtllm_dflash.decoding import Decoder, Request, SamplingParams
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.runtime.prefix_cache import PrefixBlock, PrefixCache
from trtllm_dflash.testing.tiny import cycle_sequences

BLOCK = 8  # prefix-cache block (tokens)
NEW_TOKENS = 24
GREEDY = SamplingParams(max_new_tokens=NEW_TOKENS, stop_token_ids=())


def sampled(seed: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.9, top_p=0.95, seed=seed, stop_token_ids=())


def _prompts() -> tuple[list[list[int]], list[list[int]]]:
    """Two shared prefixes (35 and 29 tokens: not whole blocks) and suffixes of different lengths."""
    windows = cycle_sequences(6, 60, torch.Generator().manual_seed(7)).tolist()
    first, second = windows[0][:35], windows[1][:29]
    suffixes = [w[:n] for w, n in zip(windows[2:], (5, 12, 3, 9))]
    return [first + s for s in suffixes], [second + s for s in suffixes]


def _cold(runtime, requests: list[Request]) -> list:
    """Each request decoded alone, without a prefix cache (copies: a decoder numbers the requests it takes)."""
    return [Decoder(runtime, max_batch=1, max_context=160).generate([Request(r.prompt_ids, r.params)])[0] for r in requests]


def _same(warm, cold) -> None:
    assert warm.token_ids == cold.token_ids
    assert warm.acceptance_lengths == cold.acceptance_lengths


# whole prompts (prefill_chunk=0: one pass), and chunked prefill in chunks of 5 (a restored
# prefix, then several chunks, with a hybrid target's kept states falling inside chunks)
CHUNKS = pytest.mark.parametrize("chunk", [0, 5], ids=["whole", "chunks-of-5"])


@CHUNKS
@pytest.mark.parametrize("target", ["dense", "hybrid"])
@pytest.mark.parametrize("params", [GREEDY, sampled(11)], ids=["greedy", "sampled"])
def test_reused_prefix_decodes_like_a_cold_prefill(request, target, params, chunk):
    runtime = request.getfixturevalue(target)
    first, _ = _prompts()
    cold = _cold(runtime, [Request(p, params) for p in first[:3]])
    cache = PrefixCache(1 << 30, block_tokens=BLOCK)
    decoder = Decoder(runtime, max_batch=2, max_context=160, prefix_cache=cache, prefill_chunk=chunk)
    results = [decoder.generate([Request(p, params)])[0] for p in first[:3]]
    assert [r.cached_prompt_tokens for r in results] == [0, 32, 32]  # whole blocks of the 35 shared tokens
    assert any(max(r.acceptance_lengths) > 2 for r in results)  # the drafter's restored context drafts well
    for warm, reference in zip(results, cold):
        _same(warm, reference)
    again = decoder.generate([Request(first[1], params)])[0]  # 47 tokens: its own 5 whole blocks now
    assert again.cached_prompt_tokens == 40
    _same(again, cold[1])


@pytest.mark.parametrize("target", ["dense", "hybrid"])
def test_a_salt_shares_blocks_only_with_the_same_salt(request, target):
    """Issue 40 item 1: cache_salt is mixed into the root of the hash chain; requests with another
    salt (or none) restore nothing of a salted prompt's blocks, and decode exactly as cold."""
    runtime = request.getfixturevalue(target)
    first, _ = _prompts()
    cold = _cold(runtime, [Request(first[1], GREEDY)])[0]
    decoder = Decoder(runtime, max_batch=2, max_context=160, prefix_cache=PrefixCache(1 << 30, block_tokens=BLOCK))
    decoder.generate([Request(first[0], GREEDY, cache_salt="tenant-a")])
    results = {salt: decoder.generate([Request(first[1], GREEDY, cache_salt=salt)])[0] for salt in ("tenant-b", None, "tenant-a")}
    assert {salt: r.cached_prompt_tokens for salt, r in results.items()} == {"tenant-b": 0, None: 0, "tenant-a": 32}
    for result in results.values():
        _same(result, cold)
    names = PrefixCache(1, block_tokens=BLOCK).names
    assert len({tuple(names(first[0], 2, salt)) for salt in (None, "a", "b", "")}) == 4  # "" is a salt too, not None


@CHUNKS
@pytest.mark.parametrize("target", ["dense", "hybrid"])
def test_batches_of_different_prefixes_joining_between_steps(request, target, chunk):
    runtime = request.getfixturevalue(target)
    first, second = _prompts()
    params = [GREEDY, sampled(3), GREEDY, sampled(5)]
    requests = [Request(p, q) for p, q in zip(first, params)] + [Request(p, q) for p, q in zip(second, params)]
    cold = {tuple(r.prompt_ids): r for r in _cold(runtime, requests)}
    decoder = Decoder(runtime, max_batch=4, max_context=160, prefix_cache=PrefixCache(1 << 30, block_tokens=BLOCK), prefill_chunk=chunk)
    results = decoder.generate([requests[0], requests[4]])  # both prefixes, cold, in one batch
    later = requests[1:4] + requests[5:]
    for r in later[:2]:
        decoder.submit(r)
    steps = 0
    while decoder.has_work:  # the rest join while the first ones decode, rows of both prefixes side by side
        if steps == 2:
            for r in later[2:]:
                decoder.submit(r)
        results += [event.result for event in decoder.step() if event.finished]
        steps += 1
    assert len(results) == len(requests)
    restored = sorted(r.cached_prompt_tokens for r in results)
    # hybrid: the second prompt of the second prefix parts from the first one's blocks at 24 tokens, where
    # no state was kept yet: it prefills whole and keeps one there for the prompts after it
    if chunk and runtime.is_hybrid:
        # chunked, a prompt looks its prefix up at its first chunk: one of the second prefix's prompts starts
        # before the state at 24 tokens is stored, and prefills whole
        assert restored == [0, 0, 0, 0, 24, 32, 32, 32]
    else:
        assert restored == ([0, 0, 0, 24, 24, 32, 32, 32] if runtime.is_hybrid else [0, 0, 24, 24, 24, 32, 32, 32])
    for result in results:
        _same(result, cold[tuple(result.prompt_ids)])


@pytest.mark.parametrize("target", ["dense", "hybrid"])
def test_evicted_prefix_prefills_cold_and_the_bytes_stay_bounded(request, target):
    runtime = request.getfixturevalue(target)
    first, second = _prompts()
    cold = _cold(runtime, [Request(first[0], GREEDY), Request(second[0], GREEDY)])
    probe = PrefixCache(1 << 30, block_tokens=BLOCK)
    Decoder(runtime, max_batch=1, max_context=160, prefix_cache=probe).generate([Request(first[0], GREEDY)])
    one_prompt = probe.nbytes  # the blocks of one prompt
    cache = PrefixCache(one_prompt, block_tokens=BLOCK)  # room for one prompt's blocks, not two
    decoder = Decoder(runtime, max_batch=1, max_context=160, prefix_cache=cache)
    restored, sizes = [], []
    for prompt in (first[0], second[0], first[0], first[0]):
        result = decoder.generate([Request(prompt, GREEDY)])[0]
        restored.append(result.cached_prompt_tokens)
        sizes.append(cache.nbytes)
        _same(result, cold[0] if prompt is first[0] else cold[1])
    assert restored == [0, 0, 0, 32]  # the second prefix evicted the first: its next run prefilled it whole
    assert max(sizes) <= cache.capacity_bytes
    assert cache.stats.evicted_blocks == 8


def test_lru_keeps_roots_longest_and_never_exceeds_its_capacity():
    def block(start: int, state: bool = False) -> PrefixBlock:
        pair = (torch.zeros(BLOCK, 1, 4), torch.zeros(BLOCK, 1, 4))  # 256 bytes
        return PrefixBlock(start, start + BLOCK, [pair], None, {0: (torch.zeros(2),)} if state else None)

    cache = PrefixCache(3 * 256 + 10, block_tokens=BLOCK)
    tokens = list(range(4 * BLOCK + 1))
    names = cache.names(tokens, 4)
    assert cache.names(tokens[:BLOCK] + [99] * 3 * BLOCK, 2)[0] == names[0] and cache.names([99] * BLOCK, 1)[0] != names[0]
    assert cache.storable(4 * BLOCK + 1) == 4 and cache.storable(4 * BLOCK) == 3  # one token is always prefilled
    for i in reversed(range(4)):  # deepest first, as the decoder stores
        cache.insert(names[i], block(i * BLOCK))
        assert cache.nbytes <= cache.capacity_bytes
    assert names[3] not in cache and names[0] in cache  # the deepest went first
    assert [b.end for b in cache.match(tokens)] == [BLOCK, 2 * BLOCK, 3 * BLOCK]
    assert cache.match(tokens, needs_state=True) == []  # a hybrid prompt resumes only where a state was kept
    cache.insert(names[1], block(BLOCK, state=True))
    assert cache.nbytes <= cache.capacity_bytes
    assert [b.end for b in cache.match(tokens, needs_state=True)] == [BLOCK, 2 * BLOCK]
    cache.insert(b"x" * 16, PrefixBlock(0, BLOCK, [(torch.zeros(1000), torch.zeros(1000))]))  # larger than the cache
    assert b"x" * 16 not in cache and cache.nbytes <= cache.capacity_bytes


def test_a_drafter_with_a_bounded_history_is_refused(dense):
    config = dense.drafter_config
    dense.drafter_config = config.__class__(**{**config.__dict__, "sliding_window_size": 16})
    try:
        with pytest.raises(DFlashError, match="last 16 context positions"):
            Decoder(dense, max_batch=1, max_context=64, prefix_cache=PrefixCache(1 << 20))
    finally:
        dense.drafter_config = config


def test_served_model_reuses_prefixes_and_answers_as_offline(hybrid_trained_pair):
    """The serving loop (what the Triton model runs) with its prefix cache on: shared-prefix prompts,
    concurrent, decode what the same pipeline decodes offline without a cache."""
    import time

    from support import RecordingSink
    from transformers import AutoTokenizer

    from trtllm_dflash.backends import open_served_pipeline
    from trtllm_dflash.served_model.batching_loop import BatchingLoop
    from trtllm_dflash.served_model.model_parameters import ServingConfig
    from trtllm_dflash.served_model.protocol import GenerateInputs

    target_dir, drafter_dir = map(str, hybrid_trained_pair)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    first, _ = _prompts()
    texts = [tokenizer.decode(p) for p in first]
    config = ServingConfig(target=target_dir, drafter=drafter_dir, max_context=160, max_tokens=64, max_batch=4, prefix_cache_block=BLOCK)
    assert config.prefix_cache_mib > 0  # on by default
    loop = BatchingLoop(config, open_served_pipeline(config))
    sinks = [RecordingSink() for _ in texts]
    loop.accept(GenerateInputs(texts[0], SamplingParams(max_new_tokens=NEW_TOKENS)), sinks[0])
    loop.start()
    try:
        deadline = time.monotonic() + 120
        while not sinks[0].responses and time.monotonic() < deadline:  # the first stores the prefix ...
            time.sleep(0.02)
        for text, sink in zip(texts[1:], sinks[1:]):  # ... the others reuse it, joining together
            loop.accept(GenerateInputs(text, SamplingParams(max_new_tokens=NEW_TOKENS)), sink)
        while not all(s.responses for s in sinks) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        loop.stop()
    assert loop.decoder.prefix_cache.stats.hit_tokens >= 3 * 32
    offline = loop.pipeline.generate(texts, max_new_tokens=NEW_TOKENS)
    for sink, reference in zip(sinks, offline):
        ((outputs, final),) = sink.responses
        assert final and outputs["output_ids"].tolist() == reference.token_ids
        assert outputs["acceptance_lengths"].tolist() == reference.acceptance_lengths

    off = BatchingLoop(config.model_copy(update={"prefix_cache_mib": 0}), loop.pipeline)
    assert off.decoder.prefix_cache is None


def _graph_decodes(runtime, prompts: list[list[int]]) -> None:
    short = SamplingParams(max_new_tokens=12, stop_token_ids=())
    requests = [Request(p, q) for p, q in zip(prompts, [short, dataclasses.replace(sampled(2), max_new_tokens=12), short])]
    cold = _cold(runtime, requests)
    decoder = Decoder(runtime, max_batch=2, max_context=88, prefix_cache=PrefixCache(1 << 30, block_tokens=BLOCK))
    results = decoder.generate(requests[:1]) + decoder.generate(requests[1:])  # the last two restore in one batch
    assert [r.cached_prompt_tokens for r in results] == [0, 32, 32]
    for warm, reference in zip(results, cold):
        _same(warm, reference)


def test_graph_runtime_reuses_prefixes(demo_build):
    """The exported graphs (what the engines are built from, on CPU): their caches are slot == position
    like the torch runtime's, so a prefill that starts after a restored prefix gives the cold tokens."""
    from transformers import AutoTokenizer

    from trtllm_dflash import demo
    from trtllm_dflash.runtime.onnx_runtime import OnnxRuntime

    runtime = OnnxRuntime(demo_build / "export", "native")
    assert runtime.prefix_cache_refusal() is None
    tokenizer = AutoTokenizer.from_pretrained(demo.target_dir())
    code = (
        "import os\nimport sys\nimport shutil\nimport argparse\n\n\n"
        'def main(argv):\n    """Copy or list the files named on the command line."""\n'
    )
    shared = tokenizer.encode(code)[:35]
    assert len(shared) == 35
    endings = ["    parser = argparse.ArgumentParser(", "    for name in argv[1:]:\n        if os.path.isdir(name):\n", "    if"]
    _graph_decodes(runtime, [shared + tokenizer.encode(e) for e in endings])


@pytest.mark.slow
def test_plugin_graph_runtime_reuses_prefixes(trained_pair, tmp_path):
    """The plugin target graph (caches updated in place, verification inside) on onnx.reference."""
    pytest.importorskip("onnxscript", reason="needs the export extra: pip install 'trtllm-dflash[export]'")
    from trtllm_dflash.builder.export import Bounds, export_pair
    from trtllm_dflash.runtime.onnx_runtime import OnnxRuntime

    target_dir, drafter_dir, _ = trained_pair
    target = load_target(target_dir, dtype=torch.float32)
    export_pair(target.model, load_drafter(drafter_dir, target), tmp_path, "fp32", Bounds(4, 64, 96, 8), ("plugin",))
    _graph_decodes(OnnxRuntime(tmp_path, "plugin"), _prompts()[0][:3])


def test_the_planner_counts_the_prefix_cache():
    from trtllm_dflash.planning import MIB, plan_deployment
    from trtllm_dflash.planning.memory import drafter_kv_bytes_per_sequence, kv_bytes_per_sequence

    without = plan_deployment("qwen3-8b", "h100")
    plan = plan_deployment("qwen3-8b", "h100", prefix_cache_mib=1024)
    assert without.budget.prefix_cache == 0 and without.prefix_cache_tokens == 0
    assert plan.budget.prefix_cache == 1024 * MIB
    assert plan.budget.fixed == without.budget.fixed + 1024 * MIB
    assert plan.budget.kv_cache < without.budget.kv_cache and plan.max_concurrency <= without.max_concurrency
    from trtllm_dflash.catalog.models import resolve_model

    model = resolve_model("qwen3-8b")
    per_token = kv_bytes_per_sequence(model, 1, plan.precision.kv_cache, 1) + drafter_kv_bytes_per_sequence(
        model, 1, plan.precision.kv_cache
    )
    assert plan.prefix_cache_tokens == 1024 * MIB // per_token
    hybrid = plan_deployment("qwen3.5-27b", "h200"), plan_deployment("qwen3.5-27b", "h200", prefix_cache_mib=64)
    assert hybrid[1].linear_state_bytes_per_sequence > hybrid[0].linear_state_bytes_per_sequence > 0  # the kept states

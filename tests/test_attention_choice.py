"""The target's attention in decode passes, by choice or by measurement (runtime/attention_choice.py).

Every candidate must compute `reference_attention.target_attention` (per-row lengths, sliding windows, the
block written exactly into the caches); a candidate that computes something else is refused by the
check, not chosen; the runtime on any choice decodes the tokens and acceptance lengths of the op,
DFlash and autoregressive, greedy equal to the target alone; prefill never leaves the op. The flash
candidate needs CUDA: here it must be refused with that reason (tests/test_kernel_choice_gpu.py
runs it on a GPU).
"""

from __future__ import annotations

import pytest
import torch

from trtllm_dflash.checkpoints import load_drafter, load_target
from trtllm_dflash.decoding import Decoder, Request, SamplingParams
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.ops import reference_attention
from trtllm_dflash.runtime import attention_choice
from trtllm_dflash.runtime.torch_runtime import TorchRuntime
from trtllm_dflash.testing.tiny import make_tiny_drafter, make_tiny_target

CPU = torch.device("cpu")
SHAPE = attention_choice.LayerShape(heads=4, kv_heads=2, head_dim=16, value_dim=16, windows=(0, 5))


@pytest.mark.parametrize("tokens", [1, 4])
@pytest.mark.parametrize("window", [0, 3])
def test_the_sdpa_candidate_is_the_reference_attention(tokens, window):
    generator = torch.Generator().manual_seed(tokens + window)
    batch, capacity = 4, 24
    q = torch.randn(batch, tokens, 4, 16, generator=generator)
    k, v = (torch.randn(batch, tokens, 2, 16, generator=generator) for _ in range(2))
    k_cache, v_cache = (torch.randn(batch, capacity, 2, 16, generator=generator) for _ in range(2))
    # an empty row, a middle one, one ending at the capacity, a graph's padding row (at the capacity)
    starts = torch.tensor([0, 7, capacity - tokens, capacity])
    want_k, want_v = k_cache.clone(), v_cache.clone()
    want = reference_attention.target_attention(q, k, v, want_k, want_v, starts, None, 0.25, window)
    got = attention_choice.RUNNERS["sdpa"](q, k, v, k_cache, v_cache, starts, None, 0.25, window, span=capacity)
    torch.testing.assert_close(got[:3], want[:3], atol=1e-5, rtol=1e-5)  # a padding row's output is discarded
    # the padding row wrote only its row's last slot (BlockPlace), which nothing reads before a request writes it
    assert torch.equal(k_cache[:, :-1], want_k[:, :-1]) and torch.equal(v_cache[:, :-1], want_v[:, :-1])
    assert torch.equal(k_cache[:3], want_k[:3]) and torch.equal(v_cache[:3], want_v[:3])


def test_the_check_passes_the_exact_candidates_and_names_why_flash_cannot_run_here():
    assert attention_choice.check("dflash", SHAPE, 3, 4, 40, torch.float32, CPU) is None
    assert attention_choice.check("sdpa", SHAPE, 3, 4, 40, torch.float32, CPU) is None
    assert attention_choice.check("flash", SHAPE, 3, 4, 40, torch.float32, CPU) == "flash attention needs CUDA"
    with_sinks = attention_choice.LayerShape(4, 2, 16, 16, (0,), sinks=True)
    assert attention_choice.check("sdpa", with_sinks, 2, 4, 40, torch.float32, CPU) == "SDPA has no attention sinks"
    assert attention_choice.check("dflash", with_sinks, 2, 4, 40, torch.float32, CPU) is None


def test_a_candidate_that_computes_other_attention_is_refused_not_chosen(monkeypatch):
    """Mutations of the sdpa candidate: ignoring the window, and dropping the cache write."""
    exact = attention_choice.RUNNERS["sdpa"]
    monkeypatch.setitem(attention_choice.RUNNERS, "sdpa", lambda *args, **k: exact(*args[:8], 0, **k))  # no window
    assert "differs from the reference" in attention_choice.check("sdpa", SHAPE, 3, 4, 40, torch.float32, CPU)
    choice = attention_choice.measure_one([SHAPE], 4, 2, 64, torch.float32, CPU)
    assert choice.chosen == "dflash"
    assert {t.candidate: t.ms is None for t in choice.timings} == {"dflash": False, "flash": True, "sdpa": True}

    def no_write(q, k, v, k_cache, v_cache, starts, sinks, scale, window=0, **pass_args):
        return exact(q, k, v, k_cache.clone(), v_cache.clone(), starts, sinks, scale, window, **pass_args)

    monkeypatch.setitem(attention_choice.RUNNERS, "sdpa", no_write)
    assert "writes the caches differently" in attention_choice.check("sdpa", SHAPE, 3, 4, 40, torch.float32, CPU)

    def padding_block_written(q, k, v, k_cache, v_cache, starts, sinks, scale, window=0, **pass_args):
        """A graph's padding row writing its block at its row's last T slots, as before 2026-11-29."""
        capacity = k_cache.shape[1]
        starts = torch.where(starts >= capacity, capacity - q.shape[1], starts)
        return exact(q, k, v, k_cache, v_cache, starts, sinks, scale, window, span=pass_args.get("span"))

    monkeypatch.setitem(attention_choice.RUNNERS, "sdpa", padding_block_written)
    assert "writes the caches differently" in attention_choice.check("sdpa", SHAPE, 3, 4, 40, torch.float32, CPU)
    assert attention_choice.check("sdpa", SHAPE, 1, 4, 40, torch.float32, CPU) is None  # one row: no padding row


def test_measure_keeps_the_fastest_exact_candidate_per_tokens_and_batch_bucket():
    choices = attention_choice.measure([SHAPE], (1, 4), (1, 2, 4), 300, torch.float32, CPU)
    assert [(c.tokens, c.batch) for c in choices.choices] == [(1, 1), (1, 2), (1, 4), (4, 1), (4, 2), (4, 4)]
    for c in choices.choices:
        timed = {t.candidate: t.ms for t in c.timings if t.ms is not None}
        assert set(timed) == {"dflash", "sdpa"} and c.chosen == min(timed, key=timed.get)
        assert c.contexts == (256, 300 - c.tokens)  # the measured contexts stop at the capacity
    # a call takes the smallest bucket holding its rows; shapes not measured run the op
    assert choices.pick(4, 3) == choices.choices[5].chosen and choices.pick(1, 1) == choices.choices[0].chosen
    assert choices.pick(3, 1) == "dflash" and choices.pick(4, 5) == "dflash"
    assert "T=4 b<=4" in choices.describe()


def test_candidates_are_timed_on_caches_of_the_runtimes_capacity_at_each_contexts_span(monkeypatch):
    """Each context is timed in a cache of the runtime's capacity (the op sizes its KV splits for
    it) with the span a decode pass gives it (SDPA on CUDA reads the span's bucket), as the decode
    passes meet it, not in a cache the context's size."""
    seen = []
    for name in ("dflash", "sdpa"):
        run = attention_choice.RUNNERS[name]
        record = lambda *a, _name=name, _run=run, **k: seen.append((_name, a[3].shape[1], int(a[5][0]), k.get("span"))) or _run(*a, **k)  # noqa: E731
        monkeypatch.setitem(attention_choice.RUNNERS, name, record)
    choice = attention_choice.measure_one([SHAPE], 1, 1, 5000, torch.float32, CPU)
    assert choice.contexts == (256, 1024, 4096)
    timed = {(name, start, span) for name, capacity, start, span in seen if capacity == 5000}
    assert timed == {(name, context, context + 1) for name in ("dflash", "sdpa") for context in choice.contexts}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    target_dir = make_tiny_target(root / "target", "qwen3", seed=5)
    drafter_dir = make_tiny_drafter(root / "drafter", target_dir, seed=2, block_size=4, target_layer_ids=(1, 2))
    target = load_target(target_dir, dtype=torch.float32)
    return target, load_drafter(drafter_dir, target)


def decode(runtime, prompts, params, max_batch=4):
    decoder = Decoder(runtime, max_batch=max_batch, max_context=64)
    return [(r.token_ids, r.acceptance_lengths) for r in decoder.generate([Request(p, s) for p, s in zip(prompts, params)])]


@pytest.mark.parametrize("choice", ["sdpa", "measure"])
def test_the_runtime_on_a_chosen_kernel_decodes_like_the_op(pair, choice, monkeypatch):
    target, drafter = pair
    calls = []
    for name in ("dflash", "sdpa"):
        runner = attention_choice.RUNNERS[name]
        monkeypatch.setitem(
            attention_choice.RUNNERS, name, lambda *a, _name=name, _run=runner, **k: calls.append((_name, a[0].shape[1])) or _run(*a, **k)
        )
    op = TorchRuntime(target.model, drafter, attention="dflash")
    chosen = TorchRuntime(target.model, drafter, attention="dflash", attention_choice=choice)
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, op.vocab_size, (n,), generator=generator).tolist() for n in (2, 13, 7, 19)]
    greedy = [SamplingParams(max_new_tokens=24)] * 4
    sampled = [SamplingParams(max_new_tokens=16, temperature=0.9, top_k=30 * (i % 2), seed=i) for i in range(4)]
    for params in (greedy, sampled):
        reference_run = decode(op, prompts, params)
        calls.clear()  # from here on only the chosen runtime's calls
        assert decode(chosen, prompts, params) == reference_run
        decode_calls = [name for name, tokens in calls if tokens in (1, 4)]
        wanted = {chosen.attention_choices.pick(t, b) for t in (1, 4) for b in (1, 2, 4)}
        assert set(decode_calls) <= wanted | {"dflash"} and set(decode_calls) & wanted  # the chosen kernels ran
    if choice == "measure":
        assert [(c.tokens, c.batch) for c in chosen.attention_choices.choices] == [(1, 1), (1, 2), (1, 4), (4, 1), (4, 2), (4, 4)]
    else:
        assert "sdpa" in {name for name, _ in calls}
    # the target alone, autoregressive through the chosen kernel and on the model's own attention: the same greedy tokens
    alone = TorchRuntime(target.model, attention="dflash", attention_choice=choice)
    own = TorchRuntime(target.model, attention="hf")
    plain = [tokens for tokens, _ in decode(alone, prompts, greedy)]
    assert plain == [tokens for tokens, _ in decode(own, prompts, greedy)] == [tokens for tokens, _ in decode(op, prompts, greedy)]
    assert {name for name, tokens in calls if tokens == 1} & {alone.attention_choices.pick(1, b) for b in (1, 2, 4)}


def test_prefill_runs_the_op_whatever_was_chosen(pair, monkeypatch):
    """A prefill's padded rows may pass the capacity; only the op's write drops those slots."""
    target, drafter = pair
    runtime = TorchRuntime(target.model, drafter, attention="dflash", attention_choice="sdpa")
    calls = []
    sdpa = attention_choice.RUNNERS["sdpa"]
    monkeypatch.setitem(attention_choice.RUNNERS, "sdpa", lambda *a, **k: calls.append(a[0].shape[1]) or sdpa(*a, **k))
    decode(runtime, [[5, 6, 7, 8, 9, 10, 11]], [SamplingParams(max_new_tokens=3)], max_batch=1)
    assert calls and 7 not in calls and set(calls) <= {1, 4}


def test_bad_choices_are_one_line_errors(pair):
    target, drafter = pair
    with pytest.raises(DFlashError, match="unknown attention_choice 'fast'"):
        TorchRuntime(target.model, drafter, attention="dflash", attention_choice="fast")
    with pytest.raises(DFlashError, match="attention='hf'") as error:
        TorchRuntime(target.model, drafter, attention="hf", attention_choice="measure")
    assert "\n" not in str(error.value)
    runtime = TorchRuntime(target.model, drafter, attention="dflash", attention_choice="flash")
    with pytest.raises(DFlashError, match="flash attention needs CUDA") as error:
        runtime.allocate(2, 64)
    assert "\n" not in str(error.value) and "attention_choice='dflash'" in str(error.value)


def test_auto_takes_the_op_path_when_a_kernel_is_chosen_and_graphs_only_where_they_run(pair):
    target, drafter = pair
    assert TorchRuntime(target.model, drafter).attention == "hf"  # on a CPU
    runtime = TorchRuntime(target.model, drafter, attention_choice="sdpa", cuda_graphs=None)
    assert runtime.attention == "dflash" and runtime.cuda_graphs is None  # no CUDA here: no graphs, no error


def test_a_repository_written_with_an_attention_choice_serves_it(tmp_path, monkeypatch):
    """`dflash-trt repo --attention-choice measure --verify-choice measure --no-cuda-graphs` reaches the
    served runtime, which measures at load (the spread verification refused: no kernels here) and
    streams the tokens of the default pipeline; engines refuse the options."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    import re

    from support import RecordingSink, cli, invoke, serve_until

    from trtllm_dflash.backends import open_served_pipeline
    from trtllm_dflash.served_model.batching_loop import BatchingLoop
    from trtllm_dflash.served_model.model_parameters import ServingConfig
    from trtllm_dflash.served_model.protocol import GenerateInputs

    out = tmp_path / "repo"
    flags = ["--attention-choice", "measure", "--verify-choice", "measure", "--linear-choice", "measure", "--no-cuda-graphs"]
    flags += ["--dependent-launch", "--max-context", "96", "--max-batch", "2"]
    cli("repo", "--model", "demo", "--out", str(out), *flags)
    parameters = dict(re.findall(r'key: "(\w+)"\s*value: \{\s*string_value: "([^"]*)"', (out / "dflash" / "config.pbtxt").read_text()))
    config = ServingConfig.from_parameters(parameters)
    assert (config.attention_choice, config.verify_choice, config.linear_choice, config.cuda_graphs) == ("measure",) * 3 + (False,)
    assert ServingConfig(target="x").cuda_graphs is None and ServingConfig(target="x").attention_choice == "dflash"
    assert config.dependent_launch and not ServingConfig(target="x").dependent_launch
    engine = BatchingLoop(config, open_served_pipeline(config))
    runtime = engine.pipeline.runtime
    assert runtime.dependent_launch  # asked for; off a Hopper GPU no launch changes (ops/kernels/dependent_launch.py)
    block = runtime.drafter_config.block_size
    assert [(c.tokens, c.batch, c.kind, c.chosen) for c in runtime.verify_choices.choices] == [
        (block, batch, kind, "positions") for batch in (1, 2) for kind in ("top-k", "other")
    ]
    assert runtime.attention == "dflash"
    assert [(c.tokens, c.batch) for c in runtime.attention_choices.choices] == [(1, 1), (1, 2), (block, 1), (block, 2)]
    # the projections measured at each bucket's AR and verify rows; off CUDA cuBLAS's stand-in keeps them
    assert {c.rows for c in runtime.linear_choices.choices} == {1, 2, block, 2 * block}
    assert all(c.chosen == "torch" and "needs CUDA" in c.refused for c in runtime.linear_choices.choices)
    sink = RecordingSink()
    engine.accept(GenerateInputs("def fib(n):", SamplingParams(max_new_tokens=24), streaming=True), sink)
    serve_until(engine, lambda: sink.finished)
    from trtllm_dflash import demo
    from trtllm_dflash.api import DFlashPipeline

    reference = DFlashPipeline.load(demo.target_dir(), demo.drafter_dir()).generate(["def fib(n):"], max_new_tokens=24)
    assert [int(t) for r in sink.responses for t in r[0]["output_ids"]] == reference[0].token_ids
    with pytest.raises(DFlashError, match="options of the torch backend"):
        ServingConfig.from_parameters({"target": "x", "backend": "trt", "engines": "e", "attention_choice": "flash"})
    with pytest.raises(DFlashError, match="options of the torch backend"):
        ServingConfig.from_parameters({"target": "x", "backend": "trt", "engines": "e", "dependent_launch": "true"})
    bad = invoke("repo", "--model", "demo", "--out", str(tmp_path / "bad"), "--attention-choice", "fastest")
    assert isinstance(bad.exception, DFlashError) and "attention_choice: Input should be 'dflash'" in str(bad.exception)
    assert not (tmp_path / "bad").exists()


def test_generate_takes_the_choice_for_target_models_only(tmp_path):
    import json

    from support import cli, invoke

    args = ["generate", "--target", "demo", "--drafter", "demo", "-p", "def fib(n):", "-n", "16", "--json"]
    default, measured = (json.loads(cli(*args, *extra).strip().splitlines()[-1]) for extra in ([], ["--attention-choice", "measure"]))
    assert measured["token_ids"] == default["token_ids"] and measured["acceptance_lengths"] == default["acceptance_lengths"]
    for flag in (["--attention-choice", "flash"], ["--dependent-launch"]):
        refused = invoke("generate", "--onnx", str(tmp_path), "-p", "x", *flag)
        assert isinstance(refused.exception, DFlashError) and "options of --target models" in str(refused.exception), flag


@pytest.mark.parametrize("window", [0, 128])
def test_the_flash_call_fits_torchs_op_schema_and_output_shape(window):
    """The GPU-only flash call checked against torch's own shape function (meta tensors, no kernel runs):
    argument names and order, GQA heads, the output's layout."""
    from trtllm_dflash.ops import flash

    q = torch.empty(3, 16, 32, 128, device="meta", dtype=torch.bfloat16)
    k_cache = torch.empty(3, 1040, 8, 128, device="meta", dtype=torch.bfloat16)
    used = torch.empty(3, device="meta", dtype=torch.int64)
    out = flash.attend(q, k_cache, k_cache, used, 128**-0.5, window)
    assert out.shape == q.shape and out.dtype == q.dtype


def test_repositories_of_engines_refuse_the_torch_runtime_options(tmp_path):
    from support import invoke

    refused = invoke(
        "repo", "--build", str(tmp_path / "build"), "--out", str(tmp_path / "repo"), "--attention-choice", "measure", "--no-cuda-graphs"
    )
    assert isinstance(refused.exception, DFlashError)
    assert "--cuda-graphs, --attention-choice are options of the torch runtime, which --build does not use" in str(refused.exception)
    assert not (tmp_path / "repo").exists()


def test_a_pass_places_its_blocks_once_for_all_its_layers():
    """Where each row writes (and SDPA's mask) depends only on the pass's starts: the runtime hands
    each decode pass one memo, so its layers' attention calls share one BlockPlace."""
    generator = torch.Generator().manual_seed(6)
    q = torch.randn(2, 4, 4, 16, generator=generator)
    k, v = (torch.randn(2, 4, 2, 16, generator=generator) for _ in range(2))
    caches = [tuple(torch.randn(2, 24, 2, 16, generator=generator) for _ in range(2)) for _ in range(3)]  # three layers
    starts, memo = torch.tensor([5, 24]), {}
    sdpa = attention_choice.AttentionChoices(fixed="sdpa")
    outs = [sdpa.attend(q, k, v, kc, vc, starts, None, 0.25, 0, span=9, memo=memo) for kc, vc in caches]
    (place,) = memo.values()
    assert place.slots.tolist() == [[5, 6, 7, 8], [23, 23, 23, 23]] and place.live.view(-1).tolist() == [True, False]
    for (kc, vc), out in zip(caches, outs):
        alone = attention_choice.RUNNERS["sdpa"](q[:1], k[:1], v[:1], kc[:1].clone(), vc[:1].clone(), starts[:1], None, 0.25)
        torch.testing.assert_close(out[:1], alone, atol=1e-6, rtol=1e-6)

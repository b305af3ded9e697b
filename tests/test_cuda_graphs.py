"""CUDA-graph step replay of the torch runtime, the parts that run without a GPU.

The capture itself needs CUDA (tests/test_cuda_graphs_gpu.py). Here: the refusal off CUDA, the
bucket arithmetic, and the replay bookkeeping (static buffers, padding rows, span buckets, eager
fallbacks) with `capture` swapped for a stand-in that re-runs the pass into the same output
buffers. So what is checked here is everything around the graph, not the graph.
"""

from __future__ import annotations

import pytest
import torch

from trtllm_dflash.checkpoints import load_drafter, load_target
from trtllm_dflash.decoding import Decoder, Request, SamplingParams
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.runtime import cuda_graphs
from trtllm_dflash.runtime.torch_runtime import TorchRuntime


def test_cuda_graphs_are_refused_off_cuda_in_one_line(tiny_qwen3):
    target = load_target(tiny_qwen3, dtype=torch.float32)
    with pytest.raises(DFlashError) as error:
        TorchRuntime(target.model, cuda_graphs=True)
    message = str(error.value)
    assert "CUDA graphs need the model on a CUDA device" in message and "cpu" in message
    assert "\n" not in message


def test_batch_and_span_buckets():
    assert cuda_graphs.batch_buckets(1) == (1,)
    assert cuda_graphs.batch_buckets(8) == (1, 2, 4, 8)
    assert cuda_graphs.batch_buckets(12) == (1, 2, 4, 8, 12)
    assert cuda_graphs.bucket_for(3, (1, 2, 4, 8)) == 4
    assert cuda_graphs.bucket_for(9, (1, 2, 4, 8)) is None
    assert cuda_graphs.span_bucket(17, 4096) == cuda_graphs.MIN_SPAN
    assert cuda_graphs.span_bucket(300, 4096) == 512
    assert cuda_graphs.span_bucket(512, 4096) == 512
    assert cuda_graphs.span_bucket(3000, 3010) == 3010


def _decode(runtime: TorchRuntime, max_batch: int, async_scheduling: bool = False) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    lengths, new_tokens = (5, 11, 3, 9, 6), (20, 9, 14, 20, 5)  # rows finish at different steps
    requests = [
        Request(torch.randint(3, 100, (n,), generator=g).tolist(), SamplingParams(max_new_tokens=m)) for n, m in zip(lengths, new_tokens)
    ]
    # max_context 500: spans of ~30 slots round up to 256, so the replayed verify attends over more slots
    decoder = Decoder(runtime, max_batch=max_batch, max_context=500, async_scheduling=async_scheduling)
    return [r.token_ids for r in decoder.generate(requests)]


@pytest.mark.parametrize("speculative", [False, True], ids=["autoregressive", "dflash"])
def test_replayed_steps_give_the_eager_tokens(rerun_graphs, tiny_qwen3, tiny_qwen3_drafter, speculative):
    target = load_target(tiny_qwen3, dtype=torch.float32)
    drafter = load_drafter(tiny_qwen3_drafter, target=target) if speculative else None
    eager = _decode(TorchRuntime(target.model, drafter), max_batch=4)
    runtime = TorchRuntime(target.model, drafter, cuda_graphs=True)
    replayed = _decode(runtime, max_batch=4)
    assert replayed == eager
    counts = runtime.cuda_graphs.counts
    # 5 requests through 4 slots: the fifth joins a running batch, requests leave at different steps
    assert counts["replayed"] > counts["captured"] >= (2 if speculative else 1)
    assert counts["padded"] > 0  # 3 live requests replayed in the graph of 4
    assert counts["gapped"] > 0  # a request finished below others: its free slot padded the graph
    assert counts["eager"] >= 2  # the prefills (and the first draft after each)
    assert runtime.cuda_graphs.buckets == (1, 2, 4)
    # the host a step behind: a step's graph replays before the step before is read
    assert _decode(runtime, max_batch=4, async_scheduling=True) == eager


@pytest.mark.parametrize("choice", ["dflash", "sdpa"])
@pytest.mark.parametrize("speculative", [False, True], ids=["autoregressive", "dflash"])
def test_padding_rows_on_the_attention_op_read_nothing(rerun_graphs, tiny_qwen3, tiny_qwen3_drafter, speculative, choice, monkeypatch):
    """On the op (the GPU's default attention) or a kernel chosen for it, a graph's padding rows
    start at the capacity and the tokens are the eager ones. The op writes none of their slots
    (the last slots of every row stay as allocated: zeros); SDPA writes only a padding row's last
    slot. (On the model's own attention they write at the row's last slots: the test above.)"""
    from trtllm_dflash.runtime import attention_choice

    target = load_target(tiny_qwen3, dtype=torch.float32)
    drafter = load_drafter(tiny_qwen3_drafter, target=target) if speculative else None
    eager = _decode(TorchRuntime(target.model, drafter, attention="dflash"), max_batch=4)
    runtime = TorchRuntime(target.model, drafter, attention="dflash", cuda_graphs=True, attention_choice=choice)
    chosen = attention_choice.RUNNERS[choice]
    padding_rows = []

    def count(q, k, v, k_cache, v_cache, starts, *args, **kwargs):
        if k_cache.shape[1] == getattr(runtime, "capacity", None):  # a decode pass's call, not the choice's check
            padding_rows.append(int((starts >= k_cache.shape[1]).sum()))
        return chosen(q, k, v, k_cache, v_cache, starts, *args, **kwargs)

    monkeypatch.setitem(attention_choice.RUNNERS, choice, count)
    assert _decode(runtime, max_batch=4) == eager
    assert runtime.cuda_graphs.counts["padded"] > 0 and runtime.cuda_graphs.counts["gapped"] > 0
    assert sum(padding_rows) > 0  # the padded replays' rows reached the attention at the capacity
    half = runtime.capacity // 2
    for layer in runtime.target_cache.layers:  # requests of ~30 tokens in rows of 500+: only padding reaches there
        assert not layer.keys[:, half:-1].any() and not layer.values[:, half:-1].any()
        assert (choice == "sdpa") or not (layer.keys[:, -1].any() or layer.values[:, -1].any())


@pytest.mark.parametrize("choice", ["dflash", "sdpa"])
def test_one_verify_graph_serves_every_span_where_rows_read_their_own_length(rerun_graphs, tiny_qwen3, tiny_qwen3_drafter, choice):
    """A context growing past 256 slots: on the op (each row reads its own length) the verify pass
    keeps its one graph, keyed by the capacity; SDPA reads the span, so it gets a graph per span
    bucket. The tokens are the eager ones either way."""
    target = load_target(tiny_qwen3, dtype=torch.float32)
    drafter = load_drafter(tiny_qwen3_drafter, target=target)
    prompt = torch.randint(3, 100, (245,), generator=torch.Generator().manual_seed(9)).tolist()

    def decode(runtime):
        decoder = Decoder(runtime, max_batch=1, max_context=1000)
        return [r.token_ids for r in decoder.generate([Request(prompt, SamplingParams(max_new_tokens=30))])]

    eager = decode(TorchRuntime(target.model, drafter, attention="dflash"))
    runtime = TorchRuntime(target.model, drafter, attention="dflash", cuda_graphs=True, attention_choice=choice)
    assert decode(runtime) == eager
    spans = {key[3] for key in runtime.cuda_graphs._graphs if key[0] == "target"}
    assert spans == ({256, 512} if choice == "sdpa" else {runtime.capacity})


def test_new_caches_drop_the_graphs(rerun_graphs, tiny_qwen3):
    target = load_target(tiny_qwen3, dtype=torch.float32)
    runtime = TorchRuntime(target.model, cuda_graphs=True)
    _decode(runtime, max_batch=2)
    assert runtime.cuda_graphs.num_graphs > 0
    runtime.allocate(8, 64)
    assert runtime.cuda_graphs.num_graphs == 0 and runtime.cuda_graphs.buckets == (1, 2, 4, 8)


def test_captures_record_in_thread_local_error_mode(monkeypatch):
    """What `capture` hands torch. The capture itself needs CUDA (tests/test_cuda_graphs_gpu.py
    captures while another thread allocates); here only the arguments are read."""
    import inspect

    assert cuda_graphs.CAPTURE_ERROR_MODE == "thread_local"
    assert "capture_error_mode" in inspect.signature(torch.cuda.graph).parameters  # this torch takes the argument
    received = {}

    class Recorder:
        def __init__(self, graph, **kwargs):
            received.update(kwargs, graph=graph)

    monkeypatch.setattr(torch.cuda, "graph", Recorder)
    graph = object()
    cuda_graphs.recording(graph, "pool")
    assert received == {"graph": graph, "pool": "pool", "capture_error_mode": "thread_local"}


def test_every_graph_capture_in_the_package_goes_through_the_thread_local_recording():
    """A static check: `torch.cuda.graph(` is called in one place, `cuda_graphs.recording`, which
    passes the mode; a second capture site elsewhere would have to pass it too."""
    import ast
    from pathlib import Path

    root = Path(cuda_graphs.__file__).resolve().parents[1]
    sites = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("torch.cuda.graph", "torch.cuda.graphs.graph"):
                keywords = {k.arg: ast.unparse(k.value) for k in node.keywords}
                sites.append((path.relative_to(root).as_posix(), keywords.get("capture_error_mode")))
    assert sites == [("runtime/cuda_graphs.py", "CAPTURE_ERROR_MODE")]


def _raised(error: Exception, during: Exception | None = None) -> Exception:
    """`error` as raised: inside an `except` for `during` where given (Python sets __context__)."""
    try:
        if during is None:
            raise error
        try:
            raise during
        except Exception:  # noqa: BLE001 - whatever it raised, the error under test is what must surface
            raise error
    except Exception as exc:  # noqa: BLE001 - returned for inspection
        return exc


def test_only_a_capture_spoiled_from_outside_is_tried_again():
    from trtllm_dflash.runtime.cuda_graphs import invalidated_by_another_thread

    invalidated = RuntimeError("CUDA error: operation failed due to a previous error during capture")
    not_permitted = RuntimeError("CUDA error: operation not permitted when stream is capturing")
    assert invalidated_by_another_thread(_raised(invalidated))
    # a host read inside the pass: capture_end reports the invalidation on top of the pass's own error
    assert not invalidated_by_another_thread(_raised(invalidated, during=not_permitted))
    assert not invalidated_by_another_thread(_raised(not_permitted))
    assert not invalidated_by_another_thread(_raised(RuntimeError("CUDA out of memory")))


def test_the_private_torch_call_a_failed_capture_needs_is_there():
    """StepGraphs._abandon_pool ends the pool's recording through torch._C._cuda_endAllocateToPool,
    the one private torch call of the package (no public API undoes capture_begin's routing). Without
    it a retried capture fails with "beginAllocateToPool: already recording" (seen on an H200): a
    torch release that drops it must fail here, on CPU, not in a server on a GPU."""
    assert callable(getattr(torch._C, "_cuda_endAllocateToPool", None))

"""TrtRuntime's engine output buffers (runtime/output_buffers.py), on CPU tensors.

TrtRuntime itself needs a CUDA GPU and built engines; the buffer logic it delegates to is the
same code here. The last test runs the real decoding loop over a runtime whose outputs are
handed out by OutputBuffers exactly as EngineGraph.run does (per role), to check that the loop
never reads an output after a later call has overwritten it.
"""

from __future__ import annotations

import math

import pytest
import torch

from trtllm_dflash.runtime import output_buffers
from trtllm_dflash.runtime.output_buffers import MIN_ELEMENTS, OutputBuffers, bucket_elements

FEATURES = 96  # the width of a tapped-features output


def test_bucket_is_the_next_power_of_two_within_the_cap():
    assert bucket_elements(1) == MIN_ELEMENTS
    assert bucket_elements(MIN_ELEMENTS + 1) == 2 * MIN_ELEMENTS
    assert bucket_elements(3 * MIN_ELEMENTS) == 4 * MIN_ELEMENTS
    assert bucket_elements(3 * MIN_ELEMENTS, cap=3 * MIN_ELEMENTS + 5) == 3 * MIN_ELEMENTS + 5
    assert bucket_elements(5 * MIN_ELEMENTS, cap=3 * MIN_ELEMENTS) == 8 * MIN_ELEMENTS  # a cap that does not hold it is ignored


def test_every_prompt_length_gets_a_view_of_its_shape_from_a_bounded_set_of_buffers():
    buffers = OutputBuffers("cpu")
    largest = 0
    for span in range(1, 2049):  # 2048 distinct prefill spans, two rows each
        shape = (2, span, FEATURES)
        view = buffers.view((1, "features", "prefill"), shape, torch.float16)
        assert tuple(view.shape) == shape and view.dtype == torch.float16 and view.is_contiguous()
        view.fill_(span)  # what the engine writes
        assert torch.all(view == span)
        largest = max(largest, math.prod(shape))
    assert len(buffers) == 1
    assert buffers.allocations <= math.ceil(math.log2(largest / MIN_ELEMENTS)) + 1
    assert buffers.live_bytes <= 2 * largest * 2  # at most twice the largest output, in bytes
    # the old per-shape cache held one buffer per span: 2048 buffers, 2048 * 2049 / 2 * 2 * 96 * 2 bytes (~800 MB)


def test_the_cap_bounds_the_buffer_at_the_profiles_largest_output():
    buffers = OutputBuffers("cpu")
    cap = 4 * 1500 * FEATURES  # e.g. 4 rows x 1500 tokens
    for span in (10, 700, 1100, 1500):
        buffers.view((1, "features", "prefill"), (4, span, FEATURES), torch.float32, cap)
    assert buffers.live_bytes == cap * 4
    smaller = buffers.view((1, "features", "prefill"), (1, 3, FEATURES), torch.float32, cap)
    assert buffers.allocations == 3 and smaller.shape == (1, 3, FEATURES)  # 4096 -> 262144 -> cap; no more


def test_same_key_reuses_its_memory_and_other_keys_do_not_share_it():
    buffers = OutputBuffers("cpu")
    first = buffers.view((0, "logits", "step"), (3, 16, 50), torch.float32)
    again = buffers.view((0, "logits", "step"), (2, 16, 50), torch.float32)
    assert again.data_ptr() == first.data_ptr()  # reused: valid until the next call of the key
    step = buffers.view((0, "features", "step"), (3, 16, FEATURES), torch.float32)
    prefill = buffers.view((0, "features", "prefill"), (3, 16, FEATURES), torch.float32)
    other_profile = buffers.view((1, "features", "step"), (3, 16, FEATURES), torch.float32)
    storages = {t.untyped_storage().data_ptr() for t in (first, step, prefill, other_profile)}
    assert len(storages) == 4


def test_a_grown_buffer_leaves_earlier_views_intact():
    buffers = OutputBuffers("cpu")
    small = buffers.view(("features",), (1, 8, FEATURES), torch.float32)
    small.fill_(1.0)
    big = buffers.view(("features",), (4, 4096, FEATURES), torch.float32)
    big.fill_(2.0)
    assert big.data_ptr() != small.data_ptr()
    assert torch.all(small == 1.0)  # the old buffer lives while the view does
    assert buffers.live_bytes == bucket_elements(big.numel()) * 4 and buffers.allocations == 2


def test_a_new_dtype_under_a_key_gets_its_own_buffer():
    buffers = OutputBuffers("cpu")
    buffers.view(("x",), (4,), torch.float32)
    view = buffers.view(("x",), (4,), torch.int64)
    assert view.dtype == torch.int64 and buffers.allocations == 2


# ------------------------------------------------------------------- the decoding loop's reads


def _route_outputs(runtime, buffers: OutputBuffers | None, role_of) -> list[torch.Tensor]:
    """Hand the runtime's verify features and draft logits out of `buffers` as EngineGraph.run
    does (each call's output is written into a view of its key's buffer, as the engine writes
    it); returns the list the context features every draft pass reads are recorded into."""
    eager_verify, eager_draft = runtime.target_verify, runtime.draft_forward
    seen: list[torch.Tensor] = []

    def into_buffer(key, value: torch.Tensor) -> torch.Tensor:
        if buffers is None:  # the runtime's own tensors: the reference run
            return value
        view = buffers.view(key, tuple(value.shape), value.dtype)
        view.copy_(value)
        return view

    def target_verify(rows, tokens, starts, span, draft_probs, sampling, logits_at=None):
        out = eager_verify(rows, tokens, starts, span, draft_probs, sampling, logits_at)
        if buffers is not None:
            out.features = into_buffer((0, "features", role_of(logits_at)), out.features)
        return out

    def draft_forward(rows, block, ctx_features, new_counts, cache_lens):
        seen.append(ctx_features.clone())
        return into_buffer((0, "logits", "step"), eager_draft(rows, block, ctx_features, new_counts, cache_lens))

    runtime.target_verify, runtime.draft_forward = target_verify, draft_forward
    return seen


def _decode(tiny_qwen3, tiny_qwen3_drafter, buffers: OutputBuffers | None, role_of=None):
    from trtllm_dflash.checkpoints import load_drafter, load_target
    from trtllm_dflash.decoding import Decoder, Request, SamplingParams
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    target = load_target(tiny_qwen3, dtype=torch.float32)
    drafter = load_drafter(tiny_qwen3_drafter, target=target)
    runtime = TorchRuntime(target.model, drafter)
    seen = _route_outputs(runtime, buffers, role_of)
    g = torch.Generator().manual_seed(5)
    lengths, new_tokens = (9, 3, 14, 6, 11, 4, 8), (12, 7, 10, 15, 6, 9, 11)
    requests = [
        Request(torch.randint(3, 100, (n,), generator=g).tolist(), SamplingParams(max_new_tokens=m)) for n, m in zip(lengths, new_tokens)
    ]
    # prompts of many lengths arriving one per step, as at a server: each is admitted into free
    # rows while the others run, and also after rows finished
    decoder = Decoder(runtime, max_batch=4, max_context=200)
    results = {}
    while requests or decoder.has_work:
        if requests:
            decoder.submit(requests.pop(0))
        for event in decoder.step():
            if event.finished:
                results[event.request_id] = (event.result.token_ids, event.result.acceptance_lengths)
    return [results[i] for i in sorted(results)], seen


def test_the_decoding_loop_reads_the_same_features_from_bucketed_buffers(tiny_qwen3, tiny_qwen3_drafter):
    from trtllm_dflash.runtime.trt_runtime import _role

    assert _role(None) == "step" and _role(torch.zeros(1)) == "prefill"
    plain, plain_seen = _decode(tiny_qwen3, tiny_qwen3_drafter, None)
    buffers = OutputBuffers("cpu")
    bucketed, bucketed_seen = _decode(tiny_qwen3, tiny_qwen3_drafter, buffers, _role)
    assert bucketed == plain
    assert len(bucketed_seen) == len(plain_seen) and all(torch.equal(a, b) for a, b in zip(bucketed_seen, plain_seen))
    assert len(buffers) == 3  # features (step, prefill) and draft logits
    # without the prefill role, admitting rows overwrites the running rows' features before the
    # loop concatenates them with the new rows': the drafter then reads the wrong context
    _, one_role_seen = _decode(tiny_qwen3, tiny_qwen3_drafter, OutputBuffers("cpu"), lambda logits_at: "step")
    assert any(not torch.equal(a, b) for a, b in zip(one_role_seen, plain_seen))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
def test_buffers_on_cuda_are_views_of_cuda_memory():
    buffers = output_buffers.OutputBuffers("cuda")
    view = buffers.view((0, "features", "step"), (2, 16, FEATURES), torch.bfloat16)
    assert view.is_cuda and view.shape == (2, 16, FEATURES) and view.data_ptr() % 256 == 0

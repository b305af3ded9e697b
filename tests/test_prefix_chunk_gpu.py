"""Prefix caching and chunked prefill on CUDA (eager and CUDA-graph replay): a reused prefix and a
prompt admitted in chunks decode exactly what a cold, whole prefill decodes on the same device, the
same tokens and the same acceptance lengths, dense and hybrid targets (graphs: dense only), greedy
and seeded sampling.

float32, so the comparison is exact: the chunked pass and the whole one add in different orders.
Skipped where no GPU is visible (every CI machine). On a GPU machine: `pytest tests/test_prefix_chunk_gpu.py`.
"""

from __future__ import annotations

import pytest
import torch

from trtllm_dflash.checkpoints import load_drafter, load_target
from trtllm_dflash.decoding import Decoder, Request, SamplingParams
from trtllm_dflash.runtime.prefix_cache import PrefixCache
from trtllm_dflash.runtime.torch_runtime import TorchRuntime
from trtllm_dflash.testing.tiny import cycle_sequences

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)"),
]

GREEDY = SamplingParams(max_new_tokens=24, stop_token_ids=())
SEEDED = SamplingParams(max_new_tokens=24, temperature=0.9, top_p=0.95, seed=11, stop_token_ids=())


def _runtime(pair, graphs: bool) -> TorchRuntime:
    target_dir, drafter_dir = pair[:2]
    target = load_target(target_dir, device="cuda", dtype=torch.float32)
    return TorchRuntime(target.model, load_drafter(drafter_dir, target, device="cuda"), cuda_graphs=graphs)


def _prompts() -> list[list[int]]:
    """Four prompts behind one shared 35-token prefix (not whole blocks), suffixes of 3 to 12 tokens."""
    windows = cycle_sequences(5, 60, torch.Generator().manual_seed(7)).tolist()
    return [windows[0][:35] + w[:n] for w, n in zip(windows[1:], (5, 12, 3, 9))]


def _decode(runtime, prompts, params, **options):
    decoder = Decoder(runtime, max_batch=2, max_context=160, **options)
    results = []
    for prompt in prompts:  # one by one, so the later prompts find the earlier ones' prefix
        results += decoder.generate([Request(prompt, params)])
    return results


# CUDA graphs do not cover hybrid targets (the runtime refuses them in one line)
@pytest.mark.parametrize(
    ("family", "graphs"), [("dense", False), ("dense", True), ("hybrid", False)], ids=["dense-eager", "dense-cuda-graphs", "hybrid-eager"]
)
@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_prefix_reuse_and_chunks_decode_like_a_cold_whole_prefill(request, family, graphs, params):
    pair = request.getfixturevalue("trained_pair" if family == "dense" else "hybrid_trained_pair")
    runtime = _runtime(pair, graphs)
    prompts = _prompts()
    cold = [(r.token_ids, r.acceptance_lengths) for r in _decode(runtime, prompts, params, prefill_chunk=0)]
    assert max(max(lengths) for _, lengths in cold) > 2  # real acceptance: the drafter's context is checked
    for chunk in (0, 5, 16):
        warm = _decode(runtime, prompts, params, prefill_chunk=chunk, prefix_cache=PrefixCache(1 << 28, block_tokens=8))
        assert [r.cached_prompt_tokens for r in warm][1:] == [32, 32, 32]
        assert [(r.token_ids, r.acceptance_lengths) for r in warm] == cold, f"chunk {chunk}"

"""The decoding loop keeps each row's greedy flag on the host (`SamplingTensors.greedy`), so
`all_greedy` reads nothing back from the device between the draft and the verify pass (issue 39).
The flags must follow the rows through joins, finishes and reorders exactly as the tensors do."""

from __future__ import annotations

import torch

from trtllm_dflash import decoding
from trtllm_dflash.checkpoints import load_drafter, load_target
from trtllm_dflash.decoding import Decoder, Request, SamplingParams
from trtllm_dflash.runtime.base import SamplingTensors
from trtllm_dflash.runtime.torch_runtime import TorchRuntime
from trtllm_dflash.testing.tiny import make_tiny_drafter, make_tiny_target


def test_all_greedy_reads_the_host_flags_when_known():
    temperature = torch.tensor([0.0, 0.0])
    assert SamplingTensors(temperature, torch.zeros(2), torch.ones(2), torch.zeros(2)).all_greedy  # read from the tensor
    known = SamplingTensors(temperature, torch.zeros(2), torch.ones(2), torch.zeros(2), greedy=(True, False))
    assert not known.all_greedy  # the host's word, not the tensor's
    assert known.slice(slice(0, 1)).all_greedy
    assert known.select(torch.tensor([1]), [1]).greedy == (False,)
    assert known.select(torch.tensor([1])).greedy is None  # no host rows given: unknown, read from the tensor
    assert SamplingTensors.cat([known, known.slice(slice(1, 2))]).greedy == (True, False, False)


def test_the_flags_follow_the_rows_through_joins_finishes_and_reorders(tmp_path, monkeypatch):
    target_dir = make_tiny_target(tmp_path / "target", "qwen3", seed=5)
    drafter_dir = make_tiny_drafter(tmp_path / "drafter", target_dir, seed=2, block_size=4, target_layer_ids=(1, 2))
    target = load_target(target_dir, dtype=torch.float32)
    runtime = TorchRuntime(target.model, load_drafter(drafter_dir, target))
    decoder = Decoder(runtime, max_batch=3, max_context=96, prefill_chunk=8, prefill_share=0.5)
    checked = []
    step = decoding.launch_step

    def checking_step(runtime, batch, *args):
        flags = batch.sampling.greedy
        assert flags is not None and flags == tuple(bool(t <= 0) for t in batch.sampling.temperature.tolist())
        checked.append(flags)
        return step(runtime, batch, *args)

    monkeypatch.setattr(decoding, "launch_step", checking_step)
    g = torch.Generator().manual_seed(4)
    requests = [
        Request(torch.randint(3, 120, (n,), generator=g).tolist(), SamplingParams(max_new_tokens=m, temperature=0.9 * (i % 2), seed=i))
        for i, (n, m) in enumerate([(20, 5), (6, 17), (31, 9), (3, 12), (12, 4), (25, 14)])
    ]
    results = decoder.generate(requests)
    assert all(len(r.token_ids) == req.params.max_new_tokens for r, req in zip(results, requests))
    assert {True, False} <= {f for flags in checked for f in flags} and len({len(f) for f in checked}) > 1

"""The decoding loop keeps each row's greedy flag on the host (`SamplingTensors.greedy`), so
`all_greedy` reads nothing back from the device between the draft and the verify pass (issue 39).
The flags must follow the rows through joins, finishes and reorders exactly as the tensors do."""

from __future__ import annotations

import pytest
import torch

from trtllm_dflash import decoding
from trtllm_dflash.checkpoints import load_drafter, load_target
from trtllm_dflash.decoding import Decoder, Request, SamplingParams
from trtllm_dflash.ops import reference, rng
from trtllm_dflash.runtime.base import SamplingTensors, draft_positions, sample_drafts
from trtllm_dflash.runtime.scheduler import _sampling_tensors
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


ROW_SETS = {
    "mixed": [(0.0, 0, 1.0), (0.8, 0, 1.0), (1.0, 5, 1.0), (0.7, 0, 0.9)],
    "sampled, no top-k or top-p": [(0.9, 0, 1.0), (1.3, 0, 1.0)],
    "top-k only, no greedy row": [(0.9, 3, 1.0), (1.1, 40, 1.0)],
    "top-p only": [(0.6, 0, 0.5), (0.0, 0, 1.0)],
}


@pytest.mark.parametrize("rows", ROW_SETS.values(), ids=ROW_SETS.keys())
def test_sampling_on_the_host_s_branches_equals_sampling_on_the_tensors_branches(rows):
    """The host's copies of the rows only decide which parts of sampling run: the samples and the
    distributions are exactly those of deciding from the tensors."""
    params = [SamplingParams(temperature=t, top_k=k, top_p=p, seed=i) for i, (t, k, p) in enumerate(rows)]
    sampling = _sampling_tensors(params, torch.device("cpu"))
    assert sampling.branches == reference.SamplingBranches(
        any(t == 0 for t, _, _ in rows), max(k for _, k, _ in rows), any(p < 1 for _, _, p in rows)
    )
    logits = torch.randn(len(rows), 6, 64, generator=torch.Generator().manual_seed(3))
    positions = torch.arange(6).expand(len(rows), -1) + 10
    s = sampling
    read = reference.sample_tokens(logits, s.temperature, s.top_k, s.top_p, s.seed, positions, rng.STREAM_DRAFT)
    known = reference.sample_tokens(logits, s.temperature, s.top_k, s.top_p, s.seed, positions, rng.STREAM_DRAFT, branches=s.branches)
    assert torch.equal(read[0], known[0]) and torch.equal(read[1], known[1])
    # the host's copies follow the rows like the tensors
    picked = sampling.select(torch.tensor([len(rows) - 1, 0]), [len(rows) - 1, 0])
    assert picked.top_ks == (rows[-1][1], rows[0][1]) and picked.top_ps == (rows[-1][2], rows[0][2])
    assert SamplingTensors.cat([picked, sampling.slice(slice(0, 1))]).top_ks == (rows[-1][1], rows[0][1], rows[0][1])


def test_drafting_a_sampled_block_reads_nothing_back_from_the_device(monkeypatch):
    """On a GPU every read of a tensor's value waits for the device: the V1 head's sampling decides
    from the host's copies, so a drafted block costs no read (Python's conversions are trapped here)."""
    params = [SamplingParams(temperature=0.8, top_k=5, top_p=0.9, seed=1), SamplingParams(temperature=0.0, seed=2)]
    sampling = _sampling_tensors(params, torch.device("cpu"))
    logits = torch.randn(2, 7, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    positions = draft_positions(torch.tensor([20, 31]), 7)
    expected = sample_drafts(logits, sampling, positions)

    def host_read(*args, **kwargs):
        raise AssertionError("a tensor's value was read on the host")

    for name in ("__bool__", "__int__", "__index__", "__float__", "item", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, host_read)
    drafted = sample_drafts(logits, sampling, positions)
    monkeypatch.undo()
    assert torch.equal(drafted.tokens, expected.tokens) and torch.equal(drafted.probs, expected.probs)
    blind = SamplingTensors(*sampling.tensors())  # without the host's copies the tensors are read
    monkeypatch.setattr(torch.Tensor, "__bool__", host_read)
    with pytest.raises(AssertionError, match="read on the host"):
        sample_drafts(logits, blind, positions)

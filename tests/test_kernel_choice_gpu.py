"""The kernel choices on a GPU (runtime/attention_choice.py, verify_choice.py): torch's flash attention
with per-row lengths computes the reference's attention at Qwen3-8B's layer shape, every attention
candidate is timed from a CUDA graph, the runtime on flash decodes like the op inside graphs; the
compiled vocabulary-spread verification commits what the reference commits at Qwen3's vocabulary,
and both verification forms are timed from graphs.

Skipped where no GPU is visible (every CI machine). On a GPU machine: `pytest tests/test_kernel_choice_gpu.py`.
"""

from __future__ import annotations

import pytest
import torch

from trtllm_dflash.checkpoints import load_drafter, load_target
from trtllm_dflash.decoding import Decoder, Request, SamplingParams
from trtllm_dflash.runtime import attention_choice, verify_choice
from trtllm_dflash.runtime.torch_runtime import TorchRuntime

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)"),
]

QWEN3_8B_LAYER = attention_choice.LayerShape(heads=32, kv_heads=8, head_dim=128, value_dim=128, windows=(0, 128))


@pytest.mark.parametrize("name", attention_choice.CANDIDATES)
@pytest.mark.parametrize("tokens,batch", [(1, 1), (16, 1), (16, 3)])
def test_every_candidate_is_the_reference_attention_at_qwen3_8b_shape(name, tokens, batch):
    cuda = torch.device("cuda")
    assert attention_choice.check(name, QWEN3_8B_LAYER, batch, tokens, 1040, torch.bfloat16, cuda) is None


def test_every_candidate_is_timed_from_a_cuda_graph():
    choice = attention_choice.measure_one([QWEN3_8B_LAYER], 16, 2, 1040, torch.bfloat16, torch.device("cuda"))
    timed = {t.candidate: t.ms for t in choice.timings}
    assert all(ms is not None and ms > 0 for ms in timed.values()), choice.line()
    assert choice.chosen == min(timed, key=timed.get)


def test_the_demo_pair_on_flash_attention_decodes_like_the_op_in_graphs():
    from trtllm_dflash import demo

    target = load_target(demo.target_dir(), device="cuda", dtype=torch.bfloat16)
    drafter = load_drafter(demo.drafter_dir(), target=target, device="cuda")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, target.model.config.vocab_size, (7 + 5 * i,), generator=g).tolist() for i in range(3)]
    decoded = {}
    for choice in ("dflash", "flash"):
        runtime = TorchRuntime(target.model, drafter, attention="dflash", cuda_graphs=True, attention_choice=choice)
        decoder = Decoder(runtime, max_batch=3, max_context=1024)
        decoded[choice] = [r.token_ids for r in decoder.generate([Request(p, SamplingParams(max_new_tokens=48)) for p in prompts])]
        assert runtime.cuda_graphs.counts["replayed"] > 0
        runtime.taps.remove()
    # two kernels round differently in bf16: a near-tie may flip a token and the text after it, rarely
    same = sum(a == b for ours, theirs in zip(decoded["dflash"], decoded["flash"]) for a, b in zip(ours, theirs))
    assert same >= 0.9 * sum(len(t) for t in decoded["dflash"]), decoded


@pytest.mark.parametrize("form", verify_choice.KERNEL_FORMS)
@pytest.mark.parametrize("batch", [1, 5])
def test_the_kernel_verification_forms_commit_what_the_reference_commits_at_qwen3_vocabulary(batch, form):
    assert verify_choice.check(form, batch, 16, 151936, torch.bfloat16, torch.device("cuda")) is None


def test_every_verification_form_is_timed_from_a_cuda_graph_on_each_kind_of_step():
    choices = verify_choice.measure_one(16, 2, 151936, torch.bfloat16, torch.device("cuda"))
    assert [c.kind for c in choices] == list(verify_choice.STEP_KINDS)
    for choice in choices:
        forms = verify_choice.STEP_KINDS[choice.kind][0]
        assert set(choice.ms) == set(forms) and all(choice.ms[f] > 0 for f in forms) and not choice.refused, choice.line()
        assert choice.chosen == min(choice.ms, key=choice.ms.get)


@pytest.mark.parametrize("rows", [1, 16, 64])
def test_the_skinny_projection_kernels_compute_f_linear_and_are_timed_from_graphs(rows):
    """Compiled, at Qwen3-8B's o_proj and gate/up shapes in bf16 (o_proj with K splits, each tile's
    last split summing them) and its down projection on silu(gate) * up (gated): within one output
    rounding of F.linear at every K split count, and timed from a CUDA graph (runtime/linear_choice.py),
    with each launch kind the GPU has.
    The same launch twice gives the same bits (the splits are summed in order, the counters left zero)."""
    from trtllm_dflash.ops.kernels import skinny_launch, tile_counters
    from trtllm_dflash.runtime import linear_choice

    g = torch.Generator(device="cuda").manual_seed(rows)
    for n, k, gated in ((4096, 4096, False), (24576, 4096, False), (4096, 12288, True)):
        weight = torch.randn(n, k, device="cuda", generator=g, dtype=torch.bfloat16) * 0.02
        for dependent in linear_choice.launch_kinds(weight.device):  # as dependent launches too, on Hopper on
            choice = linear_choice.measure_one(rows, weight, gated=gated, dependent=dependent)
            assert choice.refused == "" and choice.skinny_ms > 0 and choice.torch_ms > 0, choice.line()
            print(choice.line())
        x = torch.randn(rows, k * (2 if gated else 1), device="cuda", generator=g, dtype=torch.bfloat16)
        first = skinny_launch.skinny_linear(x, weight, splits=5, gated=gated)
        assert torch.equal(skinny_launch.skinny_linear(x, weight, splits=5, gated=gated), first)
    assert not tile_counters._COUNTERS[torch.device("cuda", torch.cuda.current_device())].any()

"""Verification of sampled steps by the per-position, vocabulary-spread or shortlist kernels (runtime/verify_choice.py).

The spread and shortlist forms must commit what the reference commits before they may run (a
broken one is refused); the runtime on either decodes the tokens and acceptance lengths of the
per-position kernels, sampled and seeded, and keeps the per-position kernels for all-greedy steps;
off CUDA without Triton's interpreter both are refused in one line and "measure" keeps "positions".
Here the kernels run in the interpreter; on a GPU, tests/test_plugin_gpu.py compares the compiled ones.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from trtllm_dflash.checkpoints import load_drafter, load_target  # noqa: E402
from trtllm_dflash.decoding import Decoder, Request, SamplingParams  # noqa: E402
from trtllm_dflash.errors import DFlashError  # noqa: E402
from trtllm_dflash.ops.kernels import verify_shortlist_launch, verify_spread_launch  # noqa: E402
from trtllm_dflash.runtime import verify_choice  # noqa: E402
from trtllm_dflash.runtime.torch_runtime import TorchRuntime  # noqa: E402
from trtllm_dflash.testing.tiny import make_tiny_drafter, make_tiny_target  # noqa: E402

CPU = torch.device("cpu")


@pytest.mark.parametrize("form", ["spread", "shortlist"])
def test_off_the_kernels_a_kernel_form_is_refused_and_measure_keeps_positions(monkeypatch, form):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(DFlashError, match="run on CUDA") as error:
        verify_choice.fixed(form, 4, 300, torch.float32, CPU)
    assert "\n" not in str(error.value) and f"verify choice '{form}'" in str(error.value)
    assert "verify_choice='positions'" in str(error.value)
    choices = verify_choice.measure((4,), (1, 2), 300, torch.float32, CPU)
    assert [(c.tokens, c.batch, c.kind, c.chosen) for c in choices.choices] == [
        (4, batch, kind, "positions") for batch in (1, 2) for kind in ("top-k", "other")
    ]
    for c in choices.choices:
        kernel_forms = {"spread", "shortlist"} if c.kind == "top-k" else {"spread"}  # the shortlist is not timed on other steps
        assert c.ms["positions"] > 0 and all(c.ms[form] is None for form in kernel_forms)
        assert set(c.refused) == kernel_forms and all("run on CUDA" in why for why in c.refused.values())


KERNEL_FORMS = [("spread", verify_spread_launch, "verify_block_spread"), ("shortlist", verify_shortlist_launch, "verify_block_shortlist")]


@pytest.mark.parametrize("form,module,function", KERNEL_FORMS)
def test_the_check_passes_the_kernel_forms_and_refuses_a_broken_one(monkeypatch, form, module, function):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert verify_choice.check(form, 5, 4, 300, torch.float32, CPU) is None
    exact = getattr(module, function)

    def one_token_off(*args, **kwargs):
        packed = exact(*args, **kwargs).clone()
        packed[0, 1] = (packed[0, 1] + 1) % 300  # the first row's bonus token
        return packed

    monkeypatch.setattr(module, function, one_token_off)
    assert verify_choice.check(form, 5, 4, 300, torch.float32, CPU) == f"the {form} kernels commit other tokens than the reference"
    with pytest.raises(DFlashError, match="commit other tokens"):
        verify_choice.fixed(form, 4, 300, torch.float32, CPU)


def test_measure_times_every_form_in_the_interpreter_and_keeps_the_fastest(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    timed = verify_choice.time_call
    monkeypatch.setattr(verify_choice, "time_call", lambda fn, device: timed(fn, device, runs=2))  # the interpreter is slow
    top_k, other = verify_choice.measure_one(3, 2, 120, torch.float32, CPU)
    assert (top_k.kind, other.kind) == ("top-k", "other")
    assert set(top_k.ms) == {"positions", "spread", "shortlist"} and set(other.ms) == {"positions", "spread"}
    for choice in (top_k, other):
        assert all(ms > 0 for ms in choice.ms.values()) and not choice.refused and choice.chosen == min(choice.ms, key=choice.ms.get)


def test_choices_pick_by_block_and_batch_bucket_and_only_for_sampled_steps():
    choices = verify_choice.VerifyChoices(
        None, (verify_choice.VerifyChoice(4, 2, "spread", {}), verify_choice.VerifyChoice(4, 8, "positions", {}))
    )
    assert choices.pick(4, 1) == "spread" and choices.pick(4, 3) == "positions" and choices.pick(4, 9) == "positions"
    assert choices.pick(1, 1) == "positions"  # blocks not measured keep the per-position kernels
    block = torch.zeros(2, 4, dtype=torch.long)
    sampled = verify_choice_sampling(greedy=(True, False))
    assert choices.kernel_form(block, sampled) == "spread"
    assert choices.kernel_form(torch.zeros(8, 4, dtype=torch.long), sampled) is None  # the bucket of 8 kept positions
    assert choices.kernel_form(block, verify_choice_sampling(greedy=(True, True))) is None
    assert choices.kernel_form(block, verify_choice_sampling(greedy=None)) is None  # the host does not know: no choice made


def test_steps_whose_sampled_rows_all_have_a_served_top_k_get_their_own_choice():
    VerifyChoice = verify_choice.VerifyChoice
    choices = verify_choice.VerifyChoices(
        None, (VerifyChoice(4, 2, "shortlist", {}, kind="top-k"), VerifyChoice(4, 2, "spread", {}, kind="other"))
    )
    block = torch.zeros(2, 4, dtype=torch.long)
    chat = verify_choice_sampling(greedy=(False, True), top_ks=(20, 0))  # the greedy row's top-k does not count
    assert choices.kernel_form(block, chat) == "shortlist" and choices.samples_drafts(2, 4, chat)
    for top_ks in [(20, 0), (20, verify_choice.SHORTLIST + 1)]:  # a sampled row without top-k, or above SHORTLIST
        sampling = verify_choice_sampling(greedy=(False, False), top_ks=top_ks)
        assert choices.kernel_form(block, sampling) == "spread" and not choices.samples_drafts(2, 4, sampling)
    unknown = verify_choice_sampling(greedy=(False, False), top_ks=None)  # top-k values the host does not know: "other"
    assert choices.kernel_form(block, unknown) == "spread"


def verify_choice_sampling(greedy, top_ks=(20, 20)):
    from trtllm_dflash.runtime.base import SamplingTensors

    rows = 2
    return SamplingTensors(
        torch.ones(rows),
        torch.zeros(rows, dtype=torch.long),
        torch.ones(rows),
        torch.zeros(rows, dtype=torch.long),
        greedy=greedy,
        top_ks=top_ks,
    )


def test_the_runtime_on_the_kernel_forms_decodes_like_the_per_position_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    target_dir = make_tiny_target(tmp_path / "target", "qwen3", seed=5)
    drafter_dir = make_tiny_drafter(tmp_path / "drafter", target_dir, seed=2, block_size=4, target_layer_ids=(1, 2))
    target = load_target(target_dir, dtype=torch.float32)
    drafter = load_drafter(drafter_dir, target)
    kernel_steps, shortlist_drafts = [], []
    real = verify_choice.verify_by
    monkeypatch.setattr(verify_choice, "verify_by", lambda form, *a: kernel_steps.append((form, a[1].shape)) or real(form, *a))
    real_drafts = verify_choice.sample_drafts_by_shortlist
    monkeypatch.setattr(verify_choice, "sample_drafts_by_shortlist", lambda *a: shortlist_drafts.append(a[0].shape) or real_drafts(*a))
    prompts = [[5, 6, 7, 8, 9], [11, 12, 13]]
    params = [SamplingParams(max_new_tokens=6, temperature=0.9, top_k=20, top_p=0.9, seed=1), SamplingParams(max_new_tokens=5)]
    runs = {}
    for choice in ("positions", "spread", "shortlist"):  # the target's own attention, unfused: its kernels are tested
        runtime = TorchRuntime(target.model, drafter, attention="hf", fused=False, verify_choice=choice)
        decoder = Decoder(runtime, max_batch=2, max_context=48)
        runs[choice] = [(r.token_ids, r.acceptance_lengths) for r in decoder.generate([Request(p, s) for p, s in zip(prompts, params)])]
        runtime.taps.remove()
    assert runs["spread"] == runs["positions"] and runs["shortlist"] == runs["positions"]
    for form in ("spread", "shortlist"):  # each kernel form verified the sampled steps
        shapes = [shape for used, shape in kernel_steps if used == form]
        assert shapes and all(shape[1] in (1, 4) for shape in shapes)
    assert shortlist_drafts  # and the shortlist form drew the drafts of the top-k rows (the other row is greedy)
    kernel_steps.clear()
    greedy = TorchRuntime(target.model, drafter, attention="hf", fused=False, verify_choice="shortlist")
    Decoder(greedy, max_batch=1, max_context=48).generate([Request([5, 6, 7], SamplingParams(max_new_tokens=6))])
    assert kernel_steps == []  # an all-greedy step keeps the split argmax

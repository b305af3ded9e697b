"""DFlash V2 drafters (DFlash2DraftModel): the published layout loads, decoding is lossless under
greedy and sampling, and a V2 drafter with identity convolutions and zero codebooks drafts exactly
what its V1 weights draft."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors import safe_open
from support import SMALL_VOCAB, chi2_pvalue, exact_distribution, hf_greedy, sample_speculatively

from trtllm_dflash import DFlashPipeline
from trtllm_dflash.checkpoints import load_drafter, load_target, save_drafter
from trtllm_dflash.config import DrafterConfig
from trtllm_dflash.drafters.dflash2.modeling import DFlash2Drafter
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.modeling.drafter import DFlashDrafter
from trtllm_dflash.ops import reference_dflash2
from trtllm_dflash.runtime.base import SamplingTensors
from trtllm_dflash.testing.tiny import make_tiny_target, make_tiny_v2_drafter, perturb_v2, tiny_drafter_config

NEW_TOKENS = 16


def published_names(layers: int) -> set[str]:
    """The V2-only tensors of the published layout (PEERS.md, "DFlash V2")."""
    names = {f"candidate_selector.{n}" for n in ("hidden_projection.weight", "predecessor_codebook", "successor_codebook")}
    for i in range(layers):
        for conv in ("attention_conv", "mlp_conv"):
            names |= {f"layers.{i}.{conv}.kernel_projection.weight", f"layers.{i}.{conv}.base_kernel"}
    return names


@pytest.fixture(scope="module")
def dense_target(tmp_path_factory):
    return make_tiny_target(tmp_path_factory.mktemp("v2-dense") / "target", "qwen3", seed=3)


def test_the_published_layout_loads_with_its_shapes(tmp_path, dense_target):
    drafter_dir = make_tiny_v2_drafter(tmp_path / "v2", dense_target, num_layers=3)
    raw = json.loads((drafter_dir / "config.json").read_text())
    assert raw["architectures"] == ["DFlash2DraftModel"]
    assert {k: raw["dflash_config"][k] for k in ("conv_kernel_size", "conv_group_size", "is_causal")} == {
        "conv_kernel_size": 2,
        "conv_group_size": 16,
        "is_causal": False,
    }
    with safe_open(str(drafter_dir / "model.safetensors"), "pt") as f:
        shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    assert published_names(3) <= set(shapes)
    hidden, k, groups, rank = 64, 2, 64 // 16, 16
    assert shapes["layers.2.mlp_conv.kernel_projection.weight"] == (2 * k * groups, hidden)
    assert shapes["layers.0.attention_conv.base_kernel"] == (2, k, hidden)
    assert shapes["candidate_selector.hidden_projection.weight"] == (rank, hidden)
    assert shapes["candidate_selector.successor_codebook"] == (128, rank)
    drafter = load_drafter(drafter_dir, load_target(dense_target))
    assert isinstance(drafter, DFlash2Drafter) and drafter.config.num_hidden_layers == 3
    assert drafter.config.selector_top_k == 8 and drafter.config.conv_groups == groups


def _edit_config(drafter_dir, edit) -> None:
    path = drafter_dir / "config.json"
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda raw: raw["dflash_config"].update(is_causal=True), "is_causal: true"),
        (lambda raw: raw["dflash_config"].pop("mask_token_id"), "without mask_token_id"),
        (lambda raw: raw["dflash_config"].update(conv_group_size=24), "do not fit hidden_size 64"),
        (lambda raw: raw["dflash_config"].update(block_size=17), "blocks are 2..16"),
        (lambda raw: raw.update(architectures=["DFlashDraftModel"]), 'set architectures to ["DFlash2DraftModel"]'),
    ],
    ids=["causal", "no-mask", "group", "block", "v2-weights-v1-config"],
)
def test_a_malformed_v2_drafter_is_refused_in_one_line(tmp_path, dense_target, edit, message):
    drafter_dir = make_tiny_v2_drafter(tmp_path / "v2", dense_target)
    _edit_config(drafter_dir, edit)
    with pytest.raises(DFlashError) as error:
        load_drafter(drafter_dir, load_target(dense_target))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_codebooks_of_another_vocabulary_are_refused(tmp_path, dense_target):
    other = make_tiny_target(tmp_path / "other", "qwen3", seed=4, vocab_size=96)
    drafter_dir = make_tiny_v2_drafter(tmp_path / "v2", other, mask_token_id=90)
    _edit_config(drafter_dir, lambda raw: raw.pop("vocab_size"))
    with pytest.raises(DFlashError, match="has 96 rows, the target vocabulary has 128"):
        load_drafter(drafter_dir, load_target(dense_target))


def _prompts(batch: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 120, (3 + (5 * i + seed) % 11,), generator=generator).tolist() for i in range(batch)]


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"], ids=["dense", "hybrid"])
@pytest.mark.parametrize("block_size", [4, 8])
def test_greedy_v2_equals_autoregressive_and_transformers(tmp_path, family, block_size):
    target_dir = make_tiny_target(tmp_path / "target", family, seed=block_size)
    drafter_dir = make_tiny_v2_drafter(tmp_path / "v2", target_dir, seed=block_size, block_size=block_size)
    prompts = _prompts(3, block_size)
    spec = DFlashPipeline.load(target_dir, drafter_dir, dtype=torch.float64).generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=())
    ar = DFlashPipeline.load(target_dir, None, dtype=torch.float64).generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=())
    reference = load_target(target_dir, dtype=torch.float64).model
    for prompt, s, a in zip(prompts, spec, ar):
        assert s.token_ids == a.token_ids == hf_greedy(reference, prompt, NEW_TOKENS)
        assert len(s.token_ids) == 1 + sum(s.acceptance_lengths)


@pytest.fixture(scope="module")
def small_vocab_v2_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("v2-small-vocab")
    target = make_tiny_target(root / "target", "llama", seed=11, vocab_size=SMALL_VOCAB)
    # 4 candidates of 8 tokens: drafts outside the candidates have q = 0, which verification must honour
    drafter = make_tiny_v2_drafter(
        root / "v2", target, seed=12, block_size=4, mask_token_id=SMALL_VOCAB - 1, target_layer_ids=(1, 2), selector_top_k=4
    )
    return target, drafter


def test_sampled_v2_matches_the_target_distribution(small_vocab_v2_pair):
    samples = sample_speculatively(*small_vocab_v2_pair, 1.0, 0, 1.0)
    exact = exact_distribution(small_vocab_v2_pair[0], 1.0, 0, 1.0)
    for positions in [(0,), (1,), (2,), (0, 1, 2)]:
        assert chi2_pvalue(samples, exact, positions) > 1e-3, positions


def _uniform_over_candidates(proposal):
    support = (proposal.probs > 0).float()
    return dataclasses.replace(proposal, probs=support / support.sum(-1, keepdim=True))


def test_the_test_rejects_v2_drafts_verified_against_the_wrong_q(small_vocab_v2_pair, monkeypatch):
    """Verifying the selector's samples against a q they were not drawn from (uniform over the
    candidates instead of softmax(score / T)) is biased, and the chi-square test sees it."""
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    propose = TorchRuntime.propose
    monkeypatch.setattr(TorchRuntime, "propose", lambda self, *a: _uniform_over_candidates(propose(self, *a)))
    samples = sample_speculatively(*small_vocab_v2_pair, 1.0, 0, 1.0)
    exact = exact_distribution(small_vocab_v2_pair[0], 1.0, 0, 1.0)
    assert chi2_pvalue(samples, exact, (0, 1, 2)) < 1e-6


def _one_step_drafts(target_dir, drafter, temperature: float) -> torch.Tensor:
    """Draft tokens of one V1-head or V2-selector step after a prefill, on a fixed batch."""
    pipe = DFlashPipeline.load(target_dir, None)
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    runtime = TorchRuntime(pipe.runtime.model, drafter)
    runtime.allocate(2, 64)
    tokens = torch.tensor([[5, 9, 14, 3, 7, 1], [8, 2, 11, 4, 0, 0]])
    lengths = torch.tensor([6, 4])
    out = runtime.target_forward(slice(0, 2), tokens, torch.zeros(2, dtype=torch.long), 6)
    block = torch.full((2, drafter.config.block_size), drafter.config.mask_token_id)
    block[:, 0] = torch.tensor([21, 33])
    sampling = SamplingTensors(torch.full((2,), temperature), torch.zeros(2, dtype=torch.long), torch.ones(2), torch.tensor([7, 8]))
    return runtime.propose(slice(0, 2), block, out.features, lengths, torch.zeros(2, dtype=torch.long), sampling).tokens


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_identity_convs_and_zero_codebooks_draft_what_v1_drafts(dense_target, temperature):
    torch.manual_seed(0)
    v1 = DFlashDrafter(tiny_drafter_config(load_target(dense_target).config, block_size=8)).eval()
    v2 = DFlash2Drafter.from_v1(v1, 128, selector_rank=16, selector_top_k=128).eval()
    drafts_v1 = _one_step_drafts(dense_target, v1, temperature)
    assert torch.equal(_one_step_drafts(dense_target, v2, temperature), drafts_v1)
    perturb_v2(v2, seed=1)
    assert not torch.equal(_one_step_drafts(dense_target, v2, temperature), drafts_v1)


def test_identity_convolution_and_selector_semantics():
    """The reference ops on hand-checkable inputs: identity conv; a codebook term that flips a pick."""
    x = torch.randn(2, 5, 32)
    base = torch.zeros(2, 32)
    base[0] = 1.0
    assert torch.equal(reference_dflash2.grouped_dynamic_conv(x, torch.zeros(2, 5, 2, 2), base), x)
    shift = torch.zeros(2, 32)
    shift[1] = 1.0  # out[t] = x[t-1], and 0 at the anchor: taps never cross the block
    out = reference_dflash2.grouped_dynamic_conv(x, torch.zeros(2, 5, 2, 2), shift)
    assert torch.equal(out[:, 1:], x[:, :-1]) and torch.equal(out[:, 0], torch.zeros(2, 32))
    unary = torch.tensor([[[0.0, 2.0, 1.9, -5.0]]])
    z = torch.ones(1, 1, 1)
    predecessor = torch.tensor([[1.0], [0.0], [0.0], [0.0]])
    successor = torch.tensor([[0.0], [0.0], [1.0], [0.0]])  # +1 for token 2 after token 0
    zeros = torch.zeros(1)
    args = (torch.tensor([0]), predecessor, successor, zeros, zeros.long(), torch.tensor([[3]]))
    tokens, cand, _ = reference_dflash2.candidate_select(unary, z, *args, top_k=2)
    assert cand.tolist() == [[[1, 2]]] and tokens.tolist() == [[2]]
    tokens, _, _ = reference_dflash2.candidate_select(unary, z, torch.tensor([1]), *args[1:], top_k=2)
    assert tokens.tolist() == [[1]]


def test_save_and_load_round_trip_keeps_v2(tmp_path, dense_target):
    drafter_dir = make_tiny_v2_drafter(tmp_path / "v2", dense_target)
    drafter = load_drafter(drafter_dir, load_target(dense_target))
    again = load_drafter(save_drafter(drafter, tmp_path / "again"), load_target(dense_target))
    assert DrafterConfig.from_dir(tmp_path / "again") == dataclasses.replace(drafter.config)
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(tensor, again.state_dict()[name]), name


def test_candidates_are_the_top_k_with_ties_to_the_smaller_id():
    """The vocabulary-wide top-k (no full sort) equals the definition: a stable descending sort."""
    generator = torch.Generator().manual_seed(0)
    for vocab, k in [(5, 5), (37, 16), (300, 16), (300, 1)]:
        for unary in (torch.randint(-2, 3, (3, 4, vocab), generator=generator).float(), torch.randn(3, 4, vocab, generator=generator)):
            expected = torch.sort(unary, dim=-1, descending=True, stable=True).indices[..., :k]
            assert torch.equal(reference_dflash2.candidates(unary, k), expected)

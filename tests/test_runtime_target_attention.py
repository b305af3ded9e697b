"""The torch runtime on the engines' target-attention op (`attention="dflash"`) against the
model's own attention (`attention="hf"`): the same tokens and acceptance for every dense family
the op expresses, greedy and seeded sampling, ragged batches past the sliding window; the
families it does not express are refused with the reason, and "auto" stays on hf on CPU.
"""

from __future__ import annotations

import pytest
import torch

from trtllm_dflash.checkpoints import load_drafter, load_target
from trtllm_dflash.decoding import Decoder, Request, SamplingParams
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.runtime.torch_runtime import TorchRuntime
from trtllm_dflash.testing.tiny import make_tiny_drafter, make_tiny_target

FAMILIES = ["qwen3", "llama", "gpt_oss", "gemma3", "qwen3_moe"]


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
    made = {}

    def get(family):
        if family not in made:
            root = tmp_path_factory.mktemp(family)
            target = make_tiny_target(root / "target", family, seed=5)
            made[family] = (target, make_tiny_drafter(root / "drafter", target, seed=2, block_size=4, target_layer_ids=(1, 2)))
        return made[family]

    return get


def decode(runtime, prompts, params):
    decoder = Decoder(runtime, max_batch=len(prompts), max_context=64)
    results = decoder.generate([Request(p, s) for p, s in zip(prompts, params)])
    return [(r.token_ids, r.acceptance_lengths) for r in results]


@pytest.mark.parametrize("family", FAMILIES)
def test_dflash_attention_decodes_like_the_models_own_attention(pair_dirs, family):
    target_dir, drafter_dir = pair_dirs(family)
    target = load_target(target_dir, dtype=torch.float32)
    drafter = load_drafter(drafter_dir, target)
    hf, ours = TorchRuntime(target.model, drafter, attention="hf"), TorchRuntime(target.model, drafter, attention="dflash")
    assert ours.attention == "dflash"
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, hf.vocab_size, (n,), generator=generator).tolist() for n in (2, 13, 7, 19)]
    greedy = [SamplingParams(max_new_tokens=28)] * 4  # past the tiny sliding window (8) many times
    assert decode(ours, prompts, greedy) == decode(hf, prompts, greedy)
    sampled = [SamplingParams(max_new_tokens=20, temperature=0.9, top_k=30 * (i % 2), seed=i) for i in range(4)]
    assert decode(ours, prompts, sampled) == decode(hf, prompts, sampled)


@pytest.mark.parametrize("family,reason", [("gemma4", "KV sharing"), ("qwen3_5", "linear-attention")])
def test_targets_the_op_cannot_express_are_refused(pair_dirs, tmp_path, family, reason):
    from transformers import AutoModelForCausalLM

    from trtllm_dflash.testing.tiny import tiny_target_config

    model = AutoModelForCausalLM.from_config(tiny_target_config(family))
    with pytest.raises(DFlashError, match=reason) as error:
        TorchRuntime(model, attention="dflash")
    assert "\n" not in str(error.value) and "attention='hf'" in str(error.value)
    assert TorchRuntime(model, attention="auto").attention == "hf"


def test_auto_keeps_the_models_attention_on_cpu(pair_dirs):
    target = load_target(pair_dirs("qwen3")[0], dtype=torch.float32)
    assert TorchRuntime(target.model, attention="auto").attention == "hf"


@pytest.mark.parametrize("hidden,picked", [(64, "dflash"), (192, "hf")])  # head dims 16 and 48
def test_auto_takes_the_kernel_only_where_it_covers_every_head_dim(monkeypatch, hidden, picked):
    """Where the kernel does not cover a head dim, the op falls back to its reference, which reads
    lengths on the host in every layer: slower than transformers' attention on a GPU, and a CUDA
    graph of the verify pass failed to capture (H200, 2026-11-26: a hidden-192 Qwen3 target)."""
    from transformers import AutoModelForCausalLM

    from trtllm_dflash.testing.tiny import tiny_target_config

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # kernels "enabled" on this CPU
    model = AutoModelForCausalLM.from_config(tiny_target_config("qwen3", hidden_size=hidden))
    assert TorchRuntime(model, attention="auto").attention == picked
    assert TorchRuntime(model, attention="dflash").attention == "dflash"  # asked for: the reference runs where it must

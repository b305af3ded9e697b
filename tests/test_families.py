"""Every target family DFlash drafters ship for, through the torch runtime, lossless.

For each family a tiny random target is written from transformers' own config class (its real
layer kinds: attention sinks, sliding windows, per-layer head dims, shared KV layers, Gated
DeltaNet linear attention, MLA, experts) plus a tiny random drafter. Greedy speculative tokens
must equal autoregressive tokens and transformers' `generate(do_sample=False)` for a batch of 4
prompts of different lengths, at block sizes 4, 8 and 16, long enough to cross the sliding
window several times.

A random drafter is (almost) always rejected, which would leave the interesting path untested:
rows accepting DIFFERENT numbers of drafts, whose hybrid states must be rolled back to different
positions. So the drafter runs for real (its cache and features stay exact) and then an oracle
overwrites its proposals with the target's true continuation for a random number of positions
followed by a wrong token: every row accepts a random prefix, as with a good drafter.
"""

from __future__ import annotations

import functools
import random

import pytest
import torch

from trtllm_dflash import hf_compat
from trtllm_dflash.checkpoints import load_drafter, load_target
from trtllm_dflash.decoding import Decoder, Request, SamplingParams
from trtllm_dflash.modeling import linear_attention
from trtllm_dflash.runtime.base import Runtime
from trtllm_dflash.runtime.torch_runtime import TorchRuntime
from trtllm_dflash.testing.tiny import (
    FAMILIES,
    HYBRID_FAMILIES,
    MULTIMODAL_FAMILIES,
    make_tiny_drafter,
    make_tiny_multimodal_target,
    make_tiny_target,
    tiny_target_config,
)

NEW_TOKENS = 40  # > 4 sliding windows of TINY_SLIDING_WINDOW
PROMPT_LENGTHS = (5, 11, 3, 17)


class OracleDrafts:
    """A runtime wrapper: the real drafter runs, then its proposals become the target's true
    continuation for a random number of positions, then a wrong token."""

    def __init__(self, runtime: TorchRuntime, references: dict[tuple[int, ...], list[int]], seed: int) -> None:
        self.runtime = runtime
        self.references = references
        self.random = random.Random(seed)
        self.decoder: Decoder | None = None
        self.accepted_runs: list[int] = []

    def __getattr__(self, name):
        return getattr(self.runtime, name)

    def propose(self, *args):
        """The V1 head over this wrapper's draft logits (not the wrapped runtime's)."""
        return Runtime.propose(self, *args)

    def draft_forward(self, rows, block, ctx_features, new_counts, cache_lens):
        logits = self.runtime.draft_forward(rows, block, ctx_features, new_counts, cache_lens).clone()
        drafts = logits.shape[1]
        assert len(self.decoder.live) == logits.shape[0]  # a draft pass covers the step's batch: the live requests in order
        for i, live in enumerate(self.decoder.live):
            reference = self.references[tuple(live.request.prompt_ids)]
            done = len(live.result.token_ids)  # the anchor is reference[done - 1]
            good = self.random.randint(0, drafts)
            tokens = [reference[min(done + k, len(reference) - 1)] for k in range(drafts)]
            tokens = [t if k < good else (t + 1) % self.runtime.vocab_size for k, t in enumerate(tokens)]
            logits[i] = torch.nn.functional.one_hot(torch.tensor(tokens), logits.shape[-1]).to(logits) * 50
            self.accepted_runs.append(good)
        return logits


@functools.lru_cache(maxsize=None)
def _target(family: str, root: str):
    from pathlib import Path

    return make_tiny_target(Path(root) / family, family, seed=7)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("families"))


def _prompts(seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 120, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


@functools.lru_cache(maxsize=None)
def _hf_greedy(family: str, root: str) -> dict[tuple[int, ...], list[int]]:
    model = load_target(_target(family, root), dtype=torch.float64).model
    out = {}
    for prompt in _prompts(0):
        with torch.no_grad():
            tokens = model.generate(
                torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0
            )
        out[tuple(prompt)] = tokens[0, len(prompt) :].tolist()
    return out


def _decode(runtime, block_size: int | None = None) -> list[list[int]]:
    decoder = Decoder(runtime, max_batch=4, max_context=128, block_size=block_size)
    if isinstance(runtime, OracleDrafts):
        runtime.decoder = decoder
    params = SamplingParams(max_new_tokens=NEW_TOKENS)
    return [r.token_ids for r in decoder.generate(Request(p, params) for p in _prompts(0))]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_autoregressive_equals_transformers_generate(root, family):
    target = load_target(_target(family, root), dtype=torch.float64)
    expected = _hf_greedy(family, root)
    assert _decode(TorchRuntime(target.model)) == [expected[tuple(p)] for p in _prompts(0)]


@pytest.mark.parametrize("block_size", [4, 8, 16])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_speculative_equals_transformers_generate(tmp_path, root, family, block_size):
    target_dir = _target(family, root)
    drafter_dir = make_tiny_drafter(tmp_path / "drafter", target_dir, seed=block_size, block_size=block_size, target_layer_ids=(1, 2))
    target = load_target(target_dir, dtype=torch.float64)
    runtime = OracleDrafts(TorchRuntime(target.model, load_drafter(drafter_dir, target)), _hf_greedy(family, root), seed=block_size)
    expected = _hf_greedy(family, root)
    assert _decode(runtime) == [expected[tuple(p)] for p in _prompts(0)]
    runs = runtime.accepted_runs
    assert len(set(runs)) > 3 and max(runs) == block_size - 1  # ragged acceptance, including whole blocks


@pytest.mark.parametrize("family", ["gpt_oss", "qwen3_5"])
def test_random_drafter_without_oracle_is_lossless(tmp_path, root, family):
    target_dir = _target(family, root)
    drafter_dir = make_tiny_drafter(tmp_path / "drafter", target_dir, seed=3, block_size=8, target_layer_ids=(0, 3))
    target = load_target(target_dir, dtype=torch.float64)
    expected = _hf_greedy(family, root)
    assert _decode(TorchRuntime(target.model, load_drafter(drafter_dir, target))) == [expected[tuple(p)] for p in _prompts(0)]


@pytest.mark.parametrize("model_type", list(MULTIMODAL_FAMILIES))
def test_multimodal_checkpoints_serve_their_text_path(tmp_path, model_type):
    """Qwen3.5/3.6, Gemma 4 and Kimi-K2.5 repos are multimodal: their text path is loaded and decoded
    losslessly against the multimodal model's own `generate`."""
    from transformers import AutoModelForImageTextToText

    target_dir = make_tiny_multimodal_target(tmp_path / "target", model_type, seed=5)
    drafter_dir = make_tiny_drafter(tmp_path / "drafter", target_dir, seed=6, block_size=8, target_layer_ids=(1, 2))
    target = load_target(target_dir, dtype=torch.float64)
    full = AutoModelForImageTextToText.from_pretrained(target_dir, dtype=torch.float64, experts_implementation="eager").eval()
    expected = {}
    for prompt in _prompts(0):
        with torch.no_grad():
            tokens = full.generate(
                torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0
            )
        expected[tuple(prompt)] = tokens[0, len(prompt) :].tolist()
    runtime = OracleDrafts(TorchRuntime(target.model, load_drafter(drafter_dir, target)), expected, seed=1)
    assert _decode(runtime) == [expected[tuple(p)] for p in _prompts(0)]


def test_gpt_oss_keeps_its_attention_sinks(root):
    """gpt-oss is loaded with eager attention (SDPA would drop the sinks), and the sinks matter."""
    model = load_target(_target("gpt_oss", root), dtype=torch.float64).model
    assert hf_compat.attention_implementation(model.config) == "eager"
    expected = _hf_greedy("gpt_oss", root)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.fill_(-1e4)  # sinks off: different outputs
    assert _decode(TorchRuntime(model)) != [expected[tuple(p)] for p in _prompts(0)]


def test_hybrid_linear_states_do_not_grow_with_context(root):
    target = load_target(_target("qwen3_5", root), dtype=torch.float64)
    runtime = TorchRuntime(target.model)
    runtime.allocate(2, 64)
    small = runtime.linear_states.nbytes
    runtime.allocate(2, 1024)
    assert runtime.linear_states.nbytes == small > 0
    assert runtime.is_hybrid and sorted(runtime.linear_modules) == [0, 1, 2]


# ----------------------------------------------------------------------------- our Gated DeltaNet layer


def _hf_layer_and_cache(family: str, root: str):
    from transformers import DynamicCache

    model = load_target(_target(family, root), dtype=torch.float64).model
    return model, DynamicCache(config=model.config)


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_linear_attention_layer_matches_transformers(root, family):
    """Prefill (ragged lengths) + a verify block through our layer give transformers' outputs, and
    committing k tokens leaves exactly the state transformers has after those tokens alone."""
    from trtllm_dflash.modeling.kv_cache import RaggedHFCache, StaticKVCache

    model, _ = _hf_layer_and_cache(family, root)
    runtime = TorchRuntime(model)
    module = runtime.linear_modules[0]
    torch.manual_seed(0)
    batch, prompt, block = 3, 9, 6
    hidden = torch.randn(batch, prompt + block, model.config.hidden_size, dtype=torch.float64)
    lengths = torch.tensor([9, 4, 7])
    kept = torch.tensor([6, 1, 3])

    states = linear_attention.LinearStates(runtime.linear_modules, batch, torch.float64, torch.device("cpu"))
    cache = RaggedHFCache(StaticKVCache.lazy(len(model.model.layers), batch, 32, torch.float64, torch.device("cpu")), states)
    rows = slice(0, batch)
    cache.bind(rows, torch.arange(prompt).expand(batch, -1), prompt, valid=lengths)
    with torch.no_grad():
        prefill = module(hidden[:, :prompt], cache_params=cache)
        # each row's block starts right after its own prompt
        blocks = torch.stack([hidden[r, lengths[r] : lengths[r] + block] for r in range(batch)])
        starts = lengths.view(-1, 1) + torch.arange(block)
        cache.bind(rows, starts, prompt + block)
        verify = module(blocks, cache_params=cache)
    states.commit(rows, kept)

    for r in range(batch):
        n = int(lengths[r])
        sequence = torch.cat([hidden[r, :n], blocks[r]]).unsqueeze(0)
        _, hf_cache = _hf_layer_and_cache(family, root)
        hf_module = model.model.layers[0].linear_attn
        with torch.no_grad():
            reference = hf_compat.call_with_linear_attention_cache(hf_module, sequence, None)  # transformers' own forward, no cache
            torch.testing.assert_close(prefill[r, :n], reference[0, :n])
            torch.testing.assert_close(verify[r], reference[0, n:])
            # transformers' state after the prompt and the kept tokens only
            hf_compat.call_with_linear_attention_cache(hf_module, sequence[:, : n + int(kept[r])], hf_cache)
        hf_conv = hf_cache.layers[0].conv_states[0]
        hf_recurrent = hf_cache.layers[0].recurrent_states[0]
        torch.testing.assert_close(states.layers[0].conv[r], hf_conv[0, :, 1:])
        torch.testing.assert_close(states.layers[0].recurrent[r], hf_recurrent[0])


def test_closed_form_block_equals_transformers_recurrent_kernel_at_every_position():
    """Our block kernel's outputs, and the state it forms for EVERY kept length n, equal
    transformers' token-by-token recurrent kernel (grouped value heads, random decay)."""
    from transformers import AutoModelForCausalLM

    hf = hf_compat.delta_rule_kernels(AutoModelForCausalLM.from_config(tiny_target_config("qwen3_5")).model.layers[0].linear_attn)
    torch.manual_seed(0)
    batch, length, k_heads, v_heads, dim = 3, 16, 2, 4, 8
    query, key = torch.randn(batch, length, k_heads, dim), torch.randn(batch, length, k_heads, dim)
    value = torch.randn(batch, length, v_heads, dim)
    g, beta = -torch.rand(batch, length, v_heads) * 2, torch.rand(batch, length, v_heads)
    initial = torch.randn(batch, v_heads, dim, dim) * 0.3
    out, keys, updates, decay_log = linear_attention.gated_delta_block(query, key, value, g, beta, initial, hf.l2norm)
    state = initial
    for t in range(length):
        expected, state = hf.recurrent(
            query[:, t : t + 1],
            key[:, t : t + 1],
            value[:, t : t + 1],
            g=g[:, t : t + 1],
            beta=beta[:, t : t + 1],
            initial_state=state,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
        torch.testing.assert_close(out[:, t], expected[:, 0])
        kept = torch.full((batch,), t + 1)
        torch.testing.assert_close(linear_attention.state_after(initial, keys, updates, decay_log, kept), state)
    ragged = torch.tensor([1, 9, 16])  # rows keep different lengths in one call
    formed = linear_attention.state_after(initial, keys, updates, decay_log, ragged)
    for r, n in enumerate(ragged.tolist()):
        torch.testing.assert_close(formed[r], linear_attention.state_after(initial, keys, updates, decay_log, torch.full((batch,), n))[r])

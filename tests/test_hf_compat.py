"""One test per transformers internal that trtllm_dflash/hf_compat.py relies on.

When a transformers release changes one of them, the test named after it fails here, next to
the one function to adapt, before the runtime tests that depend on it fail in bulk.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from trtllm_dflash import hf_compat
from trtllm_dflash.modeling.kv_cache import RaggedHFCache, StaticKVCache
from trtllm_dflash.testing.tiny import tiny_target_config

ROOT = Path(__file__).resolve().parents[1]


def _tiny(family: str, **overrides):
    torch.manual_seed(0)
    config = tiny_target_config(family)
    for name, value in overrides.items():
        setattr(config, name, value)
    return AutoModelForCausalLM.from_config(config).eval()


def test_tested_range_is_the_range_pyproject_allows():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in dependencies if re.match(r"transformers\b", d))
    assert sorted(spec.removeprefix("transformers").split(",")) == sorted(hf_compat.TESTED_TRANSFORMERS)


def test_cache_argument_routes_our_cache_through_the_model():
    """The decoder takes our Cache under `cache_argument` and gives DynamicCache's hidden states."""
    model = _tiny("qwen3")
    decoder = model.get_decoder()
    assert hf_compat.cache_argument(decoder) in {"cache", "past_key_values"}
    tokens = torch.randint(0, 100, (1, 7))
    positions = torch.arange(7).view(1, -1)
    with torch.no_grad():
        reference = hf_compat.forward_with_cache(decoder, DynamicCache(config=model.config), input_ids=tokens, use_cache=True)
        storage = StaticKVCache.lazy(model.config.num_hidden_layers, 1, 16, torch.float32, torch.device("cpu"))
        ours = RaggedHFCache(storage)
        ours.bind(slice(0, 1), positions, 7)
        mask = torch.ones(7, 7, dtype=torch.bool).tril().view(1, 1, 7, 7)
        out = hf_compat.forward_with_cache(decoder, ours, input_ids=tokens, position_ids=positions, attention_mask=mask, use_cache=True)
    torch.testing.assert_close(out.last_hidden_state, reference.last_hidden_state)
    assert all(layer.keys is not None for layer in storage.layers)  # every layer wrote through _RaggedLayer.update
    torch.testing.assert_close(storage.layers[0].keys[0, :7].transpose(0, 1), reference_keys(reference, 0))


def reference_keys(output, layer: int) -> torch.Tensor:
    cache = getattr(output, "cache", None) or output.past_key_values
    return cache.layers[layer].keys[0]


def test_linear_attention_layers_receive_our_cache():
    """A hybrid decoder hands our cache to each Gated DeltaNet layer (`cache` or `cache_params`)."""
    from trtllm_dflash.modeling import linear_attention

    model = _tiny("qwen3_5")
    decoder = model.get_decoder()
    modules = linear_attention.linear_attention_modules(decoder, model.config.get_text_config().layer_types)
    received = []
    for index, module in modules.items():
        original = module.forward
        module.forward = lambda hidden_states, attention_mask=None, _o=original, **kwargs: (
            received.append(hf_compat.linear_attention_cache(kwargs)),
            _o(hidden_states, attention_mask=attention_mask, **kwargs),
        )[1]
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        hf_compat.forward_with_cache(decoder, cache, input_ids=torch.randint(0, 100, (1, 5)), use_cache=True)
    assert received == [cache] * len(modules)


def test_call_with_linear_attention_cache_updates_transformers_state():
    model = _tiny("qwen3_5")
    module = model.get_decoder().layers[0].linear_attn
    cache = DynamicCache(config=model.config)
    hidden = torch.randn(1, 5, model.config.hidden_size)
    with torch.no_grad():
        with_cache = hf_compat.call_with_linear_attention_cache(module.forward, hidden, cache)
        without = hf_compat.call_with_linear_attention_cache(module.forward, hidden, None)
    torch.testing.assert_close(with_cache, without)
    assert cache.layers[0].conv_states[0] is not None and cache.layers[0].recurrent_states[0].abs().sum() > 0


def test_delta_rule_kernels_chunked_equals_recurrent():
    """The chunked kernel we run for prefill, called as linear_attention.py calls it (grouped value heads)."""
    model = _tiny("qwen3_5")
    module = model.get_decoder().layers[0].linear_attn
    chunked, recurrent, l2norm = hf_compat.delta_rule_kernels(module)
    torch.manual_seed(1)
    q, k, v = torch.randn(1, 9, 2, 8), torch.randn(1, 9, 2, 8), torch.randn(1, 9, 4, 8)
    g, beta, state = -torch.rand(1, 9, 4), torch.rand(1, 9, 4), torch.randn(1, 4, 8, 8)
    kwargs = dict(g=g, beta=beta, initial_state=state.clone(), output_final_state=True, use_qk_l2norm_in_kernel=True)
    out, final = chunked(q, k, v, **kwargs)
    expected, expected_final = recurrent(q, k, v, **kwargs)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(final, expected_final, atol=1e-4, rtol=1e-4)
    x = torch.randn(3, 8)
    torch.testing.assert_close(l2norm(x, dim=-1, eps=1e-6), torch.nn.functional.normalize(x, dim=-1), atol=1e-5, rtol=1e-5)


def test_registered_attention_is_called_by_the_model():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    calls = []

    def recording(module, query, key, value, attention_mask, **kwargs):
        calls.append(module.layer_idx)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    hf_compat.register_attention("dflash_compat_probe", recording)
    model = _tiny("qwen3")
    tokens = torch.randint(0, 100, (1, 6))
    with torch.no_grad():
        reference = model(tokens).logits
        previous = hf_compat.attention_implementation(model.config)
        hf_compat.set_attention_implementation(model.config, "dflash_compat_probe")
        assert hf_compat.attention_implementation(model.config) == "dflash_compat_probe"
        probed = model(tokens).logits
        hf_compat.set_attention_implementation(model.config, previous)
    assert calls == list(range(model.config.num_hidden_layers))
    torch.testing.assert_close(probed, reference)


def test_registered_experts_are_called_by_the_model():
    model = _tiny("qwen3_moe")
    assert hf_compat.can_set_experts(model)
    assert not hf_compat.can_set_experts(_tiny("qwen3"))
    tokens = torch.randint(0, 100, (1, 6))
    previous = hf_compat.experts_implementation(model)
    calls = []

    def recording(self, hidden_states, top_k_index, top_k_weights):
        calls.append(hidden_states.shape)
        return torch.zeros_like(hidden_states)

    hf_compat.register_experts("dflash_compat_probe", recording)
    with torch.no_grad():
        reference = model(tokens).logits
        model.set_experts_implementation("dflash_compat_probe")
        zeroed = model(tokens).logits
        model.set_experts_implementation(previous)
    assert len(calls) == model.config.num_hidden_layers
    assert not torch.allclose(zeroed, reference)


def test_qwen3_blocks_compute_what_the_drafter_assumes():
    config = tiny_target_config("qwen3")
    norm = hf_compat.Qwen3RMSNorm(8, eps=1e-6)
    norm.weight.data = torch.linspace(0.5, 2.0, 8)
    x = torch.randn(3, 8)
    torch.testing.assert_close(norm(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight)
    mlp = hf_compat.Qwen3MLP(config)
    torch.testing.assert_close(
        mlp(x.new_ones(2, config.hidden_size)),
        mlp.down_proj(
            torch.nn.functional.silu(mlp.gate_proj(x.new_ones(2, config.hidden_size))) * mlp.up_proj(x.new_ones(2, config.hidden_size))
        ),
    )
    cos, sin = hf_compat.Qwen3RotaryEmbedding(config)(x, torch.arange(5).view(1, -1))
    assert cos.shape == sin.shape == (1, 5, config.head_dim)
    torch.testing.assert_close(cos[0, 0], torch.ones(config.head_dim))


def test_chat_templates_compile_through_the_routed_compiler(monkeypatch):
    """chat.py's bounded rendering: while active, transformers' apply_chat_template renders the
    template our compiler returns (compiled in a copy of its sandbox); otherwise its own."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast
    from transformers.utils import chat_template_utils

    monkeypatch.setattr(chat_template_utils, "_compile_jinja_template", chat_template_utils._compile_jinja_template)  # restored after
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    environment = hf_compat.chat_template_environment()
    assert environment.is_safe_attribute("x", "__class__", None) is False  # the sandbox, not a plain Environment
    seen, active = [], [True]

    def compile_template(text):
        seen.append(text)
        return environment.from_string(text.replace("m['content']", "m['content'] | upper"))

    assert hf_compat.route_chat_template_compilation(compile_template, lambda: active[0])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"a": 0}, unk_token="a")))
    messages = [{"role": "user", "content": "hi"}]
    assert tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False) == "HI" and seen == [template]
    active[0] = False
    assert tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False) == "hi" and seen == [template]


@pytest.mark.parametrize("module", ["trtllm_dflash", "plugins", "cli", "tests", "benchmarks"])
def test_no_transformers_internals_outside_the_compat_module(module):
    pattern = re.compile(
        r"transformers\.(cache_utils|integrations|models\.|utils\.chat_template_utils)|\._(attn|experts)_implementation\b|\.cache_params\b"
    )
    offenders = []
    for path in (ROOT / module).rglob("*.py"):
        if path.name in {"hf_compat.py", "test_hf_compat.py"}:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)

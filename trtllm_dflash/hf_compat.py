"""Every place trtllm-dflash relies on transformers beyond `from_pretrained` and `model(...)`.

The torch runtime and the export plug into transformers below its documented model API: our
own KV cache objects, the Gated DeltaNet layers' forward and kernels, the attention and experts
registries, and Qwen3's building blocks for the drafter. Minor releases change these (5.24
renamed the models' `past_key_values` argument to `cache` and the linear-attention layers'
`cache_params` to `cache`), so they all live here, each with its own test in
tests/test_hf_compat.py: the next break fails one named test instead of twenty scattered ones.
Nothing outside this module imports from `transformers.cache_utils`, `transformers.integrations`
or a `transformers.models.*` modeling file, or reads a private `_` attribute of a config.
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any, Callable, NamedTuple

from torch import nn
from transformers.cache_utils import Cache, CacheLayerMixin  # noqa: F401  (Cache: the base class of our caches)
from transformers.models.qwen3.modeling_qwen3 import (  # noqa: F401  (the drafter's layers are Qwen3's)
    Qwen3MLP,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
)


class OwnedCacheLayer(CacheLayerMixin):
    """A transformers cache layer whose storage lives in its owner (one of our `Cache` subclasses).

    Subclasses implement `update`; the mixin's other hooks (lazy initialization, the compile and
    sliding flags) are settled here, the one place that knows transformers' cache-layer protocol.
    """

    is_compileable = False
    is_sliding = False

    def __init__(self, owner: Cache, index: int) -> None:
        super().__init__()
        self.owner = owner
        self.index = index
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        pass


# The transformers releases this module was tested against: the range pyproject.toml allows
# (tests/test_hf_compat.py keeps the two in step). Newer releases may work; they are not known to.
TESTED_TRANSFORMERS = (">=5.17", "<=5.24.0")


# ----------------------------------------------------------------------------- the cache argument


@functools.cache
def _cache_argument(forward: Callable) -> str:
    parameters = inspect.signature(forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def cache_argument(model: nn.Module) -> str:
    """The name under which `model.forward` takes a Cache: `cache` from 5.24, `past_key_values` before."""
    return _cache_argument(type(model).forward)


def forward_with_cache(model: nn.Module, cache: Cache | None, **inputs: Any):
    """`model(**inputs)` with `cache` passed under the name this transformers release expects."""
    return model(**inputs, **{cache_argument(model): cache})


def linear_attention_cache(kwargs: dict[str, Any]) -> Cache | None:
    """Take the cache out of a linear-attention layer's forward kwargs (`cache` or `cache_params`)."""
    cache = kwargs.pop("cache", None)
    legacy = kwargs.pop("cache_params", None)
    return cache if cache is not None else legacy


def call_with_linear_attention_cache(forward: Callable, hidden_states, cache: Cache | None, **kwargs: Any):
    """Call a linear-attention layer's original forward with the cache under its own name."""
    name = "cache" if "cache" in inspect.signature(forward).parameters else "cache_params"
    return forward(hidden_states, **{name: cache}, **kwargs)


# ----------------------------------------------------------------------------- Gated DeltaNet


class DeltaRuleKernels(NamedTuple):
    chunked: Callable  # (q, k, v, g=, beta=, initial_state=, output_final_state=, use_qk_l2norm_in_kernel=)
    recurrent: Callable  # the same arguments, token by token: the reference ours is tested against
    l2norm: Callable  # (x, dim=, eps=)


def delta_rule_kernels(module: nn.Module) -> DeltaRuleKernels:
    """The gated-delta-rule kernels of a Gated DeltaNet layer's modeling file.

    They are module-level functions of each family's modeling file (qwen3_5, qwen3_5_moe,
    qwen3_next); we run transformers' chunked kernel for prefill and test ours against both.
    Before 5.2x the kernels took as many query/key heads as value heads (the layer repeated them
    first); newer ones accept grouped heads. Ours always get them repeated, which both accept.
    """
    kernels = sys.modules[type(module).__module__]
    return DeltaRuleKernels(
        _repeat_key_heads(kernels.torch_chunk_gated_delta_rule), _repeat_key_heads(kernels.torch_recurrent_gated_delta_rule), kernels.l2norm
    )


def _repeat_key_heads(kernel: Callable) -> Callable:
    """`kernel(query, key, value, ...)` with query/key `[b, T, Hk, D]` repeated to value's Hv heads."""

    @functools.wraps(kernel)
    def grouped(query, key, value, *args, **kwargs):
        groups = value.shape[2] // key.shape[2]
        if groups > 1:
            query, key = query.repeat_interleave(groups, dim=2), key.repeat_interleave(groups, dim=2)
        return kernel(query, key, value, *args, **kwargs)

    return grouped


# ----------------------------------------------------------------------------- registries and private config fields


def register_attention(name: str, function: Callable) -> None:
    """Make `name` a valid attention implementation (transformers' public AttentionInterface)."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, function)


def attention_function(config) -> Callable:
    """The attention function a config selects (`sdpa_attention_forward`, eager, a registered one),
    called as the model's own attention modules call it."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.qwen3.modeling_qwen3 import eager_attention_forward

    return ALL_ATTENTION_FUNCTIONS.get_interface(attention_implementation(config), eager_attention_forward)


def attention_implementation(config) -> str:
    """The attention implementation a config selects (`eager`, `sdpa`, a registered name)."""
    return getattr(config, "_attn_implementation", None) or "sdpa"


def set_attention_implementation(config, name: str) -> None:
    """Select `name` for every attention layer built from `config`, without rebuilding the model."""
    config._attn_implementation = name


def register_experts(name: str, function: Callable) -> None:
    """Make `name` a valid MoE experts implementation (once per name)."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if name not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(name, function)


def can_set_experts(model: nn.Module) -> bool:
    """Whether the model's MoE experts can be switched to another implementation."""
    can_set = getattr(model, "_can_set_experts_implementation", None)
    return can_set is not None and bool(can_set())


def experts_implementation(model: nn.Module) -> str | None:
    return getattr(model.config, "_experts_implementation", None)


def transformers_mxfp4_dequantize(blocks, scales, dtype):
    """transformers' own gpt-oss MXFP4 dequantization ([E, in, out]): the reference our codec is tested against."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    return convert_moe_packed_tensors(blocks, scales, dtype=dtype)


# ----------------------------------------------------------------------------- chat template compilation
#
# transformers (5.17-5.24) compiles a chat template once, in utils.chat_template_utils:
# `_compile_jinja_template` (lru-cached) calls `_cached_compile_jinja_template`, which builds its
# ImmutableSandboxedEnvironment and compiles the template there. chat.py bounds rendering by
# compiling in an environment of its own; these two functions are all it knows of that.


def chat_template_environment() -> Any:
    """A fresh copy of the sandboxed Jinja environment transformers compiles chat templates in."""
    from transformers.utils import chat_template_utils

    return chat_template_utils._cached_compile_jinja_template("").environment


def route_chat_template_compilation(compile_template: Callable[[str], Any], active: Callable[[], bool]) -> bool:
    """Have transformers compile chat templates with `compile_template` while `active()` is true,
    with its own compiler otherwise. False (nothing changed) where transformers compiles elsewhere."""
    try:
        from transformers.utils import chat_template_utils
    except ImportError:
        return False
    original = getattr(chat_template_utils, "_compile_jinja_template", None)
    if original is None or getattr(chat_template_utils, "_cached_compile_jinja_template", None) is None:
        return False

    def compile_routed(template: str):
        return compile_template(template) if active() else original(template)

    chat_template_utils._compile_jinja_template = compile_routed
    return True

"""Gated DeltaNet layers (the linear attention of Qwen3.5 / Qwen3.6 / Qwen3-Next) under speculation.

An attention layer rolls back rejected drafts for free (slot == position, see kv_cache.py). A
linear-attention layer cannot: its state (one recurrent matrix per value head, plus the last
K-1 inputs of its causal convolution) is overwritten by every token. After a verify pass over
anchor + drafts, each row must continue from the state it would have had after consuming only
its anchor and ITS accepted drafts, and rows accept different lengths.

So a verify pass keeps the state after every block position (the block is at most 16 tokens;
SGLang's `extra_buffer` does the same) and the conv inputs of the whole block, and `commit`
selects, per row, the ones after the kept tokens: a gather, no second pass over the block.
Prefill runs transformers' own chunked kernel on each row's real length (right padding would
otherwise flow into the state) and commits at once.

The projections, the convolution weights, the gated delta rule kernels and the gated norm are
the model's own transformers code; only the state bookkeeping is ours. `gated_delta_net_forward`
replaces the layer's forward only while our cache drives it; any other call (training, HF
`generate`) goes to the original forward.
"""

from __future__ import annotations

import dataclasses
import functools
import sys

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

from trtllm_dflash.errors import DFlashError

LINEAR_ATTENTION = "linear_attention"


def is_gated_delta_net(module: nn.Module) -> bool:
    """A transformers Gated DeltaNet layer of a family whose projections we know."""
    return all(hasattr(module, name) for name in ("A_log", "dt_bias", "conv1d", "norm", "out_proj")) and (
        hasattr(module, "in_proj_qkv") or hasattr(module, "in_proj_qkvz")
    )


def linear_attention_modules(decoder: nn.Module, layer_types: list[str]) -> dict[int, nn.Module]:
    """The linear-attention module of each `linear_attention` layer; refuses kinds we cannot roll back."""
    modules = {}
    for i, kind in enumerate(layer_types):
        if kind != LINEAR_ATTENTION:
            continue
        module = getattr(decoder.layers[i], "linear_attn", None)
        if module is None or not is_gated_delta_net(module):
            name = type(module).__name__ if module is not None else "none"
            raise DFlashError(
                f"target layer {i} is a linear-attention layer of a kind the torch runtime cannot roll back ({name})",
                "use a Gated DeltaNet hybrid (Qwen3.5, Qwen3.6, Qwen3-Next) or a pure-attention target",
            )
        modules[i] = module
    return modules


@dataclasses.dataclass
class LinearLayerState:
    """Committed and pending states of one Gated DeltaNet layer for up to max_batch rows."""

    conv: torch.Tensor  # [max_batch, conv_dim, K-1]: the last K-1 conv inputs of each row
    recurrent: torch.Tensor  # [max_batch, v_heads, k_dim, v_dim], float32 like transformers keeps it
    pending_conv: torch.Tensor | None = None  # [b, conv_dim, K-1+T]: committed inputs + the verified block's
    pending_recurrent: torch.Tensor | None = None  # [b, T, v_heads, k_dim, v_dim]: state after each block position
    pending_rows: slice | None = None


class LinearStates:
    """The states of every linear-attention layer of a hybrid target.

    `capture_positions=False` runs a verify pass with transformers' chunked kernel and keeps only
    the final state: wrong for speculation (only a fully accepted block could be committed), it
    exists so benchmarks/bench_hybrid.py can measure what keeping per-position states costs.
    """

    def __init__(self, modules: dict[int, nn.Module], max_batch: int, dtype: torch.dtype, device: torch.device) -> None:
        self.capture_positions = True
        self.layers: dict[int, LinearLayerState] = {}
        for index, module in modules.items():
            conv = torch.zeros(max_batch, module.conv_dim, module.conv_kernel_size - 1, dtype=dtype, device=device)
            shape = (max_batch, module.num_v_heads, module.head_k_dim, module.head_v_dim)
            self.layers[index] = LinearLayerState(conv, torch.zeros(shape, dtype=torch.float32, device=device))

    def commit(self, rows: slice, kept: torch.Tensor) -> None:
        """Rows keep the first kept[r] (>= 1) tokens of the last verify pass: select their states."""
        for layer in self.layers.values():
            if layer.pending_recurrent is None:
                continue
            _store(layer, layer.pending_rows, layer.pending_conv, layer.pending_recurrent, kept)
            layer.pending_conv = layer.pending_recurrent = layer.pending_rows = None

    def keep_rows(self, index: torch.Tensor) -> None:
        count = index.numel()
        for layer in self.layers.values():
            layer.conv[:count] = layer.conv.index_select(0, index)
            layer.recurrent[:count] = layer.recurrent.index_select(0, index)

    @property
    def nbytes(self) -> int:
        """Committed state bytes (independent of the context length)."""
        return sum(layer.conv.nbytes + layer.recurrent.nbytes for layer in self.layers.values())


def _store(layer: LinearLayerState, rows: slice, window: torch.Tensor, states: torch.Tensor, kept: torch.Tensor) -> None:
    """Commit, per row, the conv inputs ending at token kept-1 and the recurrent state after it."""
    batch, channels, width = layer.conv[rows].shape
    index = (kept.view(-1, 1) + torch.arange(width, device=kept.device)).view(batch, 1, width)
    layer.conv[rows] = torch.gather(window, 2, index.expand(-1, channels, -1)).to(layer.conv.dtype)
    step = (kept - 1).clamp(max=states.shape[1] - 1)
    layer.recurrent[rows] = states[torch.arange(batch, device=kept.device), step].to(layer.recurrent.dtype)


def _project(module: nn.Module, hidden: torch.Tensor):
    """Conv inputs `[b, T, conv_dim]`, gate z `[b, T, Hv, Dv]`, b and a `[b, T, Hv]` (the family's own layout)."""
    batch, length, _ = hidden.shape
    if hasattr(module, "in_proj_qkvz"):  # Qwen3-Next: fused, head-grouped projections
        query, key, value, z, b, a = module.fix_query_key_value_ordering(module.in_proj_qkvz(hidden), module.in_proj_ba(hidden))
        mixed = torch.cat([x.reshape(batch, length, -1) for x in (query, key, value)], dim=-1)
        return mixed, z, b, a
    z = module.in_proj_z(hidden).reshape(batch, length, -1, module.head_v_dim)  # Qwen3.5 / 3.6
    return module.in_proj_qkv(hidden), z, module.in_proj_b(hidden), module.in_proj_a(hidden)


def gated_delta_net_forward(module: nn.Module, original, hidden_states: torch.Tensor, cache_params=None, attention_mask=None, **kwargs):
    """The layer's forward under our RaggedHFCache (see the module docstring)."""
    states: LinearStates | None = getattr(cache_params, "linear_states", None)
    if states is None:
        return original(hidden_states, cache_params=cache_params, attention_mask=attention_mask, **kwargs)
    kernels = sys.modules[type(module).__module__]  # the family's modeling file: its delta-rule kernels
    layer = states.layers[module.layer_idx]
    rows, valid = cache_params.rows, cache_params.valid
    batch, length, _ = hidden_states.shape

    mixed, z, b, a = _project(module, hidden_states)
    conv_state, recurrent = layer.conv[rows], layer.recurrent[rows]
    if valid is not None:  # prefill: rows starting at position 0 start from a zero state
        fresh = cache_params.positions[:, 0] == 0
        conv_state = conv_state.masked_fill(fresh.view(-1, 1, 1), 0)
        recurrent = recurrent.masked_fill(fresh.view(-1, 1, 1, 1), 0)
    window = torch.cat([conv_state, mixed.transpose(1, 2).to(conv_state.dtype)], dim=-1)
    weight = module.conv1d.weight
    conv = F.conv1d(window.to(weight.dtype), weight, module.conv1d.bias, groups=module.conv_dim)
    mixed = ACT2FN[module.activation](conv).to(hidden_states.dtype).transpose(1, 2)

    query, key, value = torch.split(mixed, [module.key_dim, module.key_dim, module.value_dim], dim=-1)
    query = query.reshape(batch, length, -1, module.head_k_dim)
    key = key.reshape(batch, length, -1, module.head_k_dim)
    value = value.reshape(batch, length, -1, module.head_v_dim)
    beta = b.sigmoid()
    g = -module.A_log.float().exp() * F.softplus(a.float() + module.dt_bias)

    if valid is not None:
        core = torch.zeros(batch, length, module.num_v_heads, module.head_v_dim, dtype=hidden_states.dtype, device=hidden_states.device)
        finals = []
        for r, n in enumerate(valid.tolist()):
            out, final = kernels.torch_chunk_gated_delta_rule(
                query[r : r + 1, :n], key[r : r + 1, :n], value[r : r + 1, :n], g=g[r : r + 1, :n], beta=beta[r : r + 1, :n],
                initial_state=recurrent[r : r + 1].clone(), output_final_state=True, use_qk_l2norm_in_kernel=True,
            )
            core[r, :n] = out[0]
            finals.append(final)
        _store(layer, rows, window, torch.cat(finals).unsqueeze(1), valid)
    elif not states.capture_positions:
        core, final = kernels.torch_chunk_gated_delta_rule(
            query, key, value, g=g, beta=beta, initial_state=recurrent.clone(), output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
        # the final state stands at position T-1: only kept == T selects the right one
        per_position = final.unsqueeze(1).expand(-1, length, *final.shape[1:])
        layer.pending_conv, layer.pending_recurrent, layer.pending_rows = window, per_position, rows
    else:
        outputs, per_position = [], []
        state = recurrent.clone()
        for t in range(length):
            out, state = kernels.torch_recurrent_gated_delta_rule(
                query[:, t : t + 1], key[:, t : t + 1], value[:, t : t + 1], g=g[:, t : t + 1], beta=beta[:, t : t + 1],
                initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True,
            )
            outputs.append(out)
            per_position.append(state)
        core = torch.cat(outputs, dim=1)
        layer.pending_conv, layer.pending_recurrent, layer.pending_rows = window, torch.stack(per_position, dim=1), rows

    core = module.norm(core.reshape(-1, module.head_v_dim), z.reshape(-1, module.head_v_dim))
    return module.out_proj(core.reshape(batch, length, -1))


def install(modules: dict[int, nn.Module]) -> None:
    """Route the layers' forward through `gated_delta_net_forward` (idempotent)."""
    for module in modules.values():
        if not getattr(module, "_dflash_rollback", False):
            module.forward = functools.partial(gated_delta_net_forward, module, module.forward)
            module._dflash_rollback = True

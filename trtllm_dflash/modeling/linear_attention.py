"""Gated DeltaNet layers (the linear attention of Qwen3.5 / Qwen3.6 / Qwen3-Next) under speculation.

An attention layer rolls back rejected drafts for free (slot == position, see kv_cache.py). A
linear-attention layer cannot: its state (one recurrent matrix S per value head, plus the last
K-1 inputs of its causal convolution) is overwritten by every token. After a verify pass over
anchor + drafts, each row must continue from the state it would have had after consuming only
its anchor and ITS accepted drafts, and rows accept different lengths.

The gated delta rule, per head, with k normalised and g <= 0:
    S_t = exp(g_t) S_{t-1} + k_t u_t^T,   u_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t)
unrolls over a block to
    S_n = exp(G_n) S_0 + sum_{i<=n} exp(G_n - G_i) k_i u_i^T,   G_n = g_1 + ... + g_n.
A verify pass computes the block's updates u_i in closed form (one unit-triangular solve,
`gated_delta_block`) and keeps k_i, u_i and G_i (T x (Dk + Dv + 1) numbers per head, not T
copies of the Dk x Dv state). `commit` then forms each row's S_n for its own n = anchor +
accepted drafts with one weighted sum, and takes the conv inputs ending at token n-1 from the
block's window. Nothing is re-run: no projection, convolution or attention is computed twice.

Prefill runs transformers' own chunked kernel on each row's real length (right padding would
otherwise flow into the state) and commits at once. The projections, convolution weights and
gated norm are the model's own transformers code; `gated_delta_block` is ours and is tested
against transformers' recurrent kernel (outputs and states). `gated_delta_net_forward` replaces
the layer's forward only while our cache drives it; any other call (training, HF `generate`)
goes to the original forward.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

from trtllm_dflash import hf_compat
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.modeling.slots import Slots

LINEAR_ATTENTION = "linear_attention"
KEPT_STATES = 2  # prefix caching: states kept per row and prefill (a prompt's stored end, and where it left a cached prefix)


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
    """Committed state of one Gated DeltaNet layer for up to max_batch rows, and what the last
    verify pass left for `commit`."""

    conv: torch.Tensor  # [max_batch, conv_dim, K-1]: the last K-1 conv inputs of each row
    recurrent: torch.Tensor  # [max_batch, v_heads, k_dim, v_dim], float32 like transformers keeps it
    pending_conv: torch.Tensor | None = None  # [b, conv_dim, K-1+T]: committed inputs + the block's
    pending_keys: torch.Tensor | None = None  # [b, v_heads, T, k_dim]: normalised k_i
    pending_updates: torch.Tensor | None = None  # [b, v_heads, T, v_dim]: u_i
    pending_decay: torch.Tensor | None = None  # [b, v_heads, T]: G_i, cumulative log decay


class LinearStates:
    """The states of every linear-attention layer of a hybrid target.

    `capture_positions=False` runs a verify pass with transformers' chunked kernel and keeps only
    its final state: wrong for speculation (only a fully accepted block could be committed), it
    exists so benchmarks/bench_hybrid.py can put the rollback's cost next to a pass without it.
    """

    def __init__(self, modules: dict[int, nn.Module], max_batch: int, dtype: torch.dtype, device: torch.device) -> None:
        self.capture_positions = True
        self.max_batch = max_batch
        # prefix caching: the states after the prompt lengths `kept_lengths[row]` (-1: none), kept by the
        # prefill passes (whole or chunked) that reach them, in `kept` (layer -> conv, recurrent
        # [max_batch, KEPT_STATES, ...]), by slot
        self.kept: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.kept_lengths = torch.full((max_batch, KEPT_STATES), -1, dtype=torch.long)
        self.layers: dict[int, LinearLayerState] = {}
        for index, module in modules.items():
            conv = torch.zeros(max_batch, module.conv_dim, module.conv_kernel_size - 1, dtype=dtype, device=device)
            shape = (max_batch, module.num_v_heads, module.head_k_dim, module.head_v_dim)
            self.layers[index] = LinearLayerState(conv, torch.zeros(shape, dtype=torch.float32, device=device))

    def commit(self, slots: Slots | slice, kept: torch.Tensor) -> None:
        """Batch rows keep the first kept[r] (>= 1) tokens of the last verify pass: form their slots' states."""
        rows = Slots.of(slots, kept.device).select
        for layer in self.layers.values():
            if layer.pending_keys is None:
                continue
            _store_conv(layer, rows, layer.pending_conv, kept)
            layer.recurrent[rows] = state_after(layer.recurrent[rows], layer.pending_keys, layer.pending_updates, layer.pending_decay, kept)
            layer.pending_conv = layer.pending_keys = layer.pending_updates = layer.pending_decay = None

    def keep_states_at(self, slots: Slots | slice, lengths: list[tuple[int, ...]]) -> None:
        """Ask the prefill of `slots` (in one pass or in chunks) to keep each slot's states after these
        prompt lengths; the other slots' requests stand."""
        if max(map(len, lengths), default=0) > KEPT_STATES:
            raise ValueError(f"at most {KEPT_STATES} kept states per row")
        for slot, at in zip(Slots.of(slots).ids, lengths):
            self.kept_lengths[slot] = torch.tensor(sorted(at) + [-1] * (KEPT_STATES - len(at)))

    def keep_state(self, slot: int, kept_index: int, layer_index: int, conv: torch.Tensor, recurrent: torch.Tensor) -> None:
        """Keep one slot's state at a prefix's end (prefix caching), beside its live state."""
        if layer_index not in self.kept:
            layer = self.layers[layer_index]
            with torch.inference_mode(False):  # first kept inside a forward pass; the buffers outlive it
                self.kept[layer_index] = tuple(
                    torch.zeros(t.shape[0], KEPT_STATES, *t.shape[1:], dtype=t.dtype, device=t.device)
                    for t in (layer.conv, layer.recurrent)
                )
        self.kept[layer_index][0][slot, kept_index] = conv
        self.kept[layer_index][1][slot, kept_index] = recurrent

    def export_state(self, slot: int, length: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Copies of the states the last prefill kept for `slot` after `length` tokens, by layer."""
        kept = (self.kept_lengths[slot] == length).nonzero().flatten().tolist()
        if not kept:
            raise ValueError(f"no state was kept for slot {slot} at {length} tokens")
        return {i: (conv[slot, kept[0]].clone(), recurrent[slot, kept[0]].clone()) for i, (conv, recurrent) in self.kept.items()}

    def import_state(self, slot: int, saved: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Make saved states (`export_state`) the slot's live state."""
        for i, (conv, recurrent) in saved.items():
            self.layers[i].conv[slot] = conv
            self.layers[i].recurrent[slot] = recurrent

    @property
    def nbytes(self) -> int:
        """Committed state bytes (independent of the context length)."""
        return sum(layer.conv.nbytes + layer.recurrent.nbytes for layer in self.layers.values())


def _store_conv(layer: LinearLayerState, rows: "slice | torch.Tensor", window: torch.Tensor, kept: torch.Tensor) -> None:
    """Commit, per row, the K-1 conv inputs ending at token kept-1 of `window` ([committed; block])."""
    batch, channels, width = layer.conv[rows].shape
    index = (kept.view(-1, 1) + torch.arange(width, device=kept.device)).view(batch, 1, width)
    layer.conv[rows] = torch.gather(window, 2, index.expand(-1, channels, -1)).to(layer.conv.dtype)


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2).to(torch.float32)


def gated_delta_block(query, key, value, g, beta, initial_state, l2norm):
    """The gated delta rule over a short block in closed form (the module docstring's algebra).

    query/key `[b, T, Hk, Dk]`, value `[b, T, Hv, Dv]`, g/beta `[b, T, Hv]`, initial_state
    `[b, Hv, Dk, Dv]`. Returns the outputs `[b, T, Hv, Dv]` and, heads first, the normalised keys
    `[b, Hv, T, Dk]`, the updates u `[b, Hv, T, Dv]` and the cumulative log decay G `[b, Hv, T]`.
    float32, q and k L2-normalised and q scaled by Dk^-0.5, as transformers' kernels do.
    """
    heads = value.shape[2]
    if key.shape[2] != heads:  # grouped value heads: each q/k head serves heads / Hk value heads
        query = query.repeat_interleave(heads // key.shape[2], dim=2)
        key = key.repeat_interleave(heads // key.shape[2], dim=2)
    q, k, v = _heads_first(query), _heads_first(key), _heads_first(value)
    q = l2norm(q, dim=-1, eps=1e-6) / q.shape[-1] ** 0.5
    k = l2norm(k, dim=-1, eps=1e-6)
    beta, decay_log = _heads_first(beta), _heads_first(g).cumsum(-1)
    length = q.shape[2]
    causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    decay = (decay_log.unsqueeze(-1) - decay_log.unsqueeze(-2)).masked_fill(~causal, float("-inf")).exp()
    state = initial_state.to(torch.float32)
    k_beta = k * beta.unsqueeze(-1)
    # (I + A) U = beta V - (beta K * exp(G)) S_0,  A[t, i] = beta_t (k_t . k_i) exp(G_t - G_i) for i < t
    eye = torch.eye(length, dtype=torch.bool, device=q.device)
    system = ((k_beta @ k.transpose(-1, -2)) * decay).masked_fill(eye, 1.0)
    rhs = v * beta.unsqueeze(-1) - (k_beta * decay_log.exp().unsqueeze(-1)) @ state
    updates = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    out = (q * decay_log.exp().unsqueeze(-1)) @ state + ((q @ k.transpose(-1, -2)) * decay) @ updates
    return out.transpose(1, 2), k, updates, decay_log


def state_after(
    state: torch.Tensor, keys: torch.Tensor, updates: torch.Tensor, decay_log: torch.Tensor, kept: torch.Tensor
) -> torch.Tensor:
    """S_n = exp(G_n) S_0 + sum_{i<=n} exp(G_n - G_i) k_i u_i^T for each row's n = kept[r] (>= 1)."""
    batch, heads, length = decay_log.shape
    last = decay_log.gather(-1, (kept - 1).view(-1, 1, 1).expand(-1, heads, 1))  # G_n, [b, h, 1]
    within = (torch.arange(length, device=kept.device).view(1, -1) < kept.view(-1, 1)).unsqueeze(1)
    weights = (last - decay_log).masked_fill(~within, float("-inf")).exp()  # [b, h, T]
    return last.exp().unsqueeze(-1) * state + (weights.unsqueeze(-1) * keys).transpose(-1, -2) @ updates


def _project(module: nn.Module, hidden: torch.Tensor):
    """Conv inputs `[b, T, conv_dim]`, gate z `[b, T, Hv, Dv]`, b and a `[b, T, Hv]` (the family's own layout)."""
    batch, length, _ = hidden.shape
    if hasattr(module, "in_proj_qkvz"):  # Qwen3-Next: fused, head-grouped projections
        query, key, value, z, b, a = module.fix_query_key_value_ordering(module.in_proj_qkvz(hidden), module.in_proj_ba(hidden))
        mixed = torch.cat([x.reshape(batch, length, -1) for x in (query, key, value)], dim=-1)
        return mixed, z, b, a
    z = module.in_proj_z(hidden).reshape(batch, length, -1, module.head_v_dim)  # Qwen3.5 / 3.6
    return module.in_proj_qkv(hidden), z, module.in_proj_b(hidden), module.in_proj_a(hidden)


def gated_delta_net_forward(module: nn.Module, original, hidden_states: torch.Tensor, attention_mask=None, **kwargs):
    """The layer's forward under our RaggedHFCache (see the module docstring)."""
    cache = hf_compat.linear_attention_cache(kwargs)
    states: LinearStates | None = getattr(cache, "linear_states", None)
    if states is None:
        return hf_compat.call_with_linear_attention_cache(original, hidden_states, cache, attention_mask=attention_mask, **kwargs)
    chunk_gated_delta_rule, _, l2norm = hf_compat.delta_rule_kernels(module)
    layer = states.layers[module.layer_idx]
    slots, valid = cache.slots, cache.valid
    rows = slots.select
    batch, length, _ = hidden_states.shape

    mixed, z, b, a = _project(module, hidden_states)
    conv_state, recurrent = layer.conv[rows], layer.recurrent[rows]
    if valid is not None:  # prefill: rows starting at position 0 start from a zero state
        fresh = cache.positions[:, 0] == 0
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
            state = recurrent[r : r + 1].clone()
            # prefix caching: run the row in pieces and keep the states between them
            row = slots.ids[r]
            start = int(cache.positions[r, 0])
            cuts = {at - start: kept for kept, at in enumerate(states.kept_lengths[row].tolist()) if at >= 0}  # pass offset -> kept index
            bounds = [0, *sorted(cut for cut in cuts if 0 < cut < n), n]
            for lo, hi in zip(bounds, bounds[1:]):
                out, state = chunk_gated_delta_rule(
                    query[r : r + 1, lo:hi],
                    key[r : r + 1, lo:hi],
                    value[r : r + 1, lo:hi],
                    g=g[r : r + 1, lo:hi],
                    beta=beta[r : r + 1, lo:hi],
                    initial_state=state,
                    output_final_state=True,
                    use_qk_l2norm_in_kernel=True,
                )
                core[r, lo:hi] = out[0]
                if hi in cuts:
                    conv_inputs = window[r, :, hi : hi + window.shape[-1] - length]  # the K-1 inputs ending at token hi-1
                    states.keep_state(row, cuts[hi], module.layer_idx, conv_inputs, state[0])
            finals.append(state)
        _store_conv(layer, rows, window, valid)
        layer.recurrent[rows] = torch.cat(finals).to(layer.recurrent.dtype)
    elif not states.capture_positions:  # benchmark baseline only (see LinearStates)
        core, final = chunk_gated_delta_rule(
            query,
            key,
            value,
            g=g,
            beta=beta,
            initial_state=recurrent.clone(),
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
        _store_conv(layer, rows, window, torch.full((batch,), length, device=window.device))
        layer.recurrent[rows] = final.to(layer.recurrent.dtype)
    else:
        core, keys, updates, decay_log = gated_delta_block(query, key, value, g, beta, recurrent, l2norm)
        core = core.to(hidden_states.dtype)
        layer.pending_conv = window
        layer.pending_keys, layer.pending_updates, layer.pending_decay = keys, updates, decay_log

    core = module.norm(core.reshape(-1, module.head_v_dim), z.reshape(-1, module.head_v_dim))
    return module.out_proj(core.reshape(batch, length, -1))


def install(modules: dict[int, nn.Module]) -> None:
    """Route the layers' forward through `gated_delta_net_forward` (idempotent)."""
    for module in modules.values():
        if not getattr(module, "_dflash_rollback", False):
            module.forward = functools.partial(gated_delta_net_forward, module, module.forward)
            module._dflash_rollback = True

"""A leaner forward pass of plain dense decoder stacks, for the torch runtime's target.

Why: at the sizes a CPU decodes, a target pass is mostly per-call overhead, not arithmetic:
transformers' code spends about ninety aten ops and a dozen module calls per layer (norms written
out op by op, three projections where one matmul would do, cache and mask plumbing). This pass
runs the same arithmetic on the same weights in fewer calls: the q/k/v and the gate/up projections
each as one matmul over weights concatenated once (the modules' weights become views of them, so
nothing is stored twice), norms inlined, and attention through the model's own attention function.

It covers only decoder layers it knows to be plain (`SUPPORTED_LAYERS`: RMSNorm, RoPE, a SiLU
gated MLP, optional q/k norms). `forward` (transformers' attention function, the CPU path) attends
over only the live slots of each row group and masks only where one is needed
(modeling/cache_attention.py); the torch runtime uses it only after a probe shows logits and
tapped hidden states bit-identical to transformers' forward, or, with its projections on packed
oneDNN linears (modeling/packed_linear.py, the CPU default), within float32 rounding of it (see
`TorchRuntime`).
`forward_in_place` (the GPU path, issue 39) attends through `dflash::target_attention` and runs the
elementwise work between GEMMs in three kernels per layer (ops/kernels/fused_layer.py), reading
nothing back to the host, so CUDA graphs record it; its probe compares each layer within a stated
tolerance. Every other target runs transformers' code unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from trtllm_dflash import hf_compat, ops
from trtllm_dflash.modeling.cache_attention import AttentionPlan
from trtllm_dflash.modeling.fused_ops import RopeTable, add_rms_norm, norm_of, qk_norm_rope, rms_norm, rotate, silu_mul_linear
from trtllm_dflash.modeling.slots import Slots

# decoder layers whose forward is exactly: x + attn(rmsnorm(x)), then x + mlp(rmsnorm(x)),
# with attention = (q/k/v proj, optional per-head q/k RMSNorm, RoPE, attention, o proj)
SUPPORTED_LAYERS = ("Qwen3DecoderLayer", "LlamaDecoderLayer", "Qwen2DecoderLayer", "MistralDecoderLayer")
SUPPORTED_NORMS = ("Qwen3RMSNorm", "LlamaRMSNorm", "Qwen2RMSNorm", "MistralRMSNorm")
LAYER_PARTS = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
ATTENTION_PARTS = {"q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"}
MLP_PARTS = {"gate_proj", "up_proj", "down_proj", "act_fn"}


def unsupported_reason(decoder: nn.Module) -> str | None:
    """Why `decoder` (a transformers base model) cannot run the fused pass; None if it can."""
    for name in ("embed_tokens", "rotary_emb", "norm", "layers"):
        if not hasattr(decoder, name):
            return f"the decoder has no {name}"
    if type(decoder.norm).__name__ not in SUPPORTED_NORMS:
        return f"final norm {type(decoder.norm).__name__} is not a plain RMSNorm"
    for layer in decoder.layers:
        kind = type(layer).__name__
        if kind not in SUPPORTED_LAYERS:
            return f"layer {kind} is not one of {', '.join(SUPPORTED_LAYERS)}"
        attn, mlp = layer.self_attn, layer.mlp
        parts = {name for name, _ in layer.named_children()}
        if parts != LAYER_PARTS or not {n for n, _ in attn.named_children()} <= ATTENTION_PARTS:
            return f"layer {kind} has extra parts"
        if {n for n, _ in mlp.named_children()} != MLP_PARTS or type(mlp.act_fn).__name__ not in ("SiLU", "SiLUActivation"):
            return "the MLP is not a SiLU-gated MLP"
        norms = [layer.input_layernorm, layer.post_attention_layernorm] + [
            getattr(attn, n) for n in ("q_norm", "k_norm") if hasattr(attn, n)
        ]
        if any(type(norm).__name__ not in SUPPORTED_NORMS for norm in norms):
            return "a norm is not a plain RMSNorm"
        biases = [p.bias is not None for p in (attn.q_proj, attn.k_proj, attn.v_proj)]
        if any(biases) and not all(biases) or mlp.gate_proj.bias is not None or mlp.up_proj.bias is not None:
            return "mixed projection biases"
    return None


def in_place_unsupported_reason(decoder: nn.Module) -> str | None:
    """Why `decoder` cannot run `FusedDecoder.forward_in_place` (None: it can): the fused pass's
    reasons, plus q/k norms that do not share eps (they are applied as one tensor there)."""
    reason = unsupported_reason(decoder)
    if reason is not None:
        return reason
    for layer in decoder.layers:
        attn = layer.self_attn
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        if (q_norm is None) != (k_norm is None) or q_norm is not None and q_norm.variance_epsilon != k_norm.variance_epsilon:
            return "the q and k norms differ in eps or presence"
    return None


def _fuse(linears: list[nn.Linear]) -> torch.Tensor:
    """One weight `[sum(out), in]` whose row blocks the given modules' weights become views of."""
    fused = torch.cat([linear.weight.detach() for linear in linears])
    offset = 0
    for linear in linears:
        rows = linear.weight.shape[0]
        linear.weight = nn.Parameter(fused[offset : offset + rows], requires_grad=linear.weight.requires_grad)
        offset += rows
    return fused


def head_norm_weight(q_norm: nn.Module, k_norm: nn.Module, q_heads: int, kv_heads: int) -> tuple[torch.Tensor, float] | None:
    """One `[q_heads + kv_heads, D]` weight that norms queries and keys in one pass (their heads
    side by side), where both norms share eps; None otherwise."""
    if q_norm.variance_epsilon != k_norm.variance_epsilon:
        return None
    head_dim = q_norm.weight.shape[-1]
    weight = torch.cat([q_norm.weight.detach().expand(q_heads, head_dim), k_norm.weight.detach().expand(kv_heads, head_dim)])
    return weight, q_norm.variance_epsilon


class FusedLayer:
    """One decoder layer's weights, arranged for few calls."""

    def __init__(self, layer: nn.Module) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.attn = attn  # the attention function reads its GQA groups, scaling and is_causal from it
        self.head_dim = int(attn.head_dim)
        self.qkv = _fuse([attn.q_proj, attn.k_proj, attn.v_proj])
        self.qkv_bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]) if attn.q_proj.bias is not None else None
        self.splits = [attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features]
        self.o_proj = attn.o_proj
        self.q_heads, self.kv_heads = self.splits[0] // self.head_dim, self.splits[1] // self.head_dim
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        # queries and keys are side by side in the qkv output: normed and rotated as one tensor
        self.qk_norm = head_norm_weight(q_norm, k_norm, self.q_heads, self.kv_heads) if q_norm is not None else None
        self.q_norm = norm_of(q_norm) if q_norm is not None and self.qk_norm is None else None
        self.k_norm = norm_of(k_norm) if k_norm is not None and self.qk_norm is None else None
        self.gate_up = _fuse([mlp.gate_proj, mlp.up_proj])
        self.down_proj = mlp.down_proj
        self.input_norm, self.post_norm = norm_of(layer.input_layernorm), norm_of(layer.post_attention_layernorm)
        self.scaling = attn.scaling
        self.sliding_window = getattr(attn, "sliding_window", None)


class FusedDecoder:
    """The decoder stack of a supported target, run with fewer calls (see the module docstring)."""

    def __init__(self, decoder: nn.Module, linear: Callable = F.linear) -> None:
        """`linear`: how `forward` runs its projections (F.linear, or modeling/packed_linear.py's
        packed oneDNN linears on a CPU); `forward_in_place` takes its own."""
        self.decoder = decoder
        self.linear = linear
        with torch.inference_mode(False):  # the stacked weights outlive any inference-mode caller
            self.layers = [FusedLayer(layer) for layer in decoder.layers]
        self.rope_table: RopeTable | None = None  # set by the runtime where the kernels run (forward_in_place reads it)
        self.attention = hf_compat.attention_function(decoder.config)
        # transformers' SDPA path repeats the key/value heads for GQA when a mask is given; SDPA's
        # own GQA gives the same bits without the copies
        self.sdpa = hf_compat.attention_implementation(decoder.config) == "sdpa"

    def cache_shapes(self) -> list[tuple[int, int]]:
        """(kv_heads, head_dim) of each layer's keys and values."""
        return [(layer.splits[1] // layer.head_dim, layer.head_dim) for layer in self.layers]

    @torch.inference_mode()
    def forward(
        self, tokens, positions, plan: AttentionPlan, caches, windows: list[int], taps: list[int], slots: Slots
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Final-normed hidden states `[b, T, H]` and the outputs of the `taps` layers.

        `caches[i]` is layer i's LayerCache over every slot (position == index); row r's block
        keys/values are written at slot slots.ids[r], positions `positions [b, T]`, and attention
        reads, per row group, only the live positions `plan` names for layer i's sliding window
        `windows[i]` (0: full attention).
        """
        x = self.decoder.embed_tokens(tokens)
        cos, sin = self.decoder.rotary_emb(x, positions)
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
        batch, count = tokens.shape
        # one row writes a contiguous run of positions: a slice copy instead of a scatter
        first = int(positions[0, 0]) if batch == 1 and positions.device.type == "cpu" else None
        outputs, linear = {}, self.linear
        for i, layer in enumerate(self.layers):
            qkv = linear(rms_norm(x, *layer.input_norm), layer.qkv, layer.qkv_bias)
            qk = qkv[..., : layer.splits[0] + layer.splits[1]].view(batch, count, -1, layer.head_dim)
            v = qkv[..., layer.splits[0] + layer.splits[1] :].view(batch, count, -1, layer.head_dim)
            if layer.qk_norm is not None:
                qk = rms_norm(qk, *layer.qk_norm)
            elif layer.q_norm is not None:
                q, k = qk.split([layer.q_heads, layer.kv_heads], dim=2)
                qk = torch.cat([rms_norm(q, *layer.q_norm), rms_norm(k, *layer.k_norm)], dim=2)
            q, k = rotate(qk, cos, sin).split([layer.q_heads, layer.kv_heads], dim=2)
            keys, values = caches[i].keys, caches[i].values
            if first is not None:
                keys[slots.ids[0], first : first + count] = k[0]
                values[slots.ids[0], first : first + count] = v[0]
            else:
                slots.write(keys, positions, k)
                slots.write(values, positions, v)
            if self.sdpa:
                out = plan.attend(q.transpose(1, 2), keys, values, windows[i], layer.scaling)
            else:
                out = self._model_attention(layer, plan, q.transpose(1, 2), keys, values, windows[i])
            x = x + linear(out.reshape(batch, count, -1), layer.o_proj.weight, layer.o_proj.bias)
            gate, up = linear(rms_norm(x, *layer.post_norm), layer.gate_up).chunk(2, dim=-1)
            x = x + linear(F.silu(gate) * up, layer.down_proj.weight, layer.down_proj.bias)
            if i in taps:
                outputs[i] = x
        return rms_norm(x, *norm_of(self.decoder.norm)), outputs

    @torch.inference_mode()
    def forward_in_place(
        self,
        tokens,
        positions,
        starts: torch.Tensor,
        caches,
        windows: list[int],
        taps: list[int],
        runs: list[tuple[slice, slice]],
        attend: Callable[..., torch.Tensor] = ops.target_attention,
        linear: Callable[..., torch.Tensor] = F.linear,
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """`forward`'s result, with attention by `dflash::target_attention` (the block's K/V written
        in place at each row's `starts`, each row reading its own slots) and the elementwise work
        between GEMMs in three kernels per sublayer pair (ops/kernels/fused_layer.py). It reads
        nothing back to the host, so a CUDA graph can record it: the torch runtime's GPU pass.
        `caches[i]` covers every slot; `runs` (Slots.runs) are the batch rows and the slots they
        use, one op call per run. `attend` runs the op's call (the torch runtime passes the kernel it
        chose for decode passes, runtime/attention_choice.py), `linear` the projections (the kernels
        it chose, runtime/linear_choice.py). cos/sin come from `rope_table` where the runtime set one
        (fused_ops.RopeTable), else from the model's rotary embedding. Needs
        `in_place_unsupported_reason(decoder) is None`."""
        x = self.decoder.embed_tokens(tokens)
        rope = self.rope_table.rows(positions) if self.rope_table is not None else self.decoder.rotary_emb(x, positions)
        outputs, delta = {}, None  # delta: the MLP output not yet added to the residual stream x
        for i in range(len(self.layers)):
            layer_input, x, delta = self.layer_in_place(i, x, delta, rope, starts, caches[i], windows[i], runs, attend, linear)
            if i - 1 in taps:  # layer i - 1's output: the sum this layer's norm kernel formed
                outputs[i - 1] = layer_input
        x, normed = add_rms_norm(x, delta, *norm_of(self.decoder.norm))
        if len(self.layers) - 1 in taps:
            outputs[len(self.layers) - 1] = x
        return normed, outputs

    def layer_in_place(
        self,
        i: int,
        x,
        delta,
        rope,
        starts,
        cache,
        window: int,
        runs,
        attend: Callable[..., torch.Tensor] = ops.target_attention,
        linear=F.linear,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Decoder layer i of `forward_in_place` on the residual stream `x + delta`: returns that
        stream (the layer's input, summed by its norm kernel), the stream after its attention and its
        MLP output (added by the next layer's norm kernel)."""
        layer = self.layers[i]
        batch, count = x.shape[:2]
        x, h = add_rms_norm(x, delta, *layer.input_norm)
        layer_input = x
        qkv = linear(h, layer.qkv, layer.qkv_bias)
        q, k, v = qk_norm_rope(qkv, *rope, layer.qk_norm, layer.q_heads, layer.kv_heads, layer.head_dim)
        outs = [
            attend(q[rows], k[rows], v[rows], cache.keys[held], cache.values[held], starts[rows], None, float(layer.scaling), window)
            for rows, held in runs
        ]
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        x, h = add_rms_norm(x, linear(out.reshape(batch, count, -1), layer.o_proj.weight, layer.o_proj.bias), *layer.post_norm)
        return layer_input, x, silu_mul_linear(linear(h, layer.gate_up), layer.down_proj.weight, layer.down_proj.bias, linear)

    def plan(
        self, starts: list[int], count: int, windows: set[int], dtype: torch.dtype, device: torch.device, slots: tuple[int, ...]
    ) -> AttentionPlan:
        """This pass's AttentionPlan, with explicit masks where the model's own attention runs."""
        return AttentionPlan.make(starts, count, windows, dtype, device, sdpa=self.sdpa, slots=slots)

    def _model_attention(self, layer: FusedLayer, plan: AttentionPlan, q, keys, values, window: int) -> torch.Tensor:
        """The model's own attention function (eager and others) over each row group's live slots."""
        outs = []
        for group in plan.groups:
            lo, hi = group.reads[window]
            out, _ = self.attention(
                layer.attn,
                q[group.rows],
                keys[group.slots, lo:hi].transpose(1, 2),
                values[group.slots, lo:hi].transpose(1, 2),
                group.masks[window],
                dropout=0.0,
                scaling=layer.scaling,
                sliding_window=layer.sliding_window,
            )
            outs.append(out)
        return outs[0] if len(outs) == 1 else torch.cat(outs)

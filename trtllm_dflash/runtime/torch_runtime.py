"""The torch runtime: a Hugging Face target and the PyTorch DFlash drafter.

This is the reference for losslessness and the default on CPU. The target runs unmodified
`transformers` modeling code; only its KV cache (one slot per absolute position, per-row write
positions) and its attention masks are ours, so any causal LM whose attention goes through
`Cache.update` works. Plain dense targets (Qwen3, Llama, ...) run the same arithmetic in fewer
calls (modeling/fused_target.py). On transformers' attention (the CPU) only after a probe showed it
bit-identical to transformers', attending over each row's live slots with a mask only where one is
needed (modeling/cache_attention.py: one plan per pass; a prefill is SDPA's is_causal, one query
row per sequence needs no mask). On a CPU in float32 its projections and both LM heads (and the
drafter's step) run on oneDNN linears over weights packed once where a call is big enough to pay
(modeling/packed_linear.py: 1.2x at batch 8 here); transformers' forward is then matched within
float32 rounding, not bit for bit. On the target-attention op (`attention="dflash"`, what "auto"
picks on a GPU) in place, with the elementwise work between GEMMs in three Triton kernels and no
host read, so CUDA graphs record it; its probe checks each layer within FUSED_TOLERANCE.
Tapped hidden states are taken with forward hooks on the decoder layers (the fused pass returns
them itself), which is exactly "the output of decoder layer i".

Families: each attention layer gets a cache of exactly the shape it writes (per-layer head dims,
MLA's separate key/value dims; KV-sharing layers write nothing), sliding layers get windowed
masks, eager-only models (gpt-oss: attention sinks) get additive masks, and the linear-attention
layers of hybrid targets keep per-position states that `commit` selects per row
(modeling/linear_attention.py).
"""

from __future__ import annotations

import functools

import torch
from transformers import PreTrainedModel

from trtllm_dflash import hf_compat, ops
from trtllm_dflash.drafters import kind_of
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.modeling import cache_attention, fused_ops, fused_target, linear_attention, packed_linear, target_attention
from trtllm_dflash.modeling.drafter import DFlashDrafter
from trtllm_dflash.modeling.kv_cache import RaggedHFCache, StaticKVCache
from trtllm_dflash.modeling.taps import HiddenTaps
from trtllm_dflash.ops import custom_ops
from trtllm_dflash.ops.kernels.dependent_launch import dependent_launches
from trtllm_dflash.runtime import attention_choice as attention_kernels
from trtllm_dflash.runtime import linear_choice as linear_kernels
from trtllm_dflash.runtime import verify_choice as verify_kernels
from trtllm_dflash.runtime.attention_choice import relative_error
from trtllm_dflash.runtime.base import CachedRuntime, CacheShape, Proposal, SamplingTensors, Slots, TargetOutput, draft_positions
from trtllm_dflash.runtime.cuda_graphs import StepGraphs, batch_buckets
from trtllm_dflash.runtime.cuda_graphs import refusal as cuda_graphs_refusal
from trtllm_dflash.runtime.prefix_cache import PrefixBlock

FULL_ATTENTION, SLIDING_ATTENTION = "full_attention", "sliding_attention"
LAYER_KINDS = (FULL_ATTENTION, SLIDING_ATTENTION, linear_attention.LINEAR_ATTENTION)


# the fused in-place pass against the unfused one, per layer (relative L2 error of each layer's
# contribution): its kernels compute each elementwise op in float32 and round once, transformers
# rounds after each op, and bf16 keeps 8 bits (a rounding step is 2^-8 = 0.4%)
FUSED_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2}


def causal_mask(positions: torch.Tensor, span: int, window: int = 0) -> torch.Tensor:
    """`[b, 1, T, span]` visibility of key slot j (== position j) from each query position."""
    keys = torch.arange(span, device=positions.device).view(1, 1, 1, -1)
    queries = positions.unsqueeze(1).unsqueeze(-1)
    visible = keys <= queries
    if window > 0:
        visible = visible & (keys > queries - window)
    return visible


def _launched_dependent(method):
    """Run a pass's launches as dependent launches where the runtime asks for them (`dependent_launch`)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with dependent_launches(self.dependent_launch):
            return method(self, *args, **kwargs)

    return run


class TorchRuntime(CachedRuntime):
    """Runs a transformers causal LM and a DFlashDrafter with PyTorch."""

    def __init__(
        self,
        target: PreTrainedModel,
        drafter: DFlashDrafter | None = None,
        attention: str = "auto",
        cuda_graphs: bool | None = False,
        fused: bool = True,
        packed_linears: bool = True,
        attention_choice: str = "dflash",
        verify_choice: str = "positions",
        linear_choice: str = "torch",
        dependent_launch: bool = False,
    ) -> None:
        """`attention`: "hf" runs the model's own attention over our cache; "dflash" runs
        `dflash::target_attention` (the engines' op: the block written in place, each row read up
        to its own length) inside the model's code; "auto" picks dflash where the Triton kernels
        run (CUDA) and the model's attention is one the op expresses, else hf.
        `cuda_graphs`: replay the draft and verify passes from CUDA graphs per batch bucket (None: where
        this runtime can, that is on CUDA, without a hybrid target or a bounded-history drafter).
        `fused`: run the target's decoder layers with fewer calls (modeling/fused_target.py) where
        they are plain dense layers and a probe at `allocate` shows bit-identical logits and taps;
        otherwise, or with False, transformers' own forward.
        `packed_linears`: on a CPU (float32), run the fused pass's projections, both LM heads and
        the drafter's step as oneDNN linears over weights packed once, where a call is big enough
        to pay (modeling/packed_linear.py); the probe then checks the fused pass within float32
        rounding (FUSED_TOLERANCE) instead of bit for bit.
        `attention_choice`: which kernel runs the target's attention in decode passes on the "dflash"
        path (runtime/attention_choice.py; "auto" then takes that path on a CPU too): "dflash" (the
        op), "flash" (torch's FlashAttention with per-row lengths, CUDA), "sdpa", each checked against
        the reference at `allocate`, or "measure": the fastest exact one per (tokens, batch bucket),
        timed at `allocate`.
        `verify_choice`: which kernels verify a step with sampled rows (runtime/verify_choice.py):
        "positions", "spread" (each pass spread over the vocabulary), "shortlist" (two reads of the
        logits for rows with top-k <= 64; the same decisions either way), or "measure": the fastest
        per batch bucket and kind of sampled step (all rows top-k <= 64, or not), timed at `allocate`.
        `linear_choice`: which kernels run the decode passes' projections on a GPU's kernel path
        (runtime/linear_choice.py): "torch" (F.linear), "skinny" (ops/kernels/skinny_linear.py
        where they cover the call) or "measure": the faster per (rows, weight shape), timed at `allocate`.
        `dependent_launch`: launch the Triton kernels of the decode passes, the verification and the
        drafter's sampling as programmatic dependent launches (ops/kernels/dependent_launch.py;
        Hopper on, else nothing changes): each kernel's programs wait on the GPU for the kernel ahead
        instead of being launched after it. The same arithmetic."""
        self.model = target.eval()
        self.drafter = drafter.eval() if drafter is not None else None
        self.drafter_config = drafter.config if drafter is not None else None
        self.device = next(target.parameters()).device
        self.dtype = next(target.parameters()).dtype
        self.decoder = target.get_decoder()
        self.embedding = target.get_input_embeddings()
        self.lm_head = target.get_output_embeddings()
        config = target.config.get_text_config()
        self.target_config = config
        self.vocab_size = int(config.vocab_size)
        self.num_layers = int(config.num_hidden_layers)
        self.layer_types = list(getattr(config, "layer_types", None) or [FULL_ATTENTION] * self.num_layers)
        unknown = sorted(set(self.layer_types) - set(LAYER_KINDS))
        if unknown:
            raise DFlashError(
                f"target {config.model_type} has layer types {unknown} that the torch runtime cannot cache or roll back",
                f"use a target whose layers are {', '.join(LAYER_KINDS)}",
            )
        self.sliding_window = int(getattr(config, "sliding_window", None) or 0)
        self.softcap = getattr(config, "final_logit_softcapping", None)
        implementation = hf_compat.attention_implementation(config)
        # eager attention adds the mask to the scores; sdpa and the others take a boolean mask
        self.additive_masks = implementation == "eager"
        # SDPA runs is_causal when given no mask; other attention functions (eager, gpt-oss's sinks) need ours
        self.sdpa_attention = implementation == "sdpa"
        self.linear_modules = linear_attention.linear_attention_modules(self.decoder, self.layer_types)
        linear_attention.install(self.linear_modules)
        self.linear_states: linear_attention.LinearStates | None = None
        self.taps = HiddenTaps(self.decoder.layers, self.drafter_config.target_layer_ids) if drafter else None
        if attention_choice not in attention_kernels.CHOICES:
            raise DFlashError(f"unknown attention_choice {attention_choice!r}", f"use one of {', '.join(attention_kernels.CHOICES)}")
        self.attention = self._pick_attention(attention, wants_op=attention_choice != "dflash")
        if attention_choice != "dflash" and self.attention != "dflash":
            raise DFlashError(
                f"attention_choice={attention_choice!r} chooses among kernels of the dflash attention op, "
                f"which this runtime does not run (attention={self.attention!r})",
                "use attention='dflash' (or 'auto') on a target the op expresses, or leave attention_choice at 'dflash'",
            )
        self.attention_choice = attention_choice
        if verify_choice not in verify_kernels.CHOICES:
            raise DFlashError(f"unknown verify_choice {verify_choice!r}", f"use one of {', '.join(verify_kernels.CHOICES)}")
        self.verify_choice = verify_choice
        if linear_choice not in linear_kernels.CHOICES:
            raise DFlashError(f"unknown linear_choice {linear_choice!r}", f"use one of {', '.join(linear_kernels.CHOICES)}")
        self.linear_choice = linear_choice
        self.dependent_launch = bool(dependent_launch)
        self.linear_choices = linear_kernels.LinearChoices()  # set by allocate (measured there)
        self.verify_choices = verify_kernels.VerifyChoices()  # set by allocate (measured or checked there)
        # what each decode pass's target attention runs; set by allocate (measured or checked there)
        self.attention_choices = attention_kernels.AttentionChoices()
        self._choices_for: tuple[int, int] | None = None  # the (max_batch, capacity) they were chosen for
        self.windows = target_attention.layer_windows(config)
        # cuda_graphs: replay the draft and verify passes from CUDA graphs per batch bucket (runtime/cuda_graphs.py);
        # refused in one line off CUDA. It wraps this instance's target_forward, draft_forward and allocate.
        if cuda_graphs is None:
            cuda_graphs = cuda_graphs_refusal(self) is None
        self.cuda_graphs = StepGraphs.install(self) if cuda_graphs else None
        # the fused pass: on transformers' attention (CPU) where a probe shows it bit-identical; on the
        # attention op (the GPU path, graphs or not) in place, where a probe shows it within FUSED_TOLERANCE
        if self.attention == "dflash":
            eligible = fused and not self.is_hybrid and fused_target.in_place_unsupported_reason(self.decoder) is None
        else:
            eligible = fused and not self.is_hybrid and not cuda_graphs and fused_target.unsupported_reason(self.decoder) is None
        self._fused_candidate = eligible
        self.fused: fused_target.FusedDecoder | None = None  # set by allocate once the probe matched
        usable = packed_linears and self.attention == "hf" and packed_linear.unavailable_reason(self.device, self.dtype) is None
        # the target's only with the fused pass (the probe decides): transformers' own forward keeps F.linear
        self._packed = packed_linear.PackedLinears() if usable else None
        drafter_float32 = drafter is not None and next(drafter.parameters()).dtype == torch.float32
        self._draft_linear = self._packed if self._packed is not None and drafter_float32 else None

    def _pick_attention(self, attention: str, wants_op: bool = False) -> str:
        """hf or dflash; "auto" takes dflash where the kernels run, or where an attention choice asks for the op."""
        reason = target_attention.unsupported_reason(self.model.config)
        if attention == "auto" and wants_op and reason is None:
            return "dflash"
        if attention == "auto":
            if reason is None and custom_ops.kernels_enabled(self.device):
                reason = self._kernel_gap()
            return "dflash" if reason is None and custom_ops.kernels_enabled(self.device) else "hf"
        if attention == "dflash" and reason is not None:
            raise DFlashError(f"attention='dflash' cannot run this target: {reason}", "use attention='hf' (or 'auto')")
        if attention not in ("hf", "dflash"):
            raise DFlashError(f"unknown attention {attention!r}", "use auto, hf or dflash")
        return attention

    def _kernel_gap(self) -> str | None:
        """Why the target-attention kernel would not cover a layer (None: it covers all). Where it
        does not, the op runs its torch reference, which reads lengths on the host in every layer:
        slower than transformers' attention, and impossible inside a CUDA-graph capture."""
        from trtllm_dflash.ops.kernels.tiles import ATTENTION_HEAD_DIMS

        for i, shape in enumerate(self._cache_shapes):
            if shape is not None and not {shape.key_dim, shape.value_dim} <= set(ATTENTION_HEAD_DIMS):
                return f"layer {i} has head dims {shape.key_dim}/{shape.value_dim}; the kernel covers {ATTENTION_HEAD_DIMS}"
        return None

    @functools.cached_property
    def _cache_shapes(self):
        """The K/V shape each target layer writes (None: no cache), from one probe of the model: asked
        by the attention choice and by every allocation."""
        from trtllm_dflash.graphs.target import TargetGraph

        return TargetGraph(self.model, []).cache_shapes

    @property
    def is_hybrid(self) -> bool:
        """Whether some target layers carry a recurrent state (linear attention)."""
        return bool(self.linear_modules)

    # ------------------------------------------------------------------ caches

    def allocate(self, max_batch: int, capacity: int) -> None:
        # each attention layer is allocated on its first write, with the shape it writes
        self.target_cache = StaticKVCache.lazy(self.num_layers, max_batch, capacity, self.dtype, self.device)
        dc = self.drafter_config
        drafter = CacheShape(dc.num_hidden_layers, dc.num_key_value_heads, dc.head_dim) if dc is not None else None
        self.draft_cache = (
            StaticKVCache(drafter.num_layers, max_batch, capacity, drafter.kv_heads, drafter.head_dim, self.dtype, self.device)
            if drafter is not None
            else None
        )
        self.max_batch, self.capacity = max_batch, capacity
        self.linear_states = (
            linear_attention.LinearStates(self.linear_modules, max_batch, self.dtype, self.device) if self.linear_modules else None
        )
        self._hf_cache = RaggedHFCache(self.target_cache, self.linear_states)
        if self.attention == "dflash":  # the op writes into allocated layers: give each the shape it writes
            for i, shape in enumerate(self._cache_shapes):
                if shape is not None:
                    self.target_cache.allocate_layer(i, shape.kv_heads, shape.key_dim, shape.value_dim)
        if self.fused is not None and self.attention != "dflash":  # the fused pass writes into allocated layers
            for i, (kv_heads, head_dim) in enumerate(self.fused.cache_shapes()):
                self.target_cache.allocate_layer(i, kv_heads, head_dim, head_dim)
        elif self._fused_candidate:
            self._fused_candidate = False  # probed once per runtime
            self.fused = self._probe_fused()
        self._set_rope_tables(capacity)
        if self._choices_for != (max_batch, capacity):
            if self.attention == "dflash":
                self.attention_choices = self._choose_attention(max_batch, capacity)
            self.verify_choices = self._choose_verify(max_batch)
            self.linear_choices = self._choose_linear(max_batch)
            self._choices_for = (max_batch, capacity)

    def _choose_verify(self, max_batch: int) -> verify_kernels.VerifyChoices:
        """How steps with sampled rows are verified: `verify_choice` checked, or measured."""
        block = self.drafter_config.block_size if self.drafter_config is not None else 1
        if self.verify_choice == "measure":
            return verify_kernels.measure((block,), batch_buckets(max_batch), self.vocab_size, self.dtype, self.device)
        return verify_kernels.fixed(self.verify_choice, block, self.vocab_size, self.dtype, self.device)

    def _set_rope_tables(self, capacity: int) -> None:
        """Where the kernels run, the fused target pass and the drafter's step gather cos/sin from a
        table of every position a pass can reach (a padding row's block starts at the capacity)
        instead of computing them per pass (modeling/fused_ops.py RopeTable)."""
        if not fused_ops.kernels_run(self.device):
            return
        length = capacity + (self.drafter_config.block_size if self.drafter_config is not None else 1)
        if self.fused is not None:
            self.fused.rope_table = fused_ops.RopeTable.of(self.decoder.rotary_emb, length, self.dtype, self.device)
        if self.drafter is not None:
            self.drafter.rope_table = fused_ops.RopeTable.of(self.drafter.rotary_emb, length, self.dtype, self.device)

    def _choose_linear(self, max_batch: int) -> linear_kernels.LinearChoices:
        """What runs the decode passes' projections: `linear_choice`, or measured on the fused target
        pass's and the drafter's projection weights at each batch bucket's AR and verify rows, for
        each launch kind the device has (`dependent_launch` may change between captures)."""
        if self.linear_choice != "measure":
            return linear_kernels.fixed(self.linear_choice)
        block = self.drafter_config.block_size if self.drafter_config is not None else 1
        rows = [bucket * tokens for bucket in batch_buckets(max_batch) for tokens in {1, block}]
        kinds = linear_kernels.launch_kinds(self.device)
        return linear_kernels.measure(self._projections(), rows, gated=self._down_projections(), launch_kinds=kinds)

    def _projections(self) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """(weight, bias) of every projection a decode pass runs through `linear_choices`."""
        weights = [(self.lm_head.weight, self.lm_head.bias)] if type(self.lm_head) is torch.nn.Linear else []
        for layer in self.fused.layers if self.fused is not None else []:
            weights += [(layer.qkv, layer.qkv_bias), (layer.o_proj.weight, layer.o_proj.bias), (layer.gate_up, None)]
            weights.append((layer.down_proj.weight, layer.down_proj.bias))
        if self.drafter is not None:
            weights += self.drafter.decode_projections()
        return weights

    def _down_projections(self) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """(weight, bias) of the MLP down projections that a decode pass may run on silu(gate) * up in
        one launch (`LinearChoices.gated`: the fused target pass, the drafter's step on the kernels);
        measured in that form too, besides the plain call the other paths make."""
        layers = [layer.down_proj for layer in self.fused.layers] if self.fused is not None else []
        layers += [layer.mlp.down_proj for layer in self.drafter.layers] if self.drafter is not None else []
        return [(down.weight, down.bias) for down in layers]

    def _choose_attention(self, max_batch: int, capacity: int) -> attention_kernels.AttentionChoices:
        """What each decode pass's target attention runs: `attention_choice` checked, or measured."""
        if self.attention_choice == "dflash":
            return attention_kernels.AttentionChoices()
        heads = int(self.target_config.num_attention_heads)
        windows = tuple(sorted(set(self.windows)))
        sinks = any(getattr(getattr(layer, "self_attn", None), "sinks", None) is not None for layer in self.decoder.layers)
        shapes = list(
            dict.fromkeys(
                attention_kernels.LayerShape(heads, s.kv_heads, s.key_dim, s.value_dim, windows, sinks)
                for s in self._cache_shapes
                if s is not None
            )
        )
        if self.attention_choice != "measure":
            return attention_kernels.fixed(self.attention_choice, shapes, capacity, self.dtype, self.device)
        tokens = (1, self.drafter_config.block_size) if self.drafter_config is not None else (1,)
        return attention_kernels.measure(shapes, tokens, batch_buckets(max_batch), capacity, self.dtype, self.device)

    def _probe_fused(self) -> fused_target.FusedDecoder | None:
        """The fused decoder if it reproduces the unfused forward on a probe block (written to row 0's
        first slots, which the next prefill overwrites), else None: on transformers' attention bit for
        bit, logits and taps; on the attention op (the GPU path), whose kernels round once where
        transformers rounds per op, layer by layer: from each layer's input in the unfused pass, the
        fused layer's contribution (output - input) within FUSED_TOLERANCE (relative L2 error). Layer
        by layer, because rounding differences grow through a deep stack of random weights and an
        end-to-end bound would say more about the weights than about the pass."""
        fused = fused_target.FusedDecoder(self.decoder)
        count = min(5, self.capacity)
        tokens = (torch.arange(count, device=self.device) * 7919 % self.vocab_size).view(1, -1)
        starts = torch.zeros(1, dtype=torch.long, device=self.device)
        forward = functools.partial(TorchRuntime.target_forward, self)  # never a CUDA-graph capture
        if self.attention == "dflash":
            return fused if self._layers_within_tolerance(fused, tokens, starts, forward) else None
        reference = forward(slice(0, 1), tokens, starts, count)
        for linear in ([self._packed] if self._packed is not None else []) + [torch.nn.functional.linear]:
            fused.linear, self.fused = linear, fused
            try:
                candidate = forward(slice(0, 1), tokens, starts, count)
            finally:
                self.fused = None
            if linear is self._packed:  # packed linears round differently: within float32 rounding
                tolerance = FUSED_TOLERANCE[torch.float32]
                matches = relative_error(candidate.logits, reference.logits) <= tolerance and (
                    reference.features is None or relative_error(candidate.features, reference.features) <= tolerance
                )
            else:
                matches = torch.equal(reference.logits, candidate.logits) and (
                    reference.features is None or torch.equal(reference.features, candidate.features)
                )
            if matches:
                return fused
        return None

    @torch.inference_mode()
    def _layers_within_tolerance(self, fused: fused_target.FusedDecoder, tokens, starts, forward) -> bool:
        """Each fused layer against the unfused pass's layer from the same input (see `_probe_fused`)."""
        seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

        def keep(i):
            def hook(module, args, kwargs, output):
                hidden = args[0] if args else kwargs["hidden_states"]
                seen[i] = (hidden, output[0] if isinstance(output, tuple) else output)

            return hook

        handles = [layer.register_forward_hook(keep(i), with_kwargs=True) for i, layer in enumerate(self.decoder.layers)]
        try:
            forward(slice(0, 1), tokens, starts, tokens.shape[1])
        finally:
            for handle in handles:
                handle.remove()
        positions = starts.view(-1, 1) + torch.arange(tokens.shape[1], device=self.device)
        rope = self.decoder.rotary_emb(seen[0][0], positions)
        caches, runs = self.target_cache.layers, Slots.of([0]).runs()
        tolerance = FUSED_TOLERANCE.get(self.dtype, FUSED_TOLERANCE[torch.float16])
        for i in range(len(fused.layers)):
            before, after = seen[i]
            _, x, delta = fused.layer_in_place(i, before, None, rope, starts, caches[i], self.windows[i], runs)
            if relative_error(x + delta - before, after - before) > tolerance:
                return False
        return True

    def commit(self, slots, kept: torch.Tensor) -> None:
        if self.linear_states is not None:
            self.linear_states.commit(Slots.of(slots, self.device), kept)

    # ------------------------------------------------------------------ prefix caching

    def prefix_cache_refusal(self) -> str | None:
        if self.drafter_config is not None and self.drafter_config.history > 0:
            return super().prefix_cache_refusal()
        return None  # hybrid targets too: their linear states are kept at the prefix's end (keep_prefix_state)

    def keep_prefix_state(self, slots, lengths: list[tuple[int, ...]]) -> None:
        if self.linear_states is not None:
            self.linear_states.keep_states_at(Slots.of(slots), lengths)

    def export_prefix(self, slot: int, start: int, end: int, state: bool = False) -> PrefixBlock:
        block = super().export_prefix(slot, start, end, state)
        if state and self.linear_states is not None:
            block.state = self.linear_states.export_state(slot, end)
        return block

    def import_prefix(self, slot: int, blocks: list[PrefixBlock]) -> None:
        super().import_prefix(slot, blocks)
        if self.linear_states is not None:
            self.linear_states.import_state(slot, blocks[-1].state)

    def attention_masks(self, positions: torch.Tensor, span: int):
        """One mask per attention kind (a single 4D mask where there is one kind)."""
        masks = {}
        for kind in set(self.layer_types):
            if kind == linear_attention.LINEAR_ATTENTION:
                masks[kind] = None  # those layers read their rows from our cache
                continue
            visible = causal_mask(positions, span, self.sliding_window if kind == SLIDING_ATTENTION else 0)
            if self.additive_masks:
                visible = torch.zeros(visible.shape, dtype=self.dtype, device=self.device).masked_fill(
                    ~visible, torch.finfo(self.dtype).min
                )
            masks[kind] = visible
        # a 4D mask passes through every HF model untouched; a per-type dict only where types mix
        return masks if len(masks) > 1 else next(iter(masks.values()))

    # ------------------------------------------------------------------ forward passes

    @torch.inference_mode()
    @_launched_dependent
    def target_forward(self, slots, tokens, starts, span, logits_at=None) -> TargetOutput:
        slots = Slots.of(slots, self.device)
        positions = starts.view(-1, 1) + torch.arange(tokens.shape[1], device=self.device)
        features = None
        if self.fused is not None:
            tap_ids = self.taps.layer_ids if self.taps else []
            caches = self.target_cache.layers
            if self.attention == "dflash":  # the op writes and reads each row's slots itself: no host read
                attend = self._attend(logits_at, span)
                hidden, taps = self.fused.forward_in_place(
                    tokens, positions, starts, caches, self.windows, tap_ids, slots.runs(), attend, self.linear_choices
                )
            else:  # one plan per pass: each row group reads only its live slots, masks only where needed
                plan = self.fused.plan(starts.tolist(), tokens.shape[1], set(self.windows), self.dtype, self.device, slots.ids)
                hidden, taps = self.fused.forward(tokens, positions, plan, caches, self.windows, tap_ids, slots)
            features = torch.cat([taps[i] for i in tap_ids], dim=-1) if tap_ids else None
        elif self.attention == "dflash":
            hidden = self._dflash_decoder(slots, tokens, starts, positions, self._attend(logits_at, span))
        else:
            # in prefill (logits_at) the tokens after logits_at[r] are padding
            self._hf_cache.bind(slots, positions, span, valid=None if logits_at is None else logits_at + 1)
            masks = None if self._plain_causal(tokens, starts, span, logits_at) else self.attention_masks(positions, span)
            hidden = hf_compat.forward_with_cache(
                self.decoder, self._hf_cache, input_ids=tokens, position_ids=positions, attention_mask=masks, use_cache=True
            ).last_hidden_state
        if logits_at is not None:
            hidden = hidden[torch.arange(hidden.shape[0], device=self.device), logits_at].unsqueeze(1)
        logits = self._lm_head(hidden)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        if features is None and self.taps:
            features = self.taps.features()
        return TargetOutput(logits=logits, features=features)

    def _lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's logits: through the packed linear where the fused pass runs on packed linears."""
        packed = self.fused is not None and self.fused.linear is self._packed
        return packed_linear.through(self.lm_head, hidden, self._packed if packed else self._chosen_linear)

    @property
    def _chosen_linear(self) -> linear_kernels.LinearChoices | None:
        """The chosen projection kernels, where they are not plain F.linear."""
        return self.linear_choices if self.linear_choices.fixed != "torch" else None

    @property
    def _draft_projection(self):
        """What runs the drafter's projections: packed linears on a CPU, else the chosen kernels."""
        return self._draft_linear or self._chosen_linear

    def _plain_causal(self, tokens, starts, span, logits_at) -> bool:
        """Whether this pass is a prefill from position 0 that only needs causal attention, on a model
        whose attention is SDPA: then transformers gets no mask and SDPA runs `is_causal` (flash
        attention on a GPU) instead of applying a [T, T] mask in every layer. Rows padded at the end
        are still exact (padding comes after every real token). Prefill only: never inside a
        CUDA-graph capture, where the host read of `starts` would fail."""
        width = tokens.shape[1]
        if not self.sdpa_attention or logits_at is None or width < 2 or span != width:
            return False
        if any(cache_attention.window_bites(window, width) for window in self.windows):
            return False
        return not bool(starts.any())

    @_launched_dependent
    def verify(self, target_logits, block, draft_probs, sampling: SamplingTensors, starts) -> tuple[torch.Tensor, torch.Tensor]:
        """Accepted draft count and bonus token per row: by the spread or shortlist kernels where chosen and some row samples."""
        form = self.verify_choices.kernel_form(block, sampling)
        if form is not None:
            return verify_kernels.verify_by(form, target_logits, block, draft_probs, sampling, starts)
        return super().verify(target_logits, block, draft_probs, sampling, starts)

    def _attend(self, logits_at, span: int) -> attention_kernels.Attend:
        """The target attention of this pass: the chosen kernels in decode passes, told the pass's
        span and given a memo for what its layers share; the op in prefill, whose padded rows may
        run past the capacity (only the op's write drops those)."""
        return functools.partial(self.attention_choices.attend, span=span, memo={}) if logits_at is None else ops.target_attention

    def attention_reads_span(self, length: int, batch: int) -> bool:
        """The model's attention and SDPA read the span; the op and flash each row's own length."""
        return self.attention != "dflash" or self.attention_choices.pick(length, batch) == "sdpa"

    def padding_start(self, length: int) -> int:
        """Where a CUDA graph's padding row starts its block of `length` (runtime/cuda_graphs.py): at
        the capacity where the decode passes attend through the op or a kernel chosen for it, which
        read nothing for rows starting there (and write at most the row's last slot); else at the
        row's last slots, which no prompt reaches, and the model's attention reads the pass's span."""
        return self.capacity if self.attention == "dflash" else self.capacity - length

    def _dflash_decoder(self, slots: Slots, tokens, starts, positions, attend: attention_kernels.Attend) -> torch.Tensor:
        """The decoder with every attention layer on `dflash::target_attention` (or the kernel chosen
        for it, `attend`) over our cache slots."""
        caches = {i: (layer.keys, layer.values) for i, layer in enumerate(self.target_cache.layers) if layer.keys is not None}
        step = target_attention.TargetAttentionStep(caches, starts, self.windows, runs=slots.runs(), attend=attend)
        masks = target_attention.placeholder_masks(self.model.config, tokens)
        with target_attention.use_dflash_attention(self.model), step.active():
            return self.decoder(input_ids=tokens, position_ids=positions, attention_mask=masks, use_cache=False).last_hidden_state

    @torch.inference_mode()
    @_launched_dependent
    def draft_forward(self, slots, block, ctx_features, new_counts, cache_lens) -> torch.Tensor:
        """Draft logits (a V2 drafter's unary logits, before its selector)."""
        return self.drafter.logits(
            self._draft_hidden(slots, block, ctx_features, new_counts, cache_lens), self.lm_head, self._draft_projection
        )

    def _draft_hidden(self, slots, block, ctx_features, new_counts, cache_lens) -> torch.Tensor:
        """The drafter's final hidden states at block positions 1..B-1."""
        embeds = self.drafter.embed(block, self.embedding)
        caches, slots = self.draft_cache.layers, Slots.of(slots, self.device)
        return self.drafter.step(
            embeds, ctx_features, new_counts, cache_lens, caches, slots, self._draft_projection or torch.nn.functional.linear
        )[:, 1:]

    @_launched_dependent
    def draft_head(self, logits: torch.Tensor, sampling: SamplingTensors, positions: torch.Tensor) -> Proposal:
        """V1's head: by the shortlist kernels where they verify the step and serve its sampled rows."""
        if self.verify_choices.samples_drafts(logits.shape[0], logits.shape[1] + 1, sampling):
            return Proposal(*verify_kernels.sample_drafts_by_shortlist(logits, sampling, positions))
        return super().draft_head(logits, sampling, positions)

    @torch.inference_mode()
    @_launched_dependent
    def propose(self, slots, block, ctx_features, new_counts, cache_lens, sampling: SamplingTensors, constrain=None) -> Proposal:
        if not kind_of(self.drafter_config).candidate_selector:
            return super().propose(slots, block, ctx_features, new_counts, cache_lens, sampling, constrain)
        hidden = self._draft_hidden(slots, block, ctx_features, new_counts, cache_lens)
        positions = draft_positions(cache_lens + new_counts, hidden.shape[1])
        tokens, probs = self.drafter.propose(
            hidden, self.lm_head, block[:, 0], sampling.temperature, sampling.seed, positions, self._draft_projection, sampling.all_greedy
        )
        return Proposal(tokens, probs)

"""The TensorRT runtime: the engines of `dflash-trt build` behind the decoding loop's interface.

One engine for the target (two optimization profiles: verify steps and prefill, one execution
context each) and one for the drafter. The KV caches are torch CUDA tensors `[batch, capacity,
kv_heads, head_dim]` per layer (each layer's own shape from graphs.json; layers that reuse
another layer's K/V keep none) with slot == position, exactly as in the torch runtime. Native
engines read a row's whole cache (slots past its length are masked inside the graph) and return
the new K/V, which are written into place with torch on the same CUDA stream. Plugin engines
(a verifying target, `target_verify`) get each cache bound as input and aliased output: the
target-attention plugin writes the block in place and reads only each row's slots, and the
engine returns the verification result instead of logits. Every call is enqueued with
`execute_async_v3` on torch's current stream, so the decoding loop's one host read per step is
the only synchronisation.

Engines are tied to the TensorRT version and GPU architecture that built them; both are checked
against engines.json before anything is loaded, with a message naming what to do.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from trtllm_dflash.config import DrafterConfig
from trtllm_dflash.contracts import names
from trtllm_dflash.drafters.dflash2.graph import HEAD_PLUGIN
from trtllm_dflash.errors import DFlashError, MissingDependencyError
from trtllm_dflash.runtime import selector
from trtllm_dflash.runtime.artifacts import read_index
from trtllm_dflash.runtime.base import (
    CachedRuntime,
    CacheShape,
    SamplingTensors,
    TargetOutput,
    VerifyOutput,
    contiguous_slots,
    verifying_graph_inputs,
)
from trtllm_dflash.runtime.output_buffers import OutputBuffers
from trtllm_dflash.runtime.tensorrt_flavours import INSTALL_HINT, import_tensorrt


def _torch_dtype(trt, dtype) -> torch.dtype:
    table = {
        trt.float32: torch.float32,
        trt.float16: torch.float16,
        trt.bfloat16: torch.bfloat16,
        trt.int64: torch.int64,
        trt.int32: torch.int32,
        trt.bool: torch.bool,
    }
    if hasattr(trt, "fp8"):
        table[trt.fp8] = torch.float8_e4m3fn
    return table[dtype]


class EngineGraph:
    """One deserialized engine with an execution context per optimization profile."""

    def __init__(self, trt, runtime, path: Path) -> None:
        self.trt = trt
        self.engine = runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise DFlashError(
                f"TensorRT could not load {path} (built by another TensorRT version or for another GPU)",
                "rebuild the engines on this machine with `dflash-trt build --force`",
            )
        stream = torch.cuda.current_stream().cuda_stream
        self.contexts = []
        for profile in range(self.engine.num_optimization_profiles):
            context = self.engine.create_execution_context()
            context.set_optimization_profile_async(profile, stream)
            self.contexts.append(context)
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        self.dtypes = {n: _torch_dtype(trt, self.engine.get_tensor_dtype(n)) for n in names}
        self.buffers = OutputBuffers("cuda")
        self._largest = [self._largest_outputs(profile) for profile in range(len(self.contexts))]

    def max_shape(self, name: str, profile: int = 0) -> tuple[int, ...]:
        return tuple(self.engine.get_tensor_profile_shape(name, profile)[2])

    def _largest_outputs(self, profile: int) -> dict[str, int]:
        """Elements of each output at the profile's largest input shapes: the cap of its buffer.

        An output whose shape TensorRT cannot tell from the input shapes alone gets no cap."""
        context = self.contexts[profile]
        for name in self.inputs:
            static = tuple(self.engine.get_tensor_shape(name))
            if not context.set_input_shape(name, static if all(d >= 0 for d in static) else self.max_shape(name, profile)):
                return {}
        largest = {}
        for name in self.outputs:
            shape = tuple(context.get_tensor_shape(name))
            if all(d >= 0 for d in shape):
                largest[name] = math.prod(shape)
        return largest

    def run(
        self, profile: int, feed: dict[str, torch.Tensor], aliases: dict[str, str] | None = None, role: str = "step"
    ) -> dict[str, torch.Tensor]:
        """Enqueue one inference on torch's current CUDA stream; returns the output tensors.

        `aliases` maps outputs to the inputs they update in place (the plugin nodes' caches): they
        are bound to the input's memory, so nothing is copied. Other outputs are views of buffers
        reused per (profile, name, role) and bucketed by size (runtime/output_buffers.py), so memory
        stays bounded whatever the prompt lengths; read them before the next call of the same
        profile and role (a "prefill" call does not overwrite a "step" call's outputs).
        """
        aliases = aliases or {}
        context = self.contexts[profile]
        keep = []
        for name in self.inputs:
            tensor = feed[name].to(self.dtypes[name]).contiguous()  # no copy when dtype and layout already match
            keep.append(tensor)
            context.set_input_shape(name, tuple(tensor.shape))
            context.set_tensor_address(name, tensor.data_ptr())
        outputs = {}
        for name in self.outputs:
            if name in aliases:
                outputs[name] = feed[aliases[name]]
            else:
                shape = tuple(context.get_tensor_shape(name))
                cap = self._largest[profile].get(name)
                outputs[name] = self.buffers.view((profile, name, role), shape, self.dtypes[name], cap)
            context.set_tensor_address(name, outputs[name].data_ptr())
        if not context.execute_async_v3(torch.cuda.current_stream().cuda_stream):
            raise DFlashError("TensorRT failed to run an engine", "check the shapes against the recipe's limits")
        return outputs


class TrtRuntime(selector.GraphDrafterHead, CachedRuntime):
    """Target and drafter TensorRT engines of one build, on the current CUDA device."""

    def __init__(self, engines_dir: str | Path, variant: str = "native", drafter: bool = True) -> None:
        engines_dir = Path(engines_dir)
        info = read_index(engines_dir, "engines.json", "point --engines at the engines/ folder of a `dflash-trt build`")
        if variant not in info["engines"]:
            raise DFlashError(f"{engines_dir} has no {variant} engines (built: {', '.join(info['engines'])})", "pick a built variant")
        self.info = info
        trt = _import_flavour(info["flavour"], info["tensorrt_version"])
        if not torch.cuda.is_available():
            raise MissingDependencyError(
                "the TensorRT runtime needs a CUDA GPU and none is visible", "run on the GPU the engines were built for"
            )
        major, minor = torch.cuda.get_device_capability()
        built = tuple(int(x) for x in info["compute_capability"].split("."))
        if (major, minor) != built and not (info["aot"] and major == built[0]):
            raise MissingDependencyError(
                f"these engines are for SM {info['compute_capability']} ({info['gpu']}); this GPU is SM {major}.{minor}",
                "rebuild for this GPU (`dflash-trt build --gpu ...`) or run on the GPU they were built for",
            )
        self.trt = trt
        self._runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        engines = info["engines"][variant]

        def path(graph: str) -> Path:
            return engines_dir / engines[graph].get("dir", variant) / engines[graph]["file"]

        self.target_engine = EngineGraph(trt, self._runtime, path("target"))
        self.drafter_engine = EngineGraph(trt, self._runtime, path("drafter")) if drafter and "drafter" in engines else None
        graphs = info["graphs"]["variants"][variant]
        self.target = graphs["target"]
        self.drafter = graphs.get("drafter")
        self.drafter_config = DrafterConfig.from_dir(engines_dir / "drafter") if self.drafter_engine is not None else None
        self.vocab_size = int(info["graphs"]["vocab_size"])
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.block_size = int(info["block_size"])
        self.target_verifies = bool(self.target.get("verifies"))  # the plugin target: in-place caches, verification inside
        cache_prefix = names.key_prefix(names.CACHE if self.target_verifies else names.PAST)
        self.first_cache = next(n for n in self.target_engine.inputs if n.startswith(cache_prefix))
        self._zeros: dict[tuple[int, int], torch.Tensor] = {}
        self.cache_dtype = self.target_engine.dtypes[self.first_cache]

    # ------------------------------------------------------------------ caches

    def allocate(self, max_batch: int, capacity: int) -> None:
        max_batch_engine = self.target_engine.max_shape(names.INPUT_IDS, 0)[0]
        max_slots = self.target_engine.max_shape(self.first_cache, 0)[1]
        if max_batch > max_batch_engine or capacity > max_slots:
            raise DFlashError(
                f"asked for {max_batch} rows of {capacity} slots; the engines take at most {max_batch_engine} rows of {max_slots}",
                "lower the batch or the context, or rebuild with larger limits in the recipe",
            )
        drafter = CacheShape.of(self.drafter) if self.drafter_engine is not None else None
        self.allocate_caches(max_batch, capacity, CacheShape.of(self.target), drafter, self.cache_dtype, self.device)

    @staticmethod
    def _cache_feed(layers) -> dict[str, torch.Tensor]:
        """A row slice of the cache is contiguous; the engine reads all its slots (masked past each length).

        Layers without a cache (Gemma 4's KV-sharing layers) have no engine inputs."""
        feed = {}
        for i, layer in _cached(layers):
            feed[names.key_name(names.PAST, i)] = layer.keys
            feed[names.value_name(names.PAST, i)] = layer.values
        return feed

    # ------------------------------------------------------------------ forward passes

    @torch.inference_mode()
    @contiguous_slots
    def target_forward(self, rows, tokens, starts, span, logits_at=None) -> TargetOutput:
        if self.target_verifies:
            raise DFlashError("the plugin target engine verifies inside and returns no logits", "call target_verify")
        batch, count = tokens.shape
        layers = self.target_cache.rows(rows)
        index = logits_at.view(-1, 1) if logits_at is not None else torch.arange(count, device=self.device).expand(batch, -1)
        profile = 0 if count <= self.target_engine.max_shape(names.INPUT_IDS, 0)[1] else 1
        feed = {names.INPUT_IDS: tokens, names.STARTS: starts, names.LOGIT_INDEX: index, **self._cache_feed(layers)}
        out = self.target_engine.run(profile, feed, role=_role(logits_at))
        positions = starts.view(-1, 1) + torch.arange(count, device=self.device)
        row_index = torch.arange(batch, device=self.device).view(-1, 1)
        for i, layer in _cached(layers):
            layer.keys[row_index, positions] = out[names.key_name(names.NEW, i)]
            layer.values[row_index, positions] = out[names.value_name(names.NEW, i)]
        return TargetOutput(logits=out[names.LOGITS], features=out[names.FEATURES])

    @property
    def masks_logits(self) -> bool:
        return not self.target_verifies  # a verifying target hands out no logits to mask

    @torch.inference_mode()
    @contiguous_slots
    def target_verify(
        self, rows, tokens, starts, span, draft_probs, sampling: SamplingTensors, logits_at=None, allowed=None
    ) -> VerifyOutput:
        """The plugin target engine: the caches are bound in place (input and aliased output share
        memory), the engine verifies, and only `result [b, 5]` and the features come back."""
        if not self.target_verifies:
            return super().target_verify(rows, tokens, starts, span, draft_probs, sampling, logits_at, allowed)
        feed = verifying_graph_inputs(tokens, starts, draft_probs, sampling, logits_at, self._zero_draft_probs)
        profile = 0 if tokens.shape[1] <= self.target_engine.max_shape(names.INPUT_IDS, 0)[1] else 1
        aliases = {}
        for i, layer in _cached(self.target_cache.rows(rows)):
            feed[names.key_name(names.CACHE, i)], feed[names.value_name(names.CACHE, i)] = layer.keys, layer.values
            aliases[names.key_name(names.PRESENT, i)] = names.key_name(names.CACHE, i)
            aliases[names.value_name(names.PRESENT, i)] = names.value_name(names.CACHE, i)
        out = self.target_engine.run(profile, feed, aliases, role=_role(logits_at))
        result = out[names.RESULT]
        return VerifyOutput(result[:, 0], result[:, 1], out[names.FEATURES])

    def _zero_draft_probs(self, batch: int, drafts: int) -> torch.Tensor:
        """q = 0 for greedy and autoregressive steps, allocated once per shape."""
        key = (batch, drafts)
        if key not in self._zeros:
            self._zeros[key] = torch.zeros(batch, drafts, self.vocab_size, dtype=torch.float32, device=self.device)
        return self._zeros[key]

    @torch.inference_mode()
    @contiguous_slots
    def draft_forward(self, rows, block, ctx_features, new_counts, cache_lens) -> torch.Tensor:
        """Draft logits (a V2 drafter's unary logits, before its selector)."""
        return selector.draft_logits(self.drafter_head, self._draft_outputs(rows, block, ctx_features, new_counts, cache_lens))

    def _sampling_feed(self, sampling: SamplingTensors) -> dict[str, torch.Tensor]:
        return {names.TEMPERATURE: sampling.temperature, names.SEED: sampling.seed}

    def _draft_outputs(self, rows, block, ctx_features, new_counts, cache_lens, sampling_feed=None) -> dict[str, torch.Tensor]:
        """One drafter engine call (the new context appended to the draft cache); its outputs by name."""
        layers = self.draft_cache.rows(rows)
        feed = {names.BLOCK_IDS: block, names.CTX_FEATURES: ctx_features, names.NEW_COUNTS: new_counts, names.CACHE_LENS: cache_lens}
        feed.update(self._cache_feed(layers))
        if self.drafter_head == HEAD_PLUGIN:
            feed.update(sampling_feed or {})
        out = self.drafter_engine.run(0, feed)
        for i, layer in enumerate(layers):
            append_rows(layer.keys, cache_lens, out[names.key_name(names.NEW, i)], new_counts)
            append_rows(layer.values, cache_lens, out[names.value_name(names.NEW, i)], new_counts)
        return out


def _role(logits_at: torch.Tensor | None) -> str:
    """A prefill's outputs get buffers of their own: the decoding loop still holds the last verify
    step's features while it admits new rows, and concatenates them with the prefill's."""
    return "step" if logits_at is None else "prefill"


def _cached(layers) -> list:
    """(index, layer) of the layers that keep a cache."""
    return [(i, layer) for i, layer in enumerate(layers) if layer.keys is not None]


def append_rows(cache: torch.Tensor, lengths: torch.Tensor, new: torch.Tensor, counts: torch.Tensor) -> None:
    """Write the first counts[r] rows of new[r] at slots lengths[r]... without a host sync."""
    rows, n = new.shape[:2]
    steps = torch.arange(n, device=new.device).view(1, -1)
    slots = (lengths.view(-1, 1) + steps).clamp(max=cache.shape[1] - 1)
    row_index = torch.arange(rows, device=new.device).view(-1, 1)
    valid = (steps < counts.view(-1, 1)).view(rows, n, *([1] * (new.dim() - 2)))
    cache[row_index, slots] = torch.where(valid, new.to(cache.dtype), cache[row_index, slots])


def _import_flavour(flavour: str, built_version: str):
    try:
        trt = import_tensorrt(flavour)
    except ImportError:
        raise MissingDependencyError(
            f"the engines were built with {flavour} {built_version}, which is not installed", INSTALL_HINT[flavour]
        ) from None
    if trt.__version__ != built_version:
        raise MissingDependencyError(
            f"the engines were built with {flavour} {built_version}, but {trt.__version__} is installed "
            "(engines do not load across versions)",
            f"install {flavour}=={built_version}, or rebuild with `dflash-trt build --force`",
        )
    return trt


def engine_summary(engines_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(engines_dir) / "engines.json").read_text())

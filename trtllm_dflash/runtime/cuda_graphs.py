"""CUDA graphs for the torch runtime's two passes per decoding step: the draft and the verify pass.

Why: at the batch sizes of interactive decoding a step is launch-bound. Each pass issues hundreds
of small kernels from Python (norms, projections, RoPE, attention, per layer), so the GPU waits on
the host. Replaying a captured graph issues them all in one call.

How (`TorchRuntime(..., cuda_graphs=True)` installs this on the runtime instance):
- one graph per pass and shape, captured at the first step that needs it. Keys are the batch
  bucket (1, 2, 4, 8, ... up to max_batch), the block length, the drafter's context width and,
  for the verify pass, a span bucket (the capacity where its attention reads each row's length);
- inputs are copied into static buffers (keyed by the graph tensor names, trtllm_dflash/contracts/names.py),
  the graph is replayed, and views of its static outputs are returned. Logits are valid until
  the same graph replays again, which the decoding loop never needs: it consumes them within the
  step. The tapped features are copied, because the next step's draft pass reads them;
- a graph of bucket B runs slots 0..B-1 (graph row s is cache slot s): it covers a batch whose
  slots are all below B (a request keeps its slot, runtime/base.py `Slots`, and the loop hands out
  the lowest free slot), each batch row loaded into its slot's row, the other rows padding. Every
  live request is in the batch, so padding rows are free slots or slots whose prompt is being
  prefilled in chunks (decoding.py). A padding row of the verify pass starts its block at the
  capacity where the target attends through the op or a kernel chosen for it: such a row reads
  nothing and writes nothing (`reference_attention.target_attention`; flash and SDPA write its
  row's last slot, runtime/attention_choice.py), so it costs no attention however long the
  cache. On the model's own attention it writes its keys/values at the last
  slots of its row (capacity - block length on), which no prompt reaches (prompts are shorter
  than the context, the capacity holds a block more). Either way a half-prefilled prompt is never
  overwritten and a free row's slots are written again before they are read (slot == position);
- the verify pass attends over `span` slots, rounded up to a power of two (at least
  MIN_SPAN, at most the cache capacity), so one graph serves many context lengths. The mask
  hides the extra slots; the caches start zeroed, so hidden slots are finite. Where the pass's
  attention reads each row's own length instead (the op, flash: `runtime.attention_reads_span`),
  one graph serves every span: a context growing past a power of two captures nothing new;
- the first capture runs the pass with the step's real inputs: the warm-up runs write the same
  keys/values to the same slots as the real pass, so capturing does not change what is decoded.

Not covered (these run eagerly, as without graphs): prefill, and a draft pass whose context is
wider than its block (the first draft after a prefill). Refused at
construction: a runtime that is not on CUDA, hybrid targets (their recurrent states are committed
per row outside the passes), and drafters with a bounded draft history (`sliding_window_size`),
whose step reads the row lengths on the host. A target whose forward reads device values on
the host (transformers' MoE expert loops) fails at its first capture, with one line.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable

import torch

from trtllm_dflash.contracts import names
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.runtime.base import CachedRuntime, Slots, TargetOutput

MIN_SPAN = 256  # smallest span bucket of the verify pass
WARMUP_RUNS = 2  # eager runs before a capture: cuBLAS handles, Triton compiles, allocator warm-up
MAX_CAPTURE_TRIES = 3  # captures of one key that another thread may invalidate before the step fails
# Only the capturing thread is barred from CUDA calls that are unsafe during a capture. With
# torch's default ("global"), a server thread that allocates or copies on its own stream while a
# step is being captured fails itself and invalidates the capture. In thread-local mode that thread
# goes on; the capture can still be invalidated (a device-wide synchronize in another thread in
# every mode, and on an H200 a foreign cudaMalloc after other work in the process): such a step
# runs eagerly and the capture is tried again (StepGraphs._replay).
CAPTURE_ERROR_MODE = "thread_local"


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """Batch sizes that get their own graphs: powers of two below `max_batch`, then `max_batch`."""
    if max_batch < 1:
        return ()
    buckets, size = [], 1
    while size < max_batch:
        buckets.append(size)
        size *= 2
    return (*buckets, max_batch)


def bucket_for(count: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket that holds `count` rows (None when none does)."""
    return next((b for b in buckets if b >= count), None)


def span_bucket(span: int, capacity: int) -> int:
    """The verify pass's attention span rounded up to a power of two (>= MIN_SPAN, <= capacity)."""
    rounded = 1 << max(int(span) - 1, 0).bit_length()
    return min(max(rounded, MIN_SPAN), capacity)


def refusal(runtime: CachedRuntime) -> DFlashError | None:
    """Why this runtime's passes cannot be replayed from graphs, as the one-line error (None: they can)."""
    if runtime.device.type != "cuda":
        return DFlashError(
            f"CUDA graphs need the model on a CUDA device; this runtime's model is on {runtime.device}",
            "load the model with device 'cuda', or drop cuda_graphs (--no-cuda-graphs)",
        )
    if runtime.is_hybrid:
        return DFlashError(
            "CUDA graphs do not cover hybrid targets (their linear-attention states are committed per row between passes)",
            "drop cuda_graphs for this target (--no-cuda-graphs)",
        )
    if runtime.drafter_config is not None and runtime.drafter_config.history > 0:
        return DFlashError(
            "CUDA graphs do not cover drafters with a bounded draft history (sliding_window_size): "
            "their step reads row lengths on the host",
            "drop cuda_graphs (--no-cuda-graphs), or load the drafter without sliding_window_size",
        )
    return None


def check_supported(runtime: CachedRuntime) -> None:
    """Refuse the runtimes whose passes cannot be replayed from a graph, in one line."""
    error = refusal(runtime)
    if error is not None:
        raise error


Replay = Callable[[], None]


def capture(run: Callable[[], Any], pool: Any) -> tuple[Replay, Any]:
    """Warm `run` up on a side stream, then record it into a CUDA graph.

    Returns the graph's replay function and `run`'s outputs, which become the graph's static
    outputs (overwritten by every replay)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(WARMUP_RUNS):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with recording(graph, pool):
        outputs = run()
    return graph.replay, outputs


def invalidated_by_another_thread(exc: BaseException) -> bool:
    """Whether a capture failed only because something outside the pass invalidated it.

    A device-wide synchronize in any other thread (torch.cuda.synchronize, empty_cache, the
    allocator freeing cached blocks under memory pressure) invalidates a capture in every error
    mode (seen on an H200, benchmarks/RESULTS.md); the pass itself was fine and a later capture
    can succeed. A pass that is itself uncapturable (a host read inside it) raises "not permitted"
    in the capturing thread first, and torch's capture_end then reports the invalidation on top:
    that one is never retried."""
    chain, seen = [], exc
    while seen is not None:
        chain.append(str(seen))
        seen = seen.__cause__ or seen.__context__
    invalidated = "previous error during capture" in chain[0] or "CaptureInvalidated" in chain[0]
    return invalidated and not any("not permitted when stream is capturing" in text for text in chain)


def recording(graph: Any, pool: Any) -> Any:
    """The context manager that records into `graph`: torch's, in thread-local error mode."""
    return torch.cuda.graph(graph, pool=pool, capture_error_mode=CAPTURE_ERROR_MODE)


def new_pool() -> Any:
    """A memory pool that all graphs of one runtime share (they never run at the same time)."""
    return torch.cuda.graph_pool_handle()


@dataclasses.dataclass
class _Graph:
    inputs: dict[str, torch.Tensor]
    replay: Replay | None = None
    outputs: Any = None


def _load(static: torch.Tensor, value: torch.Tensor, slots: Slots) -> None:
    """Copy batch row i of `value` into row slots.ids[i] of a static buffer, and zero the padding rows."""
    count = value.shape[0]
    if slots.run == slice(0, count):
        static[:count].copy_(value)
        static[count:].zero_()
    else:
        static.zero_()
        static.index_copy_(0, slots.index, value)


def _rows(output: torch.Tensor, slots: Slots) -> torch.Tensor:
    """The batch's rows of a graph output (graph row s is slot s)."""
    return output[: len(slots)] if slots.run == slice(0, len(slots)) else output.index_select(0, slots.index)


class StepGraphs:
    """Captures and replays a TorchRuntime's draft and verify passes, per batch bucket.

    `counts` says how many passes were captured, replayed from a graph (and of those, padded with
    rows of other slots, and with such rows between the batch's slots), and run eagerly.
    """

    def __init__(self, runtime: CachedRuntime) -> None:
        check_supported(runtime)
        self.runtime = runtime
        self._eager_target = runtime.target_forward
        self._eager_draft = runtime.draft_forward
        self._eager_allocate = runtime.allocate
        self._graphs: dict[tuple, _Graph] = {}
        self._invalidated: collections.Counter[tuple] = collections.Counter()  # failed captures in a row, per key
        self._pool: Any = None
        self.buckets = batch_buckets(runtime.max_batch)
        self.counts: collections.Counter[str] = collections.Counter()

    @classmethod
    def install(cls, runtime: CachedRuntime) -> "StepGraphs":
        """Route this runtime instance's passes (and cache allocation) through the graphs."""
        graphs = cls(runtime)
        runtime.target_forward = graphs.target_forward
        runtime.draft_forward = graphs.draft_forward
        runtime.allocate = graphs.allocate
        return graphs

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def allocate(self, max_batch: int, capacity: int) -> None:
        """New caches invalidate every graph (they recorded the old buffers' addresses)."""
        self._graphs.clear()
        self._pool = None
        self._eager_allocate(max_batch, capacity)
        self.buckets = batch_buckets(max_batch)

    def _abandon_pool(self) -> None:
        """After a failed capture: torch's capture_end raised before it stopped routing allocations
        to the pool ("beginAllocateToPool: already recording" at the next capture), so stop that
        here and give later captures a fresh pool."""
        if self._pool is not None:  # private torch: no public call undoes capture_begin's routing (tests/test_cuda_graphs.py)
            torch._C._cuda_endAllocateToPool(torch.cuda.current_device(), self._pool)
        self._pool = None

    def _bucket(self, slots: Slots) -> int | None:
        """The smallest bucket whose rows hold every slot of the batch."""
        return bucket_for(max(slots.ids) + 1, self.buckets) if slots.ids else None

    def _replay(
        self,
        key: tuple,
        bucket: int,
        what: str,
        inputs: dict[str, torch.Tensor],
        slots: Slots,
        run: Callable[[dict], Any],
        padded: dict[str, torch.Tensor] | None = None,
    ) -> Any:
        """Load `inputs` (batch rows, into their slots' rows) and `padded` (all `bucket` rows as given)
        into the graph of `key` (captured first, with these inputs, if new) and replay it."""
        padded = padded or {}
        graph = self._graphs.get(key)
        fresh = graph is None
        if fresh:
            graph = _Graph({name: value.new_zeros((bucket, *value.shape[1:])) for name, value in {**inputs, **padded}.items()})
        for name, value in inputs.items():
            _load(graph.inputs[name], value, slots)
        for name, value in padded.items():
            graph.inputs[name].copy_(value)
        if fresh:
            if self._pool is None:
                self._pool = new_pool()
            try:
                graph.replay, graph.outputs = capture(lambda: run(graph.inputs), self._pool)
            except DFlashError:
                raise
            except Exception as exc:  # e.g. a host read inside the pass ("operation not permitted when stream is capturing")
                self._invalidated[key] += 1
                self._abandon_pool()
                if invalidated_by_another_thread(exc) and self._invalidated[key] < MAX_CAPTURE_TRIES:
                    self.counts["invalidated"] += 1
                    return None  # nothing captured ran: the caller runs this step eagerly, the next one tries again
                reason = (str(exc).strip().splitlines() or [""])[0]
                raise DFlashError(
                    f"capturing the {what} pass in a CUDA graph failed ({type(exc).__name__}: {reason})",
                    "run without CUDA graphs (cuda_graphs=False)",
                ) from exc
            self._invalidated.pop(key, None)
            self._graphs[key] = graph
            self.counts["captured"] += 1
        graph.replay()
        self.counts["replayed"] += 1
        if len(slots) < bucket:
            self.counts["padded"] += 1  # replays with padding rows
        if slots.run != slice(0, len(slots)):
            self.counts["gapped"] += 1  # of those, with padding rows between the batch's slots
        return graph.outputs

    def target_forward(self, slots, tokens, starts, span, logits_at=None) -> TargetOutput:
        """The verify pass from a graph where one covers it (not prefill), else eagerly."""
        slots = Slots.of(slots, tokens.device)
        length = tokens.shape[1]
        bucket = self._bucket(slots)
        if logits_at is not None or bucket is None:
            self.counts["eager"] += 1
            return self._eager_target(slots, tokens, starts, span, logits_at)
        # one graph for every span where the pass's attention reads each row's own length
        capacity = self.runtime.capacity
        padded_span = span_bucket(span, capacity) if self.runtime.attention_reads_span(length, bucket) else capacity

        def run(static: dict[str, torch.Tensor]) -> TargetOutput:
            return self._eager_target(slice(0, bucket), static[names.INPUT_IDS], static[names.STARTS], padded_span)

        # padding rows start at the capacity (nothing written, nothing read) or write at the last
        # positions of their slots, past any prompt a prefilling slot holds (runtime.padding_start)
        padded_starts = starts.new_full((bucket,), self.runtime.padding_start(length))
        padded_starts[slots.select] = starts
        with torch.inference_mode():
            inputs, padded = {names.INPUT_IDS: tokens}, {names.STARTS: padded_starts}
            out = self._replay(("target", bucket, length, padded_span), bucket, "target verify", inputs, slots, run, padded)
            if out is None:
                return self._eager_target(slots, tokens, starts, span, logits_at)
            features = _rows(out.features, slots).clone() if out.features is not None else None
        return TargetOutput(logits=_rows(out.logits, slots), features=features)

    def draft_forward(self, slots, block, ctx_features, new_counts, cache_lens) -> torch.Tensor:
        """The draft pass from a graph where one covers it, else eagerly."""
        slots = Slots.of(slots, block.device)
        length, width = block.shape[1], ctx_features.shape[1]
        bucket = self._bucket(slots)
        if bucket is None or width > length:  # wider: the context of a prefill (the prompt)
            self.counts["eager"] += 1
            return self._eager_draft(slots, block, ctx_features, new_counts, cache_lens)

        def run(static: dict[str, torch.Tensor]) -> torch.Tensor:
            return self._eager_draft(
                slice(0, bucket), static[names.BLOCK_IDS], static[names.CTX_FEATURES], static[names.NEW_COUNTS], static[names.CACHE_LENS]
            )

        inputs = {names.BLOCK_IDS: block, names.CTX_FEATURES: ctx_features, names.NEW_COUNTS: new_counts, names.CACHE_LENS: cache_lens}
        with torch.inference_mode():
            logits = self._replay(("draft", bucket, length, width), bucket, "drafter", inputs, slots, run)
        if logits is None:
            return self._eager_draft(slots, block, ctx_features, new_counts, cache_lens)
        return _rows(logits, slots)

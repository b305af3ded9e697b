"""The serving loop: one Decoder, fed by request threads, stepped by one background thread.

Triton calls `execute()` on its own thread; it only parses and validates a request (`accept`)
and queues it. The loop thread owns the Decoder: between steps it admits queued requests,
drops cancelled ones, then runs one draft + verify step for the whole batch and streams each
request's new tokens back through its `ResponseSink`. Nothing here imports Triton, so the same
code runs inside the Python backend and in plain Python.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import queue
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Protocol

import numpy as np

from trtllm_dflash.decoding import Decoder, Request, SequenceResult, StepEvent
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.runtime.prefix_cache import PrefixCache
from trtllm_dflash.sampling_params import SamplingParams, check_prompt_text
from trtllm_dflash.served_model.detokenizer import REPLACEMENT, IncrementalDetokenizer, StopScan, stop_cut
from trtllm_dflash.served_model.metrics import ServingMetrics
from trtllm_dflash.served_model.model_parameters import ServingConfig
from trtllm_dflash.served_model.protocol import GenerateInputs

if TYPE_CHECKING:
    from trtllm_dflash.api import DFlashPipeline


class ResponseSink(Protocol):
    """Where one request's responses go (a Triton response sender, or a list in tests).

    `send` may raise when the client is gone, or hand the response to another thread and report a
    gone client through `cancelled()` later (the Triton model's sink does: its round trips run off
    this loop, served_model/call_thread.py); the loop drops the request either way."""

    def send(self, outputs: dict[str, np.ndarray], final: bool) -> None: ...

    def error(self, message: str) -> None: ...

    def cancelled(self) -> bool: ...


class Job:
    """A request on its way through the loop: its decoder request, text so far, timings."""

    def __init__(self, request: Request, inputs: GenerateInputs, sink: ResponseSink, tokenizer: Any) -> None:
        self.request = request
        self.detokenizer = IncrementalDetokenizer(tokenizer)  # the output's text, decoded step by step
        self.stop_scan = StopScan(tuple(request.params.stop), request.params.min_tokens)
        self.inputs = inputs
        self.sink = sink
        self.received = time.perf_counter()
        self.first_token_at: float | None = None
        self.text = ""  # text already sent (streaming) / produced so far
        self.ids_sent = 0  # streaming: output ids, acceptance lengths and responses already sent
        self.lengths_sent = 0
        self.responses_sent = 0
        self.steps_seen = 0  # acceptance lengths already counted in the metrics
        self.final_text = ""  # set when a stop string ends the request
        self.final_ids: list[int] = []

    @property
    def request_id(self) -> Any:
        return self.request.request_id


class BatchingLoop:
    """A loaded target (+ drafter) and the in-flight batching loop over them.

    `pipeline` is already open (a DFlashPipeline of the backend `config` names): whoever builds the
    loop opens it (the Triton model, backends/triton_model.py), so serving never picks a backend."""

    def __init__(
        self, config: ServingConfig, pipeline: DFlashPipeline, metrics: ServingMetrics | None = None, log: Callable[[str], None] = print
    ) -> None:
        self.config = config
        self.metrics = metrics or ServingMetrics()
        self.log = log
        self.pipeline = pipeline
        self.tokenizer = self.pipeline.tokenizer
        if self.tokenizer is None:
            raise DFlashError(f"target {config.target} has no tokenizer", "save the tokenizer next to the target; the server takes text")
        # what the opened pipeline holds (a context clamped to the target's or the engines') decides;
        # the model publishes these (protocol.LIMITS_OUTPUT), so the front end checks against the same
        limits = self.limits = config.limits(self.pipeline.max_context)
        self.max_context, self.max_new_tokens_limit = limits.max_context, limits.max_new_tokens
        # what a request that leaves a value out gets
        self.defaults = SamplingParams(max_new_tokens=limits.default_new_tokens)
        self.decoder = self._new_decoder()
        self.draft_len = self.decoder.block_size - 1 if self.decoder.speculative else 0
        self.metrics.speculative(self.draft_len)
        self.inbox: queue.Queue[Job] = queue.Queue()
        self.jobs: dict[Any, Job] = {}
        self._ids = itertools.count()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def _new_decoder(self) -> Decoder:
        """A decoder (with an empty prefix cache: after a failed step nothing kept is trusted)."""
        return Decoder(
            self.pipeline.runtime,
            max_batch=self.config.max_batch,
            max_context=self.max_context,
            block_size=self.config.block_size,
            draft_len_schedule=self.config.draft_len_schedule,
            prefix_cache=self._prefix_cache(),
            prefill_chunk=self.config.prefill_chunk,
            prefill_share=self.config.prefill_share or None,
            adaptive_drafting=self.config.adaptive_drafting,
            async_scheduling=self.config.async_scheduling,
        )

    def _prefix_cache(self) -> PrefixCache | None:
        if self.config.prefix_cache_mib == 0:
            return None
        refusal = self.pipeline.runtime.prefix_cache_refusal()
        if refusal is not None:
            self.log(f"prefix cache off: {refusal}")
            return None
        return PrefixCache(self.config.prefix_cache_mib * 1024 * 1024, self.config.prefix_cache_block)

    # ------------------------------------------------------------------ request side (any thread)

    def accept(self, inputs: GenerateInputs, sink: ResponseSink) -> Job:
        """Validate a request and queue it for the next step; DFlashError if it cannot run.

        Checked here once for every way in (HTTP, gRPC, the OpenAI front end), all by
        sampling_params: the prompt's length in characters first (a huge prompt is refused
        before tokenizing), then the sampling values and this server's max_new_tokens bound.
        """
        if inputs.token_ids is None:
            check_prompt_text(inputs.text, self.max_context)
        inputs.params.validate()
        inputs.params.check_limit(self.max_new_tokens_limit)
        params = dataclasses.replace(inputs.params, stop_token_ids=tuple(self.pipeline.stop_token_ids))  # the model's own
        # token ids (the OpenAI front end tokenized the prompt once, there) go in as they are; text is tokenized here
        prompt_ids = list(inputs.token_ids) if inputs.token_ids is not None else self.pipeline.encode(inputs.text)
        # a grammar compiles here, in the request's thread, not in the decoding loop (a schema can take milliseconds)
        grammar = self.pipeline.grammar_state(params.grammar) if params.grammar is not None else None
        request = Request(prompt_ids, params, request_id=next(self._ids), cache_salt=inputs.cache_salt, grammar=grammar)
        self.decoder.check_prompt(request)  # the params were validated above: once per request in this process
        job = Job(request, inputs, sink, self.tokenizer)
        self.inbox.put(job)
        return job

    # ------------------------------------------------------------------ loop side (one thread)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="dflash-decode-loop", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        for job in list(self.jobs.values()) + _drain(self.inbox):
            _safe(job.sink.error, "the server is shutting down")
        self.jobs.clear()

    def run(self) -> None:
        """Admit, drop cancelled, step, deliver; until stop()."""
        while not self._stopping.is_set():
            self._admit(wait=not self.decoder.has_work)
            self._drop_cancelled()
            if self.decoder.has_work:
                self._step()
            waiting = len(self.decoder.waiting) + len(self.decoder.prefilling) + self.inbox.qsize()  # prefilling: not decoding yet
            self.metrics.queue(len(self.decoder.live), waiting)

    def _step(self) -> None:
        try:
            # first tokens go out as soon as their prompt is prefilled, before the step's decoding
            events = self.decoder.step(emit=self._deliver_events)
        except Exception as exc:  # noqa: BLE001 - a failed step fails its requests, not the server
            self.log(f"decoding step failed: {exc!r}")
            for job in list(self.jobs.values()):
                self._finish(job, error=f"decoding failed on the server ({type(exc).__name__}: {exc})")
            self.decoder = self._new_decoder()
            return
        for stats in self.decoder.stats:
            self.metrics.step(stats.batch_size, stats.draft_seconds, stats.verify_seconds)
        self.decoder.stats.clear()
        self._deliver_events(events)

    def _deliver_events(self, events: list[StepEvent]) -> None:
        self.metrics.tokens(sum(len(event.new_token_ids) for event in events))
        for event in events:
            job = self.jobs.get(event.request_id)
            if job is not None:
                self._deliver(job, event)

    def _admit(self, wait: bool) -> None:
        try:
            job = self.inbox.get(timeout=0.05) if wait else self.inbox.get_nowait()
        except queue.Empty:
            return
        for job in [job] + _drain(self.inbox):
            try:
                self.decoder.submit(job.request, checked=True)  # checked in accept(), against the same limits
            except DFlashError as exc:
                self._finish(job, error=str(exc))
                continue
            self.jobs[job.request_id] = job

    def _drop_cancelled(self) -> None:
        for job in list(self.jobs.values()):
            if _safe(job.sink.cancelled, default=True):
                self.decoder.cancel(job.request_id)
                self._finish(job, error="request cancelled", outcome="cancelled")

    def _deliver(self, job: Job, event: StepEvent) -> None:
        result = event.result
        if job.first_token_at is None and result.token_ids:
            job.first_token_at = time.perf_counter()
            self.metrics.first_token(job.first_token_at - job.received)
        for length, drafted in zip(result.acceptance_lengths[job.steps_seen :], result.draft_lengths[job.steps_seen :]):
            self.metrics.accepted(length, drafted)
        job.steps_seen = len(result.acceptance_lengths)
        finished = event.finished
        text, ids = self._text_of(job, result, finished)
        if text is None:  # a stop string ended the request inside this step
            self.decoder.cancel(job.request_id)
            result.finish_reason = "stop"
            finished = True
            text, ids = job.final_text, job.final_ids
        if finished:
            result.elapsed = time.perf_counter() - job.received
            # counted before the final response goes out: a client that reads the metrics right
            # after its last response must see its request (the 16-stream test raced on this)
            self.jobs.pop(job.request_id, None)
            ttft = job.first_token_at - job.received if job.first_token_at else None
            self.metrics.request_done("success", result, ttft)
        if job.inputs.streaming:
            if finished or len(ids) > job.ids_sent or len(text) > len(job.text):
                outputs = self._outputs(job, result, text[len(job.text) :], ids, finished)
                job.text = text
                if not _safe(job.sink.send, outputs, finished, default=False, ok=True) and not finished:
                    self.decoder.cancel(job.request_id)
                    self._finish(job, error=None, outcome="cancelled")
                    return
        elif finished:
            _safe(job.sink.send, self._outputs(job, result, text, ids, True), True)

    def _text_of(self, job: Job, result: SequenceResult, finished: bool) -> tuple[str | None, list[int]]:
        """Text to have sent so far (held back where a stop string or a multi-byte char may follow).

        Only this step's tokens are decoded, and stop strings are searched only where one could
        end this step (served_model/detokenizer.py). A finished request's text is one whole decode.
        Returns (None, ..) when a stop string completed: the job's final_text/final_ids are set.
        """
        ids, detokenizer, scan = result.token_ids, job.detokenizer, job.stop_scan
        first_new, searched_before = detokenizer.read_offset, len(detokenizer.text)
        before = copy.copy(detokenizer) if scan.stops else None  # the state a stop's cut is found from
        text = detokenizer.decode(ids)
        hit = scan.first_hit(text, searched_before, self.tokenizer, ids)
        if hit is not None:
            keep = stop_cut(before, scan, ids, first_new, searched_before)
            del ids[keep:]
            job.final_text, job.final_ids = text[:hit], ids
            return None, ids
        if finished:
            return self.tokenizer.decode(ids, skip_special_tokens=True), ids
        hold = max(scan.longest - 1, 0)
        if text.endswith(REPLACEMENT):
            hold = max(hold, 1)
        visible = text[: len(text) - hold] if hold else text
        return (visible if len(visible) >= len(job.text) else job.text), ids

    def _outputs(self, job: Job, result: SequenceResult, text: str, ids: list[int], finished: bool) -> dict[str, np.ndarray]:
        """One response: the new text/ids/acceptance lengths (streaming) or all of them, and totals."""
        if job.inputs.streaming:  # this step's ids and acceptance lengths
            new_ids, job.ids_sent = ids[job.ids_sent :], len(ids)
            new_lengths, job.lengths_sent = result.acceptance_lengths[job.lengths_sent :], len(result.acceptance_lengths)
        else:
            new_ids, new_lengths = ids, result.acceptance_lengths
        if not job.inputs.exclude_input and job.responses_sent == 0:
            prompt = job.inputs.text if job.inputs.token_ids is None else self.tokenizer.decode(job.request.prompt_ids)
            text = prompt + text
        job.responses_sent += 1
        outputs = {
            "text_output": np.array([text.encode("utf-8")], dtype=np.object_),
            "output_ids": np.array(new_ids, dtype=np.int32),
            "acceptance_lengths": np.array(new_lengths, dtype=np.int32),
        }
        if job.inputs.streaming and not finished and not job.inputs.stream_totals:
            return outputs  # protocol.STEP_OUTPUTS: the totals come with the last response
        steps = len(result.acceptance_lengths)
        accepted = sum(result.acceptance_lengths) - steps
        drafted = sum(result.draft_lengths)  # what was verified: a draft_len_schedule shortens busy steps
        elapsed = (result.elapsed if finished else time.perf_counter() - job.received) or 1e-9
        ttft = (job.first_token_at - job.received) if job.first_token_at else 0.0
        return {
            **outputs,
            "mean_acceptance_length": np.array([result.mean_acceptance_length], dtype=np.float32),
            "acceptance_rate": np.array([accepted / drafted if drafted else 0.0], dtype=np.float32),
            "total_accepted_draft_tokens": np.array([accepted], dtype=np.int32),
            "total_draft_tokens": np.array([drafted], dtype=np.int32),
            "num_input_tokens": np.array([len(result.prompt_ids)], dtype=np.int32),
            "num_output_tokens": np.array([len(ids)], dtype=np.int32),
            "num_cached_tokens": np.array([result.cached_prompt_tokens], dtype=np.int32),
            "time_to_first_token": np.array([ttft], dtype=np.float32),
            "tokens_per_second": np.array([len(ids) / elapsed], dtype=np.float32),
            "finish_reason": np.array([(result.finish_reason or "").encode() if finished else b""], dtype=np.object_),
        }

    def _finish(self, job: Job, error: str | None, outcome: str = "error") -> None:
        """End a request early with an error response (or silently when its client is gone)."""
        self.jobs.pop(job.request_id, None)
        if error is not None:
            _safe(job.sink.error, error)
        self.metrics.request_done(outcome, None, None)


def _drain(inbox: queue.Queue) -> list:
    items = []
    while True:
        try:
            items.append(inbox.get_nowait())
        except queue.Empty:
            return items


def _safe(call: Callable, *args, default: Any = None, ok: Any = None) -> Any:
    """Call into Triton; a client that went away must not stop the loop."""
    try:
        value = call(*args)
    except Exception:  # noqa: BLE001
        return default
    return ok if ok is not None else value

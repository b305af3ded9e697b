"""Aggregate serving metrics: acceptance length, tokens/s, time to first token, batch size.

Inside Triton they are custom metrics of the Python backend (`pb_utils.MetricFamily`), served
with Triton's own on the metrics port (`/metrics`, Prometheus text). Every metric carries the
label `model` so a repository with a DFlash and an autoregressive model can be compared.
`read_metrics` parses that page back for clients, tests and benchmarks.

A drafting model also counts its drafts as vLLM does (vllm/v1/spec_decode/metrics.py,
SpecDecodingProm), under our prefix: dflash_spec_decode_num_drafts_total (verify steps, one per
request per step), _num_draft_tokens_total, _num_accepted_tokens_total (accepted drafts, the bonus
token not counted) and _num_accepted_tokens_per_pos_total{position} (steps that accepted the draft
at 0-based position p), so vLLM's PromQL for acceptance rate and length works with the prefix changed.
"""

from __future__ import annotations

import dataclasses
import time
import urllib.request
from typing import TYPE_CHECKING, Callable

from trtllm_dflash.extras import require

if TYPE_CHECKING:
    from trtllm_dflash.decoding import SequenceResult

PREFIX = "dflash_"
ACCEPTANCE_BUCKETS = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32]
BATCH_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
SECONDS_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]
RATE_BUCKETS = [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500]


class ServingMetrics:
    """Where the loop reports what it did; this base class records nothing."""

    def step(self, batch_size: int, draft_seconds: float, verify_seconds: float) -> None:
        """One draft + verify step over `batch_size` live requests."""

    def tokens(self, count: int) -> None:
        """Tokens generated (prefill first tokens included)."""

    def speculative(self, draft_len: int) -> None:
        """The model drafts `draft_len` tokens per step (0: it does not draft); told once, before any step."""

    def accepted(self, length: int, drafted: int) -> None:
        """One request's tokens committed by one verify step (tau of that step, bonus included), of
        `drafted` draft tokens verified (0 where the model does not draft or the schedule said 0)."""

    def first_token(self, seconds: float) -> None:
        """Time from a request's arrival to its first generated token."""

    def request_done(self, outcome: str, result: SequenceResult | None, ttft: float | None) -> None:
        """A request left: outcome "success", "error" or "cancelled"."""

    def queue(self, live: int, waiting: int) -> None:
        """Requests in the batch and waiting to join it, after a step."""


class TritonMetrics(ServingMetrics):
    """Custom Prometheus metrics of the Triton Python backend.

    Every update of a pb_utils metric is a round trip to tritonserver, and a decoding step made
    about 60 at batch 8 (a profile of the served loop at concurrency 8 found metrics at ~18% of its
    busy time). So counters add up here and go out at most every FLUSH_S seconds and whenever a
    request finishes (before its final response: a client that reads /metrics after its last
    response sees everything its request did); gauges go out when they change; histogram
    observations go out as they come (Prometheus keeps each one's bucket). Each update is made by
    `run` (the model's CallThread.submit: off the decoding loop, in order with its responses)."""

    FLUSH_S = 0.25

    def __init__(self, model_name: str, run: Callable[..., None] | None = None) -> None:
        import triton_python_backend_utils as pb_utils

        family = pb_utils.MetricFamily
        labels = {"model": model_name}
        self._families = []  # a MetricFamily must outlive its metrics
        self._run = run or (lambda call, *args: call(*args))  # how a pb_utils update is made

        def make(name: str, kind, description: str, buckets=None, **extra):
            fam = family(name=PREFIX + name, description=description, kind=kind)
            self._families.append(fam)
            if buckets is None:
                return fam.Metric(labels={**labels, **extra})
            return fam.Metric(labels={**labels, **extra}, buckets=buckets)

        self.acceptance = make(
            "acceptance_length", family.HISTOGRAM, "Tokens committed per verify step per request (tau)", ACCEPTANCE_BUCKETS
        )
        self.batch = make("batch_size", family.HISTOGRAM, "Requests decoded together in one step", BATCH_BUCKETS)
        self.ttft = make("time_to_first_token_seconds", family.HISTOGRAM, "Arrival to first generated token", SECONDS_BUCKETS)
        self.rate = make("request_tokens_per_second", family.HISTOGRAM, "Generated tokens per second of each request", RATE_BUCKETS)
        self.generated = make("generated_tokens_total", family.COUNTER, "Tokens generated")
        self.draft_seconds = make("draft_seconds_total", family.COUNTER, "Time in drafter passes")
        self.verify_seconds = make("verify_seconds_total", family.COUNTER, "Time in target verify passes")
        requests = family(name=PREFIX + "requests_total", description="Requests by outcome", kind=family.COUNTER)
        self._families.append(requests)
        self.requests = {o: requests.Metric(labels={**labels, "outcome": o}) for o in ("success", "error", "cancelled")}
        self.live = make("live_requests", family.GAUGE, "Requests in the decoding batch")
        self.waiting = make("waiting_requests", family.GAUGE, "Requests waiting to join the batch")
        self._family, self._labels = family, labels
        self.draft_len = 0
        self._pending: dict[int, list] = {}  # id(counter) -> [counter, amount not yet sent]
        self._gauges: dict[int, float] = {}  # id(gauge) -> the value last sent
        self._flushed = time.monotonic()

    def _add(self, counter, amount: float) -> None:
        entry = self._pending.setdefault(id(counter), [counter, 0.0])
        entry[1] += amount

    def flush(self) -> None:
        """Send the counters' amounts added since the last flush."""
        for counter, amount in self._pending.values():
            if amount:
                self._run(counter.increment, amount)
        self._pending.clear()
        self._flushed = time.monotonic()

    def _set(self, gauge, value: float) -> None:
        if self._gauges.get(id(gauge)) != value:
            self._run(gauge.set, value)
            self._gauges[id(gauge)] = value

    def speculative(self, draft_len):
        """vLLM's four spec-decode counters (the module's docstring), made only for a drafting model."""
        if draft_len <= 0 or self.draft_len:
            return
        self.draft_len = draft_len
        kinds = {
            "num_drafts_total": "Verify steps of drafting requests (one per request per step)",
            "num_draft_tokens_total": "Draft tokens proposed",
            "num_accepted_tokens_total": "Draft tokens accepted (the bonus token not counted)",
            "num_accepted_tokens_per_pos_total": "Steps that accepted the draft token at this 0-based position",
        }
        families = {}
        for name, description in kinds.items():
            families[name] = self._family(name=PREFIX + "spec_decode_" + name, description=description, kind=self._family.COUNTER)
            self._families.append(families[name])
        self.drafts = families["num_drafts_total"].Metric(labels=self._labels)
        self.draft_tokens = families["num_draft_tokens_total"].Metric(labels=self._labels)
        self.accepted_tokens = families["num_accepted_tokens_total"].Metric(labels=self._labels)
        per_position = families["num_accepted_tokens_per_pos_total"]
        self.per_position = [per_position.Metric(labels={**self._labels, "position": str(p)}) for p in range(draft_len)]

    def step(self, batch_size, draft_seconds, verify_seconds):
        self._run(self.batch.observe, batch_size)
        self._add(self.draft_seconds, draft_seconds)
        self._add(self.verify_seconds, verify_seconds)
        if time.monotonic() - self._flushed >= self.FLUSH_S:
            self.flush()

    def tokens(self, count):
        if count:
            self._add(self.generated, count)

    def accepted(self, length, drafted):
        self._run(self.acceptance.observe, length)
        if self.draft_len and drafted:
            accepted = length - 1
            self._add(self.drafts, 1)
            self._add(self.draft_tokens, drafted)
            if accepted:
                self._add(self.accepted_tokens, accepted)
            for counter in self.per_position[:accepted]:
                self._add(counter, 1)

    def first_token(self, seconds):
        self._run(self.ttft.observe, seconds)

    def request_done(self, outcome, result, ttft):
        self._add(self.requests[outcome], 1)
        if result is not None and result.elapsed > 0:
            self._run(self.rate.observe, len(result.token_ids) / result.elapsed)
        self.flush()

    def queue(self, live, waiting):
        self._set(self.live, live)
        self._set(self.waiting, waiting)


# ---------------------------------------------------------------------- reading /metrics


@dataclasses.dataclass
class Histogram:
    count: float = 0.0
    sum: float = 0.0

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else 0.0


def read_metrics(url: str, model: str, timeout: float = 10.0) -> dict[str, float | Histogram]:
    """The dflash_* metrics of one model from a Prometheus page (e.g. http://host:8002/metrics).

    Histograms come back as Histogram(count, sum); counters and gauges as numbers, with
    requests_total split as requests_total{outcome} and spec_decode_num_accepted_tokens_per_pos_total
    as ..._total{position}.
    """
    text_string_to_metric_families = require("prometheus_client.parser", "serve", "reading metrics").text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout) as response:
        text = response.read().decode()
    values: dict[str, float | Histogram] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(PREFIX):
            continue
        name = family.name[len(PREFIX) :]
        for sample in family.samples:
            if sample.labels.get("model") != model:
                continue
            if family.type == "histogram":
                histogram = values.setdefault(name, Histogram())
                if sample.name.endswith("_count"):
                    histogram.count = sample.value
                elif sample.name.endswith("_sum"):
                    histogram.sum = sample.value
            elif not sample.name.endswith("_created"):
                key = sample.name[len(PREFIX) :]  # counters keep their _total suffix here
                split = sample.labels.get("outcome", sample.labels.get("position"))
                values[f"{key}{{{split}}}" if split is not None else key] = sample.value
    return values

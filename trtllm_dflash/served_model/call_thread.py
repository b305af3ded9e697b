"""One thread that makes a served model's calls into its server, in order, off the decoding loop.

Why: in the Triton Python backend every response sent, metric updated or cancellation checked is
a round trip to tritonserver (on this project's 2-core CPU machine: a streamed response ~180 us,
a cancellation check ~40 us, a histogram observation ~16 us; benchmarks/RESULTS.md). Made on the
decoding loop's thread they took as long as the decoding itself at concurrency 8 (a profile of the
served model process: 104 of 243 samples delivering, 104 in `Decoder.step`). A round trip waits
with the GIL released, so on this thread it overlaps the loop's next step instead of lengthening it.

Calls run one after another in the order they were submitted (a request's responses stay in
order, and a metric counted before a final response is sent before it), except that an urgent
call (a request's first response, which nothing of its own precedes) runs before the ordinary
calls still waiting: a first token does not queue behind the other requests' streamed responses.
A call that raises is logged and the thread goes on: the callers wrap what must not fail (a
client that went away).

A request's streamed responses go through its `ResponseQueue`, which merges a response into the
one still waiting on this thread instead of queueing a second round trip.
"""

from __future__ import annotations

import itertools
import queue
import threading
from typing import Any, Callable

import numpy as np

URGENT, ORDINARY, LAST = 0, 1, 2  # the order in which waiting calls run; FIFO within each


class CallThread:
    """Runs submitted calls in order on one daemon thread (see the module docstring)."""

    def __init__(self, name: str = "dflash-server-calls", log: Callable[[str], None] = print) -> None:
        self._calls: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()  # FIFO among calls of one priority
        self._log = log
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, call: Callable[..., Any], *args: Any, urgent: bool = False) -> None:
        """Run `call(*args)` after every call submitted before it; `urgent`, after the urgent ones
        only (it goes ahead of the ordinary calls still waiting)."""
        self._calls.put((URGENT if urgent else ORDINARY, next(self._order), call, args))

    def close(self, timeout: float = 10.0) -> None:
        """Run what was submitted, then end the thread (waiting at most `timeout` seconds)."""
        self._calls.put((LAST, next(self._order), None, ()))
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            priority, _, call, args = self._calls.get()
            if priority == LAST:
                return
            try:
                call(*args)
            except Exception as exc:  # noqa: BLE001 - one failed call must not stop the others
                self._log(f"a call into the server failed: {getattr(call, '__qualname__', call)}: {exc!r}")


class ResponseQueue:
    """One request's responses on their way to a CallThread: a streamed response that comes while
    the previous one still waits there joins it (`merge`), so a call thread that fell behind sends
    one response for the steps it missed, not one per step. No token goes out later than it would
    have, and a thread that keeps up sends every step's response on its own. (Served at concurrency
    8 on this project's 2-core machine, 5-16 calls were often waiting, about one step's responses
    and metric updates; vLLM's RequestOutputCollector merges the outputs its API server has not
    read yet the same way.)

    A final response takes a waiting one with it. It is submitted after everything the loop
    submitted before it (the metrics of a finished request), so it never goes out before those.
    The first response, unless it is final, is urgent (CallThread.submit).
    """

    def __init__(
        self,
        calls: CallThread,
        deliver: Callable[[dict[str, np.ndarray], bool], None],
        merge: Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], dict[str, np.ndarray]],
    ) -> None:
        self._calls, self._deliver, self._merge = calls, deliver, merge
        self._waiting: dict[str, np.ndarray] | None = None  # submitted, not sent yet
        self._first = True  # nothing submitted yet
        self._lock = threading.Lock()

    def put(self, outputs: dict[str, np.ndarray], final: bool) -> None:
        """Send `outputs` after the request's earlier responses (merged into one still waiting)."""
        with self._lock:
            waiting, self._waiting = self._waiting, None
            if waiting is not None:
                outputs = self._merge(waiting, outputs)
            if not final:
                self._waiting = outputs
                if waiting is not None:
                    return  # the waiting response's call is queued: it sends the merged one
            first, self._first = self._first, False
        if final:
            self._calls.submit(self._deliver, outputs, True)
        else:
            self._calls.submit(self._send_waiting, urgent=first)

    def _send_waiting(self) -> None:
        with self._lock:
            outputs, self._waiting = self._waiting, None
        if outputs is not None:  # None: a final response took it
            self._deliver(outputs, False)

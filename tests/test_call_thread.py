"""The served model's call thread (served_model/call_thread.py): calls run in the order given, a
failing call is logged and the next ones still run, and close() runs what was submitted first;
a request's responses that wait on a busy call thread go out merged, with the same text, ids and
acceptance lengths, never ahead of what was submitted before them; a request's first response
goes ahead of the ordinary calls still waiting."""

from __future__ import annotations

import threading

from trtllm_dflash.served_model.call_thread import CallThread


def _busy(calls: CallThread) -> threading.Event:
    """Hold the call thread inside a call (a round trip in flight) until the returned event is set.

    Returns only once the thread is in it: an urgent call submitted earlier would run first."""
    inside, release = threading.Event(), threading.Event()

    def round_trip():
        inside.set()
        release.wait(30)

    calls.submit(round_trip)
    assert inside.wait(30)
    return release


def test_calls_run_in_order_on_one_other_thread_and_close_runs_what_was_submitted():
    seen, threads, logged = [], set(), []
    calls = CallThread(log=logged.append)

    def record(value):
        seen.append(value)
        threads.add(threading.current_thread().name)

    def fail():
        raise RuntimeError("client went away")

    for value in range(500):
        calls.submit(record, value)
        if value == 100:
            calls.submit(fail)
    calls.close()
    assert seen == list(range(500))
    assert threads == {"dflash-server-calls"} != {threading.current_thread().name}
    assert len(logged) == 1 and "client went away" in logged[0] and "fail" in logged[0]


def test_a_call_waiting_in_the_server_does_not_hold_up_the_submitter():
    """submit() returns at once: the decoding loop goes on while a round trip waits."""
    release, done = threading.Event(), threading.Event()
    calls = CallThread()
    calls.submit(release.wait, 30)
    calls.submit(done.set)
    assert not done.is_set()  # queued behind the waiting call, and submit() did not wait for it
    release.set()
    calls.close()
    assert done.is_set()


def test_urgent_calls_go_ahead_of_the_ordinary_ones_still_waiting_and_each_kind_keeps_its_order():
    order = []
    calls = CallThread()
    release = _busy(calls)  # everything below waits
    calls.submit(order.append, "ordinary 1")
    calls.submit(order.append, "urgent 1", urgent=True)
    calls.submit(order.append, "ordinary 2")
    calls.submit(order.append, "urgent 2", urgent=True)
    release.set()
    calls.close()  # runs everything first, urgent or not
    assert order == ["urgent 1", "urgent 2", "ordinary 1", "ordinary 2"]


def _step(text: str, ids: list[int], **totals) -> dict:
    import numpy as np

    return {
        "text_output": np.array([text.encode()], dtype=np.object_),
        "output_ids": np.array(ids, dtype=np.int32),
        "acceptance_lengths": np.array([len(ids)], dtype=np.int32),
        **{name: np.array([value]) for name, value in totals.items()},
    }


def _read(outputs: dict) -> tuple:
    return outputs["text_output"][0].decode(), outputs["output_ids"].tolist(), outputs["acceptance_lengths"].tolist()


def test_responses_waiting_on_a_busy_call_thread_go_out_as_one_with_the_same_text_and_ids():
    from trtllm_dflash.served_model.call_thread import ResponseQueue
    from trtllm_dflash.served_model.protocol import merge_step_outputs

    sent = []
    calls = CallThread()
    responses = ResponseQueue(calls, lambda outputs, final: sent.append((outputs, final)), merge_step_outputs)
    release = _busy(calls)  # the call thread is behind: a round trip in flight
    responses.put(_step(" caf", [1, 2], num_output_tokens=2), final=False)
    responses.put(_step("é", [3], num_output_tokens=3), final=False)
    responses.put(_step(" au lait", [4, 5, 6], num_output_tokens=6), final=False)
    release.set()
    calls.close()
    assert len(sent) == 1 and sent[0][1] is False
    assert _read(sent[0][0]) == (" café au lait", [1, 2, 3, 4, 5, 6], [2, 1, 3])
    assert sent[0][0]["num_output_tokens"].tolist() == [6]  # running totals: the latest


def test_a_final_response_takes_the_waiting_one_and_still_goes_out_after_what_was_submitted_before_it():
    """The loop counts a finished request's metrics before its final response: a client that reads
    /metrics after its last response must find them, so nothing may jump ahead of them."""
    from trtllm_dflash.served_model.call_thread import ResponseQueue
    from trtllm_dflash.served_model.protocol import merge_step_outputs

    order = []
    calls = CallThread()
    responses = ResponseQueue(calls, lambda outputs, final: order.append((_read(outputs), final)), merge_step_outputs)
    release = _busy(calls)
    responses.put(_step("a", [1]), final=False)
    calls.submit(order.append, "metrics flushed")
    responses.put(_step("b", [2], finish_reason="length"), final=True)
    release.set()
    calls.close()
    assert order == ["metrics flushed", (("ab", [1, 2], [1, 1]), True)]


def test_a_call_thread_that_keeps_up_sends_every_response_on_its_own():
    from trtllm_dflash.served_model.call_thread import ResponseQueue
    from trtllm_dflash.served_model.protocol import merge_step_outputs

    sent, delivered = [], threading.Semaphore(0)
    calls = CallThread()

    def deliver(outputs, final):
        sent.append((_read(outputs), final))
        delivered.release()

    responses = ResponseQueue(calls, deliver, merge_step_outputs)
    for i, final in enumerate((False, False, True)):
        responses.put(_step(str(i), [i]), final)
        assert delivered.acquire(timeout=30)
    calls.close()
    assert sent == [(("0", [0], [1]), False), (("1", [1], [1]), False), (("2", [2], [1]), True)]


def test_a_first_response_goes_ahead_of_other_requests_waiting_calls_and_later_ones_do_not():
    """A first token does not queue behind the other requests' streamed responses; after it, a
    request's responses keep their place in line."""
    from trtllm_dflash.served_model.call_thread import ResponseQueue
    from trtllm_dflash.served_model.protocol import merge_step_outputs

    order = []
    calls = CallThread()

    def queue_of(name):
        return ResponseQueue(calls, lambda outputs, final: order.append((name, _read(outputs)[0], final)), merge_step_outputs)

    a, b = queue_of("a"), queue_of("b")
    release = _busy(calls)
    calls.submit(order.append, "another request's response")
    a.put(_step("a1", [1]), final=False)  # a's first: urgent
    a.put(_step("a2", [2]), final=False)  # joins it
    b.put(_step("b1", [3]), final=False)  # b's first: urgent, after a's
    release.set()
    calls.close()
    assert order == [("a", "a1a2", False), ("b", "b1", False), "another request's response"]

    order.clear()
    out = threading.Event()
    calls = CallThread()

    def deliver(outputs, final):
        order.append((_read(outputs)[0], final))
        out.set()

    a = ResponseQueue(calls, deliver, merge_step_outputs)
    a.put(_step("x", [1]), final=False)
    assert out.wait(30)  # the first response is out
    release = _busy(calls)
    calls.submit(order.append, "metrics")
    a.put(_step("y", [2]), final=False)  # a later response: ordinary
    release.set()
    calls.close()
    assert order == [("x", False), "metrics", ("y", False)]

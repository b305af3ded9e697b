"""The served model's call thread (served_model/call_thread.py): calls run in the order given, a
failing call is logged and the next ones still run, and close() runs what was submitted first."""

from __future__ import annotations

import threading

from trtllm_dflash.served_model.call_thread import CallThread


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

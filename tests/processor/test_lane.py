"""The commit lane: calls run in order on one daemon thread; a blocked call is measurable and
left behind without holding up what replaces it."""

from __future__ import annotations

import ctypes
import threading
import time

import pytest

from flowstream.kafka import clients
from flowstream.processor.lane import Lane


def test_calls_run_in_submission_order_and_report_results() -> None:
    lane = Lane("test-lane")
    seen: list[int] = []
    futures = [lane.submit(lambda i=i: seen.append(i) or i * 2) for i in range(20)]
    assert [f.result(timeout=5) for f in futures] == [i * 2 for i in range(20)]
    assert seen == list(range(20))
    lane.close()


def test_an_error_reaches_whoever_waits() -> None:
    lane = Lane("test-lane")

    def fail() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        lane.submit(fail).result(timeout=5)
    assert lane.submit(lambda: 1).result(timeout=5) == 1  # the lane goes on
    lane.close()


def _raise_bare(value: object) -> None:
    """Raise ``value`` the way confluent-kafka's ``flush()`` raises a bare ``KafkaError`` once
    its producer is fenced: set as the pending error without being an exception instance."""
    restore = ctypes.pythonapi.PyErr_Restore
    restore.argtypes = [ctypes.py_object, ctypes.py_object, ctypes.py_object]
    restore.restype = None
    for held in (type(value), value):  # PyErr_Restore steals a reference to each
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(held))
    restore(type(value), value, None)


def test_a_bare_kafka_error_reaches_whoever_waits_as_an_exception() -> None:
    lane = Lane("test-lane")
    error = clients.KafkaError(clients.KafkaError._FENCED, "fenced", fatal=True)
    with pytest.raises(clients.KafkaException) as caught:
        lane.submit(_raise_bare, error).result(timeout=5)
    assert caught.value.args[0].fatal()
    assert lane.submit(lambda: 1).result(timeout=5) == 1  # the thread survived
    lane.close()


def test_a_blocked_call_shows_in_busy_for_and_is_left_behind() -> None:
    lane = Lane("test-lane")
    release = threading.Event()
    blocked = lane.submit(release.wait)
    queued = lane.submit(lambda: "late")
    time.sleep(0.2)
    assert lane.busy_for() >= 0.15  # the call began a moment after submit
    assert not blocked.done() and not queued.done()
    lane.close()
    replacement = Lane("test-lane")
    assert replacement.submit(lambda: "now").result(timeout=5) == "now"
    assert replacement.busy_for() == 0.0
    assert lane._thread.daemon  # a thread left blocked does not hold up the exit
    release.set()
    assert queued.result(timeout=5) == "late"  # calls already submitted still run
    replacement.close()

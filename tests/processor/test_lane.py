"""The commit lane: calls run in order on one daemon thread; a blocked call is measurable and
left behind without holding up what replaces it."""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from concurrent.futures import Future

import pytest

from flowstream.kafka import clients
from flowstream.processor.lane import Lane, LaneGivenUp


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


def test_a_call_given_up_says_when_it_returns(caplog: pytest.LogCaptureFixture) -> None:
    lane = Lane("test-lane")
    release = threading.Event()

    def send_offsets() -> str:
        release.wait(5)
        return "sent"

    blocked = lane.submit(send_offsets)
    time.sleep(0.2)
    with caplog.at_level(logging.INFO, "flowstream.processor"):
        replacement = lane.abandon()
        assert replacement is not lane and replacement.name == "test-lane"
        assert replacement.submit(lambda: "now").result(timeout=5) == "now"
        assert "given up" not in caplog.text  # nothing returned yet
        release.set()
        assert blocked.result(timeout=5) == "sent"
        deadline = time.monotonic() + 5
        while "returned" not in caplog.text:
            assert time.monotonic() < deadline, "the late return was not logged"
            time.sleep(0.01)
    line = next(r.getMessage() for r in caplog.records if "returned" in r.getMessage())
    assert "the call send_offsets given up after 0." in line
    assert line.endswith("after it began (ok)")
    replacement.close()


def test_an_idle_lane_closed_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    lane = Lane("test-lane")
    assert lane.submit(lambda: 1).result(timeout=5) == 1
    with caplog.at_level(logging.INFO, "flowstream.processor"):
        lane.abandon().close()
        lane.submit(lambda: 2)  # after the stop: never runs
        time.sleep(0.1)
    assert "returned" not in caplog.text


def test_calls_queued_behind_a_call_given_up_never_run() -> None:
    """They belong to transactions that were ended: run once the stuck call returns, a commit
    would find the slot's new producer (and commit whatever that one has begun)."""
    lane = Lane("test-lane")
    release = threading.Event()
    ran: list[str] = []
    blocked = lane.submit(release.wait, 5)
    queued = lane.submit(lambda: ran.append("late commit"))
    time.sleep(0.1)
    replacement = lane.abandon()
    release.set()
    assert blocked.result(timeout=5) is True  # the stuck call itself returns as it may
    assert isinstance(queued.exception(timeout=5), LaneGivenUp)
    assert ran == []
    assert replacement.submit(lambda: "now").result(timeout=5) == "now"
    replacement.close()


def test_a_call_waiting_for_another_when_its_lane_is_given_up_never_runs() -> None:
    """A fence chained on the sealed transaction's ``precommit`` waits in the lane's thread;
    given up meanwhile, it must not go on once ``precommit`` is set."""
    lane = Lane("test-lane")
    precommit: Future[None] = Future()
    ran: list[str] = []
    waiting = lane.submit(lambda: ran.append("fence"), after=precommit)
    time.sleep(0.1)
    assert lane.busy_for() > 0  # waiting for precommit
    replacement = lane.abandon()
    precommit.set_result(None)
    assert isinstance(waiting.exception(timeout=5), LaneGivenUp)
    assert ran == []
    replacement.close()


def test_a_slow_call_says_how_long_it_took(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a broker's failover costs a send of positions or a commit shows in the log without
    giving the call up; the wait for ``after`` is not counted, and a quick call says nothing."""
    monkeypatch.setattr("flowstream.processor.lane.SLOW_CALL_S", 0.2)
    lane = Lane("test-lane")
    before: Future[None] = Future()

    def commit_blocking() -> None:
        time.sleep(0.3)
        raise ValueError("no")

    with caplog.at_level(logging.INFO, "flowstream.processor"):
        slow = lane.submit(commit_blocking, after=before)
        time.sleep(0.5)  # waiting for ``after``: not the call's time
        before.set_result(None)
        assert isinstance(slow.exception(timeout=5), ValueError)
        assert lane.submit(lambda: 1).result(timeout=5) == 1
        lane.close()
        lane._thread.join(5)
    lines = [r.getMessage() for r in caplog.records if "took" in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("lane test-lane: the call commit_blocking took 0.")
    assert lines[0].endswith(" s (ValueError: no)")

"""The commit lane: calls run in order on one daemon thread; a blocked call is measurable and
left behind without holding up what replaces it."""

from __future__ import annotations

import threading
import time

import pytest

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


def test_a_blocked_call_shows_in_busy_for_and_is_left_behind() -> None:
    lane = Lane("test-lane")
    release = threading.Event()
    blocked = lane.submit(release.wait)
    queued = lane.submit(lambda: "late")
    time.sleep(0.2)
    assert lane.busy_for() >= 0.2
    assert not blocked.done() and not queued.done()
    lane.close()
    replacement = Lane("test-lane")
    assert replacement.submit(lambda: "now").result(timeout=5) == "now"
    assert replacement.busy_for() == 0.0
    assert lane._thread.daemon  # a thread left blocked does not hold up the exit
    release.set()
    assert queued.result(timeout=5) == "late"  # calls already submitted still run
    replacement.close()

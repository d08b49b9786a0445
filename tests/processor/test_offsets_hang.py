"""A send of positions that never returns is given up within its own limit, not the 20 s every
transactional call gets.

librdkafka's ``send_offsets_to_transaction`` can wait for good once the broker coordinating
the group is gone (its issues 5456 and 5511). In the chaos runs a SIGKILL of that broker held
every partition of a member for the whole ``stuck_s`` (20 s by default), and a revocation's
commit waited as long inside the rebalance callback. The hang of issue 5511 is produced
against three brokers, and cured by the producers' settings, in
``tests/kafka/test_coordinator_gone.py``; the give-up stays for a send that is slow or stuck for
another reason. This test is about the pipeline's own logic: the producer is the one boundary
faked, and its send of positions blocks until the test ends. The lanes, their threads and the
pipeline are real.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

import pytest

from flowstream.kafka import clients
from flowstream.processor.txn.pipeline import TransactionPipeline
from flowstream.processor.txn.slot import ProducerSlot


class _HangingProducer:
    """Every call returns at once but the send of positions, which waits for ``release``."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release
        self.sends = 0

    def init_transactions(self, timeout: float) -> None:
        pass

    def begin_transaction(self) -> None:
        pass

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        self.sends += 1
        self.release.wait(60)

    def abort_transaction(self, timeout: float) -> None:
        pass

    def produce(self, *args: Any, **kwargs: Any) -> None:
        pass

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        return 0

    def purge(self) -> None:
        pass


class _Host:
    """One owned partition whose consumer position is to be sent."""

    def positions(self) -> list[Any]:
        return [clients.TopicPartition("cmd", 0, 7)]

    def group_metadata(self) -> Any:
        return "group-metadata"

    def seal(self) -> Any:
        return [0]

    def anchors(self, sealed: Any) -> list[int]:
        return []

    def settled(self, sealed: Any, events_end: dict[int, int], start_steps: bool) -> None:
        pass

    def aborted(self, failed: list[tuple[str, bytes | None]]) -> None:
        pass

    def retake(self, retake: bool) -> None:
        pass


class _Counter:
    def inc(self, amount: float = 1) -> None:
        pass

    def observe(self, value: float) -> None:
        pass


class _Metrics:
    aborts = producer_resets = transaction_seconds = _Counter()


@pytest.mark.timeout(60)
def test_a_send_of_positions_that_hangs_is_given_up_within_its_own_limit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()
    producers: list[_HangingProducer] = []

    def new_producer(slot: ProducerSlot) -> _HangingProducer:
        producers.append(_HangingProducer(release))
        return producers[-1]

    pipeline = TransactionPipeline(
        _Host(), new_producer, stuck_s=30.0, metrics=_Metrics(), events_topic="events"
    )
    pipeline.offsets_stuck_s = 0.5
    pipeline.start()
    try:
        txn = pipeline.begin()  # its fence sends the positions, which hangs
        began = time.monotonic()
        while not pipeline.stuck():
            assert time.monotonic() - began < 5, "a send of positions hung 5 s unnoticed"
            time.sleep(0.02)
        assert time.monotonic() - began >= 0.4
        assert producers[0].sends == 1
        # A wait for the hung call (a revocation's commit waits so) ends as soon as it is
        # known to hang, not after the 30 s of stuck_s.
        assert txn.fence is not None
        began = time.monotonic()
        assert not pipeline.wait(txn.fence)
        assert time.monotonic() - began < 1.0
        with caplog.at_level(logging.ERROR, "flowstream.processor"):
            pipeline.give_up(retake=True)
        assert re.search(
            r"the producer hangs sending positions \(over 0.5 s, for \d+\.\d s\)", caplog.text
        )
        assert len(producers) == 4  # both slots got new producers
        # A second hang soon after is given the whole stuck_s: a coordinator that stays slow
        # costs one reset, not one every few seconds until the worker gives up.
        pipeline.begin()
        began = time.monotonic()
        while sum(p.sends for p in producers[2:]) == 0:
            assert time.monotonic() - began < 5, "the new producer sent no positions"
            time.sleep(0.02)
        time.sleep(1.0)
        assert not pipeline.stuck()
    finally:
        release.set()
        pipeline.close()

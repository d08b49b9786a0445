"""A reset (a fenced producer, a call given up) makes both producers again side by side.

Each new producer's ``init_transactions`` waits until the coordinator has aborted what the old
producer of its transactional id left open; while a broker fails over that takes seconds, and
made one after the other the two waits added up before the partitions were taken again. The
producer is the one boundary faked here: its making blocks until both have begun.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from flowstream.kafka import clients
from flowstream.processor.txn.pipeline import TransactionPipeline
from flowstream.processor.txn.slot import ProducerSlot

_FENCED = clients.KafkaException(clients.KafkaError(clients.KafkaError._FENCED, "fenced"))


class _Producer:
    def purge(self) -> None:
        pass


class _Host:
    def __init__(self, slots: list[ProducerSlot]) -> None:
        self.retaken: list[tuple[bool, list[Any]]] = []
        self.slots = slots

    def positions(self) -> list[Any]:
        return [clients.TopicPartition("cmd", 0, 7)]

    def retake(self, retake: bool) -> None:
        self.retaken.append((retake, [slot.producer for slot in self.slots]))


class _Counter:
    def inc(self, amount: float = 1) -> None:
        pass


class _Metrics:
    aborts = producer_resets = _Counter()


def _pipeline(new_producer: Any) -> tuple[TransactionPipeline, _Host]:
    slots: list[ProducerSlot] = []
    host = _Host(slots)
    pipeline = TransactionPipeline(
        host,  # type: ignore[arg-type]
        new_producer,
        stuck_s=30.0,
        metrics=_Metrics(),
        events_topic="events",
    )
    slots.extend(pipeline.slots)
    pipeline.start()
    return pipeline, host


@pytest.mark.timeout(30)
def test_a_reset_makes_both_producers_side_by_side() -> None:
    both_begun = threading.Barrier(2, timeout=5)
    made: list[_Producer] = []
    resetting = threading.Event()

    def new_producer(slot: ProducerSlot) -> _Producer:
        if resetting.is_set():
            # Each waits until the other has begun: made one after the other, the first
            # would wait for good (the barrier breaks after 5 s instead).
            both_begun.wait()
        made.append(_Producer())
        return made[-1]

    pipeline, host = _pipeline(new_producer)
    first = [slot.producer for slot in pipeline.slots]
    resetting.set()
    began = time.monotonic()
    pipeline.reset(
        _FENCED,
        retake=True,
    )
    assert time.monotonic() - began < 5
    assert len(made) == 4
    retake, producers = host.retaken[-1]
    # The partitions are taken again once both new producers exist.
    assert retake and set(producers) == set(made[2:]) and not set(producers) & set(first)
    pipeline.close()


def test_a_reset_that_gives_the_partitions_up_makes_no_producer() -> None:
    made: list[_Producer] = []

    def new_producer(slot: ProducerSlot) -> _Producer:
        made.append(_Producer())
        return made[-1]

    pipeline, host = _pipeline(new_producer)
    pipeline.reset(
        _FENCED,
        retake=False,
    )
    assert len(made) == 2  # made when the next transaction needs them
    assert host.retaken[-1] == (False, [None, None])
    pipeline.close()

"""The read of a partition's previous writers while the group's coordinator moves.

The reader is a stand-in for the group's ``committed()`` call: what is tested is the fence's own
policy (ask again while the coordinator moves, give up on anything else). A coordinator that
moves on the real brokers is the chaos run's: there the read once gave up at once, and the dead
writer's open transaction held its partition 10.46 s.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from flowstream.kafka import clients
from flowstream.processor import fence as fence_module
from flowstream.processor.fence import OwnerFence

TOPIC = "t.cmd.start"


class Reader:
    """Answers ``committed()`` with the errors given, in turn, then with the positions."""

    def __init__(self, errors: list[int], writer: str = "w1/dead") -> None:
        self.errors = list(errors)
        self.writer = writer
        self.calls = 0

    def committed(self, wanted: list[Any], timeout: float) -> list[Any]:
        self.calls += 1
        if self.errors:
            raise clients.KafkaException(clients.KafkaError(self.errors.pop(0)))
        return [
            clients.TopicPartition(tp.topic, tp.partition, 7, metadata=self.writer) for tp in wanted
        ]


def _fence(reader: Reader) -> OwnerFence:
    ctx = SimpleNamespace(writer="w2/alive")
    return OwnerFence(ctx, lambda: reader)  # type: ignore[arg-type]


def _assigned() -> list[Any]:
    return [clients.TopicPartition(TOPIC, 0), clients.TopicPartition(TOPIC, 1)]


def test_a_moving_coordinator_is_asked_again_until_it_answers() -> None:
    reader = Reader(
        [
            clients.KafkaError.NOT_COORDINATOR,
            clients.KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
            clients.KafkaError.COORDINATOR_NOT_AVAILABLE,
        ]
    )
    assert _fence(reader).writers_of(_assigned()) == {"w1/dead"}
    assert reader.calls == 4


def test_any_other_error_is_not_asked_again() -> None:
    reader = Reader([clients.KafkaError.GROUP_AUTHORIZATION_FAILED])
    assert _fence(reader).writers_of(_assigned()) == set()
    assert reader.calls == 1


def test_a_coordinator_that_stays_away_is_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fence_module, "_READ_PATIENCE_S", 0.3)
    reader = Reader([clients.KafkaError.NOT_COORDINATOR] * 1000)
    assert _fence(reader).writers_of(_assigned()) == set()
    assert 2 <= reader.calls <= 6


def test_its_own_writers_are_not_previous_ones() -> None:
    reader = Reader([], writer="w2/alive")
    assert _fence(reader).writers_of(_assigned()) == set()

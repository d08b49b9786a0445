"""A partition whose committed position the group coordinator answered with an error is asked
again; it is never taken as "never committed".

``Consumer.committed`` raises only when the whole OffsetFetch fails. librdkafka sets a
partition's own error on its ``TopicPartition`` and its offset to -1001 (``OFFSET_INVALID``),
for example ``UNSTABLE_OFFSET_COMMIT`` once its own retries end while a dead owner's transaction
is still open. ``TaskManager.take`` read -1001 as a partition nothing was committed for and began
at its low watermark, so every command of the partition would have been consumed again.

The consumer is faked here, at that one call: the test is about what the processor makes of the
answer. Which errors a broker sends is librdkafka's and Kafka's part and is not faked anywhere
else."""

from __future__ import annotations

from typing import Any

import pytest

from flowstream.kafka import clients
from flowstream.processor.tasks import committed_positions

TOPIC = "t.commands.start"


class _Answers:
    """A consumer whose ``committed()`` gives the prepared answers in turn."""

    def __init__(self, *answers: list[Any]) -> None:
        self.answers = list(answers)
        self.asked = 0

    def committed(self, assigned: list[Any], timeout: float) -> list[Any]:
        self.asked += 1
        return self.answers.pop(0)


def _at(partition: int, offset: int, error: int | None = None) -> Any:
    tp = clients.TopicPartition(TOPIC, partition, offset)
    if error is not None:
        # confluent-kafka's TopicPartition takes no error in its constructor.
        return _WithError(tp, clients.KafkaError(error))
    return tp


class _WithError:
    def __init__(self, tp: Any, error: Any) -> None:
        self.topic, self.partition, self.offset, self.error = tp.topic, tp.partition, -1001, error


def test_a_partition_answered_with_an_error_is_asked_again() -> None:
    unstable = clients.KafkaError.UNSTABLE_OFFSET_COMMIT
    consumer = _Answers(
        [_at(0, 120), _at(1, -1001, unstable)],
        [_at(0, 120), _at(1, 57)],
    )
    found = committed_positions(consumer, [_at(0, -1001), _at(1, -1001)])
    assert [(tp.partition, tp.offset) for tp in found] == [(0, 120), (1, 57)]
    assert consumer.asked == 2


def test_an_error_that_persists_is_raised_not_read_as_no_position() -> None:
    unstable = clients.KafkaError.UNSTABLE_OFFSET_COMMIT
    consumer = _Answers(*([_at(0, -1001, unstable)] for _ in range(6)))
    with pytest.raises(clients.KafkaException) as raised:
        committed_positions(consumer, [_at(0, -1001)])
    assert raised.value.args[0].code() == unstable
    assert consumer.asked == 6


def test_a_partition_never_committed_is_answered_without_an_error() -> None:
    consumer = _Answers([_at(0, -1001), _at(1, 8)])
    found = committed_positions(consumer, [_at(0, -1001), _at(1, -1001)])
    assert [(tp.partition, tp.offset) for tp in found] == [(0, -1001), (1, 8)]
    assert consumer.asked == 1

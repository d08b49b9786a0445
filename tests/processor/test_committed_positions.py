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
    """A consumer whose ``committed()`` gives the prepared answers in turn (an exception is
    raised)."""

    def __init__(self, *answers: list[Any] | BaseException) -> None:
        self.answers = list(answers)
        self.asked = 0
        self.closed = False

    def committed(self, assigned: list[Any], timeout: float) -> list[Any]:
        self.asked += 1
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def close(self) -> None:
        self.closed = True


def _timed_out() -> clients.KafkaException:
    return clients.KafkaException(clients.KafkaError(clients.KafkaError._TIMED_OUT))


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


def test_a_read_that_times_out_is_asked_again_through_a_new_client() -> None:
    """Session AB's chaos run: after the group coordinator's broker was killed, a member's
    consumer timed out for two minutes (librdkafka looks the coordinator up again only when a
    connection changes state) and the worker exited; a new client finds the new coordinator."""
    stuck = _Answers(_timed_out(), _timed_out())
    made: list[_Answers] = []

    def fresh() -> _Answers:
        made.append(_Answers([_at(0, 120), _at(1, 57)]))
        return made[-1]

    found = committed_positions(stuck, [_at(0, -1001), _at(1, -1001)], fresh=fresh)
    assert [(tp.partition, tp.offset) for tp in found] == [(0, 120), (1, 57)]
    assert (stuck.asked, len(made)) == (1, 1)
    assert made[0].closed and not stuck.closed


def test_reads_that_keep_timing_out_are_given_up_after_the_patience() -> None:
    stuck = _Answers(*(_timed_out() for _ in range(10)))
    made: list[_Answers] = []

    def fresh() -> _Answers:
        made.append(_Answers(_timed_out()))
        return made[-1]

    with pytest.raises(clients.KafkaException) as raised:
        committed_positions(stuck, [_at(0, -1001)], fresh=fresh, patience=1.2)
    assert raised.value.args[0].code() == clients.KafkaError._TIMED_OUT
    assert stuck.asked >= 2 and len(made) >= 1  # in turns
    assert all(reader.closed for reader in made)

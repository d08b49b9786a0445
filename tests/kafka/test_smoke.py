"""The ground flowstream stands on, proven against the real broker.

(a) transactions: ``read_committed`` never shows an aborted record and shows committed ones;
(b) KIP-447: a member whose group generation is stale cannot commit a transaction carrying
    offsets, while the current generation can;
(c) partitioning: ``partition_for`` equals the partition librdkafka's ``murmur2_random`` picks.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest

from flowstream.kafka import clients
from flowstream.kafka.clients import Consumer, KafkaError, KafkaException, TopicPartition
from flowstream.partitioning import partition_for

pytestmark = pytest.mark.kafka


def _read_partition(
    bootstrap: str, topic: str, partition: int, *, isolation: str, expect: int
) -> list[bytes]:
    """Every record value of ``topic``/``partition`` visible at ``isolation``.

    Reads until ``expect`` values arrived, then keeps polling briefly so extra records show up.
    """
    consumer = clients.new_consumer(
        bootstrap, f"reader-{uuid.uuid4().hex}", {"isolation.level": isolation}
    )
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        quiet_until: float | None = None
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None:
                assert message.error() is None, message.error()
                values.append(message.value() or b"")
            if len(values) >= expect:
                quiet_until = quiet_until or time.monotonic() + 1.5
                if time.monotonic() >= quiet_until:
                    break
        return values
    finally:
        consumer.close()


def test_read_committed_hides_aborted_transactions(
    kafka_bootstrap: str, make_topic: Callable[..., str], unique_prefix: str
) -> None:
    topic = make_topic("txn")
    producer = clients.new_transactional_producer(kafka_bootstrap, f"{unique_prefix}-tx")
    producer.init_transactions(30)

    def transaction(label: str, *, commit: bool) -> None:
        producer.begin_transaction()
        for i in range(5):
            producer.produce(topic, key=b"run-1", value=f"{label}-{i}".encode(), partition=0)
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)

    transaction("first", commit=True)
    transaction("aborted", commit=False)
    transaction("second", commit=True)

    committed = [f"{label}-{i}".encode() for label in ("first", "second") for i in range(5)]
    everything = [
        f"{label}-{i}".encode() for label in ("first", "aborted", "second") for i in range(5)
    ]
    seen = _read_partition(kafka_bootstrap, topic, 0, isolation="read_committed", expect=10)
    assert seen == committed
    # The aborted records really are in the log: only the isolation level hides them.
    raw = _read_partition(kafka_bootstrap, topic, 0, isolation="read_uncommitted", expect=15)
    assert raw == everything


def _member(bootstrap: str, group: str, topic: str) -> Consumer:
    consumer = clients.new_consumer(
        bootstrap,
        group,
        {"session.timeout.ms": 6000, "heartbeat.interval.ms": 300},
    )
    consumer.subscribe([topic])
    return consumer


def _poll_until(consumers: list[Consumer], done: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "consumer group did not settle"
        for consumer in consumers:
            message = consumer.poll(0.1)
            assert message is None or message.error() is None, message.error()


def _committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    reader = clients.new_consumer(bootstrap, group)
    try:
        found = reader.committed([TopicPartition(topic, p) for p in range(partitions)], 30)
        return {tp.partition: tp.offset for tp in found}
    finally:
        reader.close()


def test_stale_generation_cannot_commit_offsets_in_a_transaction(
    kafka_bootstrap: str,
    make_topic: Callable[..., str],
    unique_prefix: str,
    unique_name: Callable[[str], str],
) -> None:
    source = make_topic("in", partitions=2)
    sink = make_topic("out")
    group = unique_name("group")

    member_a = _member(kafka_bootstrap, group, source)
    _poll_until([member_a], lambda: len(member_a.assignment()) == 2)
    stale_metadata = member_a.consumer_group_metadata()

    # A's producer opens a transaction while A owns both partitions ...
    zombie = clients.new_transactional_producer(kafka_bootstrap, f"{unique_prefix}-a")
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(sink, key=b"run-1", value=b"from-stale-member", partition=0)
    zombie.flush(30)

    # ... then B joins: a new generation in which A keeps partition 0 and B takes partition 1.
    member_b = _member(kafka_bootstrap, group, source)
    _poll_until(
        [member_a, member_b],
        lambda: len(member_a.assignment()) == 1 and len(member_b.assignment()) == 1,
    )
    lost = 1 - member_a.assignment()[0].partition

    with pytest.raises(KafkaException) as raised:
        zombie.send_offsets_to_transaction([TopicPartition(source, lost, 1)], stale_metadata, 30)
    error = raised.value.args[0]
    assert isinstance(error, KafkaError)
    assert error.code() == KafkaError.ILLEGAL_GENERATION, error
    assert error.txn_requires_abort()
    assert not error.fatal()
    zombie.abort_transaction(30)

    # The current generation commits the same kind of transaction without trouble.
    owner = member_b if lost == member_b.assignment()[0].partition else member_a
    producer = clients.new_transactional_producer(kafka_bootstrap, f"{unique_prefix}-b")
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(sink, key=b"run-2", value=b"from-current-member", partition=0)
    producer.send_offsets_to_transaction(
        [TopicPartition(source, lost, 1)], owner.consumer_group_metadata(), 30
    )
    producer.commit_transaction(30)

    member_a.close()
    member_b.close()
    assert _read_partition(kafka_bootstrap, sink, 0, isolation="read_committed", expect=1) == [
        b"from-current-member"
    ]
    assert _committed(kafka_bootstrap, group, source, 2)[lost] == 1


@pytest.mark.parametrize("partitions", [8, 13])
def test_partition_for_matches_murmur2_random_producer(
    kafka_bootstrap: str, make_topic: Callable[..., str], partitions: int
) -> None:
    topic = make_topic(f"p{partitions}", partitions=partitions)
    run_ids = (
        [f"run-{i}" for i in range(200)]
        + [str(uuid.UUID(int=i * 7919 + 17)) for i in range(200)]
        + ["r", "ab", "abc", "ünïcødé-räñ", "日本語の実行", "x" * 255]
    )
    assigned: dict[str, int] = {}

    def delivered(error: KafkaError | None, message: clients.Message) -> None:
        assert error is None, error
        key, partition = message.key(), message.partition()
        assert key is not None and partition is not None
        assigned[key.decode("utf-8")] = partition

    producer = clients.new_producer(kafka_bootstrap)
    for run_id in run_ids:
        # No partition given: the producer's murmur2_random partitioner decides.
        producer.produce(topic, key=run_id.encode("utf-8"), value=b"", on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert len(assigned) == len(run_ids)
    mismatches = {r: (p, partition_for(r, partitions)) for r, p in assigned.items()}
    mismatches = {r: pair for r, pair in mismatches.items() if pair[0] != pair[1]}
    assert mismatches == {}
    assert len(set(assigned.values())) == partitions

"""A send of positions begun after the group's coordinator was killed returns within seconds.

librdkafka (issue 5511) waits for the cached coordinator's connection to change state before it
looks the coordinator up again. Once the dead broker has left the cluster's metadata, the client
drops that broker and nothing changes state any more: ``send_offsets_to_transaction`` then
waits until some other broker of the producer goes up or down, which may be the next broker
failure (35-120 s in session Y's chaos runs), and its timeout is not honoured (issue 5456).
``connections.max.idle.ms`` on a producer that sends positions (``OFFSET_SENDER_OVERRIDES``: the
repartition pump's) makes an idle connection close after a second, which is such a change.
Without it, this test's send never returns.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from flowstream.devkafka import Cluster
from flowstream.kafka import clients
from tests.processor.harness import three_brokers_topic, wait_until

pytestmark = [pytest.mark.kafka3, pytest.mark.timeout(240)]

PARTITIONS = 6


def test_a_send_of_positions_finds_the_new_coordinator(kafka3_cluster: Cluster) -> None:
    bootstrap = kafka3_cluster.bootstrap
    wait_until(lambda: len(clients.probe_brokers(bootstrap, 5) or ()) == 3, 90, "three brokers")
    topic = f"coord-gone-{uuid.uuid4().hex[:8]}"
    three_brokers_topic(bootstrap, topic, PARTITIONS)
    group = f"coord-gone-{uuid.uuid4().hex[:8]}"
    consumer = clients.new_consumer(bootstrap, group)
    producer = clients.new_transactional_producer(
        bootstrap, f"coord-gone-{uuid.uuid4().hex[:8]}", clients.OFFSET_SENDER_OVERRIDES
    )
    victim = -1
    try:
        consumer.assign([clients.TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        metadata = consumer.consumer_group_metadata()
        producer.init_transactions(60)
        # The first transaction caches the group's coordinator in the producer.
        assert _transaction(producer, topic, metadata, 1, wait=30) is not None
        admin = clients.new_admin(bootstrap)
        victim = admin.describe_consumer_groups([group])[group].result().coordinator.id
        kafka3_cluster.kill_node(victim)
        # The controller fences the dead node (broker.session.timeout.ms, 2 s here) and the
        # producer learns metadata without it: librdkafka drops that broker's thread.
        wait_until(
            lambda: _left(producer, victim),
            30,
            f"node {victim} left the producer's metadata",
        )
        took = _transaction(producer, topic, metadata, 2, wait=30)
        assert took is not None, "the send of positions never returned (librdkafka 5511)"
        assert took < 5.0
    finally:
        consumer.close()
        if victim >= 0:
            kafka3_cluster.start_node(victim)
            wait_until(lambda: len(clients.probe_brokers(bootstrap, 5) or ()) == 3, 90, "node back")


def _left(producer: Any, node: int) -> bool:
    """Whether the producer's metadata no longer lists ``node``."""
    try:
        return node not in producer.list_topics(timeout=5).brokers
    except clients.KafkaException:
        return False


def _transaction(producer: Any, topic: str, metadata: Any, n: int, *, wait: float) -> float | None:
    """One transaction of a few records and positions; how long the send of positions took
    (``None``: it had not returned after ``wait`` seconds)."""
    producer.begin_transaction()
    for i in range(PARTITIONS * 2):
        producer.produce(topic, key=f"k{i}", value=b"v")
    assert producer.flush(30) == 0
    outcome: list[BaseException | None] = []
    offsets = [clients.TopicPartition(topic, p, n) for p in range(PARTITIONS)]

    def send() -> None:
        try:
            producer.send_offsets_to_transaction(offsets, metadata, 60)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    began = time.monotonic()
    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    thread.join(wait)
    if not outcome:
        return None
    took = time.monotonic() - began
    assert outcome[0] is None, f"the send of positions failed: {outcome[0]!r}"
    producer.commit_transaction(30)
    return took

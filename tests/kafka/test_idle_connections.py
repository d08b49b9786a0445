"""A request that waits at the broker keeps the processor's connection.

librdkafka's ``connections.max.idle.ms`` counts from the last byte sent or received on a
connection, whatever requests are still waiting for an answer: with 1 s, a produce that waits
longer for its replicas is cut (``_TRANSPORT``) and sent again. When a broker dies its followers
are fenced only after ``broker.session.timeout.ms`` (2 s here), so every write that needs them
waits that long: in the chaos runs, cut requests (metadata, FindCoordinator, produce) kept the
processor's producers from learning the new leaders until 5-6 s after a broker's SIGKILL.

Here a follower of the partition is paused (SIGSTOP): an ``acks=all`` write waits until the
controller fences it. The processor's transactional producer must keep its connection through
that wait; the producer that sends positions to a group (``OFFSET_SENDER_OVERRIDES``) still
closes idle connections after a second, as ``test_coordinator_gone.py`` needs. The follower
paused is never the producer's transaction coordinator: a paused coordinator is another case (its
requests wait for an answer that does not come), and one in three runs met it.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid

import pytest

from flowstream.devkafka import Cluster
from flowstream.kafka import clients
from tests.processor.harness import three_brokers_topic, wait_until

pytestmark = [pytest.mark.kafka3, pytest.mark.timeout(240)]

IDLE_CUT = "Connection max idle time exceeded"
#: ``transaction.state.log.num.partitions`` of the dev cluster (``flowstream.devkafka.config``).
TXN_STATE_PARTITIONS = 10


def test_a_write_that_waits_for_a_paused_follower_keeps_its_connection(
    kafka3_cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    bootstrap = kafka3_cluster.bootstrap
    topic = f"idle-{uuid.uuid4().hex[:8]}"
    three_brokers_topic(bootstrap, topic, 1)
    partition = clients.new_admin(bootstrap).list_topics(topic, timeout=10).topics[topic]
    leader = partition.partitions[0].leader
    transactional_id = f"idle-{uuid.uuid4().hex[:8]}"
    caplog.set_level(logging.DEBUG, logger=clients.LOGGER.name)
    producer = clients.new_transactional_producer(bootstrap, transactional_id, {"debug": "broker"})
    producer.init_transactions(60)  # creates __transaction_state on a new cluster
    coordinator = _coordinator(bootstrap, transactional_id)
    follower = next(r for r in partition.partitions[0].replicas if r not in (leader, coordinator))
    pid = next(s.pid for s in kafka3_cluster.status() if s.node.node_id == follower)
    assert pid is not None
    paused = False
    try:
        _write(producer, topic)  # the connections are up
        caplog.clear()
        os.kill(pid, signal.SIGSTOP)
        paused = True
        took = _write(producer, topic)
        os.kill(pid, signal.SIGCONT)
        paused = False
        producer.poll(0)
        cut = [r.getMessage() for r in caplog.records if IDLE_CUT in r.getMessage()]
        assert took > 1.2, f"the write did not wait for the paused follower ({took:.2f} s)"
        assert not cut, f"a connection was closed while a request waited: {cut}"
    finally:
        if paused:
            os.kill(pid, signal.SIGCONT)
        wait_until(lambda: len(clients.probe_brokers(bootstrap, 5) or ()) == 3, 90, "node back")


def _write(producer: clients.Producer, topic: str) -> float:
    """One transaction of one record (acks=all); how long it took."""
    began = time.monotonic()
    producer.begin_transaction()
    producer.produce(topic, key=b"k", value=b"v", partition=0)
    producer.commit_transaction(60)
    return time.monotonic() - began


def _coordinator(bootstrap: str, transactional_id: str) -> int:
    """The broker that coordinates ``transactional_id``: the leader of its partition of
    ``__transaction_state`` (Kafka's ``abs(String.hashCode()) % partitions``)."""
    code = 0
    for char in transactional_id:
        code = (31 * code + ord(char)) & 0xFFFFFFFF
    signed = code - (1 << 32) if code >= 1 << 31 else code
    topic = "__transaction_state"
    admin = clients.new_admin(bootstrap)
    found: list[int] = []

    def known() -> bool:  # the topic is new: its partitions show up in the metadata one by one
        partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
        meta = partitions.get(abs(signed) % TXN_STATE_PARTITIONS)
        if meta is None or meta.leader < 0:
            return False
        found.append(meta.leader)
        return True

    wait_until(known, 30, "the transaction coordinator is not known")
    return found[-1]

"""Factories for Kafka clients: the only module in flowstream that imports ``confluent_kafka``.

Every producer, consumer and admin client is built here from a bootstrap address plus optional
overrides, so librdkafka's dotted configuration keys live in one place:

* producers use ``partitioner=murmur2_random`` (Java-compatible, see
  :mod:`flowstream.partitioning`), idempotence and ``acks=all``;
* transactional producers add a stable ``transactional.id`` and a bounded transaction timeout;
* consumers read ``read_committed``, never auto-commit or auto-store offsets, start at
  ``earliest`` and use the ``range`` assignor, which keeps co-partitioned topics together;
* librdkafka's log lines go to the ``flowstream.kafka`` logger instead of stderr.

The client classes and error types other modules need are re-exported from here, so no other
package module names ``confluent_kafka``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicCollection,
    TopicPartition,
)

# The stubs of confluent_kafka.admin do not mark these public names as re-exported.
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ClusterMetadata,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    OffsetSpec,
    ResourceType,
)

__all__ = [
    "CONSUMER_DEFAULTS",
    "PRODUCER_DEFAULTS",
    "TRANSACTIONAL_PRODUCER_DEFAULTS",
    "AdminClient",
    "AlterConfigOpType",
    "ClusterMetadata",
    "ConfigEntry",
    "ConfigResource",
    "Consumer",
    "ConsumerGroupTopicPartitions",
    "IsolationLevel",
    "KafkaError",
    "KafkaException",
    "Message",
    "NewTopic",
    "OffsetSpec",
    "Producer",
    "ResourceType",
    "TopicCollection",
    "TopicPartition",
    "as_exception",
    "new_admin",
    "new_consumer",
    "new_producer",
    "new_transactional_producer",
    "probe_brokers",
]

#: Where librdkafka's own log lines go.
LOGGER = logging.getLogger("flowstream.kafka")

#: Settings of every producer. ``murmur2_random`` hashes keys exactly like the Java client.
PRODUCER_DEFAULTS: Mapping[str, Any] = {
    "partitioner": "murmur2_random",
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 5,
}

#: Extra settings of transactional producers (``transactional.id`` is given per producer).
TRANSACTIONAL_PRODUCER_DEFAULTS: Mapping[str, Any] = {
    "transaction.timeout.ms": 30_000,
    # A transaction begun right after a commit meets CONCURRENT_TRANSACTIONS until the
    # coordinator has written the previous markers; librdkafka then waits retry.backoff.ms
    # (100 ms by default) before it adds partitions again. Back-to-back transactions are the
    # processor's normal case, so retry after a few milliseconds (growing on repeated errors).
    "retry.backoff.ms": 2,
    "retry.backoff.max.ms": 10,
    "socket.nagle.disable": True,
    # A transaction coordinator that died is looked up again only when the connection to it
    # changes state, and librdkafka waits up to reconnect.backoff.max.ms (10 s by default)
    # between attempts to reach it: a producer learnt its new coordinator seconds after the
    # controller had moved it. Try at least once a second.
    "reconnect.backoff.max.ms": 1000,
}

#: Settings of every consumer: offsets are committed explicitly, inside transactions or not.
CONSUMER_DEFAULTS: Mapping[str, Any] = {
    "isolation.level": "read_committed",
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "earliest",
}


def as_exception(raised: object) -> BaseException:
    """An exception for what a call raised that is not one.

    confluent-kafka can raise a bare ``KafkaError`` (not an exception class) out of ``flush()``
    once the producer is fenced; no ``except`` clause but a bare one catches it, and a thread
    it escapes from dies. Seen in ``tests/processor/test_failover.py`` (the paused processor).
    """
    if isinstance(raised, BaseException):
        return raised
    if isinstance(raised, KafkaError):
        return KafkaException(raised)
    return RuntimeError(f"a call raised {raised!r}")


def _config(bootstrap: str, *layers: Mapping[str, Any] | None) -> dict[str, Any]:
    config: dict[str, Any] = {"bootstrap.servers": bootstrap}
    for layer in layers:
        if layer:
            config.update(layer)
    return config


def new_producer(bootstrap: str, overrides: Mapping[str, Any] | None = None) -> Producer:
    """An idempotent producer with the Java-compatible partitioner."""
    return Producer(_config(bootstrap, PRODUCER_DEFAULTS, {"logger": LOGGER}, overrides))


def new_transactional_producer(
    bootstrap: str, transactional_id: str, overrides: Mapping[str, Any] | None = None
) -> Producer:
    """A transactional producer; call ``init_transactions()`` before the first transaction."""
    return Producer(
        _config(
            bootstrap,
            PRODUCER_DEFAULTS,
            TRANSACTIONAL_PRODUCER_DEFAULTS,
            {"transactional.id": transactional_id, "logger": LOGGER},
            overrides,
        )
    )


def new_consumer(
    bootstrap: str, group_id: str, overrides: Mapping[str, Any] | None = None
) -> Consumer:
    """A ``read_committed`` group consumer that never commits on its own."""
    return Consumer(
        _config(bootstrap, CONSUMER_DEFAULTS, {"group.id": group_id, "logger": LOGGER}, overrides)
    )


def new_admin(bootstrap: str, overrides: Mapping[str, Any] | None = None) -> AdminClient:
    """An admin client."""
    return AdminClient(_config(bootstrap, overrides), logger=LOGGER)


def probe_brokers(bootstrap: str, timeout: float) -> frozenset[int] | None:
    """Ids of the brokers a metadata request reports, or ``None`` if no broker answered."""
    setup_ms = max(1000, int(timeout * 1000))
    admin = new_admin(bootstrap, {"socket.connection.setup.timeout.ms": setup_ms})
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException:
        return None
    return frozenset(metadata.brokers)

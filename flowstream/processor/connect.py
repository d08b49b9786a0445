"""Connecting a processor: the topics checked against the topology, the clients built, and an
instance id refused while another live member of the group uses it."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flowstream.errors import InstanceInUseError
from flowstream.kafka import clients
from flowstream.processor.fence import OwnerFence
from flowstream.settings import Settings
from flowstream.topology import DEADLETTER, EVENTS, TopologyError

if TYPE_CHECKING:
    from flowstream.processor.worker import Processor

__all__ = ["Membership", "connect_clients", "debug_config", "membership", "session_timeout_ms"]

LOG = logging.getLogger("flowstream.processor")


def debug_config(settings: Settings) -> dict[str, str]:
    """librdkafka's ``debug`` setting, when some contexts were asked for. Their lines come at
    DEBUG level: asked for, they are logged whatever the level of the others."""
    if not settings.kafka_debug:
        return {}
    clients.LOGGER.setLevel(logging.DEBUG)
    return {"debug": settings.kafka_debug}


def request_timeout(settings: Settings) -> dict[str, int]:
    """How long a request may go unanswered before its connection is closed
    (``Settings.request_timeout_ms``; librdkafka refuses a transactional producer whose
    ``socket.timeout.ms`` is over its ``transaction.timeout.ms``)."""
    return {"socket.timeout.ms": min(settings.request_timeout_ms, settings.transaction_timeout_ms)}


def client_id(settings: Settings) -> str:
    return f"{settings.group}/{settings.instance_id}"


def connect_clients(processor: Processor) -> None:
    """Verify the topics, refuse an instance id in use, build the producers and consumers."""
    s = processor.settings
    ctx = processor.ctx
    # The group is described by a child process (clients.GroupQuery says why) while the topics
    # are checked.
    first = clients.GroupQuery(s.bootstrap, s.group)
    admin = clients.new_admin(s.bootstrap)
    brokers = verify_topics(processor, admin)
    member = membership(s, admin, brokers)
    refuse_instance_in_use(s, member.session_ms, first)
    processor.pipeline.start()
    processor.tasks.fence = OwnerFence(
        ctx,
        # Reads the group's positions without waiting for stable ones; never joins the group.
        lambda: clients.new_consumer(s.bootstrap, s.group, {"isolation.level": "read_uncommitted"}),
    )
    processor.tasks.fence.prepare(processor.tasks.command_topics[0])
    # Reads stable positions (read_committed) when the member's consumer times out; never joins.
    processor.tasks.new_reader = lambda: clients.new_consumer(s.bootstrap, s.group)
    if member.protocol == "consumer":
        set_group_session(admin, s.group, member.session_ms, member.heartbeat_ms)
    processor.tasks.incremental = member.protocol == "consumer"
    consumer = clients.new_consumer(
        s.bootstrap,
        s.group,
        {
            "client.id": client_id(s),
            **member.consumer_config(),
            "max.poll.interval.ms": s.max_poll_interval_ms,
            # Partitions resumed after a restore join the next fetch: a fetch waiting at the
            # broker for new records holds them back for this long at most (500 ms by default).
            "fetch.wait.max.ms": 100,
            # A dead group coordinator is found again as soon as one attempt to reach it fails
            # (TRANSACTIONAL_PRODUCER_DEFAULTS says why): not after up to 10 s.
            "reconnect.backoff.max.ms": 1000,
            **request_timeout(s),
            **debug_config(s),
        },
    )
    processor.consumer = processor.tasks.consumer = consumer
    # The restorer reads partitions to their end: a fetch that finds nothing new (a partition a
    # transaction marker behind) returns at once rather than after 500 ms.
    processor.restorer.consumer = clients.new_consumer(
        s.bootstrap,
        f"{s.group}-restore-unused",
        # A fetch that fails at first (a leader not known yet after an assignment) is tried
        # again in 20 ms, not 500.
        {"fetch.wait.max.ms": 10, "fetch.error.backoff.ms": 20},
    )
    processor.restorer.warm()
    processor.tasks.warm = processor.restorer.warm

    processor.restorer.targets.admin = admin
    processor.restorer.targets.new_admin = lambda: clients.new_admin(s.bootstrap)
    processor.tasks.watermarks = clients.new_consumer(
        s.bootstrap, f"{s.group}-watermarks-unused", {"isolation.level": "read_uncommitted"}
    )
    del ctx
    consumer.subscribe(
        processor.tasks.command_topics,
        on_assign=processor.on_assign,
        on_revoke=processor.on_revoke,
        on_lost=processor.on_lost,
    )


def verify_topics(processor: Processor, admin: Any) -> list[int]:
    """Check the topics against the topology; read the dead-letter topic's partition count and
    the events topic's id. Returns the ids of the brokers."""
    ctx = processor.ctx
    metadata = admin.list_topics(timeout=15)
    counts = {name: len(t.partitions) for name, t in metadata.topics.items()}
    problems = []
    for suffix, name in ctx.topics.items():
        if name not in counts:
            problems.append(f"topic {name} is missing")
        elif suffix != DEADLETTER and counts[name] != ctx.partitions:
            problems.append(
                f"topic {name} has {counts[name]} partitions, expected {ctx.partitions}"
            )
    if problems:
        raise TopologyError(
            "; ".join(problems) + " (run `flowstream topics apply` with this prefix)"
        )
    ctx.deadletter_partitions = max(1, counts[ctx.topics[DEADLETTER]])
    events = ctx.topics[EVENTS]
    try:
        described = admin.describe_topics(clients.TopicCollection([events]))[events].result(15)
        processor.restorer.topic_id = str(described.topic_id)
    except (clients.KafkaException, AttributeError, KeyError) as exc:
        LOG.info("the events topic's id is unknown (%s): stores are not checked against it", exc)
    return [int(broker) for broker in metadata.brokers]


@dataclass(frozen=True)
class Membership:
    """How the processor's consumer is a member of its group."""

    #: ``classic`` or ``consumer`` (KIP-848).
    protocol: str
    session_ms: int
    heartbeat_ms: int

    def consumer_config(self) -> dict[str, Any]:
        if self.protocol == "consumer":
            # The coordinator keeps the session (``set_group_session``) and assigns; its range
            # assignor keeps the command topics co-partitioned like the classic one.
            return {"group.protocol": "consumer", "group.remote.assignor": "range"}
        return {
            "partition.assignment.strategy": "range",  # co-partitioned command topics
            "session.timeout.ms": self.session_ms,
            "heartbeat.interval.ms": self.heartbeat_ms,
        }


#: Broker settings that decide the membership (``membership``).
_FLOORS = (
    "group.min.session.timeout.ms",
    "group.consumer.min.session.timeout.ms",
    "group.consumer.min.heartbeat.interval.ms",
    "group.coordinator.rebalance.protocols",
)


def membership(settings: Settings, admin: Any, brokers: list[int]) -> Membership:
    """The group protocol and session of this processor, from its settings and the brokers'.

    ``auto`` takes the consumer protocol where the brokers offer it and allow the session asked
    for: its coordinator counts the session from the last heartbeat it received, so a broker
    that dies while it replicates the group's writes (which holds back every heartbeat's
    answer) costs no member its partitions, as it does with the classic protocol. Otherwise
    the classic protocol, its session raised to the brokers' floor
    (``group.min.session.timeout.ms``, 6 s unless lowered) instead of failing to join."""
    wanted = settings.session_timeout_ms
    found = _broker_configs(admin, brokers)
    beat_floor = _number(found.get("group.consumer.min.heartbeat.interval.ms"))
    protocol = settings.group_protocol
    if protocol == "auto":
        offered = "consumer" in found.get("group.coordinator.rebalance.protocols", "").split(",")
        floor = _number(found.get("group.consumer.min.session.timeout.ms"))
        allowed = floor is not None and floor <= wanted
        allowed = allowed and beat_floor is not None and beat_floor <= _heartbeat(wanted)
        protocol = "consumer" if offered and allowed else "classic"
        LOG.info("group protocol %s (the brokers: %s)", protocol, found or "unknown")
    name = (
        "group.consumer.min.session.timeout.ms"
        if protocol == "consumer"
        else "group.min.session.timeout.ms"
    )
    session = wanted
    floor = _number(found.get(name))
    if floor is not None and wanted < floor:
        LOG.warning(
            "session timeout %d ms is below the brokers' %s=%d: "
            "using %d ms (lower the brokers' floor for a faster failover)",
            wanted,
            name,
            floor,
            floor,
        )
        session = floor
    heartbeat = _heartbeat(session)
    if protocol == "consumer" and beat_floor is not None:
        heartbeat = max(heartbeat, beat_floor)
    return Membership(protocol, session, heartbeat)


def session_timeout_ms(settings: Settings, admin: Any, brokers: list[int]) -> int:
    """The session timeout ``membership`` settles on."""
    return membership(settings, admin, brokers).session_ms


def _heartbeat(session_ms: int) -> int:
    # A tenth of the session: a survivor hears of a rebalance (a member died) within 150 ms
    # rather than at a fifth of the session, and a member misses nine heartbeats before it is
    # expired.
    return max(100, session_ms // 10)


def _number(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _broker_configs(admin: Any, brokers: list[int]) -> dict[str, str]:
    """The settings of ``_FLOORS`` the lowest-numbered broker reports (none it cannot)."""
    if not brokers:
        return {}
    resource = clients.ConfigResource(clients.ResourceType.BROKER, str(min(brokers)))
    try:
        found = admin.describe_configs([resource], request_timeout=10)[resource].result(15)
    except (clients.KafkaException, TypeError) as exc:
        LOG.info("the brokers' group settings are unknown (%s)", exc)
        return {}
    return {
        name: str(found[name].value)
        for name in _FLOORS
        if name in found and found[name].value is not None
    }


def set_group_session(admin: Any, group: str, session_ms: int, heartbeat_ms: int) -> None:
    """With the consumer protocol the coordinator keeps the session: set the group's own
    session timeout and heartbeat interval (group configs, Kafka 4)."""
    entries = [
        clients.ConfigEntry(
            "consumer.session.timeout.ms",
            str(session_ms),
            incremental_operation=clients.AlterConfigOpType.SET,
        ),
        clients.ConfigEntry(
            "consumer.heartbeat.interval.ms",
            str(heartbeat_ms),
            incremental_operation=clients.AlterConfigOpType.SET,
        ),
    ]
    resource = clients.ConfigResource(
        clients.ResourceType.GROUP, group, incremental_configs=entries
    )
    try:
        admin.incremental_alter_configs([resource])[resource].result(15)
    except clients.KafkaException as exc:
        raise TopologyError(
            f"group {group!r}: the brokers refused its session of {session_ms} ms "
            f"(heartbeats every {heartbeat_ms} ms): {exc.args[0]}"
        ) from None


def refuse_instance_in_use(
    settings: Settings, session_ms: int, first: clients.GroupQuery | None = None
) -> None:
    """Raise ``InstanceInUseError`` while a member of the group has this instance's client id
    for longer than a session (a killed predecessor's membership expires within one): starting
    would fence the other member's producers and steal its transactional ids.

    ``first`` is a description already asked for. A description that fails is asked again until
    that time has passed; a group that cannot be described then is not checked, and the log says
    so."""
    wanted = client_id(settings)
    deadline = time.monotonic() + session_ms / 1000 * 1.5 + 1
    query = first or clients.GroupQuery(settings.bootstrap, settings.group)
    while True:
        try:
            found = query.result()
        except clients.KafkaException as exc:
            error = exc.args[0] if exc.args else None
            passing = isinstance(error, clients.KafkaError) and (
                error.retriable() or error.code() in clients.COORDINATOR_PASSING
            )
            if not passing or time.monotonic() > deadline:
                LOG.info(
                    "group %s could not be described (%s): instance id not checked",
                    settings.group,
                    error or exc,
                )
                return
        else:
            hosts = {m.host for m in found.members if m.client_id == wanted}
            if not hosts:
                return
            if time.monotonic() > deadline:
                raise InstanceInUseError(
                    f"instance id {settings.instance_id!r} is in use by a live member of group "
                    f"{settings.group!r} ({', '.join(sorted(hosts))}); give each worker its own "
                    "--instance-id"
                )
        time.sleep(0.5)
        left = max(1.0, deadline - time.monotonic())
        query = clients.GroupQuery(settings.bootstrap, settings.group, timeout=min(10.0, left))

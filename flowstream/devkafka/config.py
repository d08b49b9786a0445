"""The files a development node runs from: ``server.properties`` and two log4j2 configurations.

One node is a combined broker+controller. Three brokers get their KRaft controller as a fourth
process, as Kafka advises for anything but development (combined mode is "not recommended in
critical deployment environments"): killing a broker then costs what a broker's death costs,
never also an election of the controller (1-3 s more, measured). The quorum is static
(``controller.quorum.voters``), so formatting needs no ``--standalone`` and no directory ids, all
on 127.0.0.1.
Internal topics get the replication of the cluster size (1, or 3 with ``min.insync.replicas=2``);
durability settings keep Kafka's defaults (no unclean leader election, ``acks=all`` honoured).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BROKER",
    "BROKER_LOG4J",
    "COMBINED",
    "CONTROLLER",
    "TOOLS_LOG4J",
    "NodeSpec",
    "server_properties",
]

HOST = "127.0.0.1"


#: What a node runs: both roles (the one-node cluster), a broker only, or the controller only.
COMBINED = "broker,controller"
BROKER = "broker"
CONTROLLER = "controller"


@dataclass(frozen=True)
class NodeSpec:
    """One node: its id, client port (none for a controller alone), controller port (none for a
    broker alone) and roles."""

    node_id: int
    port: int
    controller_port: int
    roles: str = COMBINED

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port if self.port else self.controller_port}"

    @property
    def is_broker(self) -> bool:
        return self.roles != CONTROLLER


def _listeners(node: NodeSpec) -> list[tuple[str, object]]:
    if node.roles == CONTROLLER:
        return [("listeners", f"CONTROLLER://{HOST}:{node.controller_port}")]
    listeners = f"PLAINTEXT://{HOST}:{node.port}"
    if node.roles == COMBINED:
        listeners += f",CONTROLLER://{HOST}:{node.controller_port}"
    return [
        ("listeners", listeners),
        ("advertised.listeners", f"PLAINTEXT://{HOST}:{node.port}"),
        ("inter.broker.listener.name", "PLAINTEXT"),
    ]


def server_properties(node: NodeSpec, nodes: Sequence[NodeSpec], data_dir: Path) -> str:
    """The configuration of ``node`` in a cluster of ``nodes`` (brokers and controllers)."""
    replicas = sum(1 for n in nodes if n.is_broker)
    voting = [n for n in nodes if n.roles != BROKER]
    min_isr = 2 if replicas >= 3 else 1
    voters = ",".join(f"{n.node_id}@{HOST}:{n.controller_port}" for n in voting)
    settings: list[tuple[str, object]] = [
        ("process.roles", node.roles),
        ("node.id", node.node_id),
        ("controller.quorum.voters", voters),
        *_listeners(node),
        ("controller.listener.names", "CONTROLLER"),
        ("listener.security.protocol.map", "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"),
        ("log.dirs", data_dir),
        ("num.partitions", 1),
        ("default.replication.factor", replicas),
        ("min.insync.replicas", min_isr),
        ("unclean.leader.election.enable", "false"),
        ("auto.create.topics.enable", "false"),
        ("offsets.topic.replication.factor", replicas),
        ("offsets.topic.num.partitions", 10),
        ("transaction.state.log.replication.factor", replicas),
        ("transaction.state.log.min.isr", min_isr),
        ("transaction.state.log.num.partitions", 10),
        ("share.coordinator.state.topic.replication.factor", replicas),
        ("share.coordinator.state.topic.min.isr", min_isr),
        ("group.initial.rebalance.delay.ms", 0),
        # Failover (docs/architecture.md, "Failover"): processors may use session timeouts down to
        # 1 s (the default floor is 6 s), and the coordinator looks for timed-out transactions
        # every 500 ms (default 10 s), so a dead processor's open transaction, which holds back
        # the last stable offset of every partition it wrote to, is aborted soon after its
        # transaction.timeout.ms.
        ("group.min.session.timeout.ms", 1000),
        # The same floors for groups of the consumer protocol (KIP-848), which keep their
        # session at the coordinator (defaults 45 s and 5 s).
        ("group.consumer.min.session.timeout.ms", 1000),
        ("group.consumer.min.heartbeat.interval.ms", 100),
        ("transaction.abort.timed.out.transaction.cleanup.interval.ms", 500),
        # A killed node is fenced after 3 s (2 s in a cluster) rather than 9 s (heartbeats every
        # 500 ms rather than 2 s). Until it is fenced it stays in the in-sync replicas of the
        # partitions it follows, and every write to them (acks=all) waits: that wait is most of
        # what a broker SIGKILL costs the partitions it did not lead.
        ("broker.heartbeat.interval.ms", 500),
        ("broker.session.timeout.ms", 3000 if replicas == 1 else 2000),
        # A processor commits its consumer positions with every transaction, so the group's
        # partition of __consumer_offsets grows by hundreds of records a second, and a broker
        # that becomes the group's coordinator reads all of it that is not compacted before it
        # answers: with 100 MB segments (the default) nothing is, and taking over 84,015 records
        # after a SIGKILL took 5.5-9 s, in which no transaction could commit. Small segments are
        # compacted soon (the cleaner only cleans segments no longer written to), so a new
        # coordinator reads about one segment (README, "Failover in seconds needs broker
        # settings").
        ("offsets.topic.segment.bytes", 1024 * 1024),
        ("transaction.state.log.segment.bytes", 1024 * 1024),
        ("log.cleaner.backoff.ms", 1000),
    ]
    if len(voting) > 1:
        # A killed node that was the active controller: the others stand for election after
        # 1 s without news from it (default 2 s) and within 0.5 s more (default 1 s); the new
        # controller then fences the dead node once its session (2 s) ran out.
        settings += [
            ("controller.quorum.fetch.timeout.ms", 1000),
            ("controller.quorum.election.timeout.ms", 500),
            ("controller.quorum.election.backoff.max.ms", 500),
        ]
    lines = ["# Written by flowstream dev-kafka; rewritten on every start."]
    lines += [f"{key}={value}" for key, value in settings]
    return "\n".join(lines) + "\n"


#: Broker logging: INFO to stdout, which the launcher sends to the node's ``kafka.log``.
BROKER_LOG4J = """\
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.target = SYSTEM_OUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.requestchannel.name = kafka.network.RequestChannel$
logger.requestchannel.level = WARN
"""

#: Storage-tool logging: warnings only, to stderr.
TOOLS_LOG4J = """\
status = warn
appender.console.type = Console
appender.console.name = STDERR
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stderr.ref = STDERR
"""

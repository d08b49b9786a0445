"""``Context``: what every part of the processor shares (settings, topic names, metrics, the
transaction pipeline), and producing into the open transaction."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flowstream import codec
from flowstream.model.messages import (
    CancelRun,
    CommandMessage,
    DisposeHook,
    FireTimer,
    HookTokenRejected,
    RegisterHookToken,
    ReleaseHookToken,
    ResolveChild,
    ResumeHook,
    RetryRun,
    SendSignal,
    StartRun,
)
from flowstream.partitioning import partition_for
from flowstream.processor.metrics import ProcessorMetrics
from flowstream.processor.txn.pipeline import TransactionPipeline
from flowstream.processor.txn.slot import Record, new_writer
from flowstream.replay.decide import token_digest
from flowstream.settings import Settings
from flowstream.stores.base import Clock
from flowstream.topology import (
    CMD_CANCEL,
    CMD_HOOK,
    CMD_SIGNAL,
    CMD_START,
    CMD_TIMER,
    Topology,
)

__all__ = ["COMMAND_TOPIC_FOR", "Context", "routing_key"]

COMMAND_TOPIC_FOR = {
    StartRun: CMD_START,
    SendSignal: CMD_SIGNAL,
    ResumeHook: CMD_HOOK,
    DisposeHook: CMD_HOOK,
    CancelRun: CMD_CANCEL,
    RetryRun: CMD_CANCEL,
    FireTimer: CMD_TIMER,
    ResolveChild: CMD_TIMER,
    RegisterHookToken: CMD_HOOK,
    ReleaseHookToken: CMD_HOOK,
    HookTokenRejected: CMD_HOOK,
}


def routing_key(command: CommandMessage) -> str:
    """The key that picks a command's partition: its run id, or a hook token's digest (a claim,
    a release, a resume by the token alone)."""
    if isinstance(command, RegisterHookToken | ReleaseHookToken):
        return command.token_digest
    if command.run_id is None:
        assert isinstance(command, ResumeHook) and command.token is not None
        return token_digest(command.token.get_secret_value())
    return command.run_id


@dataclass(eq=False)
class Context:
    """The processor's shared parts."""

    settings: Settings
    topology: Topology
    metrics: ProcessorMetrics
    clock: Clock
    topics: dict[str, str] = field(init=False)
    partitions: int = field(init=False)
    pipeline: TransactionPipeline = field(init=False)
    #: The dead-letter topic's real partition count (read from the cluster at start).
    deadletter_partitions: int = 1
    #: Who writes this member's transactions: ``<instance>/<token>``, a new token each time
    #: the member loses its partitions (``fence``).
    writer: str = field(init=False)

    def __post_init__(self) -> None:
        self.writer = new_writer(self.settings.instance_id)
        self.topics = self.topology.names(self.settings.topic_prefix)
        self.partitions = self.topology.run_partitions

    def produce(
        self, topic: str, partition: int, key: str, value: bytes, headers: Any = None
    ) -> None:
        """Produce into the open transaction."""
        self.pipeline.produce(Record(topic, partition, key.encode(), value, headers))

    def emit(self, command: CommandMessage, *, behind_start: bool = False) -> None:
        """Produce a command to its topic, to the partition of its routing key.

        ``behind_start``: on ``cmd.start`` instead, for a command to a run whose start this
        partition sent (a child, a continuation's successor): one partition of one topic keeps
        the order, so it is read after that start and never finds the run missing.
        """
        topic = self.topics[CMD_START if behind_start else COMMAND_TOPIC_FOR[type(command)]]
        key = routing_key(command)
        self.produce(topic, partition_for(key, self.partitions), key, codec.encode_message(command))

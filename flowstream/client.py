"""``FlowClient``: produce start, signal, hook and cancel commands; read runs back from Kafka.

Commands are keyed by run id and sent to ``partition_for(run_id)`` explicitly. Starting is
idempotent by run id and signalling by signal id (the processor enforces both), so a client may
retry any send. Reads use ``read_committed``: only events of committed transactions are seen.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import SecretStr

from flowstream import codec
from flowstream.errors import FlowError, RunNotFoundError
from flowstream.kafka import clients
from flowstream.model.base import JSON
from flowstream.model.events import EventEnvelope
from flowstream.model.messages import (
    CancelRun,
    CommandMessage,
    DisposeHook,
    ResumeHook,
    SendSignal,
    StartRun,
)
from flowstream.model.snapshot import WorkflowRunSnapshot
from flowstream.model.spec import WorkflowSpec
from flowstream.partitioning import partition_for
from flowstream.replay.decide import token_digest
from flowstream.replay.state import RunState
from flowstream.settings import Settings
from flowstream.topology import (
    CMD_CANCEL,
    CMD_HOOK,
    CMD_SIGNAL,
    CMD_START,
    EVENTS,
    Topology,
    load_topology,
)

__all__ = ["EventTail", "FlowClient"]

_RECORD_HEADER = "flowstream-record"
#: Metadata answers that pass once the cluster catches up (a new topic, a leader election).
_PASSING_ERRORS = frozenset(
    {
        clients.KafkaError.NOT_LEADER_FOR_PARTITION,
        clients.KafkaError.LEADER_NOT_AVAILABLE,
        clients.KafkaError.UNKNOWN_TOPIC_OR_PART,
        clients.KafkaError._UNKNOWN_PARTITION,
        clients.KafkaError._TIMED_OUT,
    }
)


def _is_event(message: Any) -> bool:
    for key, value in message.headers() or ():
        if key == _RECORD_HEADER:
            return bool(value == b"event")
    return True


class FlowClient:
    """Sends commands to a flowstream deployment and reads runs from its events topic."""

    def __init__(self, settings: Settings, *, topology: Topology | None = None) -> None:
        self.settings = settings
        self.topology = topology or load_topology()
        self.topics = self.topology.names(settings.topic_prefix)
        self.partitions = self.topology.run_partitions
        # A command goes out at once (librdkafka still batches what queues while a request is
        # in flight): a start waiting out a linger is latency every run pays.
        self._producer = clients.new_producer(settings.bootstrap, {"linger.ms": 0})

    # -- commands -------------------------------------------------------------------------

    def _send(self, suffix: str, run_id: str, command: CommandMessage) -> None:
        self._producer.produce(
            self.topics[suffix],
            value=codec.encode_message(command),
            key=run_id.encode(),
            partition=partition_for(run_id, self.partitions),
        )
        self._producer.poll(0)

    def start(self, run_id: str, spec: WorkflowSpec, input: JSON = None) -> None:
        self._send(CMD_START, run_id, StartRun(run_id=run_id, spec=spec, input=input))

    def signal(self, run_id: str, signal_id: str, name: str, payload: JSON = None) -> None:
        command = SendSignal(run_id=run_id, signal_id=signal_id, name=name, payload=payload)
        self._send(CMD_SIGNAL, run_id, command)

    def resume_hook(self, run_id: str, hook_id: str, payload: JSON = None) -> None:
        self._send(CMD_HOOK, run_id, ResumeHook(run_id=run_id, hook_id=hook_id, payload=payload))

    def resume_hook_by_token(self, token: str, payload: JSON = None) -> None:
        """Resume the hook that owns ``token`` (a bearer secret: it is never logged)."""
        command = ResumeHook(token=SecretStr(token), payload=payload)
        self._send(CMD_HOOK, token_digest(token), command)

    def dispose_hook(self, run_id: str, hook_id: str) -> None:
        self._send(CMD_HOOK, run_id, DisposeHook(run_id=run_id, hook_id=hook_id))

    def cancel(self, run_id: str, reason: str | None = None, *, force: bool = False) -> None:
        self._send(CMD_CANCEL, run_id, CancelRun(run_id=run_id, reason=reason, force=force))

    def flush(self, timeout: float = 30) -> None:
        if self._producer.flush(timeout):
            raise FlowError("some commands were not acknowledged by the brokers in time")

    def close(self) -> None:
        self.flush()

    # -- reads ----------------------------------------------------------------------------

    def history(self, run_id: str, *, timeout: float = 30) -> list[EventEnvelope]:
        """The committed history of ``run_id``, read from its events partition."""
        partition = partition_for(run_id, self.partitions)
        tail = EventTail(self.settings, [partition], topic=self.topics[EVENTS])
        try:
            found = [e for e in tail.read_to_end(timeout=timeout) if e.run_id == run_id]
        finally:
            tail.close()
        if not found:
            raise RunNotFoundError(run_id)
        return found

    def parked(self, run_id: str, *, timeout: float = 30) -> list[str]:
        """Why commands for ``run_id`` wait in its partition's inbox (e.g. its build is not
        served by the partition's owner); empty when nothing waits."""
        partition = partition_for(run_id, self.partitions)
        tail = EventTail(self.settings, [partition], topic=self.topics[EVENTS])
        waiting: dict[bytes, str] = {}
        try:
            for message in tail.read_records_to_end(timeout=timeout):
                if message.key() != run_id.encode():
                    continue
                headers = dict(message.headers() or ())
                kind = headers.get(_RECORD_HEADER)
                if kind not in (b"inbox", b"inbox-done"):
                    continue
                inbox_id = (message.value() or b"").split(b"\0", 2)[1]
                if kind == b"inbox":
                    waiting[inbox_id] = headers.get("flowstream-reason", b"").decode()
                elif kind == b"inbox-done":
                    waiting.pop(inbox_id, None)
        finally:
            tail.close()
        return list(waiting.values())

    def snapshot(self, run_id: str, *, timeout: float = 30) -> WorkflowRunSnapshot:
        return RunState.from_history(self.history(run_id, timeout=timeout)).snapshot()

    def wait(self, run_id: str, *, timeout: float = 60) -> WorkflowRunSnapshot:
        """Block until ``run_id`` is terminal (following no continuation) and return it."""
        results = self.wait_all([run_id], timeout=timeout)
        return results[run_id]

    def wait_all(
        self, run_ids: Iterable[str], *, timeout: float = 60
    ) -> dict[str, WorkflowRunSnapshot]:
        """Tail the events topic until every run in ``run_ids`` is terminal."""
        wanted = set(run_ids)
        partitions = sorted({partition_for(r, self.partitions) for r in wanted})
        tail = EventTail(self.settings, partitions, topic=self.topics[EVENTS])
        states: dict[str, RunState] = {}
        done: dict[str, WorkflowRunSnapshot] = {}
        deadline = time.monotonic() + timeout
        try:
            while len(done) < len(wanted):
                if time.monotonic() > deadline:
                    missing = sorted(wanted - set(done))
                    raise TimeoutError(f"{len(missing)} run(s) not terminal in time: {missing[:5]}")
                for envelope in tail.poll(0.1):
                    if envelope.run_id not in wanted or envelope.run_id in done:
                        continue
                    state = states.get(envelope.run_id)
                    if state is None:
                        state = states[envelope.run_id] = RunState.first(envelope)
                    else:
                        state.apply(envelope)
                    if state.is_terminal:
                        done[envelope.run_id] = state.snapshot()
        finally:
            tail.close()
        return done


class EventTail:
    """Reads committed events from some partitions of the events topic, from the start."""

    def __init__(self, settings: Settings, partitions: list[int], *, topic: str) -> None:
        self.topic = topic
        self.partitions = partitions
        self._consumer = clients.new_consumer(
            settings.bootstrap, f"{settings.group}-reader-unused", {"enable.partition.eof": True}
        )
        self._consumer.assign([clients.TopicPartition(topic, p, 0) for p in partitions])

    def poll(self, timeout: float) -> list[EventEnvelope]:
        """Events that arrived, waiting at most ``timeout`` for the first one."""
        found: list[EventEnvelope] = []
        first = self._consumer.poll(timeout)
        batch = [] if first is None else [first, *self._consumer.consume(999, timeout=0)]
        for message in batch:
            if message.error() is not None or not _is_event(message):
                continue
            found.append(codec.decode_event(message.value() or b""))
        return found

    def read_to_end(
        self, *, timeout: float, progress: Callable[[int], None] | None = None
    ) -> list[EventEnvelope]:
        """Every committed event so far (up to each partition's last stable offset).

        ``progress`` is called with the running count every 10,000 events.
        """
        found: list[EventEnvelope] = []
        for message in self.read_records_to_end(timeout=timeout):
            if _is_event(message):
                found.append(codec.decode_event(message.value() or b""))
                if progress is not None and len(found) % 10_000 == 0:
                    progress(len(found))
        return found

    def read_records_to_end(self, *, timeout: float) -> list[Any]:
        """Every committed record (events and inbox records) up to the last stable offset."""
        patience = time.monotonic() + timeout
        ends = {p: self._high_watermark(p, patience) for p in self.partitions}
        found: list[Any] = []
        deadline = time.monotonic() + timeout
        while True:
            positions = self._consumer.position(
                [clients.TopicPartition(self.topic, p) for p in self.partitions]
            )
            if all(tp.offset >= ends[tp.partition] or ends[tp.partition] == 0 for tp in positions):
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {self.topic} did not reach its end in time")
            for message in self._consumer.consume(num_messages=1000, timeout=0.1):
                if message.error() is None:
                    found.append(message)

    def _high_watermark(self, partition: int, deadline: float) -> int:
        """The partition's high watermark. A topic just created, or a leader just moved, answers
        "not leader" or "unknown partition" for a moment: asked again until ``deadline``."""
        while True:
            try:
                _, high = self._consumer.get_watermark_offsets(
                    clients.TopicPartition(self.topic, partition), timeout=10, cached=False
                )
                return int(high)
            except clients.KafkaException as exc:
                error = exc.args[0]
                passing = error.retriable() or error.code() in _PASSING_ERRORS
                if not passing or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def close(self) -> None:
        self._consumer.close()

"""``FlowClient``: produce start, signal, hook and cancel commands; read runs back from Kafka.

Commands are keyed by run id and sent to ``partition_for(run_id)`` explicitly. Starting is
idempotent by run id and signalling by signal id (the processor enforces both), so a client may
retry any send. Reads use ``read_committed``: only events of committed transactions are seen.

Every command carries a command id (one the caller gives, or a new one), and by default the client
waits for its outcome, an ``outcome`` record of the events topic (``wait=False``, on the client or
per call, sends and returns at once). An applied command or a no-op (a duplicate) returns its
``CommandOutcome``; a rejected one raises the error the embedded engine raises for the same request
(``RunConflictError``, ``RunNotFoundError``, ``InvalidInputError``...,
:func:`flowstream.errors.error_from`), with the processor's reason; a parked one raises
``CommandParkedError`` (``RunNotStartedError``, also a ``RunNotFoundError``, for a run that does
not exist yet: the command applies if it starts within the parked time-to-live). No outcome within
the timeout raises ``TimeoutError`` (no processor owns the partition, say); the command stays on
its topic. Any client can read any command's outcomes (:meth:`FlowClient.outcomes`).

A record that does not decode is logged and skipped (:func:`flowstream.wire.decode_events`):
reading any other run of its partition goes on; reading the run its key names raises
``CorruptHistoryError``, since that history cannot be read completely.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pydantic import SecretStr

from flowstream import codec, wire
from flowstream.errors import (
    CorruptHistoryError,
    FlowError,
    PayloadTooLargeError,
    RunNotFoundError,
)
from flowstream.kafka import clients
from flowstream.model.base import JSON, validate_run_id
from flowstream.model.events import EventEnvelope
from flowstream.model.messages import (
    CancelRun,
    CommandMessage,
    CommandOutcome,
    DisposeHook,
    OutcomeStatus,
    ResumeHook,
    RetryRun,
    SendSignal,
    StartRun,
)
from flowstream.model.snapshot import WorkflowRunSnapshot
from flowstream.model.spec import WorkflowSpec
from flowstream.outcomes import MAX_FORWARDS, OutcomeReader, answer, high_watermark, new_command_id
from flowstream.partitioning import partition_for
from flowstream.replay.decide import token_digest
from flowstream.replay.state import RunState
from flowstream.settings import Settings
from flowstream.stores.base import MAX_EVENT_BYTES
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


#: How long asking for a partition's end may take while leadership settles.
_METADATA_PATIENCE_S = 10.0


def _unreadable(run_id: str, bad: list[wire.BadRecord]) -> CorruptHistoryError:
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    return CorruptHistoryError(
        f"the history of run {run_id} cannot be read completely: {bad[0]}{more}; "
        f"audit it with `flowstream audit --run {run_id}`",
        run_id=run_id,
    )


class FlowClient:
    """Sends commands to a flowstream deployment, waits for their outcomes, and reads runs from
    its events topic."""

    def __init__(
        self,
        settings: Settings,
        *,
        topology: Topology | None = None,
        wait: bool = True,
        timeout: float = 30.0,
    ) -> None:
        """``wait``: whether commands wait for their outcome unless a call says otherwise;
        ``timeout``: for how long, in seconds."""
        self.settings = settings
        self.wait_outcomes = wait
        self.outcome_timeout = timeout
        self.topology = topology or load_topology()
        self.topics = self.topology.names(settings.topic_prefix)
        self.partitions = self.topology.run_partitions
        # A command goes out at once (librdkafka still batches what queues while a request is
        # in flight): a start waiting out a linger is latency every run pays. A command sent to
        # a leader that stopped answering is sent again to the new one after
        # ``request_timeout_ms``, not after librdkafka's 60 s.
        self._producer = clients.new_producer(
            settings.bootstrap,
            {"linger.ms": 0, "socket.timeout.ms": settings.request_timeout_ms},
        )
        # Reads the outcomes of the commands this client waits for.
        self._reader = OutcomeReader(settings, self.topics[EVENTS], self.partitions)

    # -- commands -------------------------------------------------------------------------

    def _send(
        self,
        suffix: str,
        key: str,
        command: CommandMessage,
        wait: bool | None,
        timeout: float | None,
    ) -> CommandOutcome | None:
        """Produce ``command`` to the partition of ``key``; with ``wait`` (the client's default
        when ``None``), return its outcome or raise what it means (:func:`answer`)."""
        waiting = self.wait_outcomes if wait is None else wait
        seconds = self.outcome_timeout if timeout is None else timeout
        value = codec.encode_message(command)
        if len(value) > MAX_EVENT_BYTES:
            # As the engine refuses the event it would write (a broker refuses it anyway).
            run_id = getattr(command, "run_id", None) or key
            raise PayloadTooLargeError(run_id, len(value), MAX_EVENT_BYTES)
        partition = partition_for(key, self.partitions)
        deadline = time.monotonic() + seconds
        # Its outcome is written after it, so after the end the events partition has now (a
        # topic just created may answer "not leader" for a few seconds, whatever the timeout).
        patience = max(deadline, time.monotonic() + _METADATA_PATIENCE_S)
        start = self._reader.end(partition, patience) if waiting else None
        self._producer.produce(
            self.topics[suffix],
            value=value,
            key=key.encode(),
            partition=partition,
        )
        self._producer.poll(0)
        if start is None:
            return None
        self.flush(seconds)
        command_id = getattr(command, "command_id", None)
        assert command_id is not None
        return answer(self._reader.wait(command_id, key, partition, start, deadline))

    def start(
        self,
        run_id: str,
        spec: WorkflowSpec,
        input: JSON = None,
        *,
        command_id: str | None = None,
        wait: bool | None = None,
        timeout: float | None = None,
    ) -> CommandOutcome | None:
        """Start ``run_id`` (idempotent for the same spec and input; another raises
        ``RunConflictError``). Returns the outcome when it waited for it."""
        validate_run_id(run_id)  # InvalidIdentifierError, as the engine raises
        command = StartRun(
            run_id=run_id, spec=spec, input=input, command_id=command_id or new_command_id()
        )
        return self._send(CMD_START, run_id, command, wait, timeout)

    def signal(
        self,
        run_id: str,
        name: str,
        payload: JSON = None,
        *,
        id: str,
        command_id: str | None = None,
        wait: bool | None = None,
        timeout: float | None = None,
    ) -> CommandOutcome | None:
        """Send signal ``name`` to ``run_id``, once per ``id`` (the order of the engine's
        ``signal``, the handles' and the CLI's ``kafka signal RUN NAME --id ID``)."""
        validate_run_id(run_id)  # InvalidIdentifierError, as the engine raises
        command = SendSignal(
            run_id=run_id,
            signal_id=id,
            name=name,
            payload=payload,
            command_id=command_id or new_command_id(),
        )
        return self._send(CMD_SIGNAL, run_id, command, wait, timeout)

    def resume_hook(
        self,
        run_id: str,
        hook_id: str,
        payload: JSON = None,
        *,
        command_id: str | None = None,
        wait: bool | None = None,
        timeout: float | None = None,
    ) -> CommandOutcome | None:
        validate_run_id(run_id)
        command = ResumeHook(
            run_id=run_id,
            hook_id=hook_id,
            payload=payload,
            command_id=command_id or new_command_id(),
        )
        return self._send(CMD_HOOK, run_id, command, wait, timeout)

    def resume_hook_by_token(
        self,
        token: str,
        payload: JSON = None,
        *,
        command_id: str | None = None,
        wait: bool | None = None,
        timeout: float | None = None,
    ) -> CommandOutcome | None:
        """Resume the hook that owns ``token`` (a bearer secret: it is never logged). Its
        outcomes are on the partition of the token's digest, then on the hook's run's."""
        command = ResumeHook(
            token=SecretStr(token), payload=payload, command_id=command_id or new_command_id()
        )
        return self._send(CMD_HOOK, token_digest(token), command, wait, timeout)

    def dispose_hook(
        self,
        run_id: str,
        hook_id: str,
        *,
        command_id: str | None = None,
        wait: bool | None = None,
        timeout: float | None = None,
    ) -> CommandOutcome | None:
        validate_run_id(run_id)
        command = DisposeHook(
            run_id=run_id, hook_id=hook_id, command_id=command_id or new_command_id()
        )
        return self._send(CMD_HOOK, run_id, command, wait, timeout)

    def cancel(
        self,
        run_id: str,
        reason: str | None = None,
        *,
        force: bool = False,
        command_id: str | None = None,
        wait: bool | None = None,
        timeout: float | None = None,
    ) -> CommandOutcome | None:
        validate_run_id(run_id)
        command = CancelRun(
            run_id=run_id, reason=reason, force=force, command_id=command_id or new_command_id()
        )
        return self._send(CMD_CANCEL, run_id, command, wait, timeout)

    def retry(
        self,
        run_id: str,
        *,
        command_id: str | None = None,
        wait: bool | None = None,
        timeout: float | None = None,
    ) -> CommandOutcome | None:
        """Ask the run's owner to drive it again now (after its code or a dependency was fixed).
        A run that ended answers with a no-op; one that does not exist raises
        ``RunNotFoundError``."""
        validate_run_id(run_id)
        command = RetryRun(run_id=run_id, command_id=command_id or new_command_id())
        return self._send(CMD_CANCEL, run_id, command, wait, timeout)

    # -- outcomes -------------------------------------------------------------------------

    def outcomes(self, command_id: str, key: str, *, timeout: float = 30) -> list[CommandOutcome]:
        """Every outcome of command ``command_id`` so far, in order, read by any client from the
        events partition of ``key`` (the run the command addressed; for a token-only hook
        resumption, the token's digest) and, after a forward, of the run it was sent on to."""
        found: list[CommandOutcome] = []
        read: set[int] = set()
        for _ in range(MAX_FORWARDS + 1):
            partition = partition_for(key, self.partitions)
            if partition in read:
                break  # the run it went on to shares a partition read already
            read.add(partition)
            tail = EventTail(self.settings, [partition], topic=self.topics[EVENTS])
            try:
                records = tail.read_records_to_end(timeout=timeout)
            finally:
                tail.close()
            found.extend(wire.outcomes_of(records, command_id))
            last = found[-1] if found else None
            if last is None or last.status is not OutcomeStatus.FORWARDED:
                break
            assert last.forwarded_to is not None
            key = last.forwarded_to
        return found

    def outcome(self, command_id: str, key: str, *, timeout: float = 30) -> CommandOutcome | None:
        """The latest outcome of command ``command_id`` (:meth:`outcomes`); ``None`` if none was
        written yet."""
        found = self.outcomes(command_id, key, timeout=timeout)
        return found[-1] if found else None

    def flush(self, timeout: float = 30) -> None:
        if self._producer.flush(timeout):
            raise FlowError("some commands were not acknowledged by the brokers in time")

    def close(self) -> None:
        self.flush()
        self._reader.close()

    # -- reads ----------------------------------------------------------------------------

    def history(self, run_id: str, *, timeout: float = 30) -> list[EventEnvelope]:
        """The committed history of ``run_id``, read from its events partition."""
        partition = partition_for(run_id, self.partitions)
        tail = EventTail(self.settings, [partition], topic=self.topics[EVENTS])
        try:
            found = [e for e in tail.read_to_end(timeout=timeout) if e.run_id == run_id]
        finally:
            tail.close()
        bad = [b for b in tail.bad_records if b.run_id == run_id]
        if bad:
            raise _unreadable(run_id, bad)
        if not found:
            raise RunNotFoundError(run_id)
        return found

    def parked(self, run_id: str, *, timeout: float = 30) -> list[str]:
        """Why commands for ``run_id`` wait in its partition's inbox (e.g. its build is not
        served by the partition's owner); empty when nothing waits."""
        partition = partition_for(run_id, self.partitions)
        tail = EventTail(self.settings, [partition], topic=self.topics[EVENTS])
        waiting: dict[str, str] = {}
        try:
            for message in tail.read_records_to_end(timeout=timeout):
                if message.key() != run_id.encode():
                    continue
                kind = wire.kind_of(message)
                if kind not in (wire.RecordKind.INBOX, wire.RecordKind.INBOX_DONE):
                    continue
                try:
                    _, inbox_id, _ = wire.split_inbox(message.value() or b"")
                except ValueError:
                    tail.report(wire.BadRecord.of(message, f"not an {kind.value} value"))
                    continue
                if kind is wire.RecordKind.INBOX:
                    reason = wire.header_of(message, wire.REASON_HEADER) or b""
                    waiting[inbox_id] = reason.decode(errors="replace")
                else:
                    waiting.pop(inbox_id, None)
        finally:
            tail.close()
        return list(waiting.values())

    def snapshot(self, run_id: str, *, timeout: float = 30) -> WorkflowRunSnapshot:
        return RunState.from_history(self.history(run_id, timeout=timeout)).snapshot()

    def wait(
        self, run_id: str, *, timeout: float = 60, must_exist: bool = False
    ) -> WorkflowRunSnapshot:
        """Block until ``run_id`` is terminal (following no continuation) and return it; with
        ``must_exist``, raise ``RunNotFoundError`` at once if it has no committed event yet."""
        results = self.wait_all([run_id], timeout=timeout, must_exist=must_exist)
        return results[run_id]

    def wait_all(
        self, run_ids: Iterable[str], *, timeout: float = 60, must_exist: bool = False
    ) -> dict[str, WorkflowRunSnapshot]:
        """Tail the events topic until every run in ``run_ids`` is terminal. With
        ``must_exist``, the partitions are read to their end first, and a run without a
        committed event by then raises ``RunNotFoundError`` (without it, such a run is waited
        for: its start may be on its way)."""
        wanted = set(run_ids)
        partitions = sorted({partition_for(r, self.partitions) for r in wanted})
        states: dict[str, RunState] = {}
        done: dict[str, WorkflowRunSnapshot] = {}

        def unreadable(bad: wire.BadRecord) -> None:
            # Called in the record's place among the events: a run that ended before it is done.
            run_id = bad.run_id
            if run_id is not None and run_id in wanted and run_id not in done:
                raise _unreadable(run_id, [bad])

        def take(envelopes: Iterable[EventEnvelope]) -> None:
            for envelope in envelopes:
                if envelope.run_id not in wanted or envelope.run_id in done:
                    continue
                state = states.get(envelope.run_id)
                if state is None:
                    state = states[envelope.run_id] = RunState.first(envelope)
                else:
                    state.apply(envelope)
                if state.is_terminal:
                    done[envelope.run_id] = state.snapshot()

        tail = EventTail(self.settings, partitions, topic=self.topics[EVENTS], on_bad=unreadable)
        deadline = time.monotonic() + timeout
        try:
            if must_exist:
                take(tail.read_to_end(timeout=timeout))
                missing = sorted(wanted - set(states))
                if missing:
                    raise RunNotFoundError(missing[0])
            while len(done) < len(wanted):
                if time.monotonic() > deadline:
                    missing = sorted(wanted - set(done))
                    raise TimeoutError(f"{len(missing)} run(s) not terminal in time: {missing[:5]}")
                take(tail.poll(0.1))
        finally:
            tail.close()
        return done


class EventTail:
    """Reads committed events from some partitions of the events topic, from the start.

    A record that does not decode is logged, kept in :attr:`bad_records`, passed to ``on_bad``
    (which may raise) and skipped.
    """

    def __init__(
        self,
        settings: Settings,
        partitions: list[int],
        *,
        topic: str,
        on_bad: Callable[[wire.BadRecord], None] | None = None,
    ) -> None:
        self.topic = topic
        self.partitions = partitions
        self._on_bad = on_bad
        #: Every record skipped so far because it does not decode, in the order read.
        self.bad_records: list[wire.BadRecord] = []
        self._consumer = clients.new_consumer(
            settings.bootstrap, f"{settings.group}-reader-unused", {"enable.partition.eof": True}
        )
        self._consumer.assign([clients.TopicPartition(topic, p, 0) for p in partitions])

    def poll(self, timeout: float) -> Iterator[EventEnvelope]:
        """Events that arrived, waiting at most ``timeout`` for the first one; decoded as they
        are iterated, so a bad record is reported in its place among them."""
        first = self._consumer.poll(timeout)
        batch = [] if first is None else [first, *self._consumer.consume(999, timeout=0)]
        return wire.decode_events(batch, on_bad=self.report)

    def read_to_end(
        self, *, timeout: float, progress: Callable[[int], None] | None = None
    ) -> list[EventEnvelope]:
        """Every committed event so far (up to each partition's last stable offset).

        ``progress`` is called with the running count every 10,000 events.
        """
        found: list[EventEnvelope] = []
        records = self.read_records_to_end(timeout=timeout)
        for envelope in wire.decode_events(records, on_bad=self.report):
            found.append(envelope)
            if progress is not None and len(found) % 10_000 == 0:
                progress(len(found))
        return found

    def report(self, bad: wire.BadRecord) -> None:
        """Log a record that is skipped because it does not decode, keep it, pass it on."""
        wire.log_bad_record(bad)
        self.bad_records.append(bad)
        if self._on_bad is not None:
            self._on_bad(bad)

    def read_records_to_end(self, *, timeout: float) -> list[Any]:
        """Every committed record (events and inbox records) up to the last stable offset."""
        return list(self.records_to_end(timeout=timeout))

    def records_to_end(self, *, timeout: float) -> Iterator[Any]:
        """:meth:`read_records_to_end` as the records arrive (none is kept)."""
        patience = time.monotonic() + timeout
        ends = {p: self._high_watermark(p, patience) for p in self.partitions}
        deadline = time.monotonic() + timeout
        while True:
            positions = self._consumer.position(
                [clients.TopicPartition(self.topic, p) for p in self.partitions]
            )
            if all(tp.offset >= ends[tp.partition] or ends[tp.partition] == 0 for tp in positions):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {self.topic} did not reach its end in time")
            for message in self._consumer.consume(num_messages=1000, timeout=0.1):
                if message.error() is None:
                    yield message

    def _high_watermark(self, partition: int, deadline: float) -> int:
        return high_watermark(self._consumer, self.topic, partition, deadline)

    def close(self) -> None:
        self._consumer.close()

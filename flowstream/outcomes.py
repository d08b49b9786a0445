"""Waiting for a command's outcome on the events topic, and what an outcome means to a client.

A client that sends a command notes the end of the events partition of the command's key first
(its outcome is written after the command, so after that end), then reads from there until an
outcome with the command's id appears: a final one (applied, noop, rejected) or ``parked``. A
``forwarded`` outcome sends the reader on to the partition of the run it names, from a little
before the forward was written (the next outcome is written after it, by another processor whose
clock may differ). :func:`answer` turns an outcome into a return value or the error it means.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from flowstream import wire
from flowstream.errors import (
    CommandParkedError,
    FlowError,
    RunNotFoundError,
    RunNotStartedError,
    error_from,
)
from flowstream.kafka import clients
from flowstream.model.messages import CommandOutcome, OutcomeStatus
from flowstream.partitioning import partition_for
from flowstream.settings import Settings

__all__ = ["MAX_FORWARDS", "OutcomeReader", "answer", "high_watermark", "new_command_id"]

#: How often one command's outcomes may send it on to another run: a token-only hook
#: resumption is sent on once, to the hook's run; a signal, cancellation or retry for a run
#: that continued as new once per hop of its chain to the active run. Past this many the
#: client stops following and raises (the command still applies).
MAX_FORWARDS = 64
#: A forwarded command's next outcome is looked for from this long before the forward was
#: written (the clocks of two processors may differ).
_FORWARD_SKEW_MS = 60_000
#: How long the broker may hold a fetch of the events topic that finds nothing.
_FETCH_WAIT_MS = 20
#: What a command is, in a sentence.
_WHAT = {
    "start_run": "start",
    "send_signal": "signal",
    "resume_hook": "hook resumption",
    "dispose_hook": "hook disposal",
    "cancel_run": "cancellation",
    "retry_run": "retry",
}

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


def new_command_id() -> str:
    """A new command id: 32 random hex digits."""
    return uuid.uuid4().hex


def answer(outcome: CommandOutcome) -> CommandOutcome:
    """``outcome`` if its command applied (or changed nothing); else raise the error it means:
    the class the processor named for a rejection, ``RunNotStartedError`` (a
    ``RunNotFoundError``) for a command parked for a run that does not exist yet, and
    ``CommandParkedError`` for one parked for another reason."""
    run_id = outcome.forwarded_to or outcome.key
    reason = outcome.reason or outcome.status.value
    what = _WHAT.get(outcome.command, outcome.command)
    if outcome.status is OutcomeStatus.REJECTED:
        raise error_from(outcome.error_kind, reason, run_id=run_id)
    if outcome.status is OutcomeStatus.PARKED:
        if outcome.error_kind == RunNotFoundError.__name__:
            raise RunNotStartedError(
                f"run {run_id} does not exist (yet): the {what} is parked until it starts "
                "(for the parked time-to-live at most)",
                run_id=run_id,
            )
        raise CommandParkedError(
            f"run {run_id}: the {what} is parked until it can apply: {reason}",
            run_id=run_id,
            kind=outcome.error_kind,
        )
    return outcome


def high_watermark(consumer: Any, topic: str, partition: int, deadline: float) -> int:
    """The partition's high watermark. A topic just created, or a leader just moved, answers
    "not leader" or "unknown partition" for a moment: asked again until ``deadline``."""
    while True:
        try:
            _, high = consumer.get_watermark_offsets(
                clients.TopicPartition(topic, partition), timeout=10, cached=False
            )
            return int(high)
        except clients.KafkaException as exc:
            error = exc.args[0]
            passing = error.retriable() or error.code() in _PASSING_ERRORS
            if not passing or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class OutcomeReader:
    """One ``read_committed`` consumer of the events topic (``topic``), assigned one partition at a
    time, made at the first use: it takes the ``outcome`` records (:func:`wire.outcomes_of`) and
    passes over the rest."""

    def __init__(self, settings: Settings, topic: str, partitions: int) -> None:
        self.settings = settings
        self.topic = topic
        self.partitions = partitions
        self._consumer: Any = None

    def _reader(self) -> Any:
        if self._consumer is None:
            # A read_committed fetch that finds nothing is held by the broker for up to
            # fetch.wait.max.ms (500 ms by default) even once the transaction it waits for
            # commits: each wait would end on that tick.
            self._consumer = clients.new_consumer(
                self.settings.bootstrap,
                f"{self.settings.group}-outcomes-unused",
                {"fetch.wait.max.ms": _FETCH_WAIT_MS},
            )
        return self._consumer

    def end(self, partition: int, deadline: float) -> int:
        """The end of an events partition now: a command sent after this has its outcome after
        it."""
        return high_watermark(self._reader(), self.topic, partition, deadline)

    def wait(
        self, command_id: str, key: str, partition: int, start: int, deadline: float
    ) -> CommandOutcome:
        """The first outcome of ``command_id`` from offset ``start`` of its events partition
        that is final or parked, following forwards to the partition of the run they name;
        ``TimeoutError`` past ``deadline``."""
        for _ in range(MAX_FORWARDS + 1):
            outcome, written_ms, offset = self._first(command_id, key, partition, start, deadline)
            if outcome.status is not OutcomeStatus.FORWARDED or outcome.forwarded_to is None:
                return outcome
            key = outcome.forwarded_to
            target = partition_for(key, self.partitions)
            if target == partition:  # the hook's run shares the partition: read on
                start = offset + 1
            else:
                partition = target
                start = self._offset_at(partition, written_ms - _FORWARD_SKEW_MS, deadline)
        raise FlowError(f"command {command_id} was sent on more than {MAX_FORWARDS} times")

    def _first(
        self, command_id: str, key: str, partition: int, start: int, deadline: float
    ) -> tuple[CommandOutcome, int, int]:
        """The first outcome of ``command_id`` at ``start`` or after, when it was written (ms
        since the epoch) and its offset."""
        reader = self._reader()
        reader.assign([clients.TopicPartition(self.topic, partition, start)])
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"no outcome of command {command_id} for {key} in time: is a processor "
                    f"running for partition {partition}? (the command stays on its topic)"
                )
            # poll returns at the first record (consume would wait out its timeout for 500).
            first = reader.poll(min(remaining, 0.5))
            batch = [] if first is None else [first, *reader.consume(500, timeout=0)]
            for message in batch:
                for outcome in wire.outcomes_of([message], command_id):
                    # Only the answer of the run it went to: a chain that comes back to a
                    # partition left the forwards of its earlier hops there, in the window
                    # read from (following one again went round the chain until the limit).
                    if outcome.key == key:
                        return outcome, int(message.timestamp()[1]), int(message.offset())

    def _offset_at(self, partition: int, written_ms: int, deadline: float) -> int:
        """The first offset of an events partition written at ``written_ms`` or later."""
        end = self.end(partition, deadline)
        tp = clients.TopicPartition(self.topic, partition, max(0, written_ms))
        (found,) = self._reader().offsets_for_times([tp], timeout=10)
        return end if found.offset < 0 else min(int(found.offset), end)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

"""``DeadLetters``: records for the dead-letter topic, with a minimal form to fall back on and a
bound on how often one input's dead letter may fail before it is left out."""

from __future__ import annotations

import logging
from typing import Any

from flowstream import codec
from flowstream.errors import SerializationError
from flowstream.model.messages import DeadLetter
from flowstream.processor.context import Context
from flowstream.processor.redact import redacted
from flowstream.processor.txn.slot import Record
from flowstream.topology import CMD_HOOK, DEADLETTER, EVENTS

__all__ = ["DeadLetters"]

LOG = logging.getLogger("flowstream.processor")

#: A dead letter that failed this many times (the transaction holding it aborted) goes out in
#: its minimal form (no key, no value); one more failure, and it is left out with a logged
#: reason, so one input can never stop the partitions of its member.
MINIMAL_AFTER = 1
LEFT_OUT_AFTER = 2
_REASON_CHARS = 1000


class DeadLetters:
    """Dead letters of one processor, and how often each input's failed."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        # (topic, partition, offset) of an input → how many transactions its dead letter failed.
        self._failures: dict[tuple[str, int, int], int] = {}

    def for_message(self, message: Any, reason: str) -> None:
        """Dead-letter a consumed command."""
        LOG.warning(
            "dead-lettered %s[%d]@%d: %s",
            message.topic(),
            message.partition(),
            message.offset(),
            reason,
        )
        self._send(
            message.topic(),
            message.partition(),
            message.offset(),
            message.key(),
            message.value(),
            reason,
        )

    def for_source(
        self, partition: int, key: bytes, raw: bytes | None, reason: str, *, source: str
    ) -> None:
        """Dead-letter what an inbox id (``topic:partition:offset``) or a run names."""
        topic, _, rest = source.rpartition(":")
        topic, _, part = topic.rpartition(":")
        self._send(
            topic or source,
            int(part) if part.isdigit() else partition,
            int(rest) if rest.isdigit() else 0,
            key,
            raw,
            reason,
        )

    def for_run(self, partition: int, run_id: str, reason: str) -> None:
        """Report a run whose decision failed (until a run-level failure record exists)."""
        self._send(self.ctx.topics[EVENTS], partition, 0, run_id.encode(), None, reason)

    def _send(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        reason: str,
    ) -> None:
        if value is not None:  # never a hook token in a dead letter (``redact``)
            value = redacted(value, may_hold_token=topic == self.ctx.topics[CMD_HOOK])
        failures = self._failures.get((topic, partition, offset), 0)
        if failures >= LEFT_OUT_AFTER:
            self.ctx.metrics.records_left_out.inc()
            LOG.error(
                "no dead letter for %s[%d]@%d: it failed %d times; moving past it (%s)",
                topic,
                partition,
                offset,
                failures,
                reason,
            )
            return
        self.ctx.metrics.dead_letters.inc()
        target = partition % self.ctx.deadletter_partitions
        minimal = Record(
            self.ctx.topics[DEADLETTER],
            target,
            b"",
            codec.encode_message(
                DeadLetter(
                    source_topic=topic,
                    partition=partition,
                    offset=offset,
                    reason=reason[:_REASON_CHARS],
                )
            ),
            droppable=True,
        )
        if failures >= MINIMAL_AFTER:
            self.ctx.pipeline.produce(minimal)
            return
        record = DeadLetter(
            source_topic=topic,
            partition=partition,
            offset=offset,
            key=key,
            reason=reason,
            value=value,
        )
        self.ctx.pipeline.produce(
            Record(
                minimal.topic,
                target,
                key or b"",
                codec.encode_message(record),
                fallback=minimal,
            )
        )

    def blame(self, failed: list[tuple[str, bytes | None]]) -> None:
        """An aborted transaction's records that failed: count each dead letter's input."""
        topic = self.ctx.topics[DEADLETTER]
        for failed_topic, value in failed:
            if failed_topic != topic or not value:
                continue
            try:
                letter = codec.decode_dead_letter(value)
            except SerializationError:
                continue
            source = (letter.source_topic, letter.partition, letter.offset)
            self._failures[source] = self._failures.get(source, 0) + 1
            LOG.warning("the dead letter of %s[%d]@%d failed (%d)", *source, self._failures[source])

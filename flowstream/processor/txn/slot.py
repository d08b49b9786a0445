"""``ProducerSlot``: one of the two transactional producers, its lane, and what its delivery
reports said; ``Record``: one record a transaction produces."""

from __future__ import annotations

import logging
import secrets
import sys
import threading
from typing import Any, NamedTuple

from flowstream.kafka import clients
from flowstream.processor.lane import Lane

__all__ = ["ProducerSlot", "Record", "new_writer", "transactional_ids"]

LOG = logging.getLogger("flowstream.processor")


def new_writer(instance: str) -> str:
    """A writer id for ``instance``: ``<instance>/<token>``, the token new each call."""
    return f"{instance}/{secrets.token_hex(4)}"


def transactional_ids(group: str, writer: str) -> list[str]:
    """The transactional ids of the two producers of ``writer`` in ``group``:
    ``<group>/<instance>/<token>`` and the same with ``#1``. An instance id has neither ``/``
    nor ``#`` (``Settings``) and a token is hex, so no two writers share an id."""
    return [f"{group}/{writer}", f"{group}/{writer}#1"]


class Record(NamedTuple):
    """A record to produce in a transaction (a named tuple: one is made per event produced,
    and a tuple costs a quarter of a frozen dataclass).

    ``fallback`` is produced instead when ``produce()`` refuses this one at once (an unknown
    partition, a record over the size limit): a dead letter falls back to its minimal form.
    ``droppable`` records (dead letters) are left out, with a logged reason, when their fallback
    is refused too; any other refused record fails the transaction before it commits.
    """

    topic: str
    partition: int
    key: bytes
    value: bytes
    headers: Any = None
    fallback: Record | None = None
    droppable: bool = False


class ProducerSlot:
    """One transactional producer, the lane of its blocking calls, and its transaction's
    delivery bookkeeping."""

    def __init__(self, index: int, lane: Any = None) -> None:
        self.index = index
        self.producer: Any = None
        #: The next producer, being made ahead of need (``PipelineRecovery.ensure_producer``).
        self.prepared: Any = None
        #: The writer id the producer was made for (named in the positions it records).
        self.writer = ""
        self.lane: Any = lane if lane is not None else Lane(f"flowstream-commit-{index}")
        # Bumped with each new producer: reports of a replaced one are ignored.
        self.generation = 0
        # A Kafka transaction was begun on it and has not ended (committed or aborted).
        self.begun = False
        self.error: Any = None
        # Records that failed (refused by produce() or in a delivery report): topic, value.
        self.failed: list[tuple[str, bytes | None]] = []
        # The end offset of the last record written to each events partition.
        self.events_end: dict[int, int] = {}
        self.events_topic = ""
        self._lock = threading.Lock()

    def begin(self) -> None:
        """Begin a transaction on this producer; the last one's delivery reports are forgotten."""
        self.producer.begin_transaction()
        self.begun = True
        self.error = None
        self.failed.clear()
        self.events_end.clear()

    def delivered(self, err: Any, message: Any) -> None:
        """A delivery report of this slot's current producer."""
        if err is not None:
            self.error = self.error or err
            if len(self.failed) < 16:
                self.failed.append((message.topic(), message.value()))
        elif message.topic() == self.events_topic:
            end = message.offset() + 1
            partition = message.partition()
            # Reports are served by the loop's poll (a full queue) and by the lane's flush.
            with self._lock:
                if end > self.events_end.get(partition, 0):
                    self.events_end[partition] = end

    def send(self, record: Record) -> None:
        """Produce ``record`` (or its fallback); a refusal fails the transaction, except for a
        droppable record, which is left out with a logged reason."""
        current: Record | None = record
        while current is not None:
            error = self._produce(current)
            if error is None:
                return
            if current.fallback is None:
                if current.droppable:
                    LOG.error(
                        "left out a record for %s[%d]: the producer refused it (%s)",
                        current.topic,
                        current.partition,
                        error,
                    )
                    return
                self.error = self.error or error
                if len(self.failed) < 16:
                    self.failed.append((current.topic, current.value))
                return
            LOG.warning(
                "the producer refused a record for %s[%d] (%s): producing its minimal form",
                current.topic,
                current.partition,
                error,
            )
            current = current.fallback

    def _produce(self, record: Record) -> Any:
        producer = self.producer
        while True:
            try:
                producer.produce(
                    record.topic,
                    value=record.value,
                    key=record.key,
                    partition=record.partition,
                    headers=record.headers,
                )
                return None
            except BufferError:
                producer.poll(0.05)
            except clients.KafkaException as exc:
                return exc.args[0]

    def flush(self) -> None:
        """Deliver what is queued, at shutdown; a fenced producer has nothing to deliver."""
        if self.producer is None:
            return
        try:
            self.producer.flush(5)
        except:  # noqa: E722 - a bare KafkaError once fenced: see ``clients.as_exception``
            LOG.debug("producer %d: %s", self.index, clients.as_exception(sys.exc_info()[1]))

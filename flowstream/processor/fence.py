"""``OwnerFence``: on taking partitions, abort what their previous writer left open.

A member that dies with a transaction open holds back the partitions that transaction touched:
its records hold each events partition's last stable offset, which the next owner's restore
waits for. Left alone, the coordinator aborts the transaction once it is
``transaction.timeout.ms`` old, and failover takes at least that long. And a member that lost
its partitions without knowing (paused, cut off) could still commit into them.

So every position a member commits to the group names its writer (``<instance>/<token>``, the
``metadata`` of the offset): its claim of the partitions before its first transaction
(``TaskManager.claim``) and the positions that follow its commits. The writer's two producers
have transactional ids made from it (``txn.slot.transactional_ids``). A member gets a new
writer, so new producers, each time it loses its partitions (revoked or lost:
``TransactionPipeline.retire``). On an assignment the new owner reads the last committed
positions without waiting for stable ones (a ``read_uncommitted`` client of the group, which
never joins it), and initialises the transactional ids of every writer it finds that is not its
own: the coordinator aborts what they had open and fences those producers. A dead or paused
member's transaction ends at once; a live member that gave the partitions up in a rebalance
committed first and writes under a new writer since, so fencing its old ids costs it nothing. If
the lookup fails, the coordinator's timeout still ends the transaction, later.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from flowstream.kafka import clients
from flowstream.processor.context import Context
from flowstream.processor.txn.slot import transactional_ids

__all__ = ["OwnerFence"]

LOG = logging.getLogger("flowstream.processor")

#: The longest an assignment waits for the fences (the coordinator's timeout is the fallback).
_FENCE_S = 10.0
#: Attempts per transactional id, started this far apart. The first ``InitProducerId`` of an id
#: with a transaction open makes the coordinator abort it and answer "concurrent transactions"
#: until the abort markers are written; librdkafka asks again only 500 ms later, whatever the
#: retry backoff. Attempts staggered by a fraction of that learn sooner that the abort is done;
#: each one that succeeds only bumps the dead writer's epoch again. Measured on one broker: the
#: abort is done 60-90 ms after the first attempt; attempts 40 ms apart fence in 0.14-0.22 s,
#: 120 ms apart in about 0.5 s (the first attempt's own retry).
_ATTEMPTS = 8
_STAGGER_S = 0.04
#: A group coordinator that is moving (a broker died, or leaders went back to their preferred
#: brokers) answers the read of the previous writers with one of these at once, and librdkafka
#: does not ask again: the read is asked again for this long. Given up, the dead writer's open
#: transaction held a partition's restore until the coordinator's timeout (10.46 s in a chaos
#: run, against 2-3 s for the other partitions).
_MOVING = frozenset(
    {
        clients.KafkaError.NOT_COORDINATOR,
        clients.KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        clients.KafkaError.COORDINATOR_NOT_AVAILABLE,
    }
)
_READ_PATIENCE_S = 5.0
_READ_AGAIN_S = 0.1


class OwnerFence:
    """Fences the transactional ids of the previous writers of the partitions taken."""

    def __init__(self, ctx: Context, new_reader: Callable[[], Any]) -> None:
        self.ctx = ctx
        self._new_reader = new_reader
        self._reader: Any = None
        #: Writers fenced by this member (for tests and the log).
        self.fenced: list[str] = []
        #: Every writer id this member has had: never fenced by it.
        self.mine: set[str] = set()

    def prepare(self, topic: str) -> None:
        """Connect the reader to the group's coordinator now (a position of ``topic``), so the
        first assignment does not wait for that; never raises."""
        try:
            if self._reader is None:
                self._reader = self._new_reader()
            self._reader.committed([clients.TopicPartition(topic, 0)], timeout=5)
        except clients.KafkaException as exc:
            LOG.info("the fence's reader is not connected yet (%s)", exc)

    def previous_writers(self, assigned: list[Any]) -> set[str]:
        """The writers of the last committed positions of ``assigned`` that are not this
        member's (asked again while the group's coordinator moves)."""
        if self._reader is None:
            self._reader = self._new_reader()
        self.mine.add(self.ctx.writer)
        wanted = [clients.TopicPartition(tp.topic, tp.partition) for tp in assigned]
        deadline = time.monotonic() + _READ_PATIENCE_S
        while True:
            try:
                found = self._reader.committed(wanted, timeout=5)
                break
            except clients.KafkaException as exc:
                if exc.args[0].code() not in _MOVING or time.monotonic() > deadline:
                    raise
                time.sleep(_READ_AGAIN_S)
        return {tp.metadata for tp in found if tp.metadata and tp.metadata not in self.mine}

    def writers_of(self, assigned: list[Any]) -> set[str]:
        """:meth:`previous_writers`, or none when they cannot be read (a shortcut only: the
        coordinator's timeout still ends what they left open); never raises."""
        try:
            return self.previous_writers(assigned)
        except clients.KafkaException as exc:
            LOG.info("previous writers not read (%s): not fenced", exc)
            return set()

    def fence(self, assigned: list[Any], writers: set[str] | None = None) -> None:
        """Abort what the previous writers of ``assigned`` (``writers``, read before the
        member's claim replaced them; else read now) left open; never raises."""
        began = time.monotonic()
        if writers is None:
            writers = self.writers_of(assigned)
        if not writers:
            return
        group = self.ctx.settings.group
        ids = [t for writer in sorted(writers) for t in transactional_ids(group, writer)]
        answers: dict[str, queue.SimpleQueue[bool]] = {t: queue.SimpleQueue() for t in ids}
        fenced = {t: threading.Event() for t in ids}
        for attempt in range(_ATTEMPTS):
            for t in ids:
                threading.Thread(
                    target=self._attempt,
                    args=(t, attempt * _STAGGER_S, fenced[t], answers[t]),
                    name=f"fence-{attempt}",
                    daemon=True,
                ).start()
        done = [self._first_success(answers[t], began) for t in ids]
        self.fenced.extend(sorted(writers))
        self.ctx.metrics.owner_fences.inc(len(writers))
        LOG.info(
            "fenced the transactional ids of %s (previous writers of the partitions taken) "
            "in %.2f s: %d of %d",
            ", ".join(sorted(writers)),
            time.monotonic() - began,
            sum(done),
            len(ids),
        )

    @staticmethod
    def _first_success(answers: queue.SimpleQueue[bool], began: float) -> bool:
        """Whether an attempt fenced the id, as soon as one did (the others end by themselves)."""
        for _ in range(_ATTEMPTS):
            try:
                if answers.get(timeout=max(0.0, began + _FENCE_S + 1 - time.monotonic())):
                    return True
            except queue.Empty:
                return False
        return False

    def _attempt(
        self,
        transactional_id: str,
        delay: float,
        fenced: threading.Event,
        answers: queue.SimpleQueue[bool],
    ) -> None:
        if fenced.wait(delay):
            answers.put(False)
            return
        producer = clients.new_transactional_producer(
            self.ctx.settings.bootstrap,
            transactional_id,
            {
                "transaction.timeout.ms": 60_000,
                # The coordinator answers "concurrent transactions" until the abort markers of
                # what it aborts are written (a few ms): ask again soon, not after 100 ms, 200...
                "retry.backoff.ms": 10,
                "retry.backoff.max.ms": 50,
            },
        )
        try:
            producer.init_transactions(_FENCE_S)
            fenced.set()
            answers.put(True)
        except clients.KafkaException as exc:
            if delay == 0:
                LOG.info("transactional id %s not fenced (%s)", transactional_id, exc)
            answers.put(False)
        finally:
            producer.flush(0)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

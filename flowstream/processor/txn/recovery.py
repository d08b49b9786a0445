"""``PipelineRecovery``: how the transaction pipeline aborts, gives up a hung producer, and
replaces fenced producers."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from flowstream.kafka import clients
from flowstream.processor.lane import Lane
from flowstream.processor.txn.errors import is_fatal, retrying
from flowstream.processor.txn.slot import ProducerSlot
from flowstream.processor.txn.state import PipelineHost, Txn, TxnState

__all__ = ["MAX_RESETS", "RESET_WINDOW_S", "PipelineRecovery"]

LOG = logging.getLogger("flowstream.processor")

#: More producer resets than this within the window mean another process has this instance id.
MAX_RESETS = 10
RESET_WINDOW_S = 60.0
#: How long a transaction waits for a producer made ahead before making its own.
PREPARE_WAIT_S = 30.0
#: A wait for a lane call looks this often whether a send of positions hangs.
_WAIT_SLICE_S = 0.1


class PipelineRecovery:
    """The failure half of ``TransactionPipeline``."""

    host: PipelineHost
    slots: tuple[ProducerSlot, ProducerSlot]
    open: Txn | None
    spare: Txn | None
    sealed: Txn | None
    stuck_s: float
    metrics: Any
    forget_positions: Callable[[], None]  # ``TransactionPipeline``'s
    #: Aborts so far (a reset counts): a caller can tell whether its call rewound the consumer.
    aborts: int
    _resets: list[float]
    _slot: ProducerSlot
    _new_producer: Callable[..., Any]
    _clock: Callable[[], float]

    _preparer: Any

    def ensure_producer(self, slot: ProducerSlot) -> None:
        """Make the slot's producer if a reset left it to be made (or take the one made ahead,
        if it was made in time)."""
        if slot.producer is not None:
            return
        prepared, slot.prepared = slot.prepared, None
        if prepared is not None:
            generation, future = prepared
            if generation == slot.generation:  # else a producer was made since, and replaced
                if Lane.wait(future, PREPARE_WAIT_S) and future.exception() is None:
                    slot.producer = future.result()
                    return
                LOG.info("producer %d was not made ahead in time: making it now", slot.index)
        slot.producer = self._new_producer(slot)

    def _prepare(self) -> None:
        """Make both next producers on the preparing lane, in order (``ensure_producer`` takes
        them); a slot's earlier preparation, not taken yet, is given up."""
        if self._preparer is None:
            return
        for slot in self.slots:
            make = self._new_producer(slot, ahead=True)
            slot.prepared = (slot.generation, self._preparer.submit(make))

    def wait(self, future: Future[Any], patience: float | None = None) -> bool:
        """Wait for a lane call; False if it ran into the stuck limit (or ``patience``)."""
        lane = self.slots[0].lane
        deadline = time.monotonic() + (self.stuck_s if patience is None else patience)
        while True:
            left = deadline - time.monotonic()
            if lane.wait(future, max(0.0, min(left, _WAIT_SLICE_S))):
                return True
            if left <= 0:
                return False

    def abort(
        self,
        reason: str,
        *,
        retake: bool = True,
        fatal: clients.KafkaException | None = None,
        patience: float | None = None,
    ) -> None:
        """Abort the open, spare and sealed transactions and let the host rewind. A fenced
        producer (``fatal``, or found when aborting) is replaced: no transactional call can
        succeed on it, not even an abort."""
        LOG.warning("aborting transaction: %s", reason)
        self.metrics.aborts.inc()
        self.aborts += 1
        self.forget_positions()
        txns = [t for t in (self.open, self.spare, self.sealed) if t is not None]
        for txn in txns:
            for pending in (txn.fence, txn.commit):
                if pending is not None and not self.wait(pending, patience):
                    self.give_up(retake=retake)
                    return
        failed = [record for slot in self.slots for record in slot.failed]
        fenced = fatal
        for slot in self.slots:
            if fenced is None and slot.error is not None and is_fatal(slot.error):
                fenced = clients.KafkaException(slot.error)
        for slot in self.slots:
            if not slot.begun or fenced is not None:
                continue
            try:
                retrying(functools.partial(slot.producer.abort_transaction, 30), attempts=20)
                slot.begun = False
            except clients.KafkaException as exc:
                # _CONFLICT: a commit call that failed is still unfinished in librdkafka, so
                # no abort can go through on this producer either: replace it as if fenced.
                if exc.args[0].fatal() or exc.args[0].code() == clients.KafkaError._CONFLICT:
                    fenced = exc
                else:
                    # The coordinator is unreachable for now; librdkafka keeps the producer in
                    # the abort-required state, so the next begin fails until an abort works.
                    LOG.error("abort did not complete: %s", exc)
        self._end(txns)
        if fenced is not None:
            self.reset(fenced, retake=retake)
            return
        for slot in self.slots:
            slot.error = None
            slot.failed.clear()
        self.host.aborted(failed)

    def retire(self, new_writer: Callable[[], None]) -> None:
        """Give both producers up once the partitions went (revoked after their commit, or
        lost): ``new_writer`` names the next ones, made when a transaction needs them. The
        next owner then fences the old ids (``processor.fence``) without touching this
        member's transactions."""
        self._end([t for t in (self.open, self.spare, self.sealed) if t is not None])
        for slot in self.slots:
            if slot.producer is not None:
                with contextlib.suppress(Exception):
                    slot.producer.purge()
            slot.producer = None
            slot.error = None
            slot.failed.clear()
            slot.begun = False
        self._slot = self.slots[0]
        self.forget_positions()
        new_writer()
        self._prepare()

    def _end(self, txns: list[Txn]) -> None:
        for txn in txns:
            txn.state = TxnState.ABORTED  # from any state: what Kafka holds is thrown away
        self.open = self.spare = self.sealed = None

    def give_up(self, *, retake: bool) -> None:
        """A transactional call never returned: leave it and its lane behind, and replace the
        producers as if fenced (a new one's ``init_transactions`` aborts what the old had)."""
        why = f"hangs (over {self.stuck_s:.0f} s)"
        self.metrics.aborts.inc()
        self.aborts += 1
        for slot in self.slots:
            slot.lane = slot.lane.abandon()
        self._end([t for t in (self.open, self.spare, self.sealed) if t is not None])
        error = clients.KafkaException(
            clients.KafkaError(clients.KafkaError._TIMED_OUT, "a transactional call never returned")
        )
        self.reset(error, retake=retake, why=why)

    def reset(self, error: clients.KafkaException, *, retake: bool, why: str = "is fenced") -> None:
        """Replace both producers and let the host take every partition again from the events
        topic, which holds whatever really committed.

        A fatal producer error means this ``transactional.id`` got a newer epoch: the
        coordinator aborted a transaction that outlived ``transaction.timeout.ms``, or another
        process runs with this instance id. Resets that repeat (``MAX_RESETS`` within
        ``RESET_WINDOW_S``) are raised.
        """
        now = self._clock()
        self._resets = [t for t in self._resets if now - t < RESET_WINDOW_S] + [now]
        if len(self._resets) > MAX_RESETS:
            raise error
        LOG.error("the producer %s (%s); replacing it", why, error)
        self.aborts += 1
        self.forget_positions()
        self.metrics.producer_resets.inc()
        self._end([t for t in (self.open, self.spare, self.sealed) if t is not None])
        for slot in self.slots:
            try:
                slot.producer.purge()
            except Exception:
                LOG.debug("purge failed on producer %d", slot.index)
            slot.error = None
            slot.failed.clear()
            slot.begun = False
            # Given up with its partitions (lost, revoked): the new producer is made when the
            # next transaction needs it, not in the rebalance callback, where a coordinator
            # that is gone would hold every member of the group back.
            slot.producer = None
        if retake:
            self._remake()
        self._slot = self.slots[0]
        self.host.retake(retake)

    def _remake(self) -> None:
        """Make both producers again, side by side: each ``init_transactions`` waits until the
        coordinator has aborted what the old producer of its id left open, which takes seconds
        while a broker fails over (``CONCURRENT_TRANSACTIONS`` is retried every 500 ms)."""
        made: list[Future[Any]] = []
        for slot in self.slots:
            lane = Lane(f"flowstream-remake-{slot.index}")
            made.append(lane.submit(self._new_producer, slot))
            lane.close()
        for slot, future in zip(self.slots, made, strict=True):
            slot.producer = future.result()

"""``TransactionPipeline``: the processor's Kafka transactions, two producers taking turns.

Each transaction is a :class:`Txn` whose state moves only along :data:`TRANSITIONS`:

    BEGUN ──▶ FENCING ──▶ OPEN ──▶ SEALED ──▶ COMMITTED
      └──────────┴──────────┴────────┴──────▶ ABORTED

* **BEGUN**: ``begin_transaction`` ran on its producer while nothing was owned (no positions).
  Its records wait; sealed like this, it aborts (an ungated transaction never commits).
* **FENCING**: its gate call is queued on its lane behind the transaction before it (the one
  sealed, or the open one for a spare): it registers the transaction's anchors, once that one's
  records are written. Its records wait in memory.
* **OPEN**: the gate call went through, and the transaction before it (if one commits) has
  written its records (``precommit``): records are produced directly.
* **SEALED**: nothing more joins it. Its lane produces what was held back, with the positions
  of each events partition whose command positions it moved, waits until every record is
  written (``precommit``), checks that no record failed, and commits. At most one transaction is
  sealed at a time.

The positions travel on the last record the transaction writes to the partition anyway: each
OPEN transaction holds back the last record of each events partition (``Txn.tails``; the one
before goes out as the next arrives), and the seal adds the partition's positions to it as a
``flowstream-positions`` header. Only a partition it moved without writing to gets a record of
kind ``positions`` of its own. (A record apiece was a fifth of the events topic's records.)

The positions are records of the transaction, not offsets sent to the group's coordinator
(``send_offsets_to_transaction``): a transaction then involves only its own coordinator and the
leaders of the partitions it writes, so a SIGKILL of the group coordinator's broker stalls no
transaction of any member (it stalled every one for 3-16 s while the positions went there).
Zombie members are fenced by their transactional ids instead of by the group's generation
(``processor.fence``: each owner claims a partition under its writer id before it writes, and
the next owner fences the ids of the writer it finds). The group's offsets follow the committed
positions outside the transactions (``PartitionHost.settled``).

The ordering gates, checked in code rather than promised in comments:

1. a record is produced only by an OPEN transaction (:meth:`TransactionPipeline._gate_open`):
   its own fence is done and the sealed one's ``precommit`` is set, so its records land after
   the sealed one's in every partition, and its positions after the sealed one's (the group
   keeps the positions written last): every fence of a transaction begun while another commits
   is chained on that one's ``precommit`` (the lane runs it only after);
2. nothing commits after a produce error: the lane checks the slot's errors after the last
   record is written and before ``commit_transaction``; an error found after the commit is not
   an abort (Kafka kept the transaction) but an :class:`InDoubt` outcome, and the partitions are
   restored from the events topic;
3. every transaction that commits went through its gate, and records the positions of every
   partition it moved (a transaction sealed while nothing is owned aborts);
4. a transaction opened while another commits commits only after it: a seal waits until no
   transaction is sealed.

The next transaction is begun on the other producer while the open one still decides (the
*spare*), so it never waits for the coordinator to finish the previous one
(``CONCURRENT_TRANSACTIONS``). An abort of either throws both away (the open one was decided on
top of the sealed one); a fenced producer replaces both.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from flowstream import wire
from flowstream.kafka import clients
from flowstream.processor.txn.errors import Abort, InDoubt, is_fatal, retrying
from flowstream.processor.txn.recovery import PipelineRecovery
from flowstream.processor.txn.slot import ProducerSlot, Record
from flowstream.processor.txn.state import PipelineHost, Txn, TxnState
from flowstream.processor.txn.view import PipelineView

__all__ = ["TransactionPipeline"]

LOG = logging.getLogger("flowstream.processor")

POSITIONS = wire.POSITIONS_HEADERS

#: A commit that takes longer than this logs where it waited (the gate, the records, the commit).
SLOW_COMMIT_S = 1.0


def _report_slow(number: int, stamps: tuple[float, float, float, float]) -> None:
    """Where a commit slower than ``SLOW_COMMIT_S`` since its seal waited: for the gate (the
    lane included), its records, or the commit itself (a broker's failure shows in one)."""
    sealed, gated, written, done = stamps
    if done - sealed > SLOW_COMMIT_S:
        LOG.info(
            "transaction %d: gate %.2f s, records written %.2f s, committed %.2f s",
            *(number, gated - sealed, written - gated, done - written),
        )


def _tell_when_open(txn: Txn, precommit: Future[None], on_done: Callable[[Any], None]) -> None:
    """``on_done`` as the promoted ``txn`` may open: once the sealed one's records are written
    (``precommit``) and its own fence went through, whichever is last."""
    precommit.add_done_callback(on_done)
    fence = txn.fence
    if fence is not None and not fence.done():  # begun without a wake (``begin_spare``)
        fence.add_done_callback(on_done)


class TransactionPipeline(PipelineRecovery, PipelineView):
    """The open, spare and sealed transactions over two producer slots."""

    def __init__(
        self,
        host: PipelineHost,
        new_producer: Callable[[ProducerSlot], Any],
        *,
        stuck_s: float,
        metrics: Any,
        events_topic: str,
        lanes: tuple[Any, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        prepare: Any = None,
    ) -> None:
        self.host = host
        #: A lane that makes the next producers ahead of need once the partitions went
        #: (``retire``), so a new owner's first transaction does not wait for their
        #: ``init_transactions``; without one they are made when needed.
        self._preparer = prepare
        self._new_producer = new_producer
        self.stuck_s = stuck_s
        self.metrics = metrics
        self._lanes = lanes
        self._clock = clock
        self.slots = (ProducerSlot(0, lanes and lanes[0]), ProducerSlot(1, lanes and lanes[1]))
        for slot in self.slots:
            slot.events_topic = events_topic
        self._events_topic = events_topic
        #: The slot the next open transaction begins on (never the sealed one's).
        self._slot = self.slots[0]
        self.open: Txn | None = None
        self.spare: Txn | None = None
        self.sealed: Txn | None = None
        self._numbers = 0
        #: The position of each command partition (topic, partition) as last recorded by a
        #: transaction that is sealed or committed; a seal records those that differ.
        self._recorded: dict[tuple[str, int], int] = {}
        #: The positions list ``_recorded`` was last compared with (the host hands out the
        #: same list while nothing moved: most seals are one identity test).
        self._recorded_list: list[Any] | None = None
        self._resets: list[float] = []
        self._began_commit = 0.0
        self.aborts = 0
        #: Called (in a lane's thread) as each fence and commit finishes, so a loop that waits
        #: for either goes on at once instead of at its next poll.
        self.on_done: Callable[[Future[Any]], None] | None = None

    def start(self) -> None:
        for slot in self.slots:
            slot.producer = self._new_producer(slot)

    def forget_positions(self) -> None:
        """What was recorded may be thrown away (an abort, new producers): the next seal records
        every position again."""
        self._recorded = {}
        self._recorded_list = None

    # -- opening -------------------------------------------------------------------------------

    def begin(self) -> Txn:
        """The open transaction, begun on Kafka if it is not; decisions now join it."""
        txn = self.open if self.open is not None else self._begin_on_kafka()
        if not txn.decided:
            txn.decided = True
            txn.began = self._clock()
            txn.commands = 0
            txn.idle_since = None
        return txn

    def produce(self, record: Record) -> None:
        """Produce ``record`` in the open transaction, or hold it until the fence went through."""
        txn = self.begin()
        if txn.state is TxnState.OPEN:
            self._send(txn, record)
        else:
            txn.deferred.append(record)

    def produce_all(self, records: list[Record]) -> None:
        """``produce`` each of ``records``, in order (one append's events)."""
        txn = self.begin()
        if txn.state is TxnState.OPEN:
            for record in records:
                self._send(txn, record)
        else:
            txn.deferred.extend(records)

    def _send(self, txn: Txn, record: Record) -> None:
        """Produce ``record`` in the OPEN ``txn``; a record of the events topic is held back in
        its partition's tail, and the one it replaces goes out."""
        if record.topic == self._events_topic:
            tails = txn.tails
            held = tails.get(record.partition)
            tails[record.partition] = record
            if held is None:
                return
            record = held
        txn.slot.send(record)

    def _begin_on_kafka(self, anchors: list[int] | None = None) -> Txn:
        """Begin a transaction on the open slot and queue its gate call on its lane, after the
        sealed one's records; ``anchors``: events partitions to register with it in that call,
        each by an empty record (every reader skips it)."""
        slot = self._slot
        self._numbers += 1
        txn = Txn(self._numbers, slot, opened=self._clock())
        self.open = txn
        try:
            self.ensure_producer(slot)
            try:
                slot.begin()
            except clients.KafkaException as exc:
                if exc.args[0].fatal():
                    raise
                retrying(lambda: slot.producer.abort_transaction(30), attempts=20)
                slot.begin()
        except clients.KafkaException as exc:
            # Fenced: the work goes on into a transaction that cannot commit, and its seal
            # replaces the producers. (Callers are in the middle of a decision.)
            slot.error = exc.args[0]
            return txn
        if self.host.positions():
            self._fence(txn, anchors or [], after=self._precommit())
        return txn

    def _precommit(self) -> Future[None] | None:
        return None if self.sealed is None else self.sealed.precommit

    def _fence(
        self,
        txn: Txn,
        anchors: list[int],
        *,
        after: Future[Any] | None,
        wake: bool = True,
    ) -> None:
        """Submit ``txn``'s gate call (which registers its anchors) to run once ``after`` is
        done (FENCING until it returned); ``wake``: the loop waits for it."""
        if txn.state is TxnState.BEGUN:
            txn.move(TxnState.FENCING)
        before = txn.fence
        txn.fence = txn.slot.lane.submit(
            self._send_fence,
            txn,
            anchors,
            before,
            after,
            after=after,
            patience=self.stuck_s,
        )
        if wake and self.on_done is not None:
            txn.fence.add_done_callback(self.on_done)

    def _send_fence(
        self,
        txn: Txn,
        anchors: list[int],
        before: Future[None] | None,
        prior: Future[Any] | None,
    ) -> None:
        """In the slot's lane: register the anchors, unless this transaction's earlier gate call
        (``before``) or the call it waited for (``prior``: the sealed one's ``precommit``, or the
        open one's gate) failed."""
        slot = txn.slot
        for earlier in (before, prior):
            if earlier is not None and earlier.exception() is not None:
                raise Abort(f"the transaction before it failed: {earlier.exception()}")
        for partition in anchors:
            slot.send(Record(slot.events_topic, partition, b"", b"", wire.ANCHOR_HEADERS))
        if anchors:
            slot.producer.flush(30)
        if slot.error is not None and is_fatal(slot.error):
            raise clients.KafkaException(slot.error)

    def _record_positions(self, records: list[Record], offsets: list[Any], writer: str) -> None:
        """Write the positions of each partition of ``offsets`` that differ from those last
        recorded (the seal's: recorded from then on) onto the last of ``records`` (what the
        transaction has left to produce) on its events partition; a partition without one gets
        a ``positions`` record. A record with a fallback or one that may be left out carries
        none: the positions must commit with the transaction."""
        moved = self._moved(offsets)
        if not moved:
            return
        topic = self._events_topic
        last: dict[int, int] = {}
        for index, record in enumerate(records):
            if record.topic == topic and record.fallback is None and not record.droppable:
                last[record.partition] = index
        for partition, positions in moved.items():
            value = wire.positions_value(writer, positions)
            at = last.get(partition)
            if at is None:
                records.append(Record(topic, partition, b"", value, POSITIONS))
                continue
            record = records[at]
            headers = [*(record.headers or ()), (wire.POSITIONS_HEADER, value)]
            records[at] = record._replace(headers=headers)

    def _moved(self, offsets: list[Any]) -> dict[int, dict[str, int]]:
        """The positions of each partition of ``offsets`` where any differs from those last
        recorded, by command topic; recorded from then on."""
        if offsets is self._recorded_list:
            return {}
        recorded = self._recorded
        moved: dict[int, dict[str, int]] = {}
        for tp in offsets:
            key = (tp.topic, tp.partition)
            if recorded.get(key) != tp.offset:
                recorded[key] = tp.offset
                moved.setdefault(tp.partition, {})
        self._recorded_list = offsets
        if moved:
            for tp in offsets:
                if tp.partition in moved:
                    moved[tp.partition][tp.topic] = tp.offset
        return moved

    def release(self) -> None:
        """Once the open transaction's fence went through (and so the sealed one's records
        were written), its held records go out and the next go out directly."""
        txn = self.open
        if txn is None or txn.state is not TxnState.FENCING or not self._gate_open(txn):
            return
        txn.move(TxnState.OPEN)
        records, txn.deferred = txn.deferred, []
        for record in records:
            self._send(txn, record)

    def _gate_open(self, txn: Txn) -> bool:
        fence = txn.fence
        if fence is None or not fence.done() or fence.exception() is not None:
            return False
        precommit = self._precommit()
        return precommit is None or (precommit.done() and precommit.exception() is None)

    def begin_spare(self) -> None:
        """Begin the transaction after the open one on the other producer while nothing is
        sealed; its gate call runs after the open one's."""
        txn = self.open
        if self.spare is not None or self.sealed is not None or txn is None:
            return
        if txn.fence is None or not (txn.decided or txn.eager):
            return
        slot = self._other(txn.slot)
        if slot.begun or slot.producer is None:
            return
        if not self.host.positions():
            return
        try:
            slot.begin()
        except clients.KafkaException:
            return  # begun as usual when it is needed, and the error met then
        self._numbers += 1
        spare = Txn(self._numbers, slot, opened=self._clock())
        self.spare = spare
        self._fence(spare, [], after=txn.fence, wake=False)  # waited once promoted

    def _other(self, slot: ProducerSlot) -> ProducerSlot:
        return self.slots[1 - slot.index]

    # -- sealing and committing --------------------------------------------------------------

    def seal(self, *, retake: bool = True, reopen: bool = True) -> None:
        """Seal the open transaction and hand its commit to its slot's lane; with ``reopen``, a
        transaction that carried decisions is followed at once by the next (on the other
        producer), anchored where the steps it starts will report."""
        if self.sealed is not None:
            raise AssertionError("a transaction is sealed already: settle it first")
        offsets = self.host.positions()
        if not offsets:
            self.abort("no valid consumer positions to gate the transaction", retake=retake)
            return
        txn = self.open if self.open is not None else self._begin_on_kafka()
        if txn.state is TxnState.BEGUN and txn.slot.error is None:
            self._fence(txn, [], after=None)  # begun while nothing was owned
        self.release()
        records, txn.deferred = txn.deferred, []
        records.extend(txn.tails.values())
        txn.tails = {}
        self._record_positions(records, offsets, txn.slot.writer)
        txn.sealed = self.host.seal()
        eager = txn.decided and reopen
        txn.move(TxnState.SEALED)
        txn.precommit = Future()
        fence, txn.fence = txn.fence, None
        self._began_commit = self._clock()
        txn.commit = txn.slot.lane.submit(self._commit_blocking, txn, fence, records)
        if self.on_done is not None:
            txn.commit.add_done_callback(self.on_done)
        self.sealed = txn
        self.open = None
        self._slot = self._other(txn.slot)
        anchors = self.host.anchors(txn.sealed) if eager else []
        spare, self.spare = self.spare, None
        if spare is not None:
            self.open = spare
            # Anchors go after its precommit; else the gate waits for it.
            if anchors:
                self._fence(spare, anchors, after=txn.precommit)
            elif self.on_done is not None:
                _tell_when_open(spare, txn.precommit, self.on_done)
        elif eager:
            self._begin_on_kafka(anchors)
        if self.open is not None:
            self.open.eager = eager

    def _commit_blocking(
        self,
        txn: Txn,
        fence: Future[None] | None,
        records: list[Record],
    ) -> None:
        """In the slot's lane: check the gate call, produce what was held back (with the
        positions), wait until every record is written, check none failed, commit."""
        slot = txn.slot
        producer = slot.producer
        precommit = txn.precommit
        assert precommit is not None
        try:
            if slot.error is not None:
                raise Abort(f"the transaction cannot commit: {slot.error}")
            if fence is None:
                raise Abort("the transaction went through no gate")
            if fence.exception() is not None:
                raise fence.exception()  # type: ignore[misc]
            gated = self._clock()
            for record in records:
                slot.send(record)
            if producer.flush(30):
                raise Abort("records were not delivered within 30 s")
            if slot.error is not None:
                raise Abort(f"a record was not written: {slot.error}")
        except BaseException as exc:
            # The next transaction waits for this: it must not write after records that were
            # never written (it aborts with this one).
            precommit.set_exception(Abort(f"the transaction before it failed: {exc}"))
            raise
        precommit.set_result(None)
        written = self._clock()
        retrying(lambda: producer.commit_transaction(30))
        slot.begun = False
        _report_slow(txn.number, (self._began_commit, gated, written, self._clock()))
        producer.poll(0)
        if slot.error is not None:
            raise InDoubt(f"committed, then a delivery report said: {slot.error}")

    def settle(self, *, start_steps: bool = True, retake: bool = True) -> None:
        """Wait for the sealed transaction's commit, then hand its state to the host; or abort."""
        txn = self.sealed
        if txn is None:
            return
        assert txn.commit is not None
        if not self.wait(txn.commit):
            self.give_up(retake=retake)
            return
        try:
            txn.commit.result()
        except InDoubt as exc:
            LOG.error("a commit's outcome is in doubt (%s): restoring from the events topic", exc)
            self.reset(
                clients.KafkaException(clients.KafkaError(clients.KafkaError._STATE, str(exc))),
                retake=retake,
                why="reported an error after its commit",
            )
            return
        except (clients.KafkaException, Abort, TimeoutError) as exc:
            fatal = exc if isinstance(exc, clients.KafkaException) and exc.args[0].fatal() else None
            self.abort(str(exc) or type(exc).__name__, retake=retake, fatal=fatal)
            return
        except Exception as exc:
            # A client library failing in a way it does not document (a fenced producer's
            # flush() once raised SystemError): the transaction is lost all the same.
            LOG.error("the commit failed unexpectedly (%s: %s)", type(exc).__name__, exc)
            LOG.debug("the commit's failure", exc_info=exc)
            self.abort(f"{type(exc).__name__}: {exc}", retake=retake)
            return
        txn.move(TxnState.COMMITTED)
        self.sealed = None
        self.host.settled(txn.sealed, txn.slot.events_end, start_steps)
        self.metrics.transaction_seconds.observe(self._clock() - self._began_commit)
        if self.open is not None and not self.open.decided:
            # Begun eagerly when this one was sealed: if nothing joins it soon, it commits
            # alone (its positions and anchors) and is not reopened.
            self.open.idle_since = self._clock()

    def commit_all(self, *, start_steps: bool = True, retake: bool = True) -> None:
        """Commit everything staged so far and wait for it (shutdown, revocation, restore)."""
        self.settle(start_steps=start_steps, retake=retake)
        for _ in range(2):
            if self.open is None:
                break
            self.seal(retake=retake, reopen=False)
            self.settle(start_steps=start_steps, retake=retake)

    def close(self) -> None:
        for slot in self.slots:
            slot.flush()
            slot.lane.close()
        if self._preparer is not None:
            self._preparer.close()

"""A model-based test of the transaction pipeline's own logic (no broker: a fake producer and
lanes the test runs one call at a time are the one boundary faked).

Hypothesis drives the pipeline through random interleavings of commands, dead letters, lane
progress, seals, settles, aborts, fences, revocations, lost partitions and produce errors, and
the fake producer checks, as each call happens:

1. nothing commits after a produce error (a refused record that is not a dead letter);
2. no record of a later transaction is produced before an earlier one's are written, and the
   earlier one produces nothing after that;
3. the positions travel with the effects: once a transaction commits, the ``positions``
   records committed so far cover every command whose events it commits;
4. nothing commits, and no positions are recorded, for a partition revoked or lost before;
5. nothing is sent to the group's coordinator (``send_offsets_to_transaction``).

Every Kafka behaviour (fencing, transactions, rebalances) is proven against the broker in the
other tests of this package.
"""

from __future__ import annotations

import itertools
import os
from collections import deque
from concurrent.futures import Future
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from flowstream import wire
from flowstream.kafka import clients
from flowstream.processor.txn.pipeline import TransactionPipeline
from flowstream.processor.txn.slot import ProducerSlot, Record
from flowstream.processor.txn.state import TxnState

#: Other interleavings than the fixed ones each run (``--hypothesis-seed=N`` picks them).
EXPLORE = os.environ.get("FLOWSTREAM_MODEL_EXPLORE") == "1"
EVENTS = "events"
DEADLETTER = "deadletter"
PARTITIONS = (0, 1, 2)


class Violation(AssertionError):
    pass


class _Message:
    def __init__(self, topic: str, partition: int, value: bytes, offset: int) -> None:
        self._topic, self._partition, self._value, self._offset = topic, partition, value, offset

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def value(self) -> bytes:
        return self._value

    def offset(self) -> int:
        return self._offset


class World:
    """What every fake producer shares: the global order of transactions, the armed errors and
    the partitions no longer owned."""

    def __init__(self) -> None:
        self.begins = itertools.count(1)
        self.producers: list[FakeProducer] = []
        self.sync_error: str | None = None  # topic whose next produce is refused
        self.async_error: str | None = None  # topic whose next record fails to be written
        self.gone: set[int] = set()
        self.commits = 0
        #: The positions committed records hold (``positions`` records or headers), by partition.
        self.recorded: dict[int, int] = {}


def _positions(value: bytes, headers: Any) -> bytes | None:
    """The positions value a produced record carries: a ``positions`` record's value, or its
    ``flowstream-positions`` header."""
    if headers == wire.POSITIONS_HEADERS:
        return value
    found = [v for k, v in headers or () if k == wire.POSITIONS_HEADER]
    return found[-1] if found else None


class FakeProducer:
    """A transactional producer that checks the pipeline's invariants as it is called."""

    def __init__(self, world: World, on_delivery: Any) -> None:
        self.world = world
        self.on_delivery = on_delivery
        self.fenced = False
        self.txn: int | None = None
        self.pending: list[tuple[str, int, bytes, bool]] = []
        self.refused_events = False
        self.failed_async = False
        self.overtaken = False
        self.offset = 0
        world.producers.append(self)

    def _fatal(self) -> None:
        if self.fenced:
            raise clients.KafkaException(
                clients.KafkaError(clients.KafkaError._FENCED, "fenced", fatal=True)
            )

    def init_transactions(self, timeout: float) -> None:
        self._fatal()

    def begin_transaction(self) -> None:
        self._fatal()
        if self.txn is not None:
            raise clients.KafkaException(clients.KafkaError(clients.KafkaError._STATE, "open"))
        self.txn = next(self.world.begins)
        self.pending = []
        self.written: list[tuple[str, int, bytes, Any]] = []
        self.refused_events = self.failed_async = self.overtaken = False

    def produce(self, topic: str, value: bytes, key: bytes, partition: int, headers: Any) -> None:
        self._fatal()
        if self.txn is None:
            raise Violation("produce outside a transaction")
        if _positions(value, headers) is not None and partition in self.world.gone:
            raise Violation(f"positions recorded for partition {partition}, no longer owned")
        if self.overtaken:
            raise Violation(f"transaction {self.txn} produced after a later one did")
        for other in self.world.producers:
            if other is not self and other.txn is not None and other.txn < self.txn:
                if other.pending:
                    raise Violation(
                        f"transaction {self.txn} produced before {other.txn}'s records were written"
                    )
                other.overtaken = True
        if self.world.sync_error == topic:
            self.world.sync_error = None
            if topic == EVENTS:
                self.refused_events = True
            raise clients.KafkaException(
                clients.KafkaError(clients.KafkaError._UNKNOWN_PARTITION, "refused")
            )
        fails = self.world.async_error == topic
        if fails:
            self.world.async_error = None
        self.pending.append((topic, partition, value, fails))
        self.written.append((topic, partition, value, headers))

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        self._fatal()
        for topic, partition, value, fails in self.pending:
            self.offset += 1
            error = clients.KafkaError(clients.KafkaError.MSG_SIZE_TOO_LARGE) if fails else None
            if fails:
                self.failed_async = True
            self.on_delivery(error, _Message(topic, partition, value, self.offset))
        self.pending = []
        return 0

    def send_offsets_to_transaction(
        self, offsets: list[Any], metadata: Any, timeout: float
    ) -> None:
        raise Violation("positions sent to the group's coordinator")

    def commit_transaction(self, timeout: float) -> None:
        self._fatal()
        self.flush(timeout)
        if self.refused_events:
            raise Violation(f"transaction {self.txn} committed after a produce error")
        positions = [
            (p, carried)
            for _, p, v, headers in self.written
            if (carried := _positions(v, headers)) is not None
        ]
        gone = {p for p, _ in positions} & self.world.gone
        if gone:
            raise Violation(f"transaction {self.txn} committed for partitions given up: {gone}")
        if self.failed_async:
            raise clients.KafkaException(
                clients.KafkaError(clients.KafkaError._STATE, "abortable", txn_requires_abort=True)
            )
        recorded = self.world.recorded
        for partition, value in positions:
            recorded[partition] = wire.split_positions(value)[1]["cmd"]
        last: dict[int, int] = {}
        for topic, partition, value, headers in self.written:
            bookkeeping = headers in (wire.POSITIONS_HEADERS, wire.ANCHOR_HEADERS)
            if topic == EVENTS and not bookkeeping:  # an event: "<command position>/<n>"
                applied, number = (int(part) for part in value.split(b"/"))
                if number < last.get(partition, -1):
                    raise Violation(
                        f"transaction {self.txn} wrote event {number} of partition {partition} "
                        f"after event {last[partition]}, produced later"
                    )
                last[partition] = number
                if recorded.get(partition, 0) < applied:
                    raise Violation(
                        f"transaction {self.txn} committed the effects of command {applied} of "
                        f"partition {partition}, recorded as applied up to "
                        f"{recorded.get(partition, 0)}"
                    )
        self.world.commits += 1
        self.txn = None

    def abort_transaction(self, timeout: float) -> None:
        self._fatal()
        self.pending = []
        self.written = []
        self.txn = None

    def purge(self) -> None:
        self.pending = []


class StepLane:
    """A lane whose calls run only when the test says so (or a wait needs them)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.queue: deque[tuple[Future[Any], Any, tuple[Any, ...], Future[Any] | None]] = deque()
        scheduler.lanes.append(self)

    def submit(
        self, call: Any, *args: Any, after: Future[Any] | None = None, patience: float = 30.0
    ) -> Future[Any]:
        future: Future[Any] = Future()
        self.queue.append((future, call, args, after))
        return future

    def step(self) -> bool:
        if not self.queue:
            return False
        future, call, args, after = self.queue[0]
        if after is not None and not after.done():
            return False
        self.queue.popleft()
        try:
            future.set_result(call(*args))
        except Exception as exc:
            if isinstance(exc, Violation):
                raise
            future.set_exception(exc)
        return True

    def wait(self, future: Future[Any], timeout: float) -> bool:
        self.scheduler.run_until(future)
        return future.done()

    def busy_for(self) -> float:
        return 0.0

    def close(self) -> None:
        self.queue.clear()

    def renewed(self) -> StepLane:
        return StepLane(self.scheduler)

    def abandon(self) -> StepLane:
        self.close()
        return self.renewed()


class Scheduler:
    def __init__(self) -> None:
        self.lanes: list[StepLane] = []

    def run_until(self, future: Future[Any]) -> None:
        while not future.done():
            if not any(lane.step() for lane in list(self.lanes)):
                return


class _Metric:
    def inc(self, *_: Any) -> None:
        pass

    def observe(self, *_: Any) -> None:
        pass


class _Metrics:
    aborts = producer_resets = _Metric()
    transaction_seconds = _Metric()


class FakeHost:
    """The owned partitions as the pipeline sees them."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.owned: set[int] = set(PARTITIONS)
        self.positions_of = dict.fromkeys(PARTITIONS, 0)
        self.settled_count = 0
        self.anchoring = True

    def positions(self) -> list[Any]:
        return [clients.TopicPartition("cmd", p, self.positions_of[p]) for p in sorted(self.owned)]

    def seal(self) -> Any:
        return sorted(self.owned)

    def anchors(self, sealed: Any) -> list[int]:
        return list(sealed)[:1] if self.anchoring else []

    def settled(self, sealed: Any, events_end: dict[int, int], start_steps: bool) -> None:
        self.settled_count += 1

    def aborted(self, failed: list[tuple[str, bytes | None]]) -> None:
        pass

    def retake(self, retake: bool) -> None:
        if not retake:
            self.drop(set(self.owned))

    def drop(self, partitions: set[int]) -> None:
        self.owned -= partitions
        self.world.gone |= partitions


class PipelineMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.world = World()
        self.host = FakeHost(self.world)
        self.scheduler = Scheduler()
        self.now = 0.0

        def new_producer(slot: ProducerSlot) -> FakeProducer:
            return FakeProducer(self.world, slot.delivered)

        self.pipeline = TransactionPipeline(
            self.host,
            new_producer,
            stuck_s=15.0,
            metrics=_Metrics(),
            events_topic=EVENTS,
            lanes=(StepLane(self.scheduler), StepLane(self.scheduler)),
            clock=self._clock,
        )
        self.pipeline.start()
        self.records = itertools.count()

    def _clock(self) -> float:
        self.now += 1.0
        return self.now

    @rule(partition=st.sampled_from(PARTITIONS))
    def command(self, partition: int) -> None:
        if partition not in self.host.owned:
            return
        self.host.positions_of[partition] += 1
        value = f"{self.host.positions_of[partition]}/{next(self.records)}".encode()
        self.pipeline.produce(Record(EVENTS, partition, b"run", value))

    @rule(partition=st.sampled_from(PARTITIONS), count=st.integers(1, 3))
    def append(self, partition: int, count: int) -> None:
        """One append's events, produced together."""
        if partition not in self.host.owned:
            return
        self.host.positions_of[partition] += 1
        position = self.host.positions_of[partition]
        values = [f"{position}/{next(self.records)}".encode() for _ in range(count)]
        self.pipeline.produce_all([Record(EVENTS, partition, b"run", v) for v in values])

    @rule(partition=st.sampled_from(PARTITIONS))
    def dead_letter(self, partition: int) -> None:
        if partition not in self.host.owned:
            return
        self.host.positions_of[partition] += 1
        minimal = Record(DEADLETTER, partition, b"", b"minimal", droppable=True)
        self.pipeline.produce(Record(DEADLETTER, partition, b"k", b"full", fallback=minimal))

    @rule(topic=st.sampled_from((EVENTS, DEADLETTER)), synchronous=st.booleans())
    def arm_produce_error(self, topic: str, synchronous: bool) -> None:
        if synchronous:
            self.world.sync_error = topic
        else:
            self.world.async_error = topic

    @rule(index=st.sampled_from((0, 1)))
    def lane_progress(self, index: int) -> None:
        self.pipeline.slots[index].lane.step()

    @rule()
    def release_spare(self) -> None:
        self.pipeline.release()
        self.pipeline.begin_spare()

    @rule()
    def seal(self) -> None:
        # Checked here, not as a precondition: which rules hypothesis may choose then never
        # depends on the pipeline's state.
        if self.pipeline.decided and self.pipeline.sealed is None:
            self.pipeline.seal()

    @rule()
    def settle_if_done(self) -> None:
        sealed = self.pipeline.sealed
        if sealed is not None and sealed.commit is not None and sealed.commit.done():
            self.pipeline.settle()

    @rule()
    def settle_waiting(self) -> None:
        self.pipeline.settle()

    @rule()
    def commit_all(self) -> None:
        self.pipeline.commit_all()

    @rule()
    def abort(self) -> None:
        if self.pipeline.active():
            self.pipeline.abort("the test aborts")

    @rule(anchoring=st.booleans())
    def steps_report(self, anchoring: bool) -> None:
        self.host.anchoring = anchoring

    @rule(index=st.sampled_from((0, 1)))
    def fence_producer(self, index: int) -> None:
        producer = self.pipeline.slots[index].producer
        if producer is not None:  # made lazily after a reset that gave the partitions up
            producer.fenced = True

    @rule(partition=st.sampled_from(PARTITIONS))
    def revoke(self, partition: int) -> None:
        if partition not in self.host.owned:
            return
        self.pipeline.commit_all(start_steps=False, retake=False)
        self.host.drop({partition})

    @rule(partition=st.sampled_from(PARTITIONS))
    def lost(self, partition: int) -> None:
        if partition not in self.host.owned:
            return
        if self.pipeline.active():
            self.pipeline.abort("partitions lost", retake=False, patience=0.5)
        self.host.drop({partition})

    @invariant()
    def states_are_consistent(self) -> None:
        p = self.pipeline
        if p.open is not None:
            assert p.open.state in (TxnState.BEGUN, TxnState.FENCING, TxnState.OPEN)
        if p.sealed is not None:
            assert p.sealed.state is TxnState.SEALED
            if p.open is not None:
                assert p.open.slot is not p.sealed.slot, "the open and sealed share a producer"
        if p.open is not None and p.open.state is TxnState.OPEN and p.sealed is not None:
            assert p.sealed.precommit is not None and p.sealed.precommit.done()


@pytest.mark.timeout(600)
def test_the_pipeline_keeps_its_ordering_and_fencing_rules() -> None:
    run = settings(
        max_examples=300,
        stateful_step_count=60,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        # The same 300 interleavings on every run, CI's included (FLOWSTREAM_MODEL_EXPLORE=1
        # for others): CI once failed on hypothesis finding its rule choices inconsistent.
        derandomize=not EXPLORE,
        database=None,
    )(PipelineMachine)
    run.TestCase().runTest()


def test_a_transaction_with_a_refused_record_never_commits() -> None:
    """The review's H1, by hand: a record refused at ``produce()`` while held back for the fence
    is found before ``commit_transaction``, and the transaction aborts instead."""
    machine = PipelineMachine()
    machine.command(0)  # held back: the fence has not gone through
    machine.world.sync_error = EVENTS
    machine.command(1)
    machine.seal()
    machine.settle_waiting()
    assert machine.world.commits == 0
    assert machine.pipeline.sealed is None


@pytest.mark.parametrize("moved", [False, True])
def test_the_promoted_spare_waits_for_the_sealed_transactions_records(moved: bool) -> None:
    """The review's H4: the spare that takes the sealed one's place produces nothing until the
    sealed one's records are written, whether or not the positions moved."""
    machine = PipelineMachine()
    machine.host.anchoring = False  # no step reports: nothing else would chain the spare
    machine.command(0)
    for lane in machine.scheduler.lanes:
        lane.step()
    machine.release_spare()  # the spare is begun and its fence queued
    for lane in machine.scheduler.lanes:
        lane.step()
    if moved:
        machine.host.positions_of[1] += 1
    machine.seal()
    spare = machine.pipeline.open
    assert spare is not None
    for lane in machine.scheduler.lanes:
        while lane is not machine.pipeline.sealed.slot.lane and lane.step():  # type: ignore[union-attr]
            pass
    machine.pipeline.release()
    assert spare.state is TxnState.FENCING, "the spare opened before the sealed one wrote"
    machine.command(2)
    assert spare.deferred, "a record went out before the sealed transaction's were written"


def test_the_loop_is_told_as_each_fence_and_commit_finishes() -> None:
    """A loop that waits for a fence (to produce) or a commit (to settle) goes on as it ends,
    not at its next poll: the pipeline calls ``on_done`` with each of them."""
    machine = PipelineMachine()
    done: list[Any] = []
    machine.pipeline.on_done = done.append
    machine.command(0)
    txn = machine.pipeline.open
    assert txn is not None and txn.fence is not None
    fence = txn.fence
    assert not done
    machine.scheduler.run_until(fence)
    assert done == [fence]
    machine.seal()
    assert txn.commit is not None
    machine.scheduler.run_until(txn.commit)
    assert txn.commit in done


@pytest.mark.parametrize("spare_fenced", [True, False])
def test_the_loop_is_told_when_a_promoted_spare_may_open(spare_fenced: bool) -> None:
    """A spare promoted with nothing to send again gets no fence of its own: the loop is told as
    the sealed one's records are written, and as the spare's first fence returns if that is
    later (a spare's first fence alone tells nothing: nothing waits for it until then)."""
    machine = PipelineMachine()
    machine.host.anchoring = False  # nothing to register: the promotion sends nothing
    done: list[Any] = []
    machine.pipeline.on_done = done.append
    machine.command(0)
    opened = machine.pipeline.open
    assert opened is not None
    machine.scheduler.run_until(opened.fence)  # type: ignore[arg-type]
    machine.release_spare()
    spare = machine.pipeline.spare
    assert spare is not None and spare.fence is not None
    if spare_fenced:
        machine.scheduler.run_until(spare.fence)
    assert spare.fence not in done
    queued = sum(len(lane.queue) for lane in machine.scheduler.lanes)
    machine.seal()
    sealed = machine.pipeline.sealed
    assert sealed is not None and sealed.precommit is not None
    assert machine.pipeline.open is spare and spare.state is TxnState.FENCING
    # Only the commit was queued: no lane call for the promotion.
    assert sum(len(lane.queue) for lane in machine.scheduler.lanes) == queued + 1
    done.clear()
    machine.scheduler.run_until(sealed.precommit)
    machine.scheduler.run_until(spare.fence)
    assert sealed.precommit in done and (spare_fenced or spare.fence in done)
    machine.pipeline.release()
    assert spare.state.value == "open"  # (not "is": mypy keeps the FENCING it saw above)

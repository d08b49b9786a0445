"""``Processor``: one member of the consumer group that owns partitions of the run-keyed topics.

The loop, each iteration:

1. settle the commit in flight if it finished: write the sealed RocksDB batches and start the
   steps whose ``step_started`` it made durable (or abort);
2. poll the command topics (rebalance callbacks run inside the poll);
3. restore newly assigned partitions from the events topic, in bounded slices;
4. apply each command to its partition's ``PartitionEngine`` inside the open transaction;
5. record step outcomes that came back, and drive their runs;
6. fire due timers and delayed retries by producing ``FireTimer`` commands;
7. seal the open transaction and start its commit in the commit thread when nothing more is
   about to join it (see ``_should_commit``); decisions go on meanwhile, into the next one.

Owning partition *p* means: every command topic's partition *p* is assigned to this member.
Partitions are restored before any decision, and every transaction carries consumer positions
with the group metadata, so a member that lost a partition can never make an event for it
visible.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowstream import codec
from flowstream.engine.engine import call_step
from flowstream.errors import (
    FlowError,
    InvalidTransitionError,
    NonDeterministicError,
    RunNotFoundError,
    RuntimeBuildUnavailableError,
    SerializationError,
)
from flowstream.kafka import clients
from flowstream.model.events import ChildWorkflowResolved, EventEnvelope, HookCreated
from flowstream.model.messages import (
    CancelRun,
    CommandMessage,
    DeadLetter,
    DisposeHook,
    FireTimer,
    RegisterHookToken,
    ResolveChild,
    ResumeHook,
    SendSignal,
    StartRun,
)
from flowstream.partitioning import partition_for
from flowstream.processor.engine import PartitionEngine
from flowstream.processor.lane import Lane
from flowstream.processor.metrics import ProcessorMetrics
from flowstream.replay.decide import token_digest
from flowstream.replay.state import RunState
from flowstream.runtime import FlowRuntime
from flowstream.settings import Settings
from flowstream.stores.base import Clock, utc_now
from flowstream.stores.partition import PartitionStore
from flowstream.topology import (
    CMD_CANCEL,
    CMD_HOOK,
    CMD_SIGNAL,
    CMD_START,
    CMD_TIMER,
    DEADLETTER,
    EVENTS,
    Topology,
    TopologyError,
    load_topology,
)

__all__ = ["RECORD_HEADER", "WRITER_HEADER", "Processor"]

LOG = logging.getLogger("flowstream.processor")

#: Header naming what a record on the events topic is: ``event``, ``inbox``, ``inbox-done``,
#: ``hook-token``, or ``anchor`` (empty; it registers the partition with a transaction early).
#: Readers of histories take only ``event`` records (a record without the header is one).
RECORD_HEADER = "flowstream-record"
_ANCHOR_HEADERS = [(RECORD_HEADER, b"anchor")]
#: Timers are looked for at most this often (their precision; the index scan is not free).
_TIMER_SCAN_INTERVAL_S = 0.02
#: While steps run, the loop waits this long at most for an outcome before polling again.
_STEP_WAIT_S = 0.002
#: A restore target (high watermark) that could not be read is asked for again after this long.
_TARGET_RETRY_S = 0.5
#: A partition at most this many records behind its restore target is fetched before the others.
_NEAR_RESTORED = 100
#: Header of an inbox record: why the command waits (run missing, build not served).
REASON_HEADER = "flowstream-reason"
#: Header naming the processor instance that wrote an event (for audits and failure tests).
WRITER_HEADER = "flowstream-writer"
_COMMAND_TOPIC_FOR = {
    StartRun: CMD_START,
    SendSignal: CMD_SIGNAL,
    ResumeHook: CMD_HOOK,
    DisposeHook: CMD_HOOK,
    CancelRun: CMD_CANCEL,
    FireTimer: CMD_TIMER,
    ResolveChild: CMD_TIMER,
    RegisterHookToken: CMD_HOOK,
}


def routing_key(command: CommandMessage) -> str:
    """The key that picks a command's partition: its run id, or a hook token's digest."""
    if isinstance(command, RegisterHookToken):
        return command.token_digest
    if command.run_id is None:
        assert isinstance(command, ResumeHook) and command.token is not None
        return token_digest(command.token.get_secret_value())
    return command.run_id


class _Park(Exception):
    """The command cannot be applied yet; keep it in the partition's inbox."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Slot:
    """One of the two transactional producers, with the lane of its transactional calls and
    what its current transaction's delivery reports said."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.producer: Any = None
        self.lane = Lane(f"flowstream-commit-{index}")
        # Bumped with each new producer: reports of a replaced one are ignored.
        self.generation = 0
        # A Kafka transaction was begun on it and has not ended (committed or aborted).
        self.begun = False
        self.error: Any = None
        # The end offset of the last record written to each events partition.
        self.events_end: dict[int, int] = {}

    def begin(self) -> None:
        """Begin a transaction on this producer; the last one's delivery reports are forgotten."""
        self.producer.begin_transaction()
        self.begun = True
        self.error = None
        self.events_end.clear()

    def flush(self) -> None:
        """Deliver what is queued, at shutdown; a fenced producer has nothing to deliver."""
        if self.producer is None:
            return
        try:
            self.producer.flush(5)
        except:  # noqa: E722 - a bare KafkaError once fenced: see ``clients.as_exception``
            LOG.debug("producer %d: %s", self.index, clients.as_exception(sys.exc_info()[1]))


@dataclass(eq=False)
class Owned:
    """One owned partition number: its store, engine, positions and in-flight work."""

    partition: int
    store: PartitionStore
    engine: PartitionEngine
    positions: dict[str, int]
    committed: dict[str, int]
    restoring: bool = True
    restore_target: int | None = None
    restore_began: float = field(default_factory=time.monotonic)
    events_end: int | None = None
    fired: dict[tuple[str, str, str], float] = field(default_factory=dict)
    outbox: list[tuple[str, str, int]] = field(default_factory=list)
    # Step attempts this owner started and has no outcome of yet. Per owner: a task left from
    # an earlier owner of the partition number (before a reset) never blocks this one's.
    inflight: set[tuple[str, str, int]] = field(default_factory=set)
    # What the transaction being committed holds: its steps and consumer positions.
    sealed_outbox: list[tuple[str, str, int]] = field(default_factory=list)
    sealed_positions: dict[str, int] = field(default_factory=dict)


class Processor:
    """A consumer-group member that drives the runs of the partitions it owns."""

    def __init__(
        self,
        settings: Settings,
        runtimes: Mapping[str | None, FlowRuntime],
        *,
        topology: Topology | None = None,
        clock: Clock = utc_now,
        metrics: ProcessorMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.runtimes = dict(runtimes)
        self.topology = topology or load_topology()
        self.clock = clock
        self.metrics = metrics or ProcessorMetrics()
        prefix = settings.topic_prefix
        self.topics = self.topology.names(prefix)
        self.command_topics = [
            self.topics[s] for s in (CMD_START, CMD_SIGNAL, CMD_HOOK, CMD_CANCEL, CMD_TIMER)
        ]
        self.partitions = self.topology.run_partitions
        self.state_dir = Path(settings.state_dir) / settings.group
        self._owned: dict[int, Owned] = {}
        # Step attempts running in this process, by (partition, run, step, attempt). They survive
        # a rebalance: if the partition comes back, the result is still recorded (the restored
        # history decides whether it is stale); if it went elsewhere, the result is dropped.
        self._results: deque[_StepResult] = deque()
        # (partition, run, step, attempt) whose handler runs in this process, or whose outcome
        # waits in ``_results``: whichever owner holds the partition records that outcome, so
        # no owner starts the attempt a second time meanwhile.
        self._handling: set[tuple[int, str, str, int]] = set()
        self._held_results: dict[int, list[_StepResult]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._step_slots = asyncio.Semaphore(settings.step_concurrency)
        self._executor = ThreadPoolExecutor(
            max_workers=settings.step_concurrency, thread_name_prefix="flowstream-step"
        )
        # Set when a step outcome or a commit comes back while the loop waits for one.
        self._wake = asyncio.Event()
        # When each running step task started: one started less than the linger ago is
        # likely to report into the open transaction, which waits for it (``_should_commit``).
        self._step_starts: dict[asyncio.Task[None], float] = {}
        # Runs whose decisions an abort threw away, by partition: driven again (their steps
        # re-dispatched) once the loop comes round; the commands among them are read again.
        self._redrive: dict[int, set[str]] = {}
        self._txn_open = False
        # The open transaction was begun on Kafka; its records may be produced directly.
        self._kafka_open = False
        # When a Kafka transaction was begun ahead of any decision (right after a commit that
        # carried some), or None.
        self._eager_since: float | None = None
        self._producing = False
        self._deferred: list[tuple[str, int, bytes, bytes, Any]] = []
        # Two producers take turns: the next transaction begins (and is fenced) on one while
        # the other commits. ``_slot`` holds the open transaction.
        self._slots = (_Slot(0), _Slot(1))
        self._slot = self._slots[0]
        # Set by the committing transaction once its records are written and its positions
        # sent: the next one may then send its own and write after them.
        self._precommit: Future[None] | None = None
        # The transaction after the open one, begun on the other producer while no commit is
        # in flight, and its fence (positions sent after the open one's): see ``_begin_spare``.
        self._spare: Future[None] | None = None
        self._spare_fenced: tuple[tuple[str, int, int], ...] = ()
        # The open transaction was begun eagerly after a commit that carried decisions.
        self._eager_work = False
        self._metadata: Any = None
        # A transactional call running longer than this never returns (see ``lane``): the
        # producer is given up. Well beyond a transaction's life, which ends it anyway.
        self._stuck_s = max(15.0, 2 * settings.transaction_timeout_ms / 1000)
        self._committing: Future[None] | None = None
        # The positions sent when the open transaction began, and that call.
        self._fence: Future[None] | None = None
        # The open transaction sent its positions again once commands moved them.
        self._refenced = False
        self._fenced: tuple[tuple[str, int, int], ...] = ()
        self._sealed: list[Owned] = []
        self._commit_began = 0.0
        self._txn_began = 0.0
        self._txn_commands = 0
        # The partitions the restorer fetches now, with the ``Owned`` each restores.
        self._restoring: dict[int, Owned] = {}
        self._fatal: BaseException | None = None
        self._resets: list[float] = []
        self._targets_retry_at = 0.0
        self._next_timer_scan = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self.ready = asyncio.Event()

    # -- lifecycle ------------------------------------------------------------------------

    def _connect(self) -> None:
        s = self.settings
        admin = clients.new_admin(s.bootstrap)
        brokers = self._verify_topics(admin)
        session_ms = self._session_timeout_ms(admin, brokers)
        for slot in self._slots:
            slot.producer = self._new_producer(slot)
        self.consumer = clients.new_consumer(
            s.bootstrap,
            s.group,
            {
                "session.timeout.ms": session_ms,
                "max.poll.interval.ms": s.max_poll_interval_ms,
                # A fifth of the session: a member misses four heartbeats before it is expired
                # (a coordinator moving costs some), and a survivor hears of a rebalance within
                # a fifth of the session.
                "heartbeat.interval.ms": max(100, session_ms // 5),
                **_debug(s),
            },
        )
        # The restorer reads partitions to their end: a fetch that finds nothing new (a
        # partition a transaction marker behind) returns at once rather than after 500 ms.
        self.restorer = clients.new_consumer(
            s.bootstrap, f"{s.group}-restore-unused", {"fetch.wait.max.ms": 10}
        )
        self.watermarks = self._new_watermarks()
        self.consumer.subscribe(
            self.command_topics,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def _new_watermarks(self) -> Any:
        """The client that reads the events partitions' true high watermarks."""
        s = self.settings
        return clients.new_consumer(
            s.bootstrap, f"{s.group}-watermarks-unused", {"isolation.level": "read_uncommitted"}
        )

    def _new_producer(self, slot: _Slot) -> Any:
        """A transactional producer of this instance, initialised: any transaction an earlier
        producer of the same ``transactional.id`` left open is aborted first."""
        s = self.settings
        slot.generation += 1
        generation = slot.generation

        def delivered(err: Any, message: Any) -> None:
            if generation == slot.generation:  # not a report of a producer replaced since
                self._delivered(slot, err, message)

        suffix = f".{slot.index}" if slot.index else ""
        producer = clients.new_transactional_producer(
            s.bootstrap,
            f"{s.group}-{s.instance_id}{suffix}",
            {
                "transaction.timeout.ms": s.transaction_timeout_ms,
                "message.max.bytes": 4 * 1024 * 1024,
                "linger.ms": 1,
                # No error_cb: confluent-kafka calls it for a fatal error with that error
                # already pending as the exception of the flush() or poll() that serves it, so
                # any builtin the callback calls fails with SystemError. Without one, the call
                # raises the error itself, as a bare KafkaError (``clients.as_exception``).
                "on_delivery": delivered,
                **_debug(s),
            },
        )
        _retrying(lambda: producer.init_transactions(30))
        return producer

    def _session_timeout_ms(self, admin: Any, brokers: list[int]) -> int:
        """The configured session timeout, raised to the brokers' floor
        (``group.min.session.timeout.ms``, 6 s unless lowered) instead of failing to join."""
        wanted = self.settings.session_timeout_ms
        if not brokers:
            return wanted
        resource = clients.ConfigResource(clients.ResourceType.BROKER, str(min(brokers)))
        try:
            found = admin.describe_configs([resource], request_timeout=10)[resource].result(15)
            floor = int(found["group.min.session.timeout.ms"].value)
        except (clients.KafkaException, KeyError, TypeError, ValueError) as exc:
            LOG.info("no group.min.session.timeout.ms (%s); asking for %d ms", exc, wanted)
            return wanted
        if wanted < floor:
            LOG.warning(
                "session timeout %d ms is below the brokers' group.min.session.timeout.ms=%d: "
                "using %d ms (lower the brokers' floor for a faster failover)",
                wanted,
                floor,
                floor,
            )
            return floor
        return wanted

    def _verify_topics(self, admin: Any) -> list[int]:
        """Check the topics against the topology; the ids of the brokers."""
        metadata = admin.list_topics(timeout=15)
        counts = {name: len(t.partitions) for name, t in metadata.topics.items()}
        problems = []
        for suffix, name in self.topics.items():
            if name not in counts:
                problems.append(f"topic {name} is missing")
            elif suffix != DEADLETTER and counts[name] != self.partitions:
                problems.append(
                    f"topic {name} has {counts[name]} partitions, expected {self.partitions}"
                )
        if problems:
            raise TopologyError(
                "; ".join(problems) + " (run `flowstream topics apply` with this prefix)"
            )
        return [int(broker) for broker in metadata.brokers]

    async def run(self, stop: asyncio.Event) -> None:
        """Process until ``stop`` is set; commits what is open and leaves the group cleanly."""
        self._loop = asyncio.get_running_loop()
        self._connect()
        try:
            while not stop.is_set():
                await self._iteration()
            self._commit()
        finally:
            for task in self._tasks:
                task.cancel()
            with contextlib.suppress(Exception):
                self.consumer.close()
            for owned in list(self._owned.values()):
                owned.store.close()
            self._owned.clear()
            for close in (
                self.restorer.close,
                self.watermarks.close,
                *(slot.flush for slot in self._slots),
            ):
                with contextlib.suppress(Exception):
                    close()
            self._executor.shutdown(wait=False, cancel_futures=True)
            for slot in self._slots:
                slot.lane.close()

    # -- the loop -------------------------------------------------------------------------

    async def _iteration(self) -> None:
        if max(slot.lane.busy_for() for slot in self._slots) > self._stuck_s:
            self._give_up_producer(retake=True)
        if self._committing is not None and self._committing.done():
            self._settle_commit()
        self._release_deferred()
        restoring = any(o.restoring for o in self._owned.values())
        if self._results or restoring:
            messages = self.consumer.consume(num_messages=500, timeout=0)
        elif self._tasks or self._committing is not None or self._deferred:
            # Steps run or a commit is in flight: take what is already fetched, or else wait
            # on the loop for an outcome or the commit (a short while at most, so new
            # commands are not held).
            messages = self.consumer.consume(num_messages=500, timeout=0)
            if not messages:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), _STEP_WAIT_S)
        else:
            # Nothing runs here: block in a thread until a command arrives.
            assert self._loop is not None
            messages = await self._loop.run_in_executor(None, self._wait_for_messages, 0.05)
        if self._fatal is not None:
            raise self._fatal
        self.metrics.owned_partitions.set(sum(not o.restoring for o in self._owned.values()))
        if restoring:
            await self._restore_slice()
        for message in messages:
            await self._command(message)
        await self._chain_results()
        if self._redrive:
            await self._drive_again()
        self._fire_timers()
        if self._spare is None and self._kafka_open and self._fence is not None:
            self._refence()
        if (
            self._spare is None
            and self._committing is None
            and self._kafka_open
            and self._fence is not None
            and (self._txn_open or self._eager_work)
        ):
            self._begin_spare()
        if self._txn_open and self._committing is None and self._should_commit():
            self._start_commit()
        elif self._eager_idle():
            self._start_commit()  # nothing joined it: commit the positions alone, do not reopen

    async def _chain_results(self) -> None:
        """Record the steps' outcomes, then let the steps those decisions started run, and
        record theirs within this same iteration: a step that finishes without waiting (an
        async handler, or ``inline_sync_steps``) moves its run on at once instead of one
        iteration (up to a whole batch of commands) later, so a short run's steps all join one
        transaction. Bounded, so a commit that is due is not held back."""
        for round_ in range(_CHAIN_ROUNDS):
            while self._results:
                await self._step_result(*self._results.popleft())
            if not self._tasks or round_ == _CHAIN_ROUNDS - 1:
                return
            await asyncio.sleep(0)  # the steps started above run up to their first real wait
            if not self._results:
                return

    def _eager_idle(self) -> bool:
        # Set only once a commit settled; a decision, a seal, an abort or a reset clears it.
        since = self._eager_since
        return since is not None and time.monotonic() - since >= _EAGER_IDLE_S

    def _should_commit(self) -> bool:
        """Commit when nothing more is about to join the open transaction: no outcome queued
        and none due from the steps the last commit started (short steps come back within a
        millisecond or two, so their outcomes share one transaction instead of one each). The
        linger, the commit interval and the batch size bound how long events wait."""
        age = time.monotonic() - self._txn_began
        if age >= self.settings.commit_interval_ms / 1000:
            return True
        if self._txn_commands >= self.settings.max_commands_per_transaction:
            return True
        if self._results:
            return False
        linger = self.settings.commit_linger_ms / 1000
        if age >= linger:
            return True
        now = time.monotonic()
        return all(now - began >= linger for began in self._step_starts.values())

    def _wait_for_messages(self, timeout: float) -> list[Any]:
        """Block until one message arrives (``consume`` would wait for a full batch or the whole
        timeout), then take whatever else is already fetched."""
        first = self.consumer.poll(timeout)
        if first is None:
            return []
        return [first, *self.consumer.consume(num_messages=499, timeout=0)]

    # -- transactions ---------------------------------------------------------------------
    #
    # Two transactions can be under way, on two producers that take turns (``_Slot``). The
    # *committing* one is sealed, and its slot's lane commits it. The *open* one keeps taking
    # decisions meanwhile, on the other producer: it is begun on Kafka at once and its positions
    # (the fence) go out as soon as the committing transaction has written its records and sent
    # its positions (``_precommit``). Its records wait in ``_deferred`` until the fence went
    # through: so they land after the committing transaction's records in every partition, and
    # its positions after the committing one's (the group keeps the positions written last).
    # Neither waits for the committing transaction to end, nor for the coordinator to finish
    # it (a producer's next transaction meets CONCURRENT_TRANSACTIONS until then). The open
    # transaction was decided on top of the committing one, so an abort of either throws both
    # away, and it commits only once the committing one did.

    def _begin(self) -> None:
        """Open a transaction for what comes next (on Kafka at once)."""
        if not self._txn_open:
            self._txn_open = True
            self._txn_began = time.monotonic()
            self._txn_commands = 0
            self._eager_since = None
        if not self._kafka_open:
            self._begin_on_kafka()

    def _begin_on_kafka(self, anchors: Iterable[int] = ()) -> None:
        """Begin the Kafka transaction on the open slot, and send the positions (the fence) from
        its lane: the round trips overlap the decisions and the commit in flight instead of
        delaying the commit.

        ``anchors``: events partitions to register with the transaction right after the fence,
        each by an empty ``anchor`` record (see ``_open_fence``).
        """
        slot = self._slot
        self._kafka_open = True
        self._fenced = ()
        try:
            try:
                slot.begin()
            except clients.KafkaException as exc:
                if exc.args[0].fatal():
                    raise
                _retrying(lambda: slot.producer.abort_transaction(30), attempts=20)
                slot.begin()
        except clients.KafkaException as exc:
            # Fenced (fatal): the work goes on into a transaction that cannot commit, and
            # the commit replaces the producer. (Callers are in the middle of a decision.)
            slot.error = exc.args[0]
            return
        offsets = self._positions()
        self._fenced = _offsets_key(offsets)
        if offsets:
            metadata = self._group_metadata()
            after: Future[Any] | None = self._precommit if self._committing is not None else None
            self._fence = slot.lane.submit(
                self._open_fence, slot, offsets, metadata, list(anchors), after
            )
            self._fence.add_done_callback(self._wake_loop)
        else:
            self._producing = True

    def _open_fence(
        self,
        slot: _Slot,
        offsets: list[Any] | None,
        metadata: Any,
        anchors: list[int],
        after: Future[Any] | None,
        before: Future[Any] | None = None,
    ) -> None:
        """In the slot's lane: once the committing transaction wrote its records and sent its
        positions (``after``), register the ``anchors`` events partitions with the transaction
        just begun and send its positions.

        The first record of a transaction to a partition costs a round trip to the coordinator
        (AddPartitionsToTxn, and the leader's check of it) before it can be written: 3.5 ms
        against 1 ms for the next, measured on a loopback broker. An empty record (header
        ``flowstream-record: anchor``, which every reader skips) pays it here, off the path of
        the outcomes that come next, and alongside the positions' round trips (2.5-2.8 ms for
        both against 3.8-4.1 ms one after the other). It is written after the committing
        transaction's records, so it never holds them back from ``read_committed`` readers.
        """
        if before is not None:
            before.result()  # the spare's first fence, earlier on this lane
        if after is not None:
            try:
                after.result(timeout=self._stuck_s)
            except TimeoutError:
                raise _Abort("the transaction before it never wrote its records") from None
        for partition in anchors:
            self._send(slot, self.topics[EVENTS], partition, b"", b"", _ANCHOR_HEADERS)
        if offsets is not None:
            self._send_offsets(slot.producer, offsets, metadata)
        if anchors:
            slot.producer.flush(30)
        if slot.error is not None and _is_fatal(slot.error):
            raise clients.KafkaException(slot.error)

    def _refence(self) -> None:
        """Send the open transaction's positions again as soon as the commands it applied moved
        them, while its steps run and its records are written, rather than at the seal, where
        the commit would wait for those round trips (and the spare would follow them again).
        Once per transaction: under a steady stream of commands the seal sends them anyway."""
        fence = self._fence
        if self._refenced or fence is None or not fence.done():
            return
        offsets = self._positions()
        key = _offsets_key(offsets)
        if not offsets or key == self._fenced:
            return
        self._refenced = True
        self._release_deferred()  # records wait for the first fence only, if it went through
        self._fenced = key
        after = self._precommit if self._committing is not None else None
        fence = self._slot.lane.submit(
            self._open_fence, self._slot, offsets, self._group_metadata(), [], after, fence
        )
        fence.add_done_callback(self._wake_loop)
        self._fence = fence

    def _begin_spare(self) -> None:
        """Begin the transaction that follows the open one, on the other producer, while no
        commit is in flight; its lane sends its positions once the open one's went through
        (so the group keeps the later ones). When the open one is sealed, the spare takes its
        place with its positions already sent, and only the anchors wait for the sealed one's
        records; were the sealed one to send moved positions, the spare sends them again after.
        """
        slot = self._other_slot
        if slot.begun:
            return
        offsets = self._positions()
        if not offsets:
            return
        try:
            slot.begin()
        except clients.KafkaException:
            return  # begun as usual when it is needed, and the error met then
        metadata = self._group_metadata()
        self._spare_fenced = _offsets_key(offsets)
        self._spare = slot.lane.submit(self._open_fence, slot, offsets, metadata, [], self._fence)

    def _promote_spare(
        self, spare: Future[None], precommit: Future[None], moved: bool, anchors: list[int]
    ) -> None:
        """The spare becomes the open transaction as the one before it is sealed."""
        slot = self._slot
        self._kafka_open = True
        self._producing = False
        self._fenced = self._spare_fenced
        offsets = None
        if moved:  # the sealed one sends positions again, after the spare's: follow them
            offsets = self._positions()
            self._fenced = _offsets_key(offsets)
        if offsets is None and not anchors:
            self._fence = spare
            return
        metadata = self._group_metadata() if offsets is not None else None
        self._fence = slot.lane.submit(
            self._open_fence, slot, offsets, metadata, anchors, precommit, spare
        )
        self._fence.add_done_callback(self._wake_loop)

    @property
    def _other_slot(self) -> _Slot:
        """The slot that is not open: the committing one's while a commit is in flight."""
        return self._slots[1 - self._slot.index]

    def _group_metadata(self) -> Any:
        """The consumer's group metadata (generation and member id) for the fence, fetched once
        per generation: it costs more than beginning a transaction, and only a rebalance (whose
        callbacks forget it) changes it."""
        if self._metadata is None:
            self._metadata = self.consumer.consumer_group_metadata()
        return self._metadata

    def _close_open(self) -> None:
        """No transaction is open any more (sealed, aborted, or lost with its producer)."""
        self._txn_open = False
        self._kafka_open = False
        self._refenced = False
        self._eager_since = None
        self._eager_work = False
        self._producing = False

    def _release_deferred(self) -> None:
        """Once the fence went through, records of the open transaction go out directly."""
        fence = self._fence
        ready = fence is not None and fence.done() and fence.exception() is None
        if ready and self._kafka_open and not self._producing:
            self._producing = True
            self._flush_deferred()

    def _positions(self) -> list[Any]:
        """The consumer position of every command partition of every active partition."""
        return [
            clients.TopicPartition(topic, owned.partition, position)
            for owned in self._owned.values()
            if not owned.restoring
            for topic, position in owned.positions.items()
            if position >= 0
        ]

    @staticmethod
    def _send_offsets(producer: Any, offsets: list[Any], metadata: Any) -> None:
        _retrying(lambda: producer.send_offsets_to_transaction(offsets, metadata, 30))

    def _delivered(self, slot: _Slot, err: Any, message: Any) -> None:
        if err is not None:
            slot.error = slot.error or err
        elif message.topic() == self.topics[EVENTS]:
            end = message.offset() + 1
            partition = message.partition()
            slot.events_end[partition] = max(slot.events_end.get(partition, 0), end)

    def _commit(self, *, start_steps: bool = True, retake: bool = True) -> None:
        """Commit everything staged so far and wait for it (shutdown, revocation, restore); a
        spare that took the sealed transaction's place commits (its positions) after it."""
        self._settle_commit(start_steps=start_steps, retake=retake)
        for _ in range(2):
            if not (self._txn_open or self._kafka_open):
                break
            self._start_commit(retake=retake, reopen=False)
            self._settle_commit(start_steps=start_steps, retake=retake)

    def _start_commit(self, *, retake: bool = True, reopen: bool = True) -> None:
        """Seal the open transaction and hand its commit to its slot's lane.

        1. every transaction carries the positions of *every* command partition of every
           active partition, with the group metadata: the group coordinator refuses them if
           this member lost its generation (KIP-447), and while they are pending a new owner's
           offset fetch waits for this transaction to end, so it restores what it wrote. They
           were sent when the transaction began; they are sent again if they moved since;
        2. each partition's staged RocksDB batch and outbox are sealed with the transaction;
        3. the lane commits (``commit_transaction`` fails on any undelivered record);
        4. a transaction that carried decisions is likely followed by more (the outcomes of the
           steps it starts, the next command of a busy producer): the next one is begun on the
           other slot at once (unless ``reopen`` is false), its anchors where those steps run.
        """
        offsets = self._positions()
        if not offsets:
            self._abort("no valid consumer positions to gate the transaction", retake=retake)
            return
        if not self._kafka_open:
            self._begin_on_kafka()
        self._release_deferred()
        records, self._deferred = self._deferred, []
        moved = _offsets_key(offsets) != self._fenced
        metadata = self._group_metadata() if moved else None
        active = [o for o in self._owned.values() if not o.restoring]
        for owned in active:
            if owned.store.has_staged:
                owned.store.seal()
            owned.sealed_outbox, owned.outbox = owned.outbox, []
            owned.sealed_positions = dict(owned.positions)
        eager = self._txn_open and reopen
        self._close_open()
        self._sealed = active
        self._commit_began = time.monotonic()
        fence, self._fence = self._fence, None
        slot = self._slot
        self._precommit = Future()
        self._committing = slot.lane.submit(
            self._commit_blocking,
            slot,
            fence,
            records,
            offsets if moved else None,
            metadata,
            self._precommit,
        )
        self._committing.add_done_callback(self._wake_loop)
        self._slot = self._other_slot
        anchors = [o.partition for o in active if self._will_report(o)] if eager else []
        spare, self._spare = self._spare, None
        if spare is not None:
            self._promote_spare(spare, self._precommit, moved, anchors)
        elif eager:
            self._begin_on_kafka(anchors=anchors)
        self._eager_work = eager

    def _will_report(self, owned: Owned) -> bool:
        """Steps sealed with this transaction will append outcomes to ``owned``'s events
        partition in the next one: those it starts once committed, or, started eagerly, those
        still running."""
        if not self.settings.eager_steps:
            return bool(owned.sealed_outbox)
        inflight = owned.inflight
        return any(item in inflight for item in owned.sealed_outbox)

    def _commit_blocking(
        self,
        slot: _Slot,
        fence: Future[None] | None,
        records: list[tuple[str, int, bytes, bytes, Any]],
        offsets: list[Any] | None,
        metadata: Any,
        precommit: Future[None],
    ) -> None:
        """In the slot's lane: check the fence went through, produce the records still held
        back, send moved positions, wait for every record to be written (the next transaction
        may then write and send positions), commit, serve the delivery reports (they carry the
        events offsets the local batches record)."""
        producer = slot.producer
        try:
            if slot.error is not None:
                raise _Abort(f"the transaction cannot commit: {slot.error}")
            if fence is not None:
                fence.result()  # ran before this task (one lane per slot); raises what it raised
            for record in records:
                self._send(slot, *record)
            if offsets is not None:
                self._send_offsets(producer, offsets, metadata)
            if producer.flush(30):
                raise _Abort("records were not delivered within 30 s")
        finally:
            precommit.set_result(None)
        _retrying(lambda: producer.commit_transaction(30))
        slot.begun = False
        producer.poll(0)
        if slot.error is not None:
            raise _Abort(f"delivery failed: {slot.error}")

    def _settle_commit(self, *, start_steps: bool = True, retake: bool = True) -> None:
        """Wait for the commit in flight, then write the sealed batches with the events offsets
        they reflect and start the steps whose ``step_started`` just became durable; or abort."""
        future = self._committing
        if future is None:
            return
        if not self._finished(future):
            self._give_up_producer(retake=retake)
            return
        try:
            future.result()
        except (clients.KafkaException, _Abort) as exc:
            fatal = exc if isinstance(exc, clients.KafkaException) and exc.args[0].fatal() else None
            self._abort(str(exc), retake=retake, fatal=fatal)
            return
        except Exception as exc:
            # Not a Kafka error: a client library failing in a way it does not document (a
            # fenced producer's flush() once raised SystemError). The transaction is lost all
            # the same; the abort finds out whether the producer is still usable.
            LOG.error("the commit failed unexpectedly", exc_info=exc)
            self._abort(f"{type(exc).__name__}: {exc}", retake=retake)
            return
        self._committing = None
        self._precommit = None
        if self.settings.eager_steps:
            start_steps = False  # each started as it was decided (``_dispatch``)
        events_end = self._other_slot.events_end  # the committing one's
        for owned in self._sealed:
            if self._owned.get(owned.partition) is not owned:
                continue
            owned.store.commit_sealed(events_end.get(owned.partition))
            owned.committed = owned.sealed_positions
            for item in owned.sealed_outbox if start_steps else ():
                self._start_attempt(owned, item)
            owned.sealed_outbox = []
        self._sealed = []
        self.metrics.transaction_seconds.observe(time.monotonic() - self._commit_began)
        if self._kafka_open and not self._txn_open:
            # Begun eagerly when this one was sealed: if nothing joins it soon, it commits
            # alone (its positions and anchors) and is not reopened.
            self._eager_since = time.monotonic()

    def _wake_loop(self, _: Any) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake.set)

    def _abort(
        self, reason: str, *, retake: bool = True, fatal: clients.KafkaException | None = None
    ) -> None:
        """Abort the open transaction and the one committing, if any; rewind to the last
        commit. A fenced producer (``fatal``, or found when aborting) is replaced (see
        ``_reset_producer``): no transactional call can succeed on it, not even an abort."""
        LOG.warning("aborting transaction: %s", reason)
        self.metrics.aborts.inc()
        self._metadata = None  # a refused fence may mean a generation this member missed
        # No abort under a call in flight.
        for pending in (self._fence, self._committing, self._spare):
            if pending is not None and not self._finished(pending):
                self._give_up_producer(retake=retake)
                return
        self._fence = self._committing = self._spare = None
        self._precommit = None
        fenced = fatal
        for slot in self._slots:
            # A producer found fenced when a transaction began, or in a delivery report.
            if fenced is None and slot.error is not None and _is_fatal(slot.error):
                fenced = clients.KafkaException(slot.error)
        for slot in self._slots:
            if not slot.begun or fenced is not None:
                continue
            try:
                _retrying(functools.partial(slot.producer.abort_transaction, 30), attempts=20)
                slot.begun = False
            except clients.KafkaException as exc:
                # _CONFLICT: a commit call that failed is still unfinished in librdkafka, so
                # no abort can go through on this producer either: replace it as if fenced.
                if exc.args[0].fatal() or exc.args[0].code() == clients.KafkaError._CONFLICT:
                    fenced = exc
                else:
                    # The coordinator is unreachable for now; librdkafka keeps the producer in
                    # the abort-required state, so the next begin fails until an abort goes
                    # through.
                    LOG.error("abort did not complete: %s", exc)
        self._close_open()
        self._deferred.clear()
        self._sealed = []
        if fenced is not None:
            self._reset_producer(fenced, retake=retake)
            return
        for slot in self._slots:
            slot.error = None
        for owned in self._owned.values():
            runs = owned.store.discard()
            if runs and not owned.restoring:
                self._redrive.setdefault(owned.partition, set()).update(runs)
            owned.outbox.clear()
            owned.sealed_outbox = []
            owned.fired.clear()
            owned.positions = dict(owned.committed)
            if not owned.restoring:
                for topic, position in owned.positions.items():
                    if position >= 0:
                        with contextlib.suppress(clients.KafkaException):
                            self.consumer.seek(
                                clients.TopicPartition(topic, owned.partition, position)
                            )

    def _finished(self, future: Future[Any]) -> bool:
        """Wait for a transactional call; False if it ran into the stuck limit."""
        with contextlib.suppress(TimeoutError):
            future.exception(timeout=self._stuck_s)
        return future.done()

    def _give_up_producer(self, *, retake: bool) -> None:
        """A transactional call never returned: leave it and its lane behind, and replace the
        producers as if fenced (a new one's ``init_transactions`` aborts what the old one had
        open). What was decided since the last commit is thrown away."""
        self.metrics.aborts.inc()
        for slot in self._slots:
            slot.lane.close()
            slot.lane = Lane(f"flowstream-commit-{slot.index}")
        self._fence = self._committing = self._spare = None
        self._precommit = None
        self._sealed = []
        error = clients.KafkaException(
            clients.KafkaError(clients.KafkaError._TIMED_OUT, "a transactional call never returned")
        )
        self._reset_producer(error, retake=retake, why=f"hangs (over {self._stuck_s:.0f} s)")

    def _reset_producer(
        self, error: clients.KafkaException, *, retake: bool, why: str = "is fenced"
    ) -> None:
        """Replace the producers and restore the owned partitions from the events topic.

        A fatal producer error means this ``transactional.id`` got a newer epoch: the coordinator
        aborted a transaction that outlived ``transaction.timeout.ms`` (a stalled process, a slow
        broker), or another process runs with this instance id. The open transactions are lost
        (aborted by the coordinator, or by the new producers); the group membership is not. New
        producers (which fence the other holder of the ids, if any) take over, and every owned
        partition is taken again as on an assignment: its consumer positions are read back from
        the group and its store catches up with the events topic, which holds whatever really
        committed. Resets that repeat (``_MAX_RESETS`` within ``_RESET_WINDOW_S``) mean two
        processes fence each other: the error is raised.
        """
        now = time.monotonic()
        self._resets = [t for t in self._resets if now - t < _RESET_WINDOW_S] + [now]
        if len(self._resets) > _MAX_RESETS:
            raise error
        LOG.error("the producer %s (%s); replacing it", why, error)
        self._metadata = None
        self.metrics.producer_resets.inc()
        self._close_open()
        self._fence = self._spare = None
        self._precommit = None
        self._deferred.clear()
        for slot in self._slots:
            with contextlib.suppress(Exception):
                slot.producer.purge()
            slot.error = None
            slot.begun = False
            # A slot whose transaction was open gets a new producer; so does the other, whose
            # epoch the coordinator may have bumped too.
            slot.producer = self._new_producer(slot)
        self._slot = self._slots[0]
        taken = self.consumer.assignment() if retake else []
        self._drop(set(self._owned))
        if taken:
            self._take(taken, seek=True)

    def _produce(
        self, topic: str, partition: int, key: str, value: bytes, headers: Any = None
    ) -> None:
        self._begin()
        if self._producing:
            self._send(self._slot, topic, partition, key.encode(), value, headers)
        else:
            self._deferred.append((topic, partition, key.encode(), value, headers))

    def _flush_deferred(self) -> None:
        for record in self._deferred:
            self._send(self._slot, *record)
        self._deferred.clear()

    def _send(
        self, slot: _Slot, topic: str, partition: int, key: bytes, value: bytes, headers: Any
    ) -> None:
        producer = slot.producer
        while True:
            try:
                producer.produce(topic, value=value, key=key, partition=partition, headers=headers)
                return
            except BufferError:
                producer.poll(0.05)
            except clients.KafkaException as exc:
                # The producer is fenced or the transaction must abort: the commit aborts it.
                slot.error = slot.error or exc.args[0]
                return

    # -- rebalance ------------------------------------------------------------------------

    def _on_assign(self, consumer: Any, assigned: list[Any]) -> None:
        self._metadata = None
        try:
            if not assigned:
                return
            LOG.info("assigned partitions %s", sorted({tp.partition for tp in assigned}))
            consumer.assign(assigned)
            self._take(assigned)
        except BaseException as exc:  # surfaced by the loop; callbacks must not raise
            self._fatal = exc

    def _take(self, assigned: list[Any], *, seek: bool = False) -> None:
        """Own the partitions of ``assigned`` from their committed positions: paused until
        restored; ``seek`` moves the consumer back there (when taking them again)."""
        consumer = self.consumer
        consumer.pause(assigned)
        committed = _patiently(lambda: consumer.committed(assigned, timeout=20))
        by_partition: dict[int, dict[str, int]] = {}
        for tp in committed:
            position = tp.offset
            if position < 0:
                where = clients.TopicPartition(tp.topic, tp.partition)
                low, _ = _patiently(
                    functools.partial(self.watermarks.get_watermark_offsets, where, timeout=10)
                )
                position = low
            by_partition.setdefault(tp.partition, {})[tp.topic] = position
            if seek:
                consumer.seek(clients.TopicPartition(tp.topic, tp.partition, position))
        for partition in list(self._held_results):
            if partition not in by_partition:
                del self._held_results[partition]
        for partition, positions in by_partition.items():
            if set(positions) != set(self.command_topics):
                raise TopologyError(
                    f"partition {partition} was assigned for only some command topics; "
                    "use the range assignor with equal partition counts"
                )
            self._own(partition, positions)

    def _own(self, partition: int, positions: dict[str, int]) -> None:
        path = self.state_dir / f"p{partition:04d}"
        holder: dict[str, Owned] = {}
        writer_headers = [
            (RECORD_HEADER, b"event"),
            (WRITER_HEADER, self.settings.instance_id.encode()),
        ]

        def sink(run_id: str, envelopes: list[EventEnvelope], encoded: list[bytes]) -> None:
            for envelope, data in zip(envelopes, encoded, strict=True):
                self._produce(self.topics[EVENTS], partition, run_id, data, writer_headers)
                event = envelope.event
                if isinstance(event, HookCreated):
                    self._emit(
                        RegisterHookToken(
                            token_digest=event.token_digest, run_id=run_id, hook_id=event.hook_id
                        )
                    )
            self.metrics.events_appended.inc(len(envelopes))

        store = PartitionStore(partition, path, sink, clock=self.clock)
        engine = PartitionEngine(
            store,
            self.runtimes,
            dispatch=lambda run_id, steps: self._dispatch(holder["owned"], run_id, steps),
            emit=self._emit,
            clock=self.clock,
            on_conflict=self.metrics.conflicts.inc,
        )
        owned = Owned(partition, store, engine, dict(positions), dict(positions))
        holder["owned"] = owned
        self._owned[partition] = owned

    def _on_revoke(self, consumer: Any, revoked: list[Any]) -> None:
        self._metadata = None
        LOG.info("revoked partitions %s", sorted({tp.partition for tp in revoked}))
        try:
            self._commit(start_steps=False, retake=False)
        except BaseException as exc:
            self._fatal = exc
        self._drop({tp.partition for tp in revoked})

    def _on_lost(self, consumer: Any, lost: list[Any]) -> None:
        self._metadata = None
        LOG.warning("lost partitions %s", sorted({tp.partition for tp in lost}))
        try:
            if self._txn_open or self._kafka_open or self._committing is not None:
                self._abort("partitions lost", retake=False)
        except BaseException as exc:
            self._fatal = exc
        self._drop({tp.partition for tp in lost})

    def _drop(self, partitions: set[int]) -> None:
        for partition in partitions:
            owned = self._owned.pop(partition, None)
            if owned is not None:
                owned.store.discard()
                owned.store.close()

    # -- restore --------------------------------------------------------------------------

    async def _restore_slice(self) -> None:
        """One bounded step of restoring every partition that waits for it, all at once.

        Each newly assigned partition gets its target (the events partition's true high
        watermark); the restorer then fetches every restoring partition in parallel, so a
        takeover of several partitions costs the longest restore, not their sum, and a partition
        that has little to catch up is served as soon as it has it.
        """
        events = self.topics[EVENTS]
        if (self._txn_open or self._kafka_open) and any(
            o.restoring and o.restore_target is None for o in self._owned.values()
        ):
            # Asking for targets can wait on a broker (a leader moving): no transaction of the
            # active partitions waits with it, where it could outlive its timeout.
            self._commit()
        restoring = [o for o in self._owned.values() if o.restoring]
        for owned in restoring:
            if owned.restore_target is None and time.monotonic() >= self._targets_retry_at:
                tp = clients.TopicPartition(events, owned.partition)
                try:
                    _, high = self.watermarks.get_watermark_offsets(tp, timeout=5, cached=False)
                except clients.KafkaException as exc:
                    if exc.args[0].fatal():
                        raise
                    LOG.warning(
                        "partition %d: no high watermark yet (%s); retrying", owned.partition, exc
                    )
                    # Its view of the partition may be stale (a leader moved while a broker was
                    # down, the partition unknown since): ask again soon with a fresh client.
                    with contextlib.suppress(Exception):
                        self.watermarks.close()
                    self.watermarks = self._new_watermarks()
                    self._targets_retry_at = time.monotonic() + _TARGET_RETRY_S
                    break  # the others next time: the loop goes on meanwhile
                owned.restore_target = high
                owned.events_end = owned.store.events_offset
                LOG.info(
                    "partition %d: restoring events %d..%d", owned.partition, owned.events_end, high
                )
        ready = [o for o in restoring if o.restore_target is not None]
        for owned in ready:
            if (owned.events_end or 0) >= (owned.restore_target or 0):
                await self._activate(owned)
        fetching = {o.partition: o for o in ready if o.restoring}
        # Partitions nearly caught up (typically this member's own, a transaction marker behind)
        # first: in one fetch with long restores they would wait behind those records.
        near = {
            p: o
            for p, o in fetching.items()
            if (o.restore_target or 0) - (o.events_end or 0) <= _NEAR_RESTORED
        }
        fetching = near or fetching
        if fetching != self._restoring:
            # A partition joined, finished or went away: fetch the others from where they are.
            self._restoring = fetching
            self.restorer.assign(
                [
                    clients.TopicPartition(events, partition, owned.events_end or 0)
                    for partition, owned in fetching.items()
                ]
            )
        if not fetching:
            return
        first = self.restorer.poll(0.02)
        messages = [] if first is None else [first, *self.restorer.consume(499, timeout=0)]
        for message in messages:
            if message.error() is not None:
                continue
            target = fetching.get(int(message.partition() or 0))
            offset = int(message.offset() or 0)
            if target is None or offset < (target.events_end or 0):
                continue  # fetched for an assignment that has changed since
            self._restore_record(target, message)
            target.events_end = offset + 1
        # The position passes transaction markers and aborted records, which consume() skips.
        for tp in self.restorer.position(
            [clients.TopicPartition(events, partition) for partition in fetching]
        ):
            owned = fetching[tp.partition]
            owned.events_end = max(owned.events_end or 0, tp.offset)
            if owned.store.has_staged or owned.events_end != owned.store.events_offset:
                owned.store.commit_local(owned.events_end)
            if owned.events_end >= (owned.restore_target or 0):
                await self._activate(owned)

    def _restore_record(self, owned: Owned, message: Any) -> None:
        """Apply one record of the events partition; a record that is not a valid event of its
        run is reported and skipped, so a bad record can never crash-loop the processor.

        An event is Avro single-object encoded (C3 01 ...); inbox and hook-token records start
        with UTF-8 text, which never starts with C3 01. So only those need their headers read
        (the first ``headers()`` call builds them: it costs more than storing the event).
        """
        value = message.value()
        try:
            if value is not None and value[:2] == codec.MARKER:
                owned.store.restore_event(value)
            else:
                self._restore_one(owned, message)
        except (FlowError, ValueError) as exc:
            self._skip_record(message, exc)

    def _skip_record(self, message: Any, exc: Exception) -> None:
        """A record that is not a valid event of its run is reported and skipped, so a bad
        record can never crash-loop the processor."""
        self.metrics.corrupt_records.inc()
        LOG.error(
            "skipping record %s[%d]@%d while restoring: %s",
            message.topic(),
            message.partition(),
            message.offset(),
            exc,
        )

    def _restore_one(self, owned: Owned, message: Any) -> None:
        kind = dict(message.headers() or ()).get(RECORD_HEADER, b"event")
        value = message.value()
        if kind == b"event":
            owned.store.restore_event(value)
        elif kind == b"inbox":
            run_id, inbox_id, raw = _split_inbox(value)
            owned.store.park(run_id, inbox_id, raw)
        elif kind == b"inbox-done":
            run_id, inbox_id, _ = _split_inbox(value)
            owned.store.unpark(run_id, inbox_id)
        elif kind == b"hook-token":
            digest, run_id, hook_id = value.decode().split("\0", 2)
            owned.store.index_hook_token(digest, run_id, hook_id)

    async def _activate(self, owned: Owned) -> None:
        """Restored: resume the command partitions, re-run unsettled steps, retry the inbox."""
        for run_id, exc in owned.store.finish_restore():
            self.metrics.corrupt_records.inc()
            LOG.error(
                "partition %d: run %s is not indexed after the restore: %s",
                owned.partition,
                run_id,
                exc,
            )
        owned.restoring = False
        took = time.monotonic() - owned.restore_began
        self.metrics.restore_seconds.observe(took)
        LOG.info("partition %d: restored in %.3f s", owned.partition, took)
        self.consumer.resume(
            [clients.TopicPartition(topic, owned.partition) for topic in self.command_topics]
        )
        self._begin()
        for held in self._held_results.pop(owned.partition, []):
            await self._step_result(*held)
        for run_id in owned.store.running_runs():
            await self._guard(owned, run_id, owned.engine.advance(run_id))
        await self._drain(owned, None)
        if not self.ready.is_set() and not any(o.restoring for o in self._owned.values()):
            self.ready.set()

    async def _guard(self, owned: Owned, run_id: str, work: Any) -> None:
        """Run engine work for one run; a failure is logged and counted, never fatal."""
        try:
            await work
        except NonDeterministicError as exc:
            self.metrics.nondeterminism.inc()
            LOG.error("%s", exc)
        except FlowError as exc:
            LOG.warning("run %s: %s", run_id, exc)

    # -- commands -------------------------------------------------------------------------

    async def _command(self, message: Any) -> None:
        if message.error() is not None:
            if message.error().fatal():
                raise clients.KafkaException(message.error())
            return
        partition = message.partition()
        owned = self._owned.get(partition)
        if owned is None or owned.restoring:
            return
        topic = message.topic()
        began = time.perf_counter()
        # Moved before the transaction begins: a transaction this command opens sends the
        # moved position with its first fence, not again once the fence went through.
        owned.positions[topic] = message.offset() + 1
        self._begin()
        self._txn_commands += 1
        raw = message.value() or b""
        inbox_id = f"{topic}:{partition}:{message.offset()}"
        outcome = "applied"
        try:
            if len(raw) > self.settings.max_message_bytes:
                raise SerializationError(
                    f"message of {len(raw)} bytes exceeds {self.settings.max_message_bytes}"
                )
            command = codec.decode_command(raw)
            run_id = routing_key(command)
            if partition_for(run_id, self.partitions) != partition:
                raise InvalidTransitionError(
                    f"key {run_id} belongs to partition {partition_for(run_id, self.partitions)},"
                    f" not {partition}"
                )
            try:
                await self._apply(owned, command)
            except _Park as park:
                self._park(owned, run_id, inbox_id, raw, park.reason)
                outcome = f"parked: {park.reason}"
            else:
                await self._drain(owned, run_id)
        except NonDeterministicError as exc:
            self.metrics.nondeterminism.inc()
            outcome = "deadletter"
            self._dead_letter(message, str(exc))
        except (FlowError, ValueError) as exc:
            outcome = "deadletter"
            self._dead_letter(message, str(exc))
        except Exception as exc:  # workflow or step code raised: report, keep processing
            outcome = "deadletter"
            self._dead_letter(message, f"runtime code raised {type(exc).__name__}: {exc}")
        self.metrics.commands.labels(topic=topic, outcome=outcome.split(":")[0]).inc()
        self.metrics.decision_seconds.observe(time.perf_counter() - began)

    async def _apply(self, owned: Owned, command: CommandMessage) -> None:
        """Apply one decoded command; raises ``_Park`` when it has to wait."""
        engine = owned.engine
        store = owned.store
        try:
            match command:
                case StartRun():
                    engine.create(
                        command.run_id,
                        command.spec,
                        command.input,
                        parent=command.parent,
                        depth=command.depth,
                    )
                    await engine.advance(command.run_id)
                case SendSignal():
                    if not store.exists(command.run_id):
                        raise _Park("run does not exist yet")
                    await engine.send_signal(
                        command.run_id, command.signal_id, command.name, command.payload
                    )
                case ResumeHook() if command.run_id is None:
                    self._forward_by_token(owned, command)
                case ResumeHook():
                    await self._resume_hook(owned, command)
                case RegisterHookToken():
                    owned.store.index_hook_token(
                        command.token_digest, command.run_id, command.hook_id
                    )
                    value = "\0".join((command.token_digest, command.run_id, command.hook_id))
                    self._produce(
                        self.topics[EVENTS],
                        owned.partition,
                        command.token_digest,
                        value.encode(),
                        [(RECORD_HEADER, b"hook-token")],
                    )
                case DisposeHook():
                    if not store.exists(command.run_id):
                        raise _Park("run does not exist yet")
                    await engine.dispose_hook(command.run_id, command.hook_id)
                case CancelRun():
                    if command.force:
                        await engine.force_cancel(command.run_id, command.reason)
                    else:
                        await engine.request_cancellation(command.run_id, command.reason)
                case FireTimer():
                    owned.fired.pop((command.run_id, command.kind, command.subject_id), None)
                    if not store.exists(command.run_id):
                        return
                    now = max(self.clock(), command.due)
                    if command.kind == "wait":
                        await engine.resume_wait(command.run_id, command.subject_id, now=now)
                    else:
                        await engine.advance(command.run_id, now=now)
                case ResolveChild():
                    await self._resolve_child(owned, command)
        except RuntimeBuildUnavailableError as exc:
            self.metrics.parked_for_build.inc()
            raise _Park(str(exc)) from exc

    def _forward_by_token(self, owned: Owned, command: ResumeHook) -> None:
        """A token-only resume landed on the digest's partition: send it to the hook's run."""
        assert command.token is not None
        owner = owned.store.hook_token_owner(token_digest(command.token.get_secret_value()))
        if owner is None:
            raise InvalidTransitionError("no hook is registered for the presented token")
        run_id, hook_id = owner
        self._emit(
            ResumeHook(run_id=run_id, hook_id=hook_id, token=command.token, payload=command.payload)
        )

    async def _resume_hook(self, owned: Owned, command: ResumeHook) -> None:
        assert command.run_id is not None and command.hook_id is not None
        if not owned.store.exists(command.run_id):
            raise _Park("run does not exist yet")
        state = owned.store.state(command.run_id)
        hook = state.hooks.get(command.hook_id)
        if hook is None and not state.is_terminal:
            raise _Park(f"hook {command.hook_id} does not exist yet")
        presented = None if command.token is None else command.token.get_secret_value()
        if (
            hook is not None
            and presented is not None
            and not hmac.compare_digest(hook.token_digest, token_digest(presented))
        ):
            raise InvalidTransitionError(
                f"the presented token does not match hook {command.hook_id}",
                run_id=command.run_id,
            )
        await owned.engine.resume_hook(command.run_id, command.hook_id, command.payload)

    async def _resolve_child(self, owned: Owned, command: ResolveChild) -> None:
        if not owned.store.exists(command.run_id):
            raise RunNotFoundError(command.run_id)
        state = owned.store.state(command.run_id)
        child = state.children.get(command.child_id)
        if child is None or child.run_id != command.child_run_id:
            raise InvalidTransitionError(
                f"run {command.run_id} has no child {command.child_id} with run "
                f"{command.child_run_id}"
            )
        if child.outcome is None and not state.is_terminal:
            owned.store.append_if_sequence(
                state.run_id,
                state.last_sequence,
                [ChildWorkflowResolved(child_id=command.child_id, outcome=command.outcome)],
            )
        await owned.engine.advance(command.run_id)

    def _emit(self, command: CommandMessage) -> None:
        topic = self.topics[_COMMAND_TOPIC_FOR[type(command)]]
        key = routing_key(command)
        self._produce(
            topic, partition_for(key, self.partitions), key, codec.encode_message(command)
        )

    # -- the inbox ------------------------------------------------------------------------

    def _park(self, owned: Owned, run_id: str, inbox_id: str, raw: bytes, reason: str) -> None:
        owned.store.park(run_id, inbox_id, raw)
        value = _join_inbox(run_id, inbox_id, raw)
        headers = [(RECORD_HEADER, b"inbox"), (REASON_HEADER, reason.encode())]
        self._produce(self.topics[EVENTS], owned.partition, run_id, value, headers)

    async def _drain(self, owned: Owned, run_id: str | None) -> None:
        """Retry parked commands (of one run, or all) until none applies; each applies once,
        then leaves the inbox. Applying one may unblock another (a signal makes the run create
        the hook a parked resume waits for), so passes repeat while something applied."""
        if not owned.store.has_parked():
            return
        progress = True
        while progress:
            progress = False
            for parked_run, inbox_id, raw in list(owned.store.parked(run_id)):
                if await self._retry_parked(owned, parked_run, inbox_id, raw):
                    progress = True

    async def _retry_parked(self, owned: Owned, parked_run: str, inbox_id: str, raw: bytes) -> bool:
        """Apply one parked command; False if it still has to wait."""
        reason = None
        try:
            await self._apply(owned, codec.decode_command(raw))
        except _Park:
            return False
        except FlowError as exc:
            reason = str(exc)
        owned.store.unpark(parked_run, inbox_id)
        self._produce(
            self.topics[EVENTS],
            owned.partition,
            parked_run,
            _join_inbox(parked_run, inbox_id, b""),
            [(RECORD_HEADER, b"inbox-done")],
        )
        if reason is not None:
            self._produce_dead_letter(
                owned.partition,
                parked_run.encode(),
                raw,
                f"parked command failed: {reason}",
                source=inbox_id,
            )
        return True

    # -- dead letters ---------------------------------------------------------------------

    def _dead_letter(self, message: Any, reason: str) -> None:
        self.metrics.dead_letters.inc()
        LOG.warning(
            "dead-lettered %s[%d]@%d: %s",
            message.topic(),
            message.partition(),
            message.offset(),
            reason,
        )
        record = DeadLetter(
            source_topic=message.topic(),
            partition=message.partition(),
            offset=message.offset(),
            key=message.key(),
            reason=reason,
            value=message.value(),
        )
        self._produce(
            self.topics[DEADLETTER],
            message.partition() % self.topology.topic(DEADLETTER).partitions,
            (message.key() or b"").decode(errors="replace"),
            codec.encode_message(record),
        )

    def _produce_dead_letter(
        self, partition: int, key: bytes, raw: bytes, reason: str, *, source: str
    ) -> None:
        self.metrics.dead_letters.inc()
        topic, _, rest = source.rpartition(":")
        topic, _, part = topic.rpartition(":")
        record = DeadLetter(
            source_topic=topic or source,
            partition=int(part) if part.isdigit() else partition,
            offset=int(rest) if rest.isdigit() else 0,
            key=key,
            reason=reason,
            value=raw,
        )
        self._produce(
            self.topics[DEADLETTER],
            partition % self.topology.topic(DEADLETTER).partitions,
            key.decode(errors="replace"),
            codec.encode_message(record),
        )

    # -- steps ----------------------------------------------------------------------------

    def _dispatch(self, owned: Owned, run_id: str, steps: list[tuple[str, int]]) -> None:
        """Decided steps go out with the transaction (the outbox: started once it committed),
        or at once with ``eager_steps``; the outbox then only names the partitions to anchor."""
        for step_id, attempt in steps:
            item = (run_id, step_id, attempt)
            if item in owned.inflight or item in owned.outbox:
                continue
            owned.outbox.append(item)
            if self.settings.eager_steps:
                self._start_attempt(owned, item)

    def _start_attempt(self, owned: Owned, item: tuple[str, str, int]) -> None:
        """Start a task for the attempt unless ``owned`` has one, or a task of an earlier owner
        of the partition (before a rebalance or a reset) runs its handler: its outcome comes to
        ``owned`` (``_step_result``), or, if it never starts, ``_hand_over`` starts it here."""
        if item in owned.inflight or (owned.partition, *item) in self._handling:
            return
        owned.inflight.add(item)
        self._start_step(owned, *item)

    def _hand_over(self, source: Owned, item: tuple[str, str, int]) -> None:
        """A task of ``source`` ended without an outcome: if the partition's current owner
        has the attempt running, and would not start it itself (already committed in the
        default mode, or eager), it starts it now."""
        owned = self._owned.get(source.partition)
        if owned is None or owned is source or owned.restoring:
            return  # gone, or a restore drives every running run anyway
        if not self.settings.eager_steps and (item in owned.outbox or item in owned.sealed_outbox):
            return  # started when its step_started commits
        run_id, step_id, attempt = item
        if owned.store.exists(run_id) and owned.store.state(run_id).attempt_running(
            step_id, attempt
        ):
            self._start_attempt(owned, item)

    def _start_step(self, owned: Owned, run_id: str, step_id: str, attempt: int) -> None:
        task = asyncio.ensure_future(self._run_step(owned, run_id, step_id, attempt))
        self._tasks.add(task)
        self._step_starts[task] = time.monotonic()

        def done(task: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            self._step_starts.pop(task, None)
            self._wake.set()

        task.add_done_callback(done)

    async def _run_step(self, owned: Owned, run_id: str, step_id: str, attempt: int) -> None:
        item = (run_id, step_id, attempt)
        key = (owned.partition, *item)
        try:
            async with self._step_slots:
                state = self._attempt_state(owned, run_id, step_id, attempt)
                if state is None:
                    owned.inflight.discard(item)
                    self.metrics.step_attempts.labels(outcome="not_started").inc()
                    self._hand_over(owned, item)
                    return
                self._handling.add(key)
                runtime = owned.engine.runtimes[state.spec.runtime_build_id]
                outcome = await call_step(
                    runtime,
                    state,
                    step_id,
                    attempt,
                    not self.settings.inline_sync_steps,
                    # Asked in the step's thread right before the handler starts: a processor
                    # that lost the partition never starts an attempt the new owner re-runs.
                    gate=lambda: self._owned.get(owned.partition) is owned,
                    executor=self._executor,
                )
        except Exception:  # the partition was revoked and its store closed meanwhile
            owned.inflight.discard(item)
            self._handling.discard(key)
            if self._owned.get(owned.partition) is owned:
                raise
            self._hand_over(owned, item)
            return
        if outcome is None:
            owned.inflight.discard(item)
            self._handling.discard(key)
            self.metrics.step_attempts.labels(outcome="not_started").inc()
            self._hand_over(owned, item)
            return
        self._results.append((owned, run_id, step_id, attempt, outcome))

    def _attempt_state(
        self, owned: Owned, run_id: str, step_id: str, attempt: int
    ) -> RunState | None:
        """The run's state while the partition is owned and the attempt is running in it: an
        abort may have thrown away an eagerly started step's ``step_started`` (or its whole
        run) before its task came to run."""
        if self._owned.get(owned.partition) is not owned or not owned.store.exists(run_id):
            return None
        state = owned.store.state(run_id)
        return state if state.attempt_running(step_id, attempt) else None

    async def _step_result(
        self,
        source: Owned,
        run_id: str,
        step_id: str,
        attempt: int,
        outcome: tuple[Any, str | None, bool],
    ) -> None:
        """Record an attempt's outcome with the partition's current owner: ``source`` started
        it, maybe before a reset replaced it (the outcome still saves running the step again;
        the engine records it only while the attempt is running)."""
        source.inflight.discard((run_id, step_id, attempt))
        self._handling.discard((source.partition, run_id, step_id, attempt))
        owned = self._owned.get(source.partition)
        if owned is not None and owned.restoring:
            self._held_results.setdefault(source.partition, []).append(
                (source, run_id, step_id, attempt, outcome)
            )
            return
        if owned is None or not owned.store.exists(run_id):  # gone, or its start aborted
            self.metrics.step_attempts.labels(outcome="dropped").inc()
            return
        output, error, retryable = outcome
        label = "completed" if error is None else ("retryable" if retryable else "non_retryable")
        self.metrics.step_attempts.labels(outcome=label).inc()
        self._begin()
        began = time.perf_counter()

        async def work() -> None:
            recorded = await owned.engine.record_step_outcome(
                run_id, step_id, attempt, output=output, error=error, retryable=retryable
            )
            if recorded:
                await owned.engine.advance(run_id)
                # The run moved on (e.g. it created the hook a parked resume waits for).
                await self._drain(owned, run_id)

        await self._guard(owned, run_id, work())
        self.metrics.decision_seconds.observe(time.perf_counter() - began)

    async def _drive_again(self) -> None:
        """Drive the runs an abort rewound: a step outcome it threw away is not read again from
        any topic, so the step is dispatched again (its attempt is still running in the
        history) instead of waiting for the partition's next owner."""
        redrive, self._redrive = self._redrive, {}
        for partition, runs in redrive.items():
            owned = self._owned.get(partition)
            if owned is None or owned.restoring:
                continue  # a restore drives every running run anyway
            self._begin()
            for run_id in sorted(runs):
                if owned.store.exists(run_id):  # not a run whose start was thrown away
                    await self._guard(owned, run_id, owned.engine.advance(run_id))

    # -- timers ---------------------------------------------------------------------------

    def _fire_timers(self) -> None:
        wall = time.monotonic()
        if wall < self._next_timer_scan:
            return
        self._next_timer_scan = wall + _TIMER_SCAN_INTERVAL_S
        now = self.clock()
        refire = self.settings.timer_refire_ms / 1000
        for owned in self._owned.values():
            if owned.restoring:
                continue
            first = owned.store.next_wakeup()
            if first is None or first.due > now:
                continue
            for wakeup in owned.store.due_wakeups(now):
                key = (wakeup.run_id, wakeup.kind, wakeup.subject_id)
                fired_at = owned.fired.get(key)
                if fired_at is not None and wall - fired_at < refire:
                    continue
                owned.fired[key] = wall
                self.metrics.timer_lag_seconds.observe((now - wakeup.due).total_seconds())
                kind = "wait" if wakeup.kind == "wait" else "retry"
                fire = FireTimer(
                    run_id=wakeup.run_id, kind=kind, subject_id=wakeup.subject_id, due=wakeup.due
                )
                self._produce(
                    self.topics[CMD_TIMER],
                    owned.partition,
                    wakeup.run_id,
                    codec.encode_message(fire),
                )


_StepResult = tuple[Owned, str, str, int, tuple[Any, str | None, bool]]


def _patiently(operation: Callable[[], Any], *, attempts: int = 6) -> Any:
    """Call a metadata query again while it times out (a broker may be failing over)."""
    for attempt in range(attempts):
        try:
            return operation()
        except clients.KafkaException as exc:
            if exc.args[0].fatal() or attempt == attempts - 1:
                raise
            LOG.warning("retrying after %s", exc)
            time.sleep(0.5)
    raise AssertionError("unreachable")


def _retrying(operation: Callable[[], object], *, attempts: int = 10) -> None:
    """Call a transactional producer operation again while it fails with a retriable error
    (librdkafka's contract: retry the same call; abortable and fatal errors propagate)."""
    for attempt in range(attempts):
        try:
            operation()
            return
        except clients.KafkaException as exc:
            error = exc.args[0]
            if not error.retriable() or attempt == attempts - 1:
                raise
            time.sleep(min(0.05 * 2**attempt, 1.0))


#: An eager transaction (begun right after a commit that carried decisions) that no decision
#: joined within this long commits alone, well inside any transaction timeout.
_EAGER_IDLE_S = 0.2

# Rounds of (outcomes recorded, steps run) one iteration goes through: a run of up to this many
# short sequential steps can complete within one iteration.
_CHAIN_ROUNDS = 8

#: More producer resets than this within the window mean another process has this instance id.
_MAX_RESETS = 10
_RESET_WINDOW_S = 60.0


class _Abort(Exception):
    """The open transaction cannot commit and must be aborted."""


def _is_fatal(error: Any) -> bool:
    fatal = getattr(error, "fatal", None)
    return bool(fatal()) if callable(fatal) else False


def _debug(settings: Settings) -> dict[str, str]:
    """librdkafka's ``debug`` setting, when some contexts were asked for."""
    return {"debug": settings.kafka_debug} if settings.kafka_debug else {}


def _offsets_key(offsets: list[Any]) -> tuple[tuple[str, int, int], ...]:
    return tuple((tp.topic, tp.partition, tp.offset) for tp in offsets)


def _join_inbox(run_id: str, inbox_id: str, raw: bytes) -> bytes:
    return run_id.encode() + b"\0" + inbox_id.encode() + b"\0" + raw


def _split_inbox(value: bytes) -> tuple[str, str, bytes]:
    run_id, inbox_id, raw = value.split(b"\0", 2)
    return run_id.decode(), inbox_id.decode(), raw

"""``PartitionTask`` (one owned partition: its store, engine, positions and in-flight work) and
``TaskManager`` (taking, owning and dropping partitions as the group assigns them)."""

from __future__ import annotations

import functools
import logging
import operator
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowstream.errors import StoreLockedError
from flowstream.kafka import clients
from flowstream.processor.context import Context
from flowstream.processor.engine import PartitionEngine
from flowstream.processor.fence import OwnerFence
from flowstream.processor.txn.errors import patiently
from flowstream.stores.partition import PartitionStore
from flowstream.topology import (
    CMD_CANCEL,
    CMD_HOOK,
    CMD_SIGNAL,
    CMD_START,
    CMD_TIMER,
    TopologyError,
)

__all__ = ["PartitionTask", "StepItem", "TaskManager", "committed_positions", "state_path"]

LOG = logging.getLogger("flowstream.processor")

#: Tries to open a partition's store while it is locked.
_OPEN_ATTEMPTS = 5

#: A step attempt: (run id, step id, attempt).
StepItem = tuple[str, str, int]


@dataclass(eq=False)
class PartitionTask:
    """One owned partition number: its store, engine, positions and in-flight work."""

    partition: int
    store: PartitionStore
    engine: PartitionEngine
    positions: dict[str, int]
    committed: dict[str, int]
    restoring: bool = True
    restore_target: int | None = None
    restore_began: float = field(default_factory=time.monotonic)
    last_progress: float = field(default_factory=time.monotonic)
    events_end: int | None = None
    fired: dict[tuple[str, str, str], float] = field(default_factory=dict)
    outbox: list[StepItem] = field(default_factory=list)
    # Step attempts this owner started and has no outcome of yet. Per owner: a task left from
    # an earlier owner of the partition number (before a reset) never blocks this one's.
    inflight: set[StepItem] = field(default_factory=set)
    # What the transaction being committed holds: its steps and consumer positions.
    sealed_outbox: list[StepItem] = field(default_factory=list)
    sealed_positions: dict[str, int] = field(default_factory=dict)
    # The command positions the events partition recorded (its ``positions`` records, read by
    # the restore): where the partition's commands are applied up to.
    recorded: dict[str, int] = field(default_factory=dict)
    # Runs still to drive after the restore or an abort, a budget of them per iteration.
    to_drive: deque[str] = field(default_factory=deque)
    # Parked commands still to retry after the restore, a budget per iteration.
    to_retry: deque[tuple[str, str, bytes]] = field(default_factory=deque)
    # ``positions`` as consumer positions, the positions and writer they were made of: the
    # pipeline asks for them on most loop iterations, and they move only when a command is
    # consumed.
    _offsets: tuple[dict[str, int], str, list[Any]] = field(
        default_factory=lambda: ({}, "", []), repr=False
    )

    def offsets(self, writer: str = "") -> list[Any]:
        """``positions`` (those known: not negative) as ``TopicPartition``s naming ``writer``
        (what the positions a transaction sends carry: ``ProducerSlot.named``); the list is
        shared, callers do not change it."""
        made_of, made_for, offsets = self._offsets
        if made_of != self.positions or made_for != writer:
            offsets = [
                clients.TopicPartition(topic, self.partition, position, metadata=writer)
                for topic, position in self.positions.items()
                if position >= 0
            ]
            self._offsets = (dict(self.positions), writer, offsets)
        return offsets


def state_path(root: Path, group: str, prefix: str, partition: int) -> Path:
    """Where a partition's store lives: named by group, topic prefix and partition, so two
    deployments that share a state directory never share a store."""
    return root / group / prefix / f"p{partition:04d}"


#: One read of a partition set's committed positions waits this long.
POSITIONS_TIMEOUT_S = 5.0
#: Reads that time out are asked again for this long before the error is raised.
POSITIONS_PATIENCE_S = 300.0

#: What a group answers a commit of a member it no longer counts (its session ran out while it
#: was stopped or cut off, or a newer generation or member epoch replaced it). Asking again
#: cannot help: the member must rejoin, which its consumer does once the loop polls again and
#: hands the lost partitions over to the rebalance callbacks.
_NOT_A_MEMBER = frozenset(
    {
        clients.KafkaError.UNKNOWN_MEMBER_ID,
        clients.KafkaError.ILLEGAL_GENERATION,
        clients.KafkaError.FENCED_MEMBER_EPOCH,
    }
)


class NotAMember(Exception):
    """The group refused a claim: this member is no longer in it."""


def committed_positions(
    consumer: Any,
    assigned: list[Any],
    *,
    fresh: Callable[[], Any] | None = None,
    timeout: float = POSITIONS_TIMEOUT_S,
    patience: float = POSITIONS_PATIENCE_S,
    attempts: int = 6,
) -> list[Any]:
    """The group's committed positions of ``assigned``, asked again while the answer of any
    partition carries an error (``attempts`` times) or the read times out (for ``patience``
    seconds).

    ``Consumer.committed`` raises only when the whole request fails; a partition the coordinator
    answered with an error comes back with ``error`` set and no offset, which reads as "never
    committed": its commands would be consumed again from the partition's start.

    A read that times out is asked again through a client made for it (``fresh``: a consumer of
    the group that never joins it), then through ``consumer`` again, in turns. librdkafka looks a
    group's coordinator up again only when a connection of the client changes state (its issue
    5511): after the coordinator's broker was killed, a worker's consumer kept timing out for
    two minutes (six reads of 20 s, then the worker exited) while a new client found the new
    coordinator at once."""
    deadline = time.monotonic() + patience
    errors = 0
    use_fresh = False
    while True:
        reader = fresh() if use_fresh and fresh is not None else consumer
        try:
            found = reader.committed(assigned, timeout=timeout)
            failed = [tp for tp in found if tp.error is not None]
            if not failed:
                return list(found)
            raise clients.KafkaException(failed[0].error)
        except clients.KafkaException as exc:
            error = exc.args[0]
            if error.fatal():
                raise
            if error.code() == clients.KafkaError._TIMED_OUT:
                if time.monotonic() > deadline:
                    raise
                use_fresh = not use_fresh
            else:
                errors += 1
                if errors >= attempts:
                    raise
            LOG.warning(
                "positions of %s not read (%s); asking again%s",
                sorted({tp.partition for tp in assigned}),
                exc,
                " through a new client" if use_fresh and fresh is not None else "",
            )
            time.sleep(0.5)
        finally:
            if reader is not consumer:
                reader.close()


class TaskManager:
    """The owned partitions, and the group's assignments applied to them."""

    def __init__(
        self,
        ctx: Context,
        build: Callable[[int, Path, dict[str, int]], PartitionTask],
        *,
        state_root: Path,
    ) -> None:
        self.ctx = ctx
        self._build = build
        self.state_root = state_root
        # Changed only here (``_lists`` follows it), read anywhere.
        self.owned: dict[int, PartitionTask] = {}
        self._lists: tuple[list[PartitionTask], list[PartitionTask]] | None = None
        # ``positions()``: the active list and each task's offsets it was joined from, and the
        # joined list (the same object while none of them changed: the pipeline compares it by
        # identity on every loop iteration).
        self._positions: tuple[list[PartitionTask], list[list[Any]], list[Any]] = ([], [], [])
        self.command_topics = [
            ctx.topics[s] for s in (CMD_START, CMD_SIGNAL, CMD_HOOK, CMD_CANCEL, CMD_TIMER)
        ]
        self.consumer: Any = None
        #: A ``read_uncommitted`` client for the start of a command partition never committed.
        self.watermarks: Any = None
        #: Called with the partitions that were dropped (their held step results go).
        self.on_taken: Callable[[set[int]], None] = lambda partitions: None
        #: Aborts what a gone previous owner left open (set once connected).
        self.fence: OwnerFence | None = None
        #: Makes a consumer of the group that never joins it: reads positions when the member's
        #: own consumer times out (:func:`committed_positions`).
        self.new_reader: Callable[[], Any] | None = None
        #: The consumer protocol (KIP-848): assignments come and go as changes.
        self.incremental = False
        #: Partitions being revoked (during ``on_revoke``): a reset does not take them again.
        self.leaving: set[int] = set()
        #: Readies the restore's reader, on the opening thread (set once connected).
        self.warm: Callable[[], None] = lambda: None

    def get(self, partition: int) -> PartitionTask | None:
        return self.owned.get(partition)

    def active(self) -> list[PartitionTask]:
        """The owned tasks restored (a list kept until ``owned`` or a task's ``restoring``
        changes: every loop iteration asks several times; callers do not change it)."""
        return (self._lists or self._split())[0]

    def restoring(self) -> list[PartitionTask]:
        """The owned tasks still restoring (kept like ``active``)."""
        return (self._lists or self._split())[1]

    def own(self, task: PartitionTask) -> None:
        """``task`` is its partition's from now on (in place of any before it)."""
        self.owned[task.partition] = task
        self._lists = None

    def activate(self, task: PartitionTask) -> None:
        """``task`` is restored: it takes decisions from now on."""
        task.restoring = False
        self._lists = None

    def _split(self) -> tuple[list[PartitionTask], list[PartitionTask]]:
        lists = self._lists
        if lists is None:
            tasks = list(self.owned.values())
            lists = self._lists = (
                [t for t in tasks if not t.restoring],
                [t for t in tasks if t.restoring],
            )
        return lists

    def positions(self) -> list[Any]:
        """The consumer position of every command partition of every active partition, each
        naming the context's writer; the same list (callers do not change it) until a task's
        positions, the active tasks or the writer change."""
        active = self.active()
        writer = self.ctx.writer
        parts = [task.offsets(writer) for task in active]
        made_of, joined_parts, joined = self._positions
        if made_of is not active or any(map(operator.is_not, parts, joined_parts)):
            joined = [tp for part in parts for tp in part]
            self._positions = (active, parts, joined)
        return joined

    def take(self, assigned: list[Any], *, seek: bool = False) -> None:
        """Own the partitions of ``assigned`` from their committed positions: paused until
        restored. A new assignment is assigned to the consumer at those positions; ``seek``
        moves the consumer, which has them assigned already, back there (taking them again).

        The consumer is given the positions read here rather than left to read them itself:
        its own read, made at once, meets the dead owner's pending offset commit before the
        fence ends it, and librdkafka asks again only a second later, so the commands after
        the last commit waited a second more than the runs restored from the store."""
        consumer = self.consumer
        if seek:
            consumer.pause(assigned)
        # The stores open (and the restore's reader learns the events topic) on a thread while
        # the previous writers are fenced and the positions read: one waits on the disk, the
        # others on the coordinators (a failover waits on both).
        opening = _Opening(self, sorted({tp.partition for tp in assigned}))
        try:
            # A new assignment fences the previous writers first: committed() waits for the
            # offsets an open transaction of a writer of an earlier release holds pending. Taken
            # again (``seek``), it fences them only once the group accepted the claim: a zombie
            # resumed after its session ran out (refused) must not fence the owner it finds.
            writers = set() if self.fence is None else self.fence.writers_of(assigned)
            if self.fence is not None and not seek:
                self.fence.fence(assigned, writers)
                writers = set()
            committed = committed_positions(consumer, assigned, fresh=self.new_reader)
            by_partition: dict[int, dict[str, int]] = {}
            for tp in committed:
                position = tp.offset
                if position < 0:
                    where = clients.TopicPartition(tp.topic, tp.partition)
                    # A topic created moments ago may not be known to this client yet (the
                    # consumer protocol assigns within a second of joining): wait up to 20 s.
                    low, _ = patiently(
                        functools.partial(self.watermarks.get_watermark_offsets, where, timeout=10),
                        attempts=40,
                    )
                    position = low
                by_partition.setdefault(tp.partition, {})[tp.topic] = position
            for partition, positions in by_partition.items():
                if set(positions) != set(self.command_topics):
                    raise TopologyError(
                        f"partition {partition} was assigned for only some command topics; "
                        "use the range assignor with equal partition counts"
                    )
            at = [
                clients.TopicPartition(topic, partition, position)
                for partition, positions in by_partition.items()
                for topic, position in positions.items()
            ]
            try:
                self.claim(at)
            except NotAMember as exc:
                self._not_taken(assigned, at, seek, exc)
                opening.discard()
                return
            if self.fence is not None and writers:
                self.fence.fence(assigned, writers)
            if seek:
                for tp in at:
                    consumer.seek(tp)
            else:
                self._assign_paused(at)
            opened = opening.result()
        except BaseException:
            opening.discard()
            raise
        self.on_taken(set(by_partition))
        for partition, positions in by_partition.items():
            task = opened[partition]
            task.positions = dict(positions)
            task.committed = dict(positions)
            task.restore_began = task.last_progress = time.monotonic()
            self.own(task)

    def _not_taken(self, assigned: list[Any], at: list[Any], seek: bool, exc: Exception) -> None:
        """The claim of ``at`` was refused (:class:`NotAMember`): own none of it, and keep it
        paused in the consumer (a new assignment is assigned paused), so no command is read
        until the rebalance that follows takes it away and hands it out again."""
        LOG.warning(
            "partitions %s not taken: this member is no longer in the group (%s); it rejoins",
            sorted({tp.partition for tp in assigned}),
            exc,
        )
        if not seek:
            self._assign_paused(at)

    def _assign_paused(self, at: list[Any]) -> None:
        # The consumer protocol hands assignments out as changes only.
        (self.consumer.incremental_assign if self.incremental else self.consumer.assign)(at)
        self.consumer.pause(at)

    def claim(self, at: list[Any]) -> None:
        """Commit positions ``at`` to the group under this member's writer id before any of its
        transactions writes their partitions. The next owner fences the writer it finds there
        (``OwnerFence``), so an owner that loses the partitions without knowing (paused, cut
        off) can commit nothing after the next owner read them. The group checks the member's
        generation: a member that is no longer in it cannot claim (:class:`NotAMember`, at
        once: a resumed zombie asked again every 0.5 s for 300 s and never rejoined). Asked
        again while the coordinator does not answer (it may be moving)."""
        writer = self.ctx.writer
        named = [
            clients.TopicPartition(tp.topic, tp.partition, tp.offset, metadata=writer) for tp in at
        ]
        deadline = time.monotonic() + POSITIONS_PATIENCE_S
        while True:
            try:
                self.consumer.commit(offsets=named, asynchronous=False)
                return
            except clients.KafkaException as exc:
                if exc.args[0].code() in _NOT_A_MEMBER:
                    raise NotAMember(str(exc.args[0])) from exc
                if exc.args[0].fatal() or time.monotonic() > deadline:
                    raise
                LOG.warning(
                    "the claim of %s was not committed (%s); asking again",
                    sorted({tp.partition for tp in at}),
                    exc,
                )
                time.sleep(0.5)

    def commit_positions(self, tasks: list[PartitionTask], *, asynchronous: bool = True) -> None:
        """Commit ``tasks``' committed positions to the group under this member's writer id:
        they follow what the transactions recorded (for the group's lag, and for the next
        owner to start from without reading the events partition). Never raises: the
        transactions hold the positions."""
        writer = self.ctx.writer
        offsets = [
            clients.TopicPartition(topic, task.partition, position, metadata=writer)
            for task in tasks
            for topic, position in task.committed.items()
            if position >= 0
        ]
        if not offsets:
            return
        try:
            self.consumer.commit(offsets=offsets, asynchronous=asynchronous)
        except clients.KafkaException as exc:
            LOG.info("the group's offsets were not committed (%s)", exc)

    def open(self, partition: int, positions: dict[str, int]) -> PartitionTask:
        """A task for ``partition`` on its store (a store this process just closed, in a reset
        or a quick rebalance, can take a moment to release its lock: tried again)."""
        path = state_path(
            self.state_root, self.ctx.settings.group, self.ctx.settings.topic_prefix, partition
        )
        for attempt in range(_OPEN_ATTEMPTS):
            try:
                return self._build(partition, path, positions)
            except StoreLockedError:
                if attempt == _OPEN_ATTEMPTS - 1:
                    raise  # another process holds it: fatal
                time.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")

    def drop(self, partitions: set[int]) -> None:
        for partition in partitions:
            task = self.owned.pop(partition, None)
            self._lists = None
            if task is not None:
                task.store.discard()
                task.store.close()

    def rebuild(self, task: PartitionTask, why: str) -> PartitionTask:
        """Throw a partition's store away and restore it from the events topic from the start."""
        LOG.warning(
            "partition %d: %s; rebuilding its state from the events topic", task.partition, why
        )
        path = Path(task.store.path)
        task.store.close()
        shutil.rmtree(path, ignore_errors=True)
        fresh = self._build(task.partition, path, dict(task.positions))
        fresh.committed = dict(task.committed)
        self.own(fresh)
        return fresh

    def close(self) -> None:
        for task in list(self.owned.values()):
            task.store.close()
        self.owned.clear()
        self._lists = None


class _Opening:
    """The tasks of some partitions, their stores opened on a thread of their own."""

    def __init__(self, tasks: TaskManager, partitions: list[int]) -> None:
        self._tasks = tasks
        self._partitions = partitions
        self._opened: dict[int, PartitionTask] = {}
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._open, name="flowstream-open", daemon=True)
        self._thread.start()

    def _open(self) -> None:
        try:
            self._tasks.warm()
            for partition in self._partitions:
                self._opened[partition] = self._tasks.open(partition, {})
        except BaseException as exc:  # raised by result(), on the thread that waits
            self._error = exc

    def result(self) -> dict[int, PartitionTask]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._opened

    def discard(self) -> None:
        """Close what was opened (the assignment failed)."""
        self._thread.join()
        for task in self._opened.values():
            task.store.close()

"""``StateRestorer``: a newly owned partition's store catches up with its events partition before
the partition decides anything.

Its target is the events partition's true high watermark (read ``read_uncommitted``: a
``read_committed`` watermark is the last stable offset, which under-reads after two quick
handovers). Every restoring partition is fetched at once, in bounded slices of the loop, and is
done by *position* (commit markers occupy offsets). A stored offset above the high watermark
means the store belongs to another incarnation of the topic: it is rebuilt from the start.

A record that cannot be read (an unknown writer schema during a rolling deploy, bytes that do
not decode, an event that does not follow its run's history) quarantines its run: the run is
never advanced, its later records are skipped, and its commands are dead-lettered with the
reason, so no sequence number is ever handed out twice. On activation nothing unbounded runs
inside a transaction: the open one is committed first, and the runs to drive and the inbox to
retry go to the ``Sweeper``, a budget per iteration.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from flowstream import wire
from flowstream.kafka import clients
from flowstream.processor import hooktokens
from flowstream.processor.context import Context
from flowstream.processor.inbox import parked_value
from flowstream.processor.redact import redacted
from flowstream.processor.steps import StepRunner
from flowstream.processor.tasks import PartitionTask, TaskManager
from flowstream.topology import EVENTS

__all__ = ["StateRestorer", "Targets"]

LOG = logging.getLogger("flowstream.processor")

#: A restore target (high watermark) that could not be read is asked for again after this long.
_TARGET_RETRY_S = 0.1
#: How long one ask for a partition's watermarks may take; asked again, with a new client,
#: a request to a leader that died times out sooner: it is asked until the leader has moved,
#: and a new leader is asked at most about this long after the move.
_TARGET_TIMEOUT_S = 1.0
_TARGET_RETRY_TIMEOUT_S = 0.5
#: How long a slice waits for the targets it just asked for.
_TARGET_WAIT_S = 0.05
#: A partition at most this many records behind its restore target is fetched before the others.
_NEAR_RESTORED = 100
#: One slice applies at most this many records of what is already fetched, in about this long.
_SLICE_RECORDS = 5000
_SLICE_S = 0.05
#: How long one iteration builds the indexes of restored runs (``finish_restore_slice``).
_FINISH_SLICE_S = 0.1
#: A restore that makes no progress for this long is reported (a hanging transaction, a log
#: truncated below the target), again every such period.
_STALL_S = 60.0


class StateRestorer:
    """Restores the partitions that wait for it, a slice per loop iteration."""

    def __init__(self, ctx: Context, tasks: TaskManager, steps: StepRunner) -> None:
        self.ctx = ctx
        self.tasks = tasks
        self.steps = steps
        self.consumer: Any = None
        self.topic_id: str | None = None
        self.ready = asyncio.Event()
        self._fetching: dict[int, PartitionTask] = {}
        self.targets = Targets(tasks)

    def warm(self) -> None:
        """Learn the events topic's partitions and leaders now; never raises.

        A consumer assigned partitions of a topic it holds no metadata of (never fetched, or
        aged out of its cache) waits for librdkafka's once-a-second scan of unknown topics
        before it fetches: up to a second added to every failover. Called when connecting
        and on every assignment, on a thread beside the fence."""
        try:
            self.consumer.list_topics(self.ctx.topics[EVENTS], timeout=2)
        except clients.KafkaException as exc:
            LOG.info("the events topic's metadata is not known yet (%s)", exc)

    async def restore_slice(self) -> None:
        """One bounded step of restoring every partition that waits for it."""
        self.targets.ask([t for t in self.tasks.restoring() if t.restore_target is None])
        for task in self.tasks.restoring():
            if task.restore_target is None:
                self._target(task)
        ready = [t for t in self.tasks.restoring() if t.restore_target is not None]
        finish_until = time.monotonic() + _FINISH_SLICE_S
        for task in ready:
            if (task.events_end or 0) >= (task.restore_target or 0):
                self.activate(task, finish_until)
                if self._retaken(ready):
                    return  # the next slice goes on with the tasks that own them now
        # A partition building its indexes has every record: it is not fetched again.
        fetching = {t.partition: t for t in ready if t.restoring and not t.store.finishing}
        # Partitions nearly caught up (typically this member's own, a transaction marker behind)
        # first: in one fetch with long restores they would wait behind those records.
        near = {
            p: t
            for p, t in fetching.items()
            if (t.restore_target or 0) - (t.events_end or 0) <= _NEAR_RESTORED
        }
        fetching = near or fetching
        events = self.ctx.topics[EVENTS]
        if fetching != self._fetching:
            # A partition joined, finished or went away: fetch the others from where they are.
            self._fetching = fetching
            self.consumer.assign(
                [clients.TopicPartition(events, p, t.events_end or 0) for p, t in fetching.items()]
            )
        if not fetching:
            return
        first = self.consumer.poll(0.02)
        messages = [] if first is None else [first, *self.consumer.consume(499, timeout=0)]
        # What is already fetched is applied within the slice's time (a failover's partitions
        # wait on their restore alone, while live commands wait on each iteration).
        deadline = time.monotonic() + _SLICE_S
        while len(messages) < _SLICE_RECORDS and time.monotonic() < deadline:
            more = self.consumer.consume(500, timeout=0)
            if not more:
                break
            messages.extend(more)
        for message in messages:
            if message.error() is not None:
                continue
            target = fetching.get(int(message.partition() or 0))
            offset = int(message.offset() or 0)
            if target is None or offset < (target.events_end or 0):
                continue  # fetched for an assignment that has changed since
            self._record(target, message)
            target.events_end = offset + 1
        # The position passes transaction markers and aborted records, which consume() skips.
        for tp in self.consumer.position(
            [clients.TopicPartition(events, partition) for partition in fetching]
        ):
            task = fetching[tp.partition]
            moved = max(task.events_end or 0, tp.offset) > (task.events_end or 0)
            task.events_end = max(task.events_end or 0, tp.offset)
            if task.store.has_staged or task.events_end != task.store.events_offset:
                task.store.commit_local(task.events_end, task.recorded)
            if moved or messages:
                task.last_progress = time.monotonic()
            self._check_stall(task)
            if task.events_end >= (task.restore_target or 0):
                self.activate(task, finish_until)
                if self._retaken(list(fetching.values())):
                    return

    def _retaken(self, tasks: list[PartitionTask]) -> bool:
        """Whether any of ``tasks`` is no longer its partition's: an activation commits what
        is open, and a commit given up or fenced takes the partitions again, closing their
        stores, so the rest of a slice must not go on with the tasks it began with."""
        if all(self.tasks.get(t.partition) is t for t in tasks):
            return False
        self._fetching = {}
        return True

    def _target(self, task: PartitionTask) -> None:
        """Set ``task``'s restore target once the broker has said it (asked again if not)."""
        try:
            answer = self.targets.answer(task)
        except clients.KafkaException as exc:
            if exc.args[0].fatal():
                raise
            LOG.warning("partition %d: no high watermark yet (%s); retrying", task.partition, exc)
            return
        if answer is None:
            return
        low, high = answer
        stored = task.store.events_offset
        foreign = self._foreign(task, stored, low, high)
        if foreign is not None:
            task = self.tasks.rebuild(task, foreign)
            stored = 0
        if self.topic_id is not None:
            task.store.set_meta("topic_id", self.topic_id.encode())
        task.restore_target = high
        task.events_end = stored
        task.recorded = task.store.positions
        task.last_progress = time.monotonic()
        LOG.info("partition %d: restoring events %d..%d", task.partition, stored, high)

    def _foreign(self, task: PartitionTask, stored: int, low: int, high: int) -> str | None:
        """Why the store cannot be a cache of this events partition, or ``None``."""
        recorded = task.store.meta("topic_id")
        if (
            recorded is not None
            and self.topic_id is not None
            and recorded.decode() != self.topic_id
        ):
            return "its store was written from another events topic of that name (recreated?)"
        if stored > high:
            return f"its store reflects offset {stored}, beyond the topic's end {high}"
        if 0 < stored < low:
            return f"its store reflects offset {stored}, before the topic's start {low}"
        return None

    def _check_stall(self, task: PartitionTask) -> None:
        stalled = time.monotonic() - task.last_progress
        if stalled > _STALL_S:
            LOG.error(
                "partition %d: restore at %d of %d made no progress for %.0f s; check the "
                "brokers (a hanging transaction, a truncated log)",
                task.partition,
                task.events_end or 0,
                task.restore_target or 0,
                stalled,
            )
            task.last_progress = time.monotonic()

    def _record(self, task: PartitionTask, message: Any) -> None:
        """Apply one record of the events partition; one that cannot be read quarantines its
        run (never skipped silently: the run's history would resume on a shorter prefix)."""
        kind = wire.kind_of(message)
        value = message.value() or b""
        try:
            recorded = wire.positions_of(message, kind)
        except (UnicodeDecodeError, ValueError) as exc:
            self._quarantine(task, message, exc)
            recorded = None
        if recorded is not None:
            task.recorded.update(recorded)
        try:
            if kind is wire.RecordKind.EVENT:
                task.store.restore_event(value)
            elif kind is wire.RecordKind.INBOX:
                run_id, inbox_id, raw = wire.split_inbox(value)
                kind_of_time, at_ms = message.timestamp()
                parked_at = at_ms if kind_of_time else int(self.ctx.clock().timestamp() * 1000)
                raw = redacted(raw, may_hold_token=False) or b""  # parked by an earlier release
                task.store.park(run_id, inbox_id, parked_value(parked_at, raw))
            elif kind is wire.RecordKind.INBOX_DONE:
                run_id, inbox_id, _ = wire.split_inbox(value)
                task.store.unpark(run_id, inbox_id)
            elif kind in hooktokens.RECORD_KINDS:
                hooktokens.restore_record(task.store, kind, value)
        except Exception as exc:
            self._quarantine(task, message, exc)

    def _quarantine(self, task: PartitionTask, message: Any, exc: Exception) -> None:
        where = f"{message.topic()}[{message.partition()}]@{message.offset()}"
        self.ctx.metrics.corrupt_records.inc()
        run_id = getattr(exc, "run_id", None) or (message.key() or b"").decode(errors="replace")
        if not run_id:
            LOG.error("skipping a record with no run at %s: %s", where, exc)
            return
        reason = f"{where} cannot be read: {exc}"
        LOG.error("run %s is quarantined: %s", run_id, reason)
        task.store.quarantine(run_id, reason)

    def activate(self, task: PartitionTask, finish_until: float) -> None:
        """Restored: build the restored runs' indexes, a slice per iteration until
        ``finish_until``; then resume the command partitions, and what is to be driven goes to
        the sweeper."""
        pipeline = self.ctx.pipeline
        if pipeline.active() and not task.store.finishing:
            pipeline.commit_all()  # no transaction waits on the first slice
            if self.tasks.get(task.partition) is not task:
                return
        failures, done = task.store.finish_restore_slice(finish_until)
        for run_id, exc in failures:
            self.ctx.metrics.corrupt_records.inc()
            reason = f"its history does not validate: {exc}"
            LOG.error("partition %d: run %s is quarantined: %s", task.partition, run_id, reason)
            task.store.quarantine(run_id, reason)
        if not done:
            return
        if task.store.has_staged:
            task.store.commit_local(task.store.events_offset, task.recorded)
        self._follow_recorded(task)
        self.tasks.activate(task)
        took = time.monotonic() - task.restore_began
        self.ctx.metrics.restore_seconds.observe(took)
        self.ctx.metrics.quarantined_runs.set(
            sum(t.store.quarantined_count for t in self.tasks.owned.values())
        )
        LOG.info("partition %d: restored in %.3f s", task.partition, took)
        resumed = [
            clients.TopicPartition(topic, task.partition) for topic in self.tasks.command_topics
        ]
        self.tasks.consumer.resume(resumed)
        self.targets.wake(self.tasks.consumer, resumed)
        self.steps.results.extend(self.steps.held.pop(task.partition, []))
        task.to_drive = deque(dict.fromkeys([*task.store.running_runs(), *task.store.to_drive]))
        task.to_retry = deque(task.store.parked(None)) if task.store.has_parked() else deque()
        if not self.ready.is_set() and not self.tasks.restoring():
            self.ready.set()

    def _follow_recorded(self, task: PartitionTask) -> None:
        """Move the command partitions on to the positions the transactions recorded where the
        group's offsets, committed later and outside them, lag behind (a member that died
        between its commit and the group's): those commands are applied already."""
        consumer = self.tasks.consumer
        for topic, position in task.recorded.items():
            if topic in task.positions and position > task.positions[topic]:
                LOG.info(
                    "partition %d: %s applied up to %d (the group's offset: %d)",
                    task.partition,
                    topic,
                    position,
                    task.positions[topic],
                )
                task.positions[topic] = task.committed[topic] = position
                consumer.seek(clients.TopicPartition(topic, task.partition, position))


class Targets:
    """The events partitions' watermarks, asked for with the admin client, every partition in
    requests of its own: a partition whose leader is gone (a broker down) waits for an answer
    without holding back the others' restores, nor the loop, nor the transactions of the
    active partitions.

    Not a consumer's ``get_watermark_offsets``: one client's queries wait behind each other, so
    every partition asked with one led by a killed broker waited out that query's timeout
    (measured: answers at 5, 10 and 15 s for a 5 s timeout), and the client kept asking the
    dead broker after its partitions had moved. Neither does a client learn of a moved leader
    from a request that timed out (its answer is -1001, not an error): a partition asked in
    vain is asked next with a new admin client, which reads where its leader is now."""

    def __init__(self, tasks: TaskManager) -> None:
        self.tasks = tasks
        #: The admin client the watermarks are asked with, and how to make another (both set
        #: when connecting).
        self.admin: Any = None
        self.new_admin: Callable[[], Any] = lambda: None
        #: What was asked for each partition: its task, the low and high offsets' answers, and
        #: the client they come from (kept until then).
        self._asked: dict[int, tuple[PartitionTask, Future[Any], Future[Any], Any]] = {}
        self._retry_at: dict[int, float] = {}
        #: Partitions whose last ask failed: asked again with a new client.
        self._fresh: set[int] = set()
        self._nudger = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowstream-wake")
        self._nudge: Future[None] | None = None

    def ask(self, tasks: list[PartitionTask]) -> None:
        """Ask for the targets of ``tasks`` not asked for yet; waits a moment for the answers
        (a healthy broker's come in milliseconds: this slice goes on with them)."""
        now = time.monotonic()
        new: list[Future[Any]] = []
        for task in tasks:
            asked = self._asked.get(task.partition)
            if asked is not None and asked[0] is task:
                continue
            if now < self._retry_at.get(task.partition, 0.0):
                continue
            tp = clients.TopicPartition(self.tasks.ctx.topics[EVENTS], task.partition)
            fresh = task.partition in self._fresh
            self._fresh.discard(task.partition)
            admin = self.new_admin() if fresh else self.admin
            timeout = _TARGET_RETRY_TIMEOUT_S if fresh else _TARGET_TIMEOUT_S
            low, high = (_offset(admin, tp, timeout, latest=latest) for latest in (False, True))
            self._asked[task.partition] = (task, low, high, admin)
            new += [low, high]
        if new:
            wait(new, timeout=_TARGET_WAIT_S)

    def answer(self, task: PartitionTask) -> tuple[int, int] | None:
        """The (low, high) watermarks asked for ``task``, once answered; ``None`` until then.
        Raises what the broker answered instead (asked again a moment later)."""
        asked = self._asked.get(task.partition)
        if asked is None or asked[0] is not task or not (asked[1].done() and asked[2].done()):
            return None
        del self._asked[task.partition]
        try:
            low, high = int(asked[1].result().offset), int(asked[2].result().offset)
            if low < 0 or high < 0:
                # A request that timed out (its leader gone) is answered -1001, without an
                # error: taken as the topic's end, it would have emptied the store.
                raise clients.KafkaException(
                    clients.KafkaError(
                        clients.KafkaError.OFFSET_NOT_AVAILABLE, f"answered {low}..{high}"
                    )
                )
        except clients.KafkaException:
            self._retry_at[task.partition] = time.monotonic() + _TARGET_RETRY_S
            self._fresh.add(task.partition)
            raise
        return low, high

    def wake(self, consumer: Any, resumed: list[Any]) -> None:
        """Have ``consumer`` fetch ``resumed`` now rather than up to a second later.

        librdkafka's ``resume()`` does not wake the broker thread that fetches a partition: one
        whose partitions were all paused (as all are after a rebalance) sleeps up to a second
        before it fetches again (measured: 0.05-1.0 s after a short pause). Any request to the
        leader wakes it: one watermark query, on a thread of its own (it may wait behind a
        fetch at the broker; the restore's queries never wait behind it). While one is on its
        way the fetcher is awake: no other is sent."""
        if not resumed or (self._nudge is not None and not self._nudge.done()):
            return

        def nudge() -> None:
            with contextlib.suppress(clients.KafkaException):
                consumer.get_watermark_offsets(resumed[0], timeout=1, cached=False)

        self._nudge = self._nudger.submit(nudge)

    def close(self) -> None:
        self._nudger.shutdown(wait=True, cancel_futures=True)  # a second at most


def _offset(admin: Any, tp: Any, timeout: float, *, latest: bool) -> Future[Any]:
    """The answer to one partition's earliest or latest offset (``read_uncommitted``), in a
    request of its own: a request's answer waits for its slowest leader."""
    specs: Any = clients.OffsetSpec
    return admin.list_offsets(  # type: ignore[no-any-return]
        {tp: specs.latest() if latest else specs.earliest()},
        isolation_level=clients.IsolationLevel.READ_UNCOMMITTED,
        request_timeout=timeout,
    )[tp]

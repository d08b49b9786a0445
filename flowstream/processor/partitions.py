"""``PartitionHost``: what the transaction pipeline asks of the owned partitions (their positions,
sealing and writing their staged state, rewinding them), and how a partition task is built."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowstream import wire
from flowstream.kafka import clients
from flowstream.model.events import EventEnvelope
from flowstream.processor.connect import debug_config, request_timeout
from flowstream.processor.engine import PartitionEngine
from flowstream.processor.tasks import PartitionTask
from flowstream.processor.txn.errors import retrying
from flowstream.processor.txn.slot import ProducerSlot, Record, transactional_ids
from flowstream.replay.task_failures import TaskRetryPolicy
from flowstream.stores.partition import PartitionStore
from flowstream.topology import EVENTS

if TYPE_CHECKING:
    from flowstream.processor.worker import Processor

__all__ = ["GROUP_COMMIT_S", "PartitionHost"]

#: The group's offsets follow the positions the transactions record at most this often. Each
#: commit goes to the group's coordinator on the member's own connection, ahead of its
#: heartbeats, and waits there for the offsets partition's replicas: a commit that meets a
#: broker's SIGKILL held the member's heartbeats back in the chaos runs (1 s apart then).
GROUP_COMMIT_S = 5.0


class PartitionHost:
    """The pipeline's host: the processor's partitions as the transactions see them."""

    def __init__(self, processor: Processor) -> None:
        self.p = processor
        self._group_committed = 0.0
        #: A commit settled whose positions the group's offsets do not hold yet.
        self._group_behind = False

    # -- building ------------------------------------------------------------------------------

    def build(self, partition: int, path: Path, positions: dict[str, int]) -> PartitionTask:
        """A task for ``partition`` with its store at ``path``."""
        p = self.p
        ctx = p.ctx
        events = ctx.topics[EVENTS]
        headers = wire.event_headers(p.settings.instance_id)
        holder: dict[str, PartitionTask] = {}

        def sink(run_id: str, envelopes: list[EventEnvelope], encoded: list[bytes]) -> None:
            key = run_id.encode()
            ctx.pipeline.produce_all(
                [Record(events, partition, key, data, headers) for data in encoded]
            )
            p.commands.hook_tokens.appended(store, run_id, envelopes)  # claims, releases
            ctx.metrics.events_appended.inc(len(envelopes))

        store = PartitionStore(partition, path, sink, clock=ctx.clock, local_token_claims=False)
        engine = PartitionEngine(
            store,
            p.runtimes,
            dispatch=lambda run_id, steps: p.steps.dispatch(holder["task"], run_id, steps),
            emit=ctx.emit,
            clock=ctx.clock,
            on_conflict=ctx.metrics.conflicts.inc,
            max_continuations=p.settings.max_continuations,
            task_retry=TaskRetryPolicy(
                initial_ms=p.settings.task_retry_initial_ms,
                max_interval_ms=p.settings.task_retry_max_interval_ms,
                max_automatic=p.settings.task_retry_max_automatic,
                fail_after=p.settings.task_fail_after,
            ),
            on_task_failure=p.boundary.task_failed,
        )
        task = PartitionTask(partition, store, engine, dict(positions), dict(positions))
        holder["task"] = task
        return task

    def new_producer(self, slot: ProducerSlot, *, ahead: bool = False) -> Any:
        """A transactional producer of this instance, initialised: any transaction an earlier
        producer of the same ``transactional.id`` left open is aborted first. ``ahead``: the
        slot is claimed for it now, and a call that makes it is returned, to run elsewhere."""
        s = self.p.settings
        slot.generation += 1
        generation = slot.generation

        def delivered(err: Any, message: Any) -> None:
            if generation == slot.generation:  # not a report of a producer replaced since
                slot.delivered(err, message)

        slot.writer = self.p.ctx.writer
        transactional_id = transactional_ids(s.group, slot.writer)[slot.index]

        def make() -> Any:
            producer = clients.new_transactional_producer(
                s.bootstrap,
                transactional_id,
                {
                    "transaction.timeout.ms": s.transaction_timeout_ms,
                    "message.max.bytes": 4 * 1024 * 1024,
                    "linger.ms": 1,
                    # No error_cb: confluent-kafka calls it for a fatal error with that error
                    # already pending as the exception of the flush() or poll() that serves it,
                    # so any builtin the callback calls fails with SystemError. Without one, the
                    # call raises the error itself, as a bare KafkaError
                    # (``clients.as_exception``).
                    "on_delivery": delivered,
                    **request_timeout(s),
                    **debug_config(s),
                },
            )
            retrying(lambda: producer.init_transactions(30))
            return producer

        return make if ahead else make()

    # -- what the pipeline asks ----------------------------------------------------------------

    def positions(self) -> list[Any]:
        return self.p.tasks.positions()

    def seal(self) -> list[PartitionTask]:
        active = self.p.tasks.active()
        for task in active:
            if task.store.has_staged:
                task.store.seal()
            task.sealed_outbox, task.outbox = task.outbox, []
            task.sealed_positions = dict(task.positions)
        return active

    def anchors(self, sealed: list[PartitionTask]) -> list[int]:
        """Steps sealed with this transaction will append outcomes to a task's events partition
        in the next one: those it starts once committed, or, started eagerly, those running."""
        eager = self.p.settings.eager_steps
        return [
            t.partition
            for t in sealed
            if (any(item in t.inflight for item in t.sealed_outbox) if eager else t.sealed_outbox)
        ]

    def settled(
        self, sealed: list[PartitionTask], events_end: dict[int, int], start_steps: bool
    ) -> None:
        if self.p.settings.eager_steps:
            start_steps = False  # each started as it was decided
        leaving = self.p.tasks.leaving
        for task in sealed:
            if self.p.tasks.get(task.partition) is not task:
                continue
            task.store.commit_sealed(events_end.get(task.partition), task.sealed_positions)
            task.committed = task.sealed_positions
            starts = start_steps and task.partition not in leaving
            for item in task.sealed_outbox if starts else ():
                self.p.steps.start(task, item)
            task.sealed_outbox = []
        self._group_behind = True
        self.follow_group()

    def follow_group(self) -> None:
        """Commit the settled positions to the group if it lags them and ``GROUP_COMMIT_S``
        passed since the last time (asked after each commit and on every loop iteration, so an
        idle member's last positions reach the group too)."""
        if not self._group_behind:
            return
        now = time.monotonic()
        if now - self._group_committed >= GROUP_COMMIT_S:
            self._group_committed = now
            self._group_behind = False
            self.p.tasks.commit_positions(self.p.tasks.active())

    def aborted(self, failed: list[tuple[str, bytes | None]]) -> None:
        """Rewind every partition to its last commit. The commands among the runs the abort
        threw away are read again; the others (whose step outcomes were lost) are driven again,
        which dispatches their running steps anew."""
        self.p.dead_letters.blame(failed)
        self.p.forget_backlog()  # read again from the rewound positions
        consumer = self.p.consumer
        for task in self.p.tasks.owned.values():
            runs = task.store.discard()
            if runs and not task.restoring:
                task.to_drive.extend(sorted(runs - set(task.to_drive)))
            task.outbox.clear()
            task.sealed_outbox = []
            task.fired.clear()
            task.positions = dict(task.committed)
            if task.restoring:
                continue
            for topic, position in task.positions.items():
                if position >= 0:
                    with contextlib.suppress(clients.KafkaException):
                        consumer.seek(clients.TopicPartition(topic, task.partition, position))

    def retake(self, retake: bool) -> None:
        tasks = self.p.tasks
        self.p.forget_backlog()
        leaving = tasks.leaving
        taken = (
            [tp for tp in self.p.consumer.assignment() if tp.partition not in leaving]
            if retake
            else []
        )
        tasks.drop(set(tasks.owned))
        if taken:
            tasks.take(taken, seek=True)

"""``Processor``: one member of the consumer group that owns partitions of the run-keyed topics.

It builds the clients and the parts, runs the loop and shuts down. One iteration
(:meth:`Processor.iteration`):

1. settle the commit in flight if it finished (the sealed RocksDB batches are written, the steps
   their ``step_started`` made durable start), or give up a producer whose call hangs;
2. poll the command topics (rebalance callbacks run inside the poll);
3. restore newly assigned partitions from the events topic, a bounded slice (``StateRestorer``);
4. queue the stalled runs of a budgeted liveness scan, and drive a budget of the runs a
   restore, an abort or the scan left to drive (``Sweeper``), before any new command;
5. apply each command inside the open transaction (``CommandHandler``);
6. record step outcomes that came back, and drive their runs (``StepRunner``);
7. fire a budget of due timers (``TimerPunctuator``), and every so often dead-letter the
   commands parked past their time-to-live (``Inbox.expire``);
8. seal the open transaction when nothing more is about to join it (``TransactionPipeline``).

Owning partition *p* means every command topic's partition *p* is assigned to this member.
Partitions are restored before any decision, and every transaction records the command positions
it moved in the events partitions, with the effects; a member claims its partitions under its
writer id before it writes, and the next owner fences that writer, so a member that lost a
partition can never make an event for it visible after the next owner read it. Every call into
user code goes through one ``FailureBoundary``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flowstream.processor.boundary import FailureBoundary
from flowstream.processor.commands import CommandHandler
from flowstream.processor.connect import connect_clients
from flowstream.processor.context import Context
from flowstream.processor.deadletters import DeadLetters
from flowstream.processor.gauges import ProcessorGauges
from flowstream.processor.lane import Lane
from flowstream.processor.metrics import ProcessorMetrics
from flowstream.processor.partitions import PartitionHost
from flowstream.processor.restore import StateRestorer
from flowstream.processor.steps import StepRunner
from flowstream.processor.sweeps import Sweeper
from flowstream.processor.tasks import TaskManager
from flowstream.processor.timers import TimerPunctuator
from flowstream.processor.txn.pipeline import TransactionPipeline
from flowstream.processor.txn.slot import new_writer
from flowstream.runtime import FlowRuntime
from flowstream.settings import Settings
from flowstream.stores.base import Clock, utc_now
from flowstream.topology import Topology, load_topology

__all__ = ["Processor"]

LOG = logging.getLogger("flowstream.processor")

#: While steps run, the loop waits this long at most for an outcome before polling again.
_STEP_WAIT_S = 0.002
#: While nothing can be decided until a commit ends, the loop waits this long at most for it
#: (woken as soon as it ends) before polling again.
_CLOSED_WAIT_S = 0.05
# How long one iteration takes decisions (step outcomes, then commands) before the open
# transaction is sealed is ``Settings.decision_budget_ms``: the rest wait for the next, so no
# transaction grows towards its timeout however many commands arrive at once.
#: The share of the transaction timeout a transaction may be open and still take decisions.
MAX_OPEN_SHARE = 0.3
#: ... and never for longer than this, whatever the timeout: a transaction's size sets how long
#: its commit takes, and the next one stays open (on the other producer) until then. With the
#: share alone, a 10 s timeout let a burst build transactions whose commits outlived it.
MAX_OPEN_S = 0.6
#: How long one iteration takes decisions while some partitions restore (a restore slice
#: applies records for about as long).
_RESTORING_BUDGET_S = 0.05
#: An eager transaction (begun right after a commit that carried decisions) that no decision
#: joined within this long commits alone, well inside any transaction timeout.
_EAGER_IDLE_S = 0.2


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
        self.metrics = metrics or ProcessorMetrics()
        self.metrics.registry.register(ProcessorGauges(self))
        self.metrics.set_build(self.runtimes)
        ctx = self.ctx = Context(settings, topology or load_topology(), self.metrics, clock)
        self.dead_letters = DeadLetters(ctx)
        self.boundary = FailureBoundary(ctx, self.dead_letters)
        self.host = PartitionHost(self)
        self.tasks = TaskManager(ctx, self.host.build, state_root=Path(settings.state_dir))
        self.commands = CommandHandler(ctx, self.tasks, self.dead_letters, self.boundary)
        self.steps = StepRunner(ctx, self.tasks, self.boundary, self.commands.inbox)
        self.tasks.on_taken = self.steps.forget
        self.restorer = StateRestorer(ctx, self.tasks, self.steps)
        self.sweeper = Sweeper(ctx, self.tasks, self.boundary, self.commands.inbox, self.steps)
        self.timers = TimerPunctuator(ctx, self.tasks)
        # A transactional call running longer than this never returns (see ``lane``): the
        # producer is given up. Well beyond a transaction's life, which ends it anyway.
        stuck_s = max(15.0, 2 * settings.transaction_timeout_ms / 1000)
        ctx.pipeline = self.pipeline = TransactionPipeline(
            self.host,
            self.host.new_producer,
            stuck_s=stuck_s,
            metrics=self.metrics,
            events_topic=ctx.topics["events"],
            prepare=Lane("flowstream-prepare"),
        )
        self.consumer: Any = None
        # Commands consumed but not applied yet: an iteration's decisions stop at the budget.
        self._backlog: deque[Any] = deque()
        self._fatal: BaseException | None = None
        self._decision_budget_s = settings.decision_budget_ms / 1000
        # A transaction open on Kafka longer than this takes no more decisions: well inside the
        # transaction timeout, whatever the commit before it costs.
        self._max_open_s = min(MAX_OPEN_S, MAX_OPEN_SHARE * settings.transaction_timeout_ms / 1000)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._owned = 0  # the owned-partitions gauge's value

    @property
    def ready(self) -> asyncio.Event:
        """Set once every partition assigned at the start is restored."""
        return self.restorer.ready

    async def run(self, stop: asyncio.Event) -> None:
        """Process until ``stop`` is set; commits what is open and leaves the group cleanly."""
        self._loop = self.steps.loop = asyncio.get_running_loop()
        self.pipeline.on_done = self._wake_loop
        connect_clients(self)
        try:
            while not stop.is_set():
                await self.iteration()
            self.pipeline.commit_all()
        finally:
            self.steps.close()
            self.restorer.targets.close()  # first: a wake in flight uses the consumer
            with contextlib.suppress(Exception):
                self.consumer.close()
            self.tasks.close()
            if self.tasks.fence is not None:
                self.tasks.fence.close()
            for close in (self.restorer.consumer.close, self.tasks.watermarks.close):
                with contextlib.suppress(Exception):
                    close()
            self.pipeline.close()

    async def iteration(self) -> None:
        self.metrics.loop_iterations.inc()
        pipeline = self.pipeline
        if pipeline.stuck():
            pipeline.give_up(retake=True)
        sealed = pipeline.sealed
        if sealed is not None and sealed.commit is not None and sealed.commit.done():
            pipeline.settle()
        pipeline.release()
        messages = await self._poll()
        restoring = bool(self.tasks.restoring())
        # While partitions restore, an iteration's decisions leave the restore about half the
        # loop: the backlog of the partitions already active would otherwise take four fifths.
        budget = self._decision_budget_s
        if restoring:
            budget = min(budget, _RESTORING_BUDGET_S)
        until = pipeline.decisions_until(budget, self._max_open_s)
        if self._fatal is not None:
            raise self._fatal
        active = len(self.tasks.active())
        if active != self._owned:  # a gauge set takes its lock: not on every iteration
            self._owned = active
            self.metrics.owned_partitions.set(active)
        if restoring:
            aborts = pipeline.aborts
            await self.restorer.restore_slice()
            if pipeline.aborts != aborts:
                messages = []  # the abort rewound the consumer: they are read again
        # Runs a restore or an abort left to drive go first, a budget of them: a backlog of
        # commands (a failover's) would otherwise take every iteration's decisions, and the
        # runs that were in flight on the partitions taken would wait until it is consumed.
        self.sweeper.scan()
        if self.sweeper.pending() and time.monotonic() < until:
            await self.sweeper.sweep()
        # Outcomes of steps before new commands: the runs already under way finish first, so a
        # backlog of starts (more than an iteration decides) cannot starve them.
        await self.steps.chain(deadline=until)
        for at, message in enumerate(messages):
            if time.monotonic() > until:
                self._backlog.extend(messages[at:])  # the next iteration, after a seal
                break
            await self.commands.handle(message)
            self.steps.make_way()
        await self.steps.chain(deadline=until)
        self.timers.fire()
        await self.commands.inbox.expire(self.tasks.active())
        pipeline.begin_spare()
        self.host.follow_group()
        if pipeline.decided and pipeline.sealed is None and self._should_commit():
            pipeline.seal()
        elif pipeline.idle_eager(_EAGER_IDLE_S):
            pipeline.seal()  # nothing joined it: commit the positions alone, do not reopen

    async def _poll(self) -> list[Any]:
        steps = self.steps
        if self.pipeline.closed_until_commit(self._max_open_s):
            # Nothing can be decided until the commit in flight ends (a broker's failure holds
            # it for seconds): wait for it, and hold what is read meanwhile (500 commands at
            # most) for then. Handing the held commands back at once went round the loop 4,000
            # times a second; in chaos runs two workers so spun at 50-90 % of a core each
            # through a broker kill, and the brokers they starved were fenced in turn.
            await self._nap(steps.wake, _CLOSED_WAIT_S)
            if not self._backlog:
                self._backlog.extend(self.consumer.consume(num_messages=500, timeout=0))
            return []
        if self._backlog:
            held = list(self._backlog)
            self._backlog.clear()
            return held
        if steps.results or self.tasks.restoring() or self.sweeper.pending():
            return list(self.consumer.consume(num_messages=500, timeout=0))
        if steps.running or self.pipeline.busy:
            # Steps run or a commit is in flight: take what is already fetched, or else wait
            # on the loop for an outcome or the commit (a short while at most).
            messages = self.consumer.consume(num_messages=500, timeout=0)
            if not messages:
                await self._nap(steps.wake, _STEP_WAIT_S)
            return list(messages)
        # Nothing runs here: block in a thread until a command arrives.
        assert self._loop is not None
        return await self._loop.run_in_executor(None, self._wait_for_messages, 0.05)

    async def _nap(self, wake: asyncio.Event, timeout: float) -> None:
        """Wait until ``wake`` is set or ``timeout`` passed (a timer, not ``wait_for``'s task
        and cancellation: this runs once an iteration)."""
        assert self._loop is not None
        wake.clear()
        timer = self._loop.call_later(timeout, wake.set)
        try:
            await wake.wait()
        finally:
            timer.cancel()

    def _wake_loop(self, _: Any) -> None:
        """A fence or a commit finished (in its lane): the loop waiting for it goes on."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # closed meanwhile: nothing waits
                loop.call_soon_threadsafe(self.steps.wake.set)

    def _should_commit(self) -> bool:
        """Commit when nothing more is about to join the open transaction: no outcome queued
        and none due from the steps the last commit started. The linger, the commit interval
        and the batch size bound how long events wait."""
        txn = self.pipeline.open
        assert txn is not None
        settings = self.settings
        age = time.monotonic() - txn.began
        if age >= settings.commit_interval_ms / 1000:
            return True
        if txn.commands >= settings.max_commands_per_transaction:
            return True
        if self.steps.results:
            return False
        linger = settings.commit_linger_ms / 1000
        return age >= linger or not self.steps.should_wait(linger)

    def _wait_for_messages(self, timeout: float) -> list[Any]:
        """Block until one message arrives, then take whatever else is already fetched."""
        first = self.consumer.poll(timeout)
        if first is None:
            return []
        return [first, *self.consumer.consume(num_messages=499, timeout=0)]

    def forget_backlog(self, partitions: set[int] | None = None) -> None:
        """Consumed commands not applied yet are read again (an abort rewound the consumer, or
        the partitions were dropped and taken again); ``partitions``: only theirs (the others
        stay assigned where they are)."""
        if partitions is None:
            self._backlog.clear()
        else:
            kept = [m for m in self._backlog if m.partition() not in partitions]
            self._backlog = deque(kept)

    # -- rebalance (callbacks run inside the consumer's poll) -----------------------------------

    def on_assign(self, consumer: Any, assigned: list[Any]) -> None:
        if not self.tasks.incremental:
            self.forget_backlog()  # an eager assignment follows the revocation of all
        try:
            if not assigned:
                return
            new = {tp.partition for tp in assigned}
            # The consumer protocol assigns changes: the line says what is owned then, too.
            LOG.info(
                "assigned partitions %s; owns %s", sorted(new), sorted({*self.tasks.owned, *new})
            )
            self.tasks.take(assigned)  # assigns them to the consumer, paused
        except BaseException as exc:  # surfaced by the loop; callbacks must not raise
            self._fatal = exc

    def on_revoke(self, consumer: Any, revoked: list[Any]) -> None:
        """Commit, then give the partitions up. With the consumer protocol only some may go:
        the others keep their backlog, and a commit that fails takes them again. The group's
        offsets of the partitions that go are committed last (the transactions recorded them
        already): the next owner reads them at once, without the events partition's."""
        gone = {tp.partition for tp in revoked}
        incremental = self.tasks.incremental
        self.forget_backlog(gone if incremental else None)
        LOG.info(
            "revoked partitions %s; owns %s", sorted(gone), sorted(set(self.tasks.owned) - gone)
        )
        self.tasks.leaving = gone
        try:
            # The partitions that stay start the steps their commit holds (``settled`` skips
            # the leaving ones: their next owner starts what its restore shows running).
            self.pipeline.commit_all(start_steps=incremental, retake=incremental)
        except BaseException as exc:
            self._fatal = exc
        finally:
            self.tasks.leaving = set()
        leaving = [t for t in self.tasks.owned.values() if t.partition in gone and not t.restoring]
        self.tasks.commit_positions(leaving, asynchronous=False)
        self.tasks.drop(gone)
        self._retire()

    def on_lost(self, consumer: Any, lost: list[Any]) -> None:
        self.forget_backlog()
        gone = {tp.partition for tp in lost}
        LOG.warning(
            "lost partitions %s; owns %s", sorted(gone), sorted(set(self.tasks.owned) - gone)
        )
        try:
            if self.pipeline.active():
                # Never wait on a call that may hang (a dead coordinator): the partitions are
                # gone already, and what this member had open cannot commit.
                self.pipeline.abort("partitions lost", retake=False, patience=0.5)
        except BaseException as exc:
            self._fatal = exc
        self.tasks.drop(gone)
        self._retire()

    def _retire(self) -> None:
        """The partitions went: the next transactions are written by new producers under a
        new writer id, so the next owners may fence the old ones (``fence``)."""

        def renew() -> None:
            self.ctx.writer = new_writer(self.settings.instance_id)

        try:
            self.pipeline.retire(renew)
        except BaseException as exc:
            self._fatal = exc

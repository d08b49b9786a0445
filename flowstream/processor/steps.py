"""``StepRunner``: step attempts off the decision path, and their outcomes back into the runs.

A decided step goes out with the transaction (the outbox: started once its ``step_started``
committed), or at once with ``eager_steps``. Handlers run on a thread pool bounded by
``step_concurrency`` (or on the loop for async handlers). Right before a handler starts, its
thread checks the partition is still owned by the task that started it. Outcomes queue for the
loop, which records them with the partition's current owner; one whose attempt is no longer
running in the history is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from flowstream.engine import call_step
from flowstream.processor.boundary import FailureBoundary
from flowstream.processor.context import Context
from flowstream.processor.inbox import Inbox
from flowstream.processor.tasks import PartitionTask, StepItem, TaskManager
from flowstream.replay.state import RunState

__all__ = ["StepResult", "StepRunner"]

LOG = logging.getLogger("flowstream.processor")

#: (task that started it, run, step, attempt, (output, error, retryable)).
StepResult = tuple[PartitionTask, str, str, int, tuple[Any, str | None, bool]]

# Rounds of (outcomes recorded, steps run) one iteration goes through: a run of up to this many
# short sequential steps can complete within one iteration.
_CHAIN_ROUNDS = 8

# A step task running this long may be starved of the interpreter lock: the loop lets step threads
# in between its decisions (``make_way``). At 10 ms the one-worker workload lost 3-13 % of its
# throughput in four passes out of four; at 50 ms nothing the noise lets through.
_STARVED_S = 0.05


class StepRunner:
    """Starts step attempts and records their outcomes."""

    def __init__(
        self, ctx: Context, tasks: TaskManager, boundary: FailureBoundary, inbox: Inbox
    ) -> None:
        self.ctx = ctx
        self.tasks = tasks
        self.boundary = boundary
        self.inbox = inbox
        settings = ctx.settings
        self.results: deque[StepResult] = deque()
        # (partition, run, step, attempt) whose handler runs in this process, or whose outcome
        # waits in ``results``: whichever owner holds the partition records that outcome, so
        # no owner starts the attempt a second time meanwhile.
        self.handling: set[tuple[int, str, str, int]] = set()
        self.held: dict[int, list[StepResult]] = {}
        self.running: set[asyncio.Task[None]] = set()
        # When each running step task started: one started less than the linger ago is
        # likely to report into the open transaction, which waits for it.
        self.starts: dict[asyncio.Task[None], float] = {}
        self._slots = asyncio.Semaphore(settings.step_concurrency)
        self.executor = ThreadPoolExecutor(
            max_workers=settings.step_concurrency, thread_name_prefix="flowstream-step"
        )
        self.wake = asyncio.Event()
        #: The processor's event loop (set when it runs): a start asked for from another thread
        #: is handed to it.
        self.loop: asyncio.AbstractEventLoop | None = None

    def forget(self, partitions: set[int]) -> None:
        """Partitions taken again: outcomes held for partitions not among them are dropped."""
        for partition in list(self.held):
            if partition not in partitions:
                del self.held[partition]

    def dispatch(self, task: PartitionTask, run_id: str, steps: list[tuple[str, int]]) -> None:
        """Decided steps go out with the transaction (the outbox), or at once when eager."""
        for step_id, attempt in steps:
            item = (run_id, step_id, attempt)
            if item in task.inflight or item in task.outbox:
                continue
            task.outbox.append(item)
            if self.ctx.settings.eager_steps:
                self.start(task, item)

    def start(self, task: PartitionTask, item: StepItem) -> None:
        """Start a task for the attempt unless ``task`` has one, or a task of an earlier owner
        of the partition (before a rebalance or a reset) runs its handler: its outcome comes to
        ``task``, or, if it never starts, ``_hand_over`` starts it here.

        A rebalance callback may ask from the thread the loop waits on for a command (with the
        consumer protocol a revocation starts the steps the staying partitions' commit holds):
        the start is handed to the loop, where the step's task can be created."""
        loop = self.loop
        if loop is not None and not _runs_on(loop):
            loop.call_soon_threadsafe(self.start, task, item)
            return
        if item in task.inflight or (task.partition, *item) in self.handling:
            return
        task.inflight.add(item)
        future = asyncio.ensure_future(self._run(task, *item))
        self.running.add(future)
        self.starts[future] = time.monotonic()

        def done(future: asyncio.Task[None]) -> None:
            self.running.discard(future)
            self.starts.pop(future, None)
            self.wake.set()

        future.add_done_callback(done)

    def _hand_over(self, source: PartitionTask, item: StepItem) -> None:
        """A task of ``source`` ended without an outcome: if the partition's current owner
        has the attempt running, and would not start it itself, it starts it now."""
        task = self.tasks.get(source.partition)
        if task is None or task is source or task.restoring:
            return  # gone, or a restore drives every running run anyway
        if not self.ctx.settings.eager_steps and (
            item in task.outbox or item in task.sealed_outbox
        ):
            return  # started when its step_started commits
        run_id, step_id, attempt = item
        if task.store.exists(run_id) and task.store.state(run_id).attempt_running(step_id, attempt):
            self.start(task, item)

    async def _run(self, task: PartitionTask, run_id: str, step_id: str, attempt: int) -> None:
        item = (run_id, step_id, attempt)
        key = (task.partition, *item)
        try:
            async with self._slots:
                state = self._attempt_state(task, run_id, step_id, attempt)
                if state is None:
                    self._not_started(task, item, key)
                    return
                self.handling.add(key)
                runtime = task.engine.runtimes[state.spec.runtime_build_id]
                began = time.perf_counter()
                outcome = await call_step(
                    runtime,
                    state,
                    step_id,
                    attempt,
                    not self.ctx.settings.inline_sync_steps,
                    # Asked in the step's thread right before the handler starts: a processor
                    # that lost the partition never starts an attempt the new owner re-runs.
                    gate=lambda: self.tasks.get(task.partition) is task,
                    executor=self.executor,
                )
        except Exception as exc:
            self._not_started(task, item, key)
            if self.tasks.get(task.partition) is task:
                # Not the handler (its errors are outcomes): the store or the executor failed.
                # The run is driven again, which dispatches the attempt anew.
                LOG.error("run %s: step %s could not run: %s", run_id, step_id, exc)
                task.to_drive.append(run_id)
            return
        if outcome is None:
            self._not_started(task, item, key)
            return
        self.ctx.metrics.observe_step(state.steps[step_id].step_name, time.perf_counter() - began)
        self.results.append((task, run_id, step_id, attempt, outcome))

    def _not_started(
        self, task: PartitionTask, item: StepItem, key: tuple[int, str, str, int]
    ) -> None:
        task.inflight.discard(item)
        self.handling.discard(key)
        self.ctx.metrics.child(self.ctx.metrics.step_attempts, "not_started").inc()
        self._hand_over(task, item)

    def _attempt_state(
        self, task: PartitionTask, run_id: str, step_id: str, attempt: int
    ) -> RunState | None:
        """The run's state while the partition is owned and the attempt is running in it: an
        abort may have thrown away an eagerly started step's ``step_started`` (or its whole
        run) before its task came to run."""
        if self.tasks.get(task.partition) is not task or not task.store.exists(run_id):
            return None
        state = task.store.state(run_id)
        return state if state.attempt_running(step_id, attempt) else None

    async def chain(self, *, deadline: float | None = None) -> None:
        """Record the steps' outcomes, then let the steps those decisions started run, and
        record theirs within this same iteration: a step that finishes without waiting moves
        its run on at once, so a short run's steps all join one transaction. Bounded, so a
        commit that is due is not held back."""
        for round_ in range(_CHAIN_ROUNDS):
            while self.results:
                if deadline is not None and time.monotonic() > deadline:
                    return  # the rest join the next transaction
                await self.record(*self.results.popleft())
                self.make_way()
            if not self.running or round_ == _CHAIN_ROUNDS - 1:
                return
            await asyncio.sleep(0)  # the steps started above run up to their first real wait
            if not self.results:
                return

    async def record(
        self,
        source: PartitionTask,
        run_id: str,
        step_id: str,
        attempt: int,
        outcome: tuple[Any, str | None, bool],
    ) -> None:
        """Record an attempt's outcome with the partition's current owner: ``source`` started
        it, maybe before a reset replaced it (the engine records it only while the attempt is
        running in the history)."""
        source.inflight.discard((run_id, step_id, attempt))
        self.handling.discard((source.partition, run_id, step_id, attempt))
        task = self.tasks.get(source.partition)
        if task is not None and task.restoring:
            self.held.setdefault(source.partition, []).append(
                (source, run_id, step_id, attempt, outcome)
            )
            return
        if task is None or not task.store.exists(run_id):  # gone, or its start aborted
            self.ctx.metrics.child(self.ctx.metrics.step_attempts, "dropped").inc()
            return
        output, error, retryable = outcome
        label = "completed" if error is None else ("retryable" if retryable else "non_retryable")
        self.ctx.metrics.child(self.ctx.metrics.step_attempts, label).inc()
        self.ctx.pipeline.begin()
        began = time.perf_counter()

        async def work() -> None:
            recorded = await task.engine.record_step_outcome(
                run_id, step_id, attempt, output=output, error=error, retryable=retryable
            )
            if recorded:
                await task.engine.advance(run_id)
                await self.inbox.drain(task, run_id)

        await self.boundary.guard(task, run_id, work())
        self.ctx.metrics.decision_seconds.observe(time.perf_counter() - began)

    def make_way(self) -> None:
        """Between two decisions, let a step thread that waits for the interpreter lock take it,
        once a step has run for longer than it should have to wait.

        CPython's lock goes to a waiting thread only once the holder has run 5 ms without
        releasing it. The loop releases it for an instant in every Kafka and RocksDB call: that
        wakes the waiting thread, which finds the lock taken again and starts its 5 ms over, so
        a step that makes many short system calls is starved while the loop has decisions to
        take (measured beside a busy loop: 16 file writes took 0.52 s median, 1.55 s worst).
        A zero sleep gives the woken thread its turn (2 ms median for the same writes). Not at
        every decision, nor for a step started a moment ago: switching threads whenever a step
        runs cost the one-worker workload about a fifth of its throughput (664 against 818
        runs a second); its short steps finish at the loop's next pause."""
        starts = self.starts
        if starts and time.monotonic() - next(iter(starts.values())) > _STARVED_S:
            time.sleep(0)

    def should_wait(self, linger_s: float) -> bool:
        """Some step started less than ``linger_s`` ago: its outcome is likely to come soon."""
        now = time.monotonic()
        return any(now - began < linger_s for began in self.starts.values())

    def close(self) -> None:
        for future in self.running:
            future.cancel()
        self.executor.shutdown(wait=False, cancel_futures=True)


def _runs_on(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the calling thread is running ``loop``."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False

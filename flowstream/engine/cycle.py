"""``ReplayCycle``: drives one run over an ``EventStore`` with the replay cycle of the seeds.

One cycle: state (projected, cached) → engine repairs (start, failure settlement, signal pairing)
→ children reconciliation → suspension check → ``run_workflow`` → ``decide`` → append at the
expected sequence → run the decided steps → repeat. A lost ``append_if_sequence`` race re-reads
and replays; it never surfaces from ``drive``.

Workflow code that raises, returns something that is not a command, or returns one its history
refuses (``NonDeterministicError`` and the other refusals of ``decide``) does not surface from
``drive`` either: the cycle appends ``workflow_task_failed`` at the expected sequence and the run
is suspended on the task's retry (``replay.task_failures``), which a due wakeup, new input or an
operator retry (``drive(..., retry_task=True)``) brings. What is not the workflow's fault (a
build this host does not serve, the engine's own limits, a store error) still raises.

The cycle touches the world outside the run only through the abstract hooks declared here
(continuation successors, children, steps). The engine's other parts implement them for an
embedded host, and the Kafka processor's ``PartitionEngine`` overrides them for a partition.
"""

from __future__ import annotations

import inspect
import types
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flowstream.engine.builds import RuntimeBuilds
from flowstream.errors import (
    EventConflictError,
    FlowError,
    LimitExceededError,
    RuntimeBuildUnavailableError,
)
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import (
    ChildWorkflowRequested,
    FlowEvent,
    RunContinuedAsNew,
    RunStarted,
)
from flowstream.model.snapshot import WorkflowRunSnapshot
from flowstream.model.spec import WorkflowSpec
from flowstream.replay.context import HistoryView, WorkflowInvocation
from flowstream.replay.decide import Decision, decide, engine_repair, is_suspended
from flowstream.replay.state import RunState
from flowstream.replay.task_failures import TaskRetryPolicy, task_failed_events
from flowstream.runtime import FlowRuntime, check_served
from flowstream.stores.base import Clock, EventStore, utc_now

__all__ = ["ReplayCycle", "maybe_await"]


#: The events of a decision that a limit of the engine may refuse (``_check_children``,
#: ``_check_continuation``); a decision without them is not looked at again.
_LIMITED = frozenset({ChildWorkflowRequested, RunContinuedAsNew})


@dataclass(frozen=True, slots=True)
class _Failed:
    """Why workflow code could not decide: the exception's class name and its text."""

    error_type: str
    message: str

    @classmethod
    def of(cls, exc: Exception) -> _Failed:
        try:
            text = str(exc)
        except Exception:  # an exception whose text itself raises
            text = "<the exception's text could not be read>"
        return cls(type(exc).__name__, text)


#: Types whose values are never awaitable (``inspect.isawaitable`` said so once: it depends on
#: the type alone, except for a generator, which the ``types.coroutine`` decorator may flag).
_PLAIN_TYPES: set[type] = {type(None), dict, list, str, int, float, bool}


async def maybe_await(value: Any) -> Any:
    """``value``, awaited first when it is awaitable (user code may be sync or async)."""
    kind = type(value)
    if kind in _PLAIN_TYPES:
        return value
    if inspect.isawaitable(value):
        return await value
    if kind is not types.GeneratorType and len(_PLAIN_TYPES) < 256:
        _PLAIN_TYPES.add(kind)
    return value


class ReplayCycle(ABC):
    """The replay cycle of runs stored in ``store``, run with the code in ``runtime``."""

    def __init__(
        self,
        store: EventStore,
        runtime: FlowRuntime,
        *,
        clock: Clock = utc_now,
        builds: RuntimeBuilds | None = None,
        max_replay_iterations: int = 1_000_000,
        max_child_depth: int = 32,
        max_continuations: int = 1_000,
        on_conflict: Callable[[], None] | None = None,
        eager_steps: bool = False,
        task_retry: TaskRetryPolicy | None = None,
        on_task_failure: Callable[[str, str, str], None] | None = None,
    ) -> None:
        if max_replay_iterations < 1:
            raise ValueError("max_replay_iterations must be at least 1")
        if max_continuations < 0:
            raise ValueError("max_continuations must be 0 (no limit) or more")
        self.store = store
        self.runtime = runtime
        self._clock = clock
        self.builds = builds or RuntimeBuilds()
        #: Decisions one drive may take. A drive takes a run until it suspends, one decision
        #: per iteration, so this guards against a loop, not against a long run (the
        #: reference's 1024 would stop a run of a few thousand quick steps half-way).
        self._max_iterations = max_replay_iterations
        self._max_child_depth = max_child_depth
        #: The longest continuation chain, in hops after its root (0: no limit).
        self._max_continuations = max_continuations
        #: Called for every lost append_if_sequence race (the cycle then replays); for metrics.
        self.on_conflict = on_conflict
        #: Start a step's handler without waiting for its ``step_started`` to be durable (the
        #: state a call returns still is). A crash can then lose the record of an attempt whose
        #: handler ran: the step runs again with the same attempt and idempotency key.
        self.eager_steps = eager_steps
        #: How a failed workflow task is retried (``workflow_task_failed`` records).
        self.task_retry = task_retry or TaskRetryPolicy()
        #: Called with (run id, error type, message) for every recorded task failure; for
        #: metrics and logs.
        self.on_task_failure = on_task_failure
        self._retry_now: set[str] = set()  # runs an operator retry is driving

    async def drive(
        self, run_id: str, *, now: datetime | None = None, retry_task: bool = False
    ) -> WorkflowRunSnapshot:
        """Replay ``run_id`` until it suspends or ends; returns the active run of its chain.

        ``retry_task``: an operator retry. A run whose workflow task failed is asked for a
        decision at once, even when its next automatic retry is not due (or there is none).
        """
        return (await self.advance(run_id, now=now, retry_task=retry_task)).snapshot()

    async def advance(
        self, run_id: str, *, now: datetime | None = None, retry_task: bool = False
    ) -> RunState:
        """``drive`` for hosts that need no snapshot: the state of the chain's active run."""
        leaf = (await self._leaf(run_id)).run_id if retry_task else None
        if leaf is not None:
            self._retry_now.add(leaf)
        try:
            state = await self._drive_chain(run_id, now, notify_parent=True)
        finally:
            if leaf is not None:
                self._retry_now.discard(leaf)
        await self.store.wait_durable()
        return state

    async def _reported(self, state: RunState) -> WorkflowRunSnapshot:
        """A snapshot for a caller: only once what it shows is durable."""
        await self.store.wait_durable()
        return state.snapshot()

    def _admit(self, run_id: str, spec: WorkflowSpec) -> None:
        """Refuse, before anything is appended, a run whose build or workflow is not served."""
        if not self.builds.admits(spec.runtime_build_id):
            raise RuntimeBuildUnavailableError(run_id, spec.runtime_build_id, self.builds.current)
        check_served(self._runtime_for(spec), run_id, spec)

    def _runtime_for(self, spec: WorkflowSpec) -> FlowRuntime:
        """The runtime that replays runs of ``spec`` (one per build in the Kafka processor)."""
        return self.runtime

    async def _drive_one(
        self, run_id: str, now: datetime | None, *, notify_parent: bool
    ) -> RunState:
        # One look more than the limit allows iterations: a run that the last allowed one ended
        # or suspended is returned, not reported as over the limit. Starting a run is free.
        spent, free = 0, False
        while True:
            spent, free = (spent if free else spent + 1), False
            state = self.store.state(run_id)
            if state.is_terminal:
                await self._after_terminal(state, now, notify_parent=notify_parent)
                return self.store.state(run_id)
            self._admit(run_id, state.spec)
            moment = max(self._clock(), now) if now is not None else self._clock()
            retry_task = run_id in self._retry_now
            try:
                repairs = engine_repair(state)
                if spent > self._max_iterations:
                    if not repairs and is_suspended(state, moment, retry_task=retry_task):
                        return state
                    break
                if repairs:
                    self.store.append_if_sequence(run_id, state.last_sequence, repairs)
                    free = isinstance(repairs[0], RunStarted)
                    continue
                if state.open_children and await self._reconcile_children(state, now):
                    continue
                if is_suspended(state, moment, retry_task=retry_task):
                    return state
                expected = state.last_sequence
                decided = await self._ask(state, moment)
                if decided is None:
                    continue  # another writer moved the run while its code ran: replay
                state = self.store.state(run_id)
                if isinstance(decided, _Failed):
                    events = task_failed_events(
                        state, decided.error_type, decided.message, moment, self.task_retry
                    )
                    self.store.append_if_sequence(run_id, expected, events)
                    if self.on_task_failure is not None:
                        self.on_task_failure(run_id, decided.error_type, decided.message)
                    if len(events) > 1:
                        continue  # the policy failed the run: its end is handled above
                    return self.store.state(run_id)
                decision = decided
                if decision.events:
                    self.store.append_if_sequence(run_id, expected, decision.events)
                if decision.run_steps:
                    if not self.eager_steps:  # step_started is durable before any handler
                        await self.store.wait_durable()
                    if await self._run_steps(run_id, decision.run_steps, now):
                        continue
                    return self.store.state(run_id)
                if decision.suspend:
                    return self.store.state(run_id)
            except EventConflictError:
                if self.on_conflict is not None:
                    self.on_conflict()
                continue
        raise LimitExceededError(
            f"run {run_id} exceeded {self._max_iterations} replay iterations in one drive",
            run_id=run_id,
        )

    async def _ask(self, state: RunState, moment: datetime) -> Decision | _Failed | None:
        """Ask workflow code for ``state``'s next decision, or say why it could not decide.

        ``None`` when the run moved while the code ran (it may have awaited): the decision was
        made on a stale history, so the caller replays from the top instead of using it.
        """
        run_id, expected = state.run_id, state.last_sequence
        invocation = WorkflowInvocation(
            run_id, state.spec, state.input, HistoryView(state.history, expected), state
        )
        failed: _Failed | None = None
        command: Any = None
        try:
            command = await maybe_await(self._runtime_for(state.spec).run_workflow(invocation))
        except Exception as exc:  # workflow code raised: the task failed, not the engine
            failed = _Failed.of(exc)
        if failed is None and not isinstance(command, RuntimeCommand):
            failed = _Failed(
                "InvalidCommand",
                f"run_workflow returned {type(command).__name__}, not a RuntimeCommand",
            )
        current = self.store.state(run_id)
        if current.last_sequence != expected:
            return None
        if failed is not None:
            return failed
        try:
            decision = decide(current, command, moment)
            # The engine's limits (child depth, continuation hops) refuse a decision the same
            # way: recorded for the run, never a silent stop.
            if not _LIMITED.isdisjoint(map(type, decision.events)):  # (no generator per decision)
                self._check_children(current, decision.events)
                self._check_continuation(current, decision.events)
        except FlowError as exc:  # nondeterministic, or a command the history or a limit refuses
            return _Failed.of(exc)
        return decision

    # -- the hooks: where a run touches successors, children and step handlers -----------------

    @abstractmethod
    async def _leaf(self, run_id: str) -> RunState:
        """The active run of ``run_id``'s continuation chain."""

    @abstractmethod
    async def _drive_chain(
        self, run_id: str, now: datetime | None, *, notify_parent: bool
    ) -> RunState:
        """Drive ``run_id`` and the successors it continues into; the last one's state."""

    @abstractmethod
    def _ensure_successor(self, state: RunState) -> None:
        """Make sure the successor a continued ``state`` names exists."""

    @abstractmethod
    def _check_children(self, state: RunState, events: Sequence[FlowEvent]) -> None:
        """Refuse ``events`` that would request a child too deep or forming a cycle."""

    @abstractmethod
    def _check_continuation(self, state: RunState, events: Sequence[FlowEvent]) -> None:
        """Refuse ``events`` that would continue ``state`` past the continuation limit."""

    @abstractmethod
    async def _reconcile_children(self, state: RunState, now: datetime | None) -> bool:
        """Bring ``state``'s open children along; True if something was appended to it."""

    @abstractmethod
    async def _after_terminal(
        self, state: RunState, now: datetime | None, *, notify_parent: bool
    ) -> None:
        """What follows a run's end: its successor, or a wake-up of its parent."""

    @abstractmethod
    async def _run_steps(self, run_id: str, step_ids: list[str], now: datetime | None) -> bool:
        """Start the decided steps (their ``step_started`` is appended); True to keep driving."""

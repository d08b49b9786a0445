"""``ReplayCycle``: drives one run over an ``EventStore`` with the replay cycle of the seeds.

One cycle: state (projected, cached) → engine repairs (start, failure settlement, signal pairing)
→ children reconciliation → suspension check → ``run_workflow`` → ``decide`` → append at the
expected sequence → run the decided steps → repeat. A lost ``append_if_sequence`` race re-reads
and replays; it never surfaces from ``drive``.

The cycle touches the world outside the run only through the abstract hooks declared here
(continuation successors, children, steps). The engine's other parts implement them for an
embedded host, and the Kafka processor's ``PartitionEngine`` overrides them for a partition.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from flowstream.engine.builds import RuntimeBuilds
from flowstream.errors import (
    EventConflictError,
    InvalidTransitionError,
    LimitExceededError,
    RuntimeBuildUnavailableError,
)
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import FlowEvent
from flowstream.model.snapshot import WorkflowRunSnapshot
from flowstream.model.spec import WorkflowSpec
from flowstream.replay.context import HistoryView, WorkflowInvocation
from flowstream.replay.decide import decide, engine_repair, is_suspended
from flowstream.replay.state import RunState
from flowstream.runtime import FlowRuntime, check_served
from flowstream.stores.base import Clock, EventStore, utc_now

__all__ = ["ReplayCycle", "maybe_await"]


async def maybe_await(value: Any) -> Any:
    """``value``, awaited first when it is awaitable (user code may be sync or async)."""
    if inspect.isawaitable(value):
        return await value
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
    ) -> None:
        if max_replay_iterations < 1:
            raise ValueError("max_replay_iterations must be at least 1")
        if max_continuations < 0:
            raise ValueError("max_continuations must be 0 (no limit) or more")
        self.store = store
        self.runtime = runtime
        self._clock = clock
        self.builds = builds or RuntimeBuilds()
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

    async def drive(self, run_id: str, *, now: datetime | None = None) -> WorkflowRunSnapshot:
        """Replay ``run_id`` until it suspends or ends; returns the active run of its chain."""
        return (await self.advance(run_id, now=now)).snapshot()

    async def advance(self, run_id: str, *, now: datetime | None = None) -> RunState:
        """``drive`` for hosts that need no snapshot: the state of the chain's active run."""
        state = await self._drive_chain(run_id, now, notify_parent=True)
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
        for _ in range(self._max_iterations):
            state = self.store.state(run_id)
            if state.is_terminal:
                await self._after_terminal(state, now, notify_parent=notify_parent)
                return self.store.state(run_id)
            self._admit(run_id, state.spec)
            moment = max(self._clock(), now) if now is not None else self._clock()
            try:
                repairs = engine_repair(state)
                if repairs:
                    self.store.append_if_sequence(run_id, state.last_sequence, repairs)
                    continue
                if state.open_children and await self._reconcile_children(state, now):
                    continue
                if is_suspended(state, moment):
                    return state
                expected = state.last_sequence
                invocation = WorkflowInvocation(
                    run_id, state.spec, state.input, HistoryView(state.history, expected), state
                )
                runtime = self._runtime_for(state.spec)
                command = await maybe_await(runtime.run_workflow(invocation))
                if not isinstance(command, RuntimeCommand):
                    raise InvalidTransitionError(
                        f"run_workflow returned {type(command).__name__}, not a RuntimeCommand",
                        run_id=run_id,
                    )
                # Workflow code may have awaited: if another writer moved the run, the decision
                # was made on a stale history, so replay from the top instead of appending it.
                state = self.store.state(run_id)
                if state.last_sequence != expected:
                    continue
                decision = decide(state, command, moment)
                self._check_children(state, decision.events)
                self._check_continuation(state, decision.events)
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

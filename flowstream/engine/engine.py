"""``FlowEngine``: drives runs over an ``EventStore`` with the replay cycle of the seeds.

One cycle: state (projected, cached) → engine repairs (start, failure settlement, signal pairing)
→ children reconciliation → suspension check → ``run_workflow`` → ``decide`` → append at the
expected sequence → run the decided steps → repeat. A lost ``append_if_sequence`` race re-reads
and replays; it never surfaces from ``drive``.
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, cast

from pydantic import JsonValue, TypeAdapter, ValidationError

from flowstream.errors import (
    EventConflictError,
    FlowError,
    InvalidTransitionError,
    LimitExceededError,
    NonRetryableError,
    PayloadTooLargeError,
    RunConflictError,
    RuntimeBuildUnavailableError,
    UnknownOutcomeError,
)
from flowstream.model.base import JSON, json_equal, validate_run_id
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import (
    ChildCancellationPolicy,
    ChildWorkflowRequested,
    ChildWorkflowResolved,
    EventEnvelope,
    FlowEvent,
    HookDisposed,
    HookReceived,
    ParentLink,
    RunCancellationRequested,
    RunCancelled,
    RunCreated,
    SignalReceived,
    TerminalOutcome,
    WaitCompleted,
)
from flowstream.model.snapshot import (
    HookStatus,
    RunStatus,
    StepStatus,
    WaitStatus,
    WorkflowRunSnapshot,
    WorkflowRunSummary,
)
from flowstream.model.spec import ExhaustedAction, WorkflowSpec
from flowstream.replay.context import (
    HistoryView,
    StepInvocation,
    WorkflowInvocation,
    step_idempotency_key,
)
from flowstream.replay.decide import (
    decide,
    engine_repair,
    is_suspended,
    step_outcome_events,
    token_digest,
)
from flowstream.replay.state import RunState, Wakeup
from flowstream.runtime import FlowRuntime
from flowstream.stores.base import Clock, EventStore, utc_now

__all__ = ["FlowEngine", "RuntimeBuilds", "SchedulerTick", "Suspension"]


@dataclass(frozen=True, slots=True)
class RuntimeBuilds:
    """Which pinned runs this engine may replay.

    With no ``current`` build the engine serves only unpinned runs. With one, it serves that
    build and the ``compatible`` ones, and unpinned runs only when ``accept_unpinned``.
    """

    current: str | None = None
    compatible: frozenset[str] = frozenset()
    accept_unpinned: bool = False

    def admits(self, build_id: str | None) -> bool:
        if build_id is None:
            return self.current is None or self.accept_unpinned
        return build_id == self.current or build_id in self.compatible


@dataclass(frozen=True, slots=True)
class Suspension:
    """One open suspension of a non-terminal run."""

    run_id: str
    kind: str  # wait | retry | hook | signal | child
    subject_id: str
    due: datetime | None = None
    is_due: bool = False


@dataclass(slots=True)
class SchedulerTick:
    """What ``resume_due`` did: runs resumed, and runs whose resumption raised."""

    resumed: list[str] = field(default_factory=list)
    failed: dict[str, FlowError] = field(default_factory=dict)


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


class FlowEngine:
    """Drives workflow runs stored in ``store`` with the code in ``runtime``."""

    def __init__(
        self,
        store: EventStore,
        runtime: FlowRuntime,
        *,
        clock: Clock = utc_now,
        builds: RuntimeBuilds | None = None,
        max_replay_iterations: int = 1_000_000,
        max_child_depth: int = 32,
        on_conflict: Callable[[], None] | None = None,
        eager_steps: bool = False,
    ) -> None:
        if max_replay_iterations < 1:
            raise ValueError("max_replay_iterations must be at least 1")
        self.store = store
        self.runtime = runtime
        self._clock = clock
        self.builds = builds or RuntimeBuilds()
        self._max_iterations = max_replay_iterations
        self._max_child_depth = max_child_depth
        #: Called for every lost append_if_sequence race (the cycle then replays); for metrics.
        self.on_conflict = on_conflict
        #: Start a step's handler without waiting for its ``step_started`` to be durable (the
        #: state a call returns still is). A crash can then lose the record of an attempt whose
        #: handler ran: the step runs again with the same attempt and idempotency key.
        self.eager_steps = eager_steps

    # -- runs -----------------------------------------------------------------------------

    async def start(
        self,
        run_id: str,
        spec: WorkflowSpec,
        input: JSON = None,
        *,
        drive: bool = True,
        parent: ParentLink | None = None,
        depth: int = 0,
    ) -> WorkflowRunSnapshot:
        """Create ``run_id`` (idempotent for the same spec and input) and drive it."""
        self.create(run_id, spec, input, parent=parent, depth=depth)
        if drive:
            return await self.drive(run_id)
        await self.store.wait_durable()
        return self.snapshot(run_id)

    def create(
        self,
        run_id: str,
        spec: WorkflowSpec,
        input: JSON = None,
        *,
        parent: ParentLink | None = None,
        depth: int = 0,
    ) -> None:
        """Append ``run_created`` unless the run exists with the same spec and input."""
        validate_run_id(run_id)
        while True:
            if self.store.exists(run_id):
                state = self.store.state(run_id)
                if state.spec != spec:
                    raise RunConflictError(f"run {run_id}: workflow spec differs", run_id=run_id)
                if not json_equal(state.input, input):
                    raise RunConflictError(f"run {run_id}: workflow input differs", run_id=run_id)
                return
            self._admit(run_id, spec)
            try:
                created = RunCreated(spec=spec, input=input, parent=parent, depth=depth)
                self.store.append_if_sequence(run_id, 0, [created])
            except EventConflictError:
                continue
            return

    async def drive(self, run_id: str, *, now: datetime | None = None) -> WorkflowRunSnapshot:
        """Replay ``run_id`` until it suspends or ends; returns the active run of its chain."""
        return (await self.advance(run_id, now=now)).snapshot()

    async def advance(self, run_id: str, *, now: datetime | None = None) -> RunState:
        """``drive`` for hosts that need no snapshot: the state of the chain's active run."""
        state = await self._drive_chain(run_id, now, notify_parent=True)
        await self.store.wait_durable()
        return state

    def snapshot(self, run_id: str) -> WorkflowRunSnapshot:
        return self.store.state(run_id).snapshot()

    def history(self, run_id: str) -> list[EventEnvelope]:
        return self.store.read(run_id)

    def list_runs(self) -> list[str]:
        return self.store.list_runs()

    def continuation_chain(self, run_id: str) -> list[str]:
        """``run_id`` and every successor after it, in order."""
        chain = [run_id]
        state = self.store.state(run_id)
        while state.outcome is not None and state.outcome.successor_run_id is not None:
            successor = state.outcome.successor_run_id
            if successor in chain:
                raise InvalidTransitionError("continuation chain has a cycle", run_id=run_id)
            chain.append(successor)
            if not self.store.exists(successor):
                break
            state = self.store.state(successor)
        return chain

    # -- timers and retries -----------------------------------------------------------------

    def next_wakeup(self) -> Wakeup | None:
        """The earliest durable deadline (timer or delayed retry) in the store."""
        return self.store.next_wakeup()

    async def resume_wait(
        self, run_id: str, wait_id: str, *, now: datetime | None = None
    ) -> WorkflowRunSnapshot:
        """Complete a due timer once and drive the run; repeats are no-ops."""
        moment = now or self._clock()
        while True:
            state = self.store.state(run_id)
            wait = state.waits.get(wait_id)
            if wait is None:
                raise InvalidTransitionError(f"wait {wait_id} does not exist", run_id=run_id)
            if state.is_terminal or wait.status is not WaitStatus.WAITING:
                return await self._reported(state)
            if moment < wait.resume_at:
                raise InvalidTransitionError(
                    f"wait {wait_id} is due at {wait.resume_at.isoformat()}, not yet",
                    run_id=run_id,
                )
            self._admit(run_id, state.spec)
            try:
                self.store.append_if_sequence(
                    run_id, state.last_sequence, [WaitCompleted(wait_id=wait_id)]
                )
            except EventConflictError:
                continue
            return await self.drive(run_id, now=moment)

    async def resume_due(self, now: datetime | None = None) -> SchedulerTick:
        """Resume exactly the runs with a timer or delayed retry due at ``now``."""
        moment = now or self._clock()
        tick = SchedulerTick()
        by_run: dict[str, list[Wakeup]] = {}
        for wakeup in self.store.due_wakeups(moment):
            by_run.setdefault(wakeup.run_id, []).append(wakeup)
        for run_id, wakeups in by_run.items():
            try:
                for wakeup in wakeups:
                    if wakeup.kind == "wait":
                        await self.resume_wait(run_id, wakeup.subject_id, now=moment)
                if any(w.kind == "retry" for w in wakeups):
                    await self.drive(run_id, now=moment)
                tick.resumed.append(run_id)
            except FlowError as exc:
                tick.failed[run_id] = exc
        return tick

    # -- signals and hooks ----------------------------------------------------------------

    async def send_signal(
        self, run_id: str, signal_id: str, name: str, payload: JSON = None
    ) -> WorkflowRunSnapshot:
        """Deliver a signal once per ``signal_id``; the same id with other content conflicts."""
        while True:
            state = await self._leaf(run_id)
            existing = state.signals.get(signal_id)
            if existing is not None:
                if existing.name == name and existing.payload == payload:
                    return await self._reported(state)
                raise RunConflictError(
                    f"run {state.run_id}: signal {signal_id} was already received with "
                    "another name or payload",
                    run_id=state.run_id,
                )
            if name not in state.spec.signal_names:
                raise InvalidTransitionError(
                    f"signal name {name!r} is not declared by workflow {state.spec.name}",
                    run_id=state.run_id,
                )
            if state.is_terminal:
                raise InvalidTransitionError(
                    f"cannot signal a {state.status.value} run", run_id=state.run_id
                )
            self._admit(state.run_id, state.spec)
            event = SignalReceived(signal_id=signal_id, name=name, payload=payload)
            try:
                self.store.append_if_sequence(state.run_id, state.last_sequence, [event])
            except EventConflictError:
                continue
            return await self.drive(state.run_id)

    async def resume_hook(
        self, run_id: str, hook_id: str, payload: JSON = None
    ) -> WorkflowRunSnapshot:
        """Deliver a hook payload; an identical repeat is a no-op, another payload conflicts."""
        while True:
            state = self.store.state(run_id)
            hook = state.hooks.get(hook_id)
            if hook is None:
                raise InvalidTransitionError(f"hook {hook_id} does not exist", run_id=run_id)
            if hook.received:
                if hook.payload == payload:
                    return await self._reported(await self._leaf(run_id))
                raise RunConflictError(
                    f"run {run_id}: hook {hook_id} was already resumed with another payload",
                    run_id=run_id,
                )
            if state.is_terminal or hook.status is not HookStatus.ACTIVE:
                raise InvalidTransitionError(
                    f"hook {hook_id} is {hook.status.value} and cannot be resumed",
                    run_id=run_id,
                )
            self._admit(run_id, state.spec)
            try:
                self.store.append_if_sequence(
                    run_id, state.last_sequence, [HookReceived(hook_id=hook_id, payload=payload)]
                )
            except EventConflictError:
                continue
            return await self.drive(run_id)

    async def resume_hook_by_token(self, token: str, payload: JSON = None) -> WorkflowRunSnapshot:
        """Resume the hook that owns ``token`` (a bearer secret; never logged or echoed)."""
        run_id, hook_id = self._hook_for_token(token)
        return await self.resume_hook(run_id, hook_id, payload)

    async def dispose_hook(self, run_id: str, hook_id: str) -> WorkflowRunSnapshot:
        while True:
            state = self.store.state(run_id)
            hook = state.hooks.get(hook_id)
            if hook is None:
                raise InvalidTransitionError(f"hook {hook_id} does not exist", run_id=run_id)
            if state.is_terminal or hook.status not in (HookStatus.ACTIVE, HookStatus.RECEIVED):
                return await self._reported(state)
            try:
                self.store.append_if_sequence(
                    run_id, state.last_sequence, [HookDisposed(hook_id=hook_id)]
                )
            except EventConflictError:
                continue
            return await self.drive(run_id)

    def _hook_for_token(self, token: str) -> tuple[str, str]:
        digest = token_digest(token)
        owner = self.store.find_hook(digest)
        if owner is not None:
            run_id, hook_id = owner
            hook = self.store.state(run_id).hooks.get(hook_id)
            if hook is not None and hmac.compare_digest(hook.token_digest, digest):
                return owner
        raise InvalidTransitionError("no hook is registered for the presented token")

    # -- cancellation ---------------------------------------------------------------------

    async def request_cancellation(
        self, run_id: str, reason: str | None = None
    ) -> WorkflowRunSnapshot:
        """Durably ask the run to cancel; workflow code sees it and cleans up (idempotent)."""
        while True:
            state = await self._leaf(run_id)
            if state.is_terminal:
                return await self._reported(state)
            if state.cancellation is not None:
                if state.cancellation.reason != reason:
                    raise RunConflictError(
                        f"run {state.run_id}: cancellation request differs from the durable "
                        "request",
                        run_id=state.run_id,
                    )
                return await self.drive(state.run_id)
            self._admit(state.run_id, state.spec)
            event = RunCancellationRequested(reason=reason)
            try:
                self.store.append_if_sequence(state.run_id, state.last_sequence, [event])
            except EventConflictError:
                continue
            return await self.drive(state.run_id)

    async def force_cancel(self, run_id: str, reason: str | None = None) -> WorkflowRunSnapshot:
        """End the run now without running workflow code; open children follow their policy."""
        state = await self._force_cancel(run_id, reason, notify_parent=True)
        return state.snapshot()

    async def _force_cancel(
        self, run_id: str, reason: str | None, *, notify_parent: bool
    ) -> RunState:
        while True:
            state = await self._leaf(run_id)
            if state.is_terminal:
                return state
            events: list[FlowEvent] = []
            for child_id in state.blocking_children:
                child = state.children[child_id]
                if child.cancellation_policy is ChildCancellationPolicy.ABANDON:
                    continue
                if self.store.exists(child.run_id):
                    child_leaf = await self._force_cancel(child.run_id, reason, notify_parent=False)
                    outcome = child_leaf.outcome
                else:  # the child's creation was lost: it never ran, so it ends here too
                    outcome = TerminalOutcome(type="cancelled", error=reason)
                assert outcome is not None
                events.append(ChildWorkflowResolved(child_id=child_id, outcome=outcome))
            events.append(RunCancelled(reason=reason))
            try:
                self.store.append_if_sequence(state.run_id, state.last_sequence, events)
            except EventConflictError:
                continue
            final = self.store.state(state.run_id)
            await self._after_terminal(final, None, notify_parent=notify_parent)
            await self.store.wait_durable()
            return final

    # -- inspection -----------------------------------------------------------------------

    def list_open_suspensions(self, now: datetime | None = None) -> list[Suspension]:
        """Open waits, hooks, retries, signal waits and children of non-terminal runs."""
        found: list[Suspension] = []
        for run_id in self.store.list_runs():
            state = self.store.state(run_id)
            if state.is_terminal:
                continue
            for wait_id in sorted(state.open_waits):
                found.append(Suspension(run_id, "wait", wait_id, state.waits[wait_id].resume_at))
            for step_id in sorted(state.delayed_steps):
                found.append(Suspension(run_id, "retry", step_id, state.steps[step_id].retry_after))
            for hook_id in sorted(state.active_hooks):
                found.append(Suspension(run_id, "hook", hook_id))
            for queue in state.waiting_signal_waits.values():
                for wait_id in queue:
                    found.append(Suspension(run_id, "signal", wait_id))
            for child_id in sorted(state.open_children):
                found.append(Suspension(run_id, "child", child_id))
        if now is not None:
            found = [replace(s, is_due=s.due is not None and s.due <= now) for s in found]
        return found

    def summary(self) -> WorkflowRunSummary:
        by_status: dict[RunStatus, int] = {}
        counts = {
            "open_waits": 0,
            "active_hooks": 0,
            "pending_retries": 0,
            "open_children": 0,
            "open_signal_waits": 0,
        }
        runs = self.store.list_runs()
        for run_id in runs:
            state = self.store.state(run_id)
            status = state.public_status()
            by_status[status] = by_status.get(status, 0) + 1
            if state.is_terminal:
                continue
            counts["open_waits"] += len(state.open_waits)
            counts["active_hooks"] += len(state.active_hooks)
            counts["pending_retries"] += len(state.delayed_steps)
            counts["open_children"] += len(state.open_children)
            counts["open_signal_waits"] += sum(len(q) for q in state.waiting_signal_waits.values())
        return WorkflowRunSummary(total_runs=len(runs), by_status=by_status, **counts)

    # -- the replay cycle -----------------------------------------------------------------

    async def _reported(self, state: RunState) -> WorkflowRunSnapshot:
        """A snapshot for a caller: only once what it shows is durable."""
        await self.store.wait_durable()
        return state.snapshot()

    def _admit(self, run_id: str, spec: WorkflowSpec) -> None:
        if not self.builds.admits(spec.runtime_build_id):
            raise RuntimeBuildUnavailableError(run_id, spec.runtime_build_id, self.builds.current)

    async def _leaf(self, run_id: str) -> RunState:
        """The active run of ``run_id``'s continuation chain (repairing a missing successor)."""
        state = self.store.state(run_id)
        seen = {run_id}
        while state.outcome is not None and state.outcome.successor_run_id is not None:
            successor = state.outcome.successor_run_id
            if successor in seen:
                raise InvalidTransitionError("continuation chain has a cycle", run_id=run_id)
            seen.add(successor)
            self._ensure_successor(state)
            state = self.store.state(successor)
        return state

    def _ensure_successor(self, state: RunState) -> None:
        assert state.outcome is not None and state.outcome.successor_run_id is not None
        successor = state.outcome.successor_run_id
        created = RunCreated(
            spec=state.spec,
            input=state.continuation_input,
            parent=ParentLink(run_id=state.run_id, continued=True),
            depth=state.depth,
        )
        if not self.store.exists(successor):
            try:
                self.store.append_if_sequence(successor, 0, [created])
                return
            except EventConflictError:
                pass
        found = self.store.state(successor).history[0].event
        if not json_equal(found.model_dump(mode="json"), created.model_dump(mode="json")):
            raise InvalidTransitionError(
                f"run {successor} exists but is not the continuation of {state.run_id}: "
                "its run_created differs from the durable link",
                run_id=state.run_id,
            )

    async def _drive_chain(
        self, run_id: str, now: datetime | None, *, notify_parent: bool
    ) -> RunState:
        state = await self._drive_one(run_id, now, notify_parent=notify_parent)
        while state.outcome is not None and state.outcome.successor_run_id is not None:
            self._ensure_successor(state)
            state = await self._drive_one(
                state.outcome.successor_run_id, now, notify_parent=notify_parent
            )
        return state

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
                command = await _maybe_await(runtime.run_workflow(invocation))
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

    def _check_children(self, state: RunState, events: Sequence[FlowEvent]) -> None:
        if not any(isinstance(e, ChildWorkflowRequested) for e in events):
            return
        if self._max_child_depth and state.depth + 1 > self._max_child_depth:
            raise LimitExceededError(
                f"run {state.run_id}: child workflow depth would exceed {self._max_child_depth}",
                run_id=state.run_id,
            )
        ancestors = set()
        link = state.parent
        current = state
        while link is not None:
            ancestors.add(link.run_id)
            if not self.store.exists(link.run_id):
                break
            current = self.store.state(link.run_id)
            link = current.parent
        for event in events:
            if isinstance(event, ChildWorkflowRequested) and event.child_run_id in ancestors | {
                state.run_id
            }:
                raise LimitExceededError(
                    f"run {state.run_id}: child workflow {event.child_id} would form a cycle",
                    run_id=state.run_id,
                )

    async def _reconcile_children(self, state: RunState, now: datetime | None) -> bool:
        """Create, cancel and drive open children; resolve the first terminal one. True if
        something was appended to the parent."""
        for child_id in sorted(
            state.open_children, key=lambda c: state.children[c].requested_sequence
        ):
            child = state.children[child_id]
            if not self.store.exists(child.run_id):
                created = RunCreated(
                    spec=child.spec,
                    input=child.input,
                    parent=ParentLink(run_id=state.run_id, child_id=child_id),
                    depth=state.depth + 1,
                )
                try:
                    self.store.append_if_sequence(child.run_id, 0, [created])
                except EventConflictError:
                    pass
            cancellation = state.cancellation
            if (
                cancellation is not None
                and child.cancellation_policy is ChildCancellationPolicy.REQUEST_CANCELLATION
                and child.requested_sequence < cancellation.sequence
            ):
                leaf = await self._leaf(child.run_id)
                if not leaf.is_terminal and leaf.cancellation is None:
                    try:
                        self.store.append_if_sequence(
                            leaf.run_id,
                            leaf.last_sequence,
                            [RunCancellationRequested(reason=cancellation.reason)],
                        )
                    except EventConflictError:
                        pass
            try:
                leaf = await self._drive_chain(child.run_id, now, notify_parent=False)
            except RuntimeBuildUnavailableError:
                continue
            if leaf.is_terminal:
                assert leaf.outcome is not None
                self.store.append_if_sequence(
                    state.run_id,
                    state.last_sequence,
                    [ChildWorkflowResolved(child_id=child_id, outcome=leaf.outcome)],
                )
                return True
        return False

    async def _after_terminal(
        self, state: RunState, now: datetime | None, *, notify_parent: bool
    ) -> None:
        """A continued run gets its successor; a finished child wakes its parent."""
        if state.outcome is not None and state.outcome.successor_run_id is not None:
            self._ensure_successor(state)
            return
        if not notify_parent:
            return
        root = state
        while root.parent is not None and root.parent.continued:
            if not self.store.exists(root.parent.run_id):
                return
            root = self.store.state(root.parent.run_id)
        if root.parent is None or root.parent.child_id is None:
            return
        parent_id = root.parent.run_id
        if not self.store.exists(parent_id):
            return
        parent = self.store.state(parent_id)
        child = parent.children.get(root.parent.child_id)
        if parent.is_terminal or child is None or child.outcome is not None:
            return
        try:
            await self._drive_chain(parent_id, now, notify_parent=True)
        except RuntimeBuildUnavailableError:
            return

    def _runtime_for(self, spec: WorkflowSpec) -> FlowRuntime:
        """The runtime that replays runs of ``spec`` (one per build in the Kafka processor)."""
        return self.runtime

    async def record_step_outcome(
        self,
        run_id: str,
        step_id: str,
        attempt: int,
        *,
        output: JSON = None,
        error: str | None = None,
        retryable: bool = True,
        now: datetime | None = None,
    ) -> bool:
        """Append an attempt's outcome computed elsewhere; False when it was stale (dropped)."""
        if not self.store.state(run_id).attempt_running(step_id, attempt):
            return False
        self._record_outcome(run_id, step_id, attempt, (output, error, retryable), now)
        return True

    async def _run_steps(self, run_id: str, step_ids: list[str], now: datetime | None) -> bool:
        """Run the decided steps concurrently, committing each outcome as it settles; True to
        keep driving.

        A fail-run failure stops the siblings still running; the next cycle settles them with
        ``step_cancelled`` markers before the run's terminal event.
        """
        state = self.store.state(run_id)
        calls = [(step_id, state.steps[step_id].attempt) for step_id in step_ids]
        if len(calls) == 1:
            step_id, attempt = calls[0]
            outcome = await self._call_step(state, step_id, attempt, in_thread=False)
            self._record_outcome(run_id, step_id, attempt, outcome, now)
            return True
        tasks = {
            asyncio.ensure_future(self._call_step(state, step_id, attempt, in_thread=True)): (
                step_id,
                attempt,
            )
            for step_id, attempt in calls
        }
        pending = set(tasks)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    step_id, attempt = tasks[task]
                    if self._record_outcome(run_id, step_id, attempt, task.result(), now):
                        return True
        finally:
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        return True

    async def _call_step(
        self, state: RunState, step_id: str, attempt: int, *, in_thread: bool
    ) -> tuple[JSON, str | None, bool]:
        outcome = await call_step(self._runtime_for(state.spec), state, step_id, attempt, in_thread)
        assert outcome is not None  # no gate: the handler always runs
        return outcome

    def _record_outcome(
        self,
        run_id: str,
        step_id: str,
        attempt: int,
        outcome: tuple[JSON, str | None, bool],
        now: datetime | None,
    ) -> bool:
        """Append one attempt's outcome; True when it ends the run (fail-run failure)."""
        output, error, retryable = outcome
        while True:
            state = self.store.state(run_id)
            moment = max(self._clock(), now) if now is not None else self._clock()
            events = step_outcome_events(
                state, step_id, attempt, output=output, error=error, retryable=retryable, now=moment
            )
            if not events:
                return False
            try:
                self.store.append_if_sequence(run_id, state.last_sequence, events)
            except EventConflictError:
                continue
            except PayloadTooLargeError as exc:
                # Retrying would only produce the same output again: fail the attempt for good.
                output, error, retryable = None, f"step output rejected: {exc}", False
                continue
            step = self.store.state(run_id).steps[step_id]
            return step.status is StepStatus.FAILED and (
                step.retry.on_exhausted is ExhaustedAction.FAIL_RUN
            )


def _error_text(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def call_step(
    runtime: FlowRuntime,
    state: RunState,
    step_id: str,
    attempt: int,
    in_thread: bool,
    *,
    gate: Callable[[], bool] | None = None,
    executor: Executor | None = None,
) -> tuple[JSON, str | None, bool] | None:
    """Invoke a step handler once: (output, error text or None, retryable).

    ``gate`` is asked right before the handler starts (in its thread); when it says no, the
    handler is not called and ``None`` is returned (the caller no longer owns the run).
    """
    step = state.steps[step_id]
    invocation = StepInvocation(
        run_id=state.run_id,
        step_id=step_id,
        step_name=step.step_name,
        attempt=attempt,
        input=step.input,
        history=HistoryView(state.history, state.last_sequence),
        idempotency_key=step_idempotency_key(state.run_id, step_id),
    )

    def guarded() -> Any:
        if gate is not None and not gate():
            return _NOT_RUN
        return runtime.run_step(invocation)

    try:
        if in_thread and not inspect.iscoroutinefunction(runtime.run_step):
            loop = asyncio.get_running_loop()
            result = await loop.run_in_executor(executor, guarded)
        else:
            result = await _maybe_await(guarded())
        if result is _NOT_RUN:
            return None
        try:
            _JSON_VALUE.validate_python(result)
        except ValidationError as exc:
            return None, f"step returned a value that is not JSON: {exc}", False
        return cast(JSON, result), None, True
    except (NonRetryableError, UnknownOutcomeError) as exc:
        return None, _error_text(exc), False
    except Exception as exc:  # a step handler's failure is data, recorded in history
        return None, _error_text(exc), True


_NOT_RUN = object()
_JSON_VALUE: TypeAdapter[JSON] = TypeAdapter(JsonValue)

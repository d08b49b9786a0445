"""``RunState``: the projection of one run's history, advanced one event at a time.

``RunState.apply`` is the single place where the event state machine is enforced: every store
calls it inside its append (so an invalid write fails) and every read rebuilds or advances it
(so a corrupt history is reported, never executed). Advancing a cached state by the new events
keeps the cost of a decision independent of the history's length.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NoReturn

from flowstream.errors import CorruptHistoryError, InvalidTransitionError
from flowstream.model.base import JSON
from flowstream.model.events import (
    EVENT_SCHEMA_VERSION,
    ChildCancellationPolicy,
    ChildWorkflowRequested,
    ChildWorkflowResolved,
    EventEnvelope,
    HookCreated,
    HookDisposed,
    HookReceived,
    ParentLink,
    RunCancellationRequested,
    RunCancelled,
    RunCompleted,
    RunContinuedAsNew,
    RunCreated,
    RunFailed,
    RunProgressRecorded,
    RunRetryExhausted,
    RunStarted,
    RunTimedOut,
    SignalReceived,
    SignalWaitCompleted,
    SignalWaitCreated,
    StepCancelled,
    StepCompleted,
    StepCreated,
    StepFailed,
    StepNonRetryable,
    StepRetrying,
    StepStarted,
    TerminalOutcome,
    WaitCompleted,
    WaitCreated,
    WorkflowProgress,
)
from flowstream.model.snapshot import (
    TERMINAL_STATUSES,
    HookStatus,
    RunStatus,
    StepStatus,
    WaitStatus,
    WorkflowRunSnapshot,
)
from flowstream.model.spec import ExhaustedAction, RetryPolicy, WorkflowSpec

__all__ = ["RunState", "Wakeup", "project"]


@dataclass(slots=True)
class StepState:
    step_id: str
    step_name: str
    input: JSON
    retry: RetryPolicy
    status: StepStatus = StepStatus.PENDING
    attempt: int = 0
    output: JSON = None
    error: str | None = None
    retry_after: datetime | None = None


@dataclass(slots=True)
class WaitState:
    wait_id: str
    resume_at: datetime
    status: WaitStatus = WaitStatus.WAITING


@dataclass(slots=True)
class HookState:
    hook_id: str
    token_digest: str
    metadata: JSON
    status: HookStatus = HookStatus.ACTIVE
    payload: JSON = None
    received: bool = False


@dataclass(slots=True)
class SignalState:
    signal_id: str
    name: str
    payload: JSON
    received_sequence: int
    consumed_by: str | None = None


@dataclass(slots=True)
class SignalWaitState:
    wait_id: str
    signal_name: str
    created_sequence: int
    status: WaitStatus = WaitStatus.WAITING
    signal_id: str | None = None


@dataclass(slots=True)
class ChildState:
    child_id: str
    run_id: str
    spec: WorkflowSpec
    input: JSON
    cancellation_policy: ChildCancellationPolicy
    requested_sequence: int
    outcome: TerminalOutcome | None = None


@dataclass(slots=True)
class CancellationState:
    reason: str | None
    requested_at: datetime
    sequence: int


@dataclass(frozen=True, slots=True)
class Wakeup:
    """A durable deadline: a timer (``kind="wait"``) or a delayed retry (``kind="retry"``)."""

    due: datetime
    run_id: str
    kind: str
    subject_id: str


@dataclass(slots=True)
class FailRunFailure:
    """A step failure that must end the run (retry exhausted or non-retryable, fail-run)."""

    step_id: str
    attempt: int
    error: str
    exhausted: bool


@dataclass(slots=True)
class RunState:
    """Mutable projection of one run. Only ``apply`` changes it."""

    run_id: str
    spec: WorkflowSpec
    input: JSON
    parent: ParentLink | None
    depth: int
    created_at: datetime
    status: RunStatus = RunStatus.PENDING
    last_sequence: int = 0
    updated_at: datetime | None = None
    steps: dict[str, StepState] = field(default_factory=dict)
    waits: dict[str, WaitState] = field(default_factory=dict)
    hooks: dict[str, HookState] = field(default_factory=dict)
    signals: dict[str, SignalState] = field(default_factory=dict)
    signal_waits: dict[str, SignalWaitState] = field(default_factory=dict)
    children: dict[str, ChildState] = field(default_factory=dict)
    progress: dict[str, WorkflowProgress] = field(default_factory=dict)
    cancellation: CancellationState | None = None
    output: JSON = None
    error: str | None = None
    outcome: TerminalOutcome | None = None
    continuation_input: JSON = None
    history: list[EventEnvelope] = field(default_factory=list)
    # Indexes that keep every decision O(open work) instead of O(history).
    active_steps: set[str] = field(default_factory=set)
    delayed_steps: set[str] = field(default_factory=set)
    open_waits: set[str] = field(default_factory=set)
    active_hooks: set[str] = field(default_factory=set)
    open_children: set[str] = field(default_factory=set)
    waiting_signal_waits: dict[str, deque[str]] = field(default_factory=dict)
    unconsumed_signals: dict[str, deque[str]] = field(default_factory=dict)
    fail_run_failure: FailRunFailure | None = None

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def from_history(cls, envelopes: Iterable[EventEnvelope]) -> RunState:
        """Project a whole history; any violation raises ``CorruptHistoryError``."""
        state: RunState | None = None
        run_id: str | None = None
        for envelope in envelopes:
            run_id = run_id or envelope.run_id
            try:
                if state is None:
                    state = cls.first(envelope)
                else:
                    state.apply(envelope)
            except InvalidTransitionError as exc:
                raise CorruptHistoryError(
                    f"corrupt history at sequence {envelope.sequence}: {exc}", run_id=run_id
                ) from exc
        if state is None:
            raise CorruptHistoryError("history is empty")
        return state

    @classmethod
    def first(cls, envelope: EventEnvelope) -> RunState:
        event = envelope.event
        if envelope.schema_version != EVENT_SCHEMA_VERSION:
            raise InvalidTransitionError(
                f"event schema version {envelope.schema_version} is not supported",
                run_id=envelope.run_id,
            )
        if envelope.sequence != 1 or not isinstance(event, RunCreated):
            raise InvalidTransitionError(
                "a history must start with run_created at sequence 1", run_id=envelope.run_id
            )
        state = cls(
            run_id=envelope.run_id,
            spec=event.spec,
            input=event.input,
            parent=event.parent,
            depth=event.depth,
            created_at=envelope.timestamp,
            last_sequence=1,
            updated_at=envelope.timestamp,
        )
        state.history.append(envelope)
        return state

    # -- derived views --------------------------------------------------------------------

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def attempt_running(self, step_id: str, attempt: int) -> bool:
        """The step's ``attempt`` was started and has no outcome yet: only then is an outcome of
        it recorded, or a handler run for it."""
        step = self.steps.get(step_id)
        return step is not None and step.status is StepStatus.RUNNING and step.attempt == attempt

    @property
    def blocking_children(self) -> list[str]:
        """Open children that block the run (abandoned children stop blocking once cancelling)."""
        if self.cancellation is None:
            return sorted(self.open_children, key=self._child_order)
        return sorted(
            (
                child_id
                for child_id in self.open_children
                if self.children[child_id].cancellation_policy
                is ChildCancellationPolicy.REQUEST_CANCELLATION
            ),
            key=self._child_order,
        )

    def _child_order(self, child_id: str) -> int:
        return self.children[child_id].requested_sequence

    def has_open_suspension(self) -> bool:
        return bool(
            self.open_waits
            or self.active_hooks
            or self.delayed_steps
            or self.open_children
            or any(self.waiting_signal_waits.values())
        )

    def due_retries(self, now: datetime) -> list[str]:
        return sorted(
            step_id
            for step_id in self.delayed_steps
            if (due := self.steps[step_id].retry_after) is not None and due <= now
        )

    def wakeups(self) -> list[Wakeup]:
        """Durable deadlines of this run (none once it is terminal)."""
        if self.is_terminal:
            return []
        found = [Wakeup(self.waits[w].resume_at, self.run_id, "wait", w) for w in self.open_waits]
        for step_id in self.delayed_steps:
            due = self.steps[step_id].retry_after
            if due is not None:
                found.append(Wakeup(due, self.run_id, "retry", step_id))
        return found

    def public_status(self) -> RunStatus:
        if self.status is RunStatus.RUNNING and self.has_open_suspension():
            return RunStatus.SUSPENDED
        return self.status

    def snapshot(self) -> WorkflowRunSnapshot:
        """A frozen copy for callers; built on demand, never on the decision path."""
        data: dict[str, Any] = {
            "run_id": self.run_id,
            "spec": self.spec,
            "input": self.input,
            "status": self.public_status(),
            "parent": self.parent,
            "steps": self.steps,
            "waits": self.waits,
            "hooks": self.hooks,
            "signals": list(self.signals.values()),
            "signal_waits": self.signal_waits,
            "children": self.children,
            "progress": list(self.progress.values()),
            "cancellation": self.cancellation,
            "output": self.output,
            "error": self.error,
            "outcome": self.outcome,
            "last_sequence": self.last_sequence,
            "updated_at": self.updated_at,
        }
        return WorkflowRunSnapshot.model_validate(data, from_attributes=True)

    # -- the state machine ----------------------------------------------------------------

    def apply(self, envelope: EventEnvelope) -> None:
        """Advance by one committed event, or raise ``InvalidTransitionError``."""
        if envelope.run_id != self.run_id:
            self._reject(f"event for run {envelope.run_id} in the history of {self.run_id}")
        if envelope.schema_version != EVENT_SCHEMA_VERSION:
            self._reject(f"event schema version {envelope.schema_version} is not supported")
        if envelope.sequence != self.last_sequence + 1:
            self._reject(f"sequence {envelope.sequence} does not follow {self.last_sequence}")
        event = envelope.event
        if self.is_terminal:
            self._reject(f"{event.type} after the run reached {self.status.value}")
        handler = _HANDLERS.get(type(event))
        if handler is None:
            self._reject(f"{event.type} cannot appear after the first event")
        handler(self, event, envelope)
        self.last_sequence = envelope.sequence
        self.updated_at = envelope.timestamp
        self.history.append(envelope)

    def _reject(self, message: str) -> NoReturn:
        raise InvalidTransitionError(message, run_id=self.run_id)

    def _require_started(self, what: str) -> None:
        if self.status is RunStatus.PENDING:
            self._reject(f"{what} before run_started")

    # run lifecycle

    def _on_started(self, event: RunStarted, envelope: EventEnvelope) -> None:
        if self.status is not RunStatus.PENDING:
            self._reject("run_started is only legal once, from pending")
        self.status = RunStatus.RUNNING

    def _terminal(self, outcome: TerminalOutcome, status: RunStatus) -> None:
        self._require_started(f"terminal event {outcome.type}")
        if outcome.type != "continued_as_new":
            blocking = [
                c
                for c in self.open_children
                if self.children[c].cancellation_policy
                is ChildCancellationPolicy.REQUEST_CANCELLATION
            ]
            if blocking:
                self._reject(f"cannot terminate while child workflow {blocking[0]} is open")
        self.outcome = outcome
        self.status = status

    def _on_completed(self, event: RunCompleted, envelope: EventEnvelope) -> None:
        if self.status is RunStatus.CANCELLING:
            self._reject("run_completed while cancelling; return cancel or fail")
        self._terminal(TerminalOutcome(type="completed", output=event.output), RunStatus.COMPLETED)
        self.output = event.output

    def _on_failed(self, event: RunFailed, envelope: EventEnvelope) -> None:
        self._terminal(TerminalOutcome(type="failed", error=event.error), RunStatus.FAILED)
        self.error = event.error

    def _on_cancellation_requested(
        self, event: RunCancellationRequested, envelope: EventEnvelope
    ) -> None:
        if self.cancellation is not None:
            self._reject("run_cancellation_requested appears twice")
        self.cancellation = CancellationState(event.reason, envelope.timestamp, envelope.sequence)
        self.status = RunStatus.CANCELLING
        # Work that existed before the request becomes non-actionable.
        for step_id in list(self.active_steps):
            step = self.steps[step_id]
            step.status = StepStatus.CANCELLED
            step.retry_after = None
            step.error = "cancelled by run cancellation request"
        self.active_steps.clear()
        self.delayed_steps.clear()
        for wait_id in self.open_waits:
            self.waits[wait_id].status = WaitStatus.CANCELLED
        self.open_waits.clear()
        for hook_id in self.active_hooks:
            self.hooks[hook_id].status = HookStatus.CANCELLED
        self.active_hooks.clear()
        for queue in self.waiting_signal_waits.values():
            for wait_id in queue:
                self.signal_waits[wait_id].status = WaitStatus.CANCELLED
        self.waiting_signal_waits.clear()

    def _on_cancelled(self, event: RunCancelled, envelope: EventEnvelope) -> None:
        if self.status is RunStatus.PENDING:  # cancelled before it ever started
            self.status = RunStatus.RUNNING
        self._terminal(TerminalOutcome(type="cancelled", error=event.reason), RunStatus.CANCELLED)
        self.error = event.reason

    def _on_timed_out(self, event: RunTimedOut, envelope: EventEnvelope) -> None:
        reason = event.reason or f"workflow timed out at {event.deadline.isoformat()}"
        self._terminal(TerminalOutcome(type="timed_out", error=reason), RunStatus.FAILED)
        self.error = reason

    def _on_retry_exhausted(self, event: RunRetryExhausted, envelope: EventEnvelope) -> None:
        step = self.steps.get(event.step_id)
        if (
            step is None
            or step.status is not StepStatus.FAILED
            or step.retry.on_exhausted is not ExhaustedAction.FAIL_RUN
            or step.attempt != event.attempt
            or step.error != event.error
        ):
            self._reject(
                f"run_retry_exhausted does not match a failed fail-run step {event.step_id}"
            )
        self._terminal(
            TerminalOutcome(type="retry_exhausted", error=event.error, step_id=event.step_id),
            RunStatus.FAILED,
        )
        self.error = event.error

    def _on_continued(self, event: RunContinuedAsNew, envelope: EventEnvelope) -> None:
        if self.status is not RunStatus.RUNNING:
            self._reject("run_continued_as_new is only legal while running")
        if self.open_children:
            self._reject("cannot continue as new with an open child workflow")
        if any(self.waiting_signal_waits.values()):
            self._reject("cannot continue as new with an open signal wait")
        if any(self.unconsumed_signals.values()):
            self._reject("cannot continue as new with an unconsumed signal")
        self._terminal(
            TerminalOutcome(type="continued_as_new", successor_run_id=event.successor_run_id),
            RunStatus.CONTINUED_AS_NEW,
        )
        self.continuation_input = event.input

    def _on_progress(self, event: RunProgressRecorded, envelope: EventEnvelope) -> None:
        progress = event.progress
        if progress.progress_id in self.progress:
            self._reject(f"progress {progress.progress_id} recorded twice")
        if progress.total is not None and progress.completed > progress.total:
            self._reject(f"progress {progress.progress_id} has completed > total")
        self.progress[progress.progress_id] = progress

    # steps

    def _step(self, step_id: str, what: str) -> StepState:
        step = self.steps.get(step_id)
        if step is None:
            self._reject(f"{what} for unknown step {step_id}")
        assert step is not None
        return step

    def _running_step(self, step_id: str, attempt: int, what: str) -> StepState:
        step = self._step(step_id, what)
        if step.status is not StepStatus.RUNNING or step.attempt != attempt:
            self._reject(
                f"{what} for step {step_id} attempt {attempt}, but the step is "
                f"{step.status.value} at attempt {step.attempt}"
            )
        return step

    def _on_step_created(self, event: StepCreated, envelope: EventEnvelope) -> None:
        self._require_started("step_created")
        if event.step_id in self.steps:
            self._reject(f"step {event.step_id} created twice")
        self.steps[event.step_id] = StepState(
            event.step_id, event.step_name, event.input, event.retry
        )
        self.active_steps.add(event.step_id)

    def _on_step_started(self, event: StepStarted, envelope: EventEnvelope) -> None:
        step = self._step(event.step_id, "step_started")
        if step.status is not StepStatus.PENDING or event.attempt != step.attempt + 1:
            self._reject(
                f"step_started attempt {event.attempt} for step {event.step_id} that is "
                f"{step.status.value} at attempt {step.attempt}"
            )
        if event.attempt > step.retry.max_attempts:
            self._reject(f"step {event.step_id} started beyond its retry budget")
        step.status = StepStatus.RUNNING
        step.attempt = event.attempt
        step.retry_after = None
        self.delayed_steps.discard(event.step_id)

    def _on_step_completed(self, event: StepCompleted, envelope: EventEnvelope) -> None:
        step = self._step(event.step_id, "step_completed")
        if step.status is not StepStatus.RUNNING:
            self._reject(f"step_completed for step {event.step_id} that is {step.status.value}")
        step.status = StepStatus.COMPLETED
        step.output = event.output
        step.error = None
        self.active_steps.discard(event.step_id)

    def _on_step_retrying(self, event: StepRetrying, envelope: EventEnvelope) -> None:
        step = self._running_step(event.step_id, event.attempt, "step_retrying")
        if event.attempt >= step.retry.max_attempts:
            self._reject(f"step_retrying for step {event.step_id} beyond its retry budget")
        delayed = step.retry.delay_ms > 0
        if delayed and event.retry_after is None:
            self._reject(f"delayed retry of step {event.step_id} without retry_after")
        if not delayed and event.retry_after is not None:
            self._reject(f"immediate retry of step {event.step_id} with retry_after")
        step.status = StepStatus.PENDING
        step.error = event.error
        step.retry_after = event.retry_after
        if event.retry_after is not None:
            self.delayed_steps.add(event.step_id)

    def _on_step_failed(self, event: StepFailed, envelope: EventEnvelope) -> None:
        step = self._running_step(event.step_id, event.attempt, "step_failed")
        if event.attempt < step.retry.max_attempts:
            self._reject(f"step_failed for step {event.step_id} before its budget is exhausted")
        self._fail_step(step, event.error, exhausted=True)

    def _on_step_non_retryable(self, event: StepNonRetryable, envelope: EventEnvelope) -> None:
        step = self._running_step(event.step_id, event.attempt, "step_non_retryable")
        self._fail_step(step, event.error, exhausted=False)

    def _fail_step(self, step: StepState, error: str, *, exhausted: bool) -> None:
        step.status = StepStatus.FAILED
        step.error = error
        self.active_steps.discard(step.step_id)
        if step.retry.on_exhausted is ExhaustedAction.FAIL_RUN and self.fail_run_failure is None:
            self.fail_run_failure = FailRunFailure(step.step_id, step.attempt, error, exhausted)

    def _on_step_cancelled(self, event: StepCancelled, envelope: EventEnvelope) -> None:
        step = self._step(event.step_id, "step_cancelled")
        if step.status not in (StepStatus.PENDING, StepStatus.RUNNING):
            self._reject(f"step_cancelled for step {event.step_id} that is {step.status.value}")
        step.status = StepStatus.CANCELLED
        step.error = event.reason
        step.retry_after = None
        self.active_steps.discard(event.step_id)
        self.delayed_steps.discard(event.step_id)

    # timers

    def _on_wait_created(self, event: WaitCreated, envelope: EventEnvelope) -> None:
        self._require_started("wait_created")
        if event.wait_id in self.waits:
            self._reject(f"wait {event.wait_id} created twice")
        self.waits[event.wait_id] = WaitState(event.wait_id, event.resume_at)
        self.open_waits.add(event.wait_id)

    def _on_wait_completed(self, event: WaitCompleted, envelope: EventEnvelope) -> None:
        wait = self.waits.get(event.wait_id)
        if wait is None or wait.status is not WaitStatus.WAITING:
            self._reject(f"wait_completed for wait {event.wait_id} that is not waiting")
        assert wait is not None
        wait.status = WaitStatus.COMPLETED
        self.open_waits.discard(event.wait_id)

    # signals

    def _on_signal_received(self, event: SignalReceived, envelope: EventEnvelope) -> None:
        if event.signal_id in self.signals:
            self._reject(f"signal {event.signal_id} received twice")
        if event.name not in self.spec.signal_names:
            self._reject(f"signal name {event.name!r} is not declared by the workflow spec")
        self.signals[event.signal_id] = SignalState(
            event.signal_id, event.name, event.payload, envelope.sequence
        )
        self.unconsumed_signals.setdefault(event.name, deque()).append(event.signal_id)

    def _on_signal_wait_created(self, event: SignalWaitCreated, envelope: EventEnvelope) -> None:
        self._require_started("signal_wait_created")
        if event.wait_id in self.signal_waits:
            self._reject(f"signal wait {event.wait_id} created twice")
        if event.signal_name not in self.spec.signal_names:
            self._reject(f"signal name {event.signal_name!r} is not declared by the workflow spec")
        self.signal_waits[event.wait_id] = SignalWaitState(
            event.wait_id, event.signal_name, envelope.sequence
        )
        self.waiting_signal_waits.setdefault(event.signal_name, deque()).append(event.wait_id)

    def _on_signal_wait_completed(
        self, event: SignalWaitCompleted, envelope: EventEnvelope
    ) -> None:
        wait = self.signal_waits.get(event.wait_id)
        signal = self.signals.get(event.signal_id)
        if wait is None or signal is None or wait.status is not WaitStatus.WAITING:
            self._reject(f"signal_wait_completed pairs unknown or closed wait {event.wait_id}")
        assert wait is not None and signal is not None
        waits = self.waiting_signal_waits.get(wait.signal_name)
        signals = self.unconsumed_signals.get(signal.name)
        if (
            signal.name != wait.signal_name
            or not waits
            or not signals
            or waits[0] != event.wait_id
            or signals[0] != event.signal_id
        ):
            self._reject(
                f"signal wait {event.wait_id} must pair, in FIFO order, the oldest waiting wait "
                "with the oldest unconsumed signal of the same name"
            )
        assert waits is not None and signals is not None
        waits.popleft()
        signals.popleft()
        wait.status = WaitStatus.COMPLETED
        wait.signal_id = event.signal_id
        signal.consumed_by = event.wait_id

    # hooks

    def _on_hook_created(self, event: HookCreated, envelope: EventEnvelope) -> None:
        self._require_started("hook_created")
        if event.hook_id in self.hooks:
            self._reject(f"hook {event.hook_id} created twice")
        self.hooks[event.hook_id] = HookState(event.hook_id, event.token_digest, event.metadata)
        self.active_hooks.add(event.hook_id)

    def _on_hook_received(self, event: HookReceived, envelope: EventEnvelope) -> None:
        hook = self.hooks.get(event.hook_id)
        if hook is None or hook.status is not HookStatus.ACTIVE:
            self._reject(f"hook_received for hook {event.hook_id} that is not active")
        assert hook is not None
        hook.status = HookStatus.RECEIVED
        hook.payload = event.payload
        hook.received = True
        self.active_hooks.discard(event.hook_id)

    def _on_hook_disposed(self, event: HookDisposed, envelope: EventEnvelope) -> None:
        hook = self.hooks.get(event.hook_id)
        if hook is None or hook.status not in (HookStatus.ACTIVE, HookStatus.RECEIVED):
            self._reject(f"hook_disposed for hook {event.hook_id} that is not active or received")
        assert hook is not None
        hook.status = HookStatus.DISPOSED
        self.active_hooks.discard(event.hook_id)

    # children

    def _on_child_requested(self, event: ChildWorkflowRequested, envelope: EventEnvelope) -> None:
        self._require_started("child_workflow_requested")
        if event.child_id in self.children:
            self._reject(f"child workflow {event.child_id} requested twice")
        self.children[event.child_id] = ChildState(
            event.child_id,
            event.child_run_id,
            event.spec,
            event.input,
            event.cancellation_policy,
            envelope.sequence,
        )
        self.open_children.add(event.child_id)

    def _on_child_resolved(self, event: ChildWorkflowResolved, envelope: EventEnvelope) -> None:
        child = self.children.get(event.child_id)
        if child is None or child.outcome is not None:
            self._reject(f"child_workflow_resolved for child {event.child_id} that is not open")
        if event.outcome.type == "continued_as_new":
            self._reject("a child resolves to the outcome of the last run of its chain")
        assert child is not None
        child.outcome = event.outcome
        self.open_children.discard(event.child_id)


_HANDLERS: dict[type[Any], Callable[[RunState, Any, EventEnvelope], None]] = {
    RunStarted: RunState._on_started,
    RunCompleted: RunState._on_completed,
    RunFailed: RunState._on_failed,
    RunCancellationRequested: RunState._on_cancellation_requested,
    RunCancelled: RunState._on_cancelled,
    RunTimedOut: RunState._on_timed_out,
    RunRetryExhausted: RunState._on_retry_exhausted,
    RunContinuedAsNew: RunState._on_continued,
    RunProgressRecorded: RunState._on_progress,
    StepCreated: RunState._on_step_created,
    StepStarted: RunState._on_step_started,
    StepCompleted: RunState._on_step_completed,
    StepRetrying: RunState._on_step_retrying,
    StepFailed: RunState._on_step_failed,
    StepNonRetryable: RunState._on_step_non_retryable,
    StepCancelled: RunState._on_step_cancelled,
    WaitCreated: RunState._on_wait_created,
    WaitCompleted: RunState._on_wait_completed,
    SignalReceived: RunState._on_signal_received,
    SignalWaitCreated: RunState._on_signal_wait_created,
    SignalWaitCompleted: RunState._on_signal_wait_completed,
    HookCreated: RunState._on_hook_created,
    HookReceived: RunState._on_hook_received,
    HookDisposed: RunState._on_hook_disposed,
    ChildWorkflowRequested: RunState._on_child_requested,
    ChildWorkflowResolved: RunState._on_child_resolved,
}


def project(envelopes: Iterable[EventEnvelope]) -> WorkflowRunSnapshot:
    """Project a whole history into a snapshot (validating it)."""
    return RunState.from_history(envelopes).snapshot()

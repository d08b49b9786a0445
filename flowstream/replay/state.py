"""``RunState``: the projection of one run's history, advanced one event at a time.

``RunState.apply`` is the single place where the event state machine is enforced (each event's
transition is in :mod:`flowstream.replay.transitions`, the records it keeps in
:mod:`flowstream.replay.records`): every store calls it inside its append (so an invalid write
fails) and every read rebuilds or advances it (so a corrupt history is reported, never executed).
Advancing a cached state by the new events keeps the cost of a decision independent of the
history's length.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from flowstream.errors import CorruptHistoryError, InvalidTransitionError
from flowstream.model.base import JSON
from flowstream.model.events import (
    EVENT_SCHEMA_VERSION,
    ChildCancellationPolicy,
    EventEnvelope,
    ParentLink,
    RunCreated,
    TerminalOutcome,
    WorkflowProgress,
    WorkflowTaskFailed,
)
from flowstream.model.snapshot import (
    TERMINAL_STATUSES,
    RunStatus,
    StepStatus,
    WorkflowRunSnapshot,
)
from flowstream.model.spec import WorkflowSpec
from flowstream.replay.records import (
    CancellationState,
    ChildState,
    FailRunFailure,
    HookState,
    SignalState,
    SignalWaitState,
    StepState,
    TaskFailure,
    WaitState,
    Wakeup,
)
from flowstream.replay.transitions import TRANSITIONS, reject

__all__ = ["RunState", "Wakeup", "project"]


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
    #: The last workflow-task failure, until the run moves on (any other event clears it).
    task_failure: TaskFailure | None = None
    #: ``public_status`` and the sequence it was computed at (asked before and after appends).
    _public: tuple[int, RunStatus] = field(
        default=(-1, RunStatus.PENDING), init=False, repr=False, compare=False
    )

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
        """Durable deadlines of this run (none once it is terminal).

        While its workflow task is failing, the task's retry is the run's only deadline: what
        else could be due (a delayed step's retry) needs a decision, which is that retry.
        """
        if self.is_terminal:
            return []
        failure = self.task_failure
        if failure is not None:
            if failure.retry_at is None:
                return []
            return [Wakeup(failure.retry_at, self.run_id, "task", f"attempt-{failure.attempt}")]
        found = [Wakeup(self.waits[w].resume_at, self.run_id, "wait", w) for w in self.open_waits]
        for step_id in self.delayed_steps:
            due = self.steps[step_id].retry_after
            if due is not None:
                found.append(Wakeup(due, self.run_id, "retry", step_id))
        return found

    def public_status(self) -> RunStatus:
        at, status = self._public
        if at == self.last_sequence:
            return status
        status = self.status
        if status is RunStatus.RUNNING and self.has_open_suspension():
            status = RunStatus.SUSPENDED
        self._public = (self.last_sequence, status)
        return status

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
            "task_failure": self.task_failure,
            "last_sequence": self.last_sequence,
            "updated_at": self.updated_at,
        }
        return WorkflowRunSnapshot.model_validate(data, from_attributes=True)

    # -- the state machine (its transitions are in ``transitions``) ----------------------------

    def apply(self, envelope: EventEnvelope) -> None:
        """Advance by one committed event, or raise ``InvalidTransitionError``."""
        if envelope.run_id != self.run_id:
            reject(self, f"event for run {envelope.run_id} in the history of {self.run_id}")
        if envelope.schema_version != EVENT_SCHEMA_VERSION:
            reject(self, f"event schema version {envelope.schema_version} is not supported")
        if envelope.sequence != self.last_sequence + 1:
            reject(self, f"sequence {envelope.sequence} does not follow {self.last_sequence}")
        event = envelope.event
        if self.is_terminal:
            reject(self, f"{event.type} after the run reached {self.status.value}")
        handler = TRANSITIONS.get(type(event))
        if handler is None:
            reject(self, f"{event.type} cannot appear after the first event")
        handler(self, event, envelope)
        if self.task_failure is not None and not isinstance(event, WorkflowTaskFailed):
            self.task_failure = None  # the run moved on
        self.last_sequence = envelope.sequence
        self.updated_at = envelope.timestamp
        self.history.append(envelope)


def project(envelopes: Iterable[EventEnvelope]) -> WorkflowRunSnapshot:
    """Project a whole history into a snapshot (validating it)."""
    return RunState.from_history(envelopes).snapshot()

"""What the run index holds: one ``RunRow`` per run, projected from the run's state alone.

A row is a pure function of the run's history (``row_of`` reads a ``RunState``; nothing here
asks the clock), so an index kept current event by event, one rebuilt from the events topic and
one built from the store's histories hold the same rows. ``RunQuery`` filters by status,
workflow and update time and pages with an opaque cursor; ``RunPage`` is one page, newest update
first. ``RunIndex`` is what every index answers, whichever mode keeps it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, NamedTuple, Protocol, runtime_checkable

from pydantic import Field, field_validator

from flowstream.model.base import FrozenModel
from flowstream.model.snapshot import TERMINAL_STATUSES, RunStatus, StepStatus
from flowstream.replay.state import RunState

__all__ = [
    "MAX_LIMIT",
    "ROW_FIELDS",
    "OpenItem",
    "RunIndex",
    "RunPage",
    "RunQuery",
    "RunRow",
    "last_error",
    "micros",
    "open_items",
    "row_fields",
    "row_of",
    "row_values",
    "waiting_for",
]

#: The largest page a query returns.
MAX_LIMIT = 1000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Members looked up once: ``RunStatus.PENDING`` is an attribute lookup on the enum's class.
_PENDING = RunStatus.PENDING
_RUN_RUNNING = RunStatus.RUNNING
_RUNNING = StepStatus.RUNNING
_COMPLETED = StepStatus.COMPLETED


class RunRow(FrozenModel):
    """One run as the index shows it."""

    run_id: str
    workflow: str
    #: The public status (``suspended`` when running with an open wait, hook, retry or child).
    status: RunStatus
    #: The runtime build the run is pinned to (``None``: any build).
    build: str | None = None
    created_at: datetime
    updated_at: datetime
    #: What moves the run on, in one line ("signal approve", "timer until …", "hook h-1",
    #: "child c-1", "step charge (attempt 2)"); ``None`` for an ended run, or one that waits on
    #: nothing but its next decision.
    waiting_for: str | None = None
    last_error: str | None = None
    #: The parent of a child run, or the predecessor of a continuation.
    parent_run_id: str | None = None
    #: The run this one continued as (status ``continued_as_new``).
    continued_to: str | None = None
    #: The sequence of its last event.
    last_sequence: int = 0


def _aware(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


class RunQuery(FrozenModel):
    """Which runs to list: every filter given must hold (each set: any of its members)."""

    status: frozenset[RunStatus] | None = None
    workflow: frozenset[str] | None = None
    #: Runs updated at or after this moment (a naive time is UTC).
    updated_after: datetime | None = None
    #: Runs updated before this moment.
    updated_before: datetime | None = None
    limit: int = Field(default=50, ge=1, le=MAX_LIMIT)
    #: ``next_cursor`` of the previous page; the same filters must be given with it.
    cursor: str | None = None

    @field_validator("updated_after", "updated_before")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return _aware(value)


class RunPage(FrozenModel):
    """One page of a query, most recently updated first; ``next_cursor`` is ``None`` at the end."""

    rows: tuple[RunRow, ...] = ()
    next_cursor: str | None = None


@runtime_checkable
class RunIndex(Protocol):
    """A view of every run: filtered pages, one run's row, and runs by status."""

    def query(self, query: RunQuery) -> RunPage: ...

    def get(self, run_id: str) -> RunRow | None: ...

    def counts(self) -> dict[str, int]:
        """Runs by public status; every status is named, with 0 when none has it."""
        ...


# -- the projection -----------------------------------------------------------------------------


class OpenItem(NamedTuple):
    """One open suspension of a run: a timer (``wait``), a delayed step ``retry``, a ``hook``,
    a ``signal`` wait or a ``child``."""

    kind: str
    subject_id: str
    due: datetime | None = None


def open_items(state: RunState) -> tuple[OpenItem, ...]:
    """The open suspensions of a run that has not ended, in a stable order."""
    if (
        not (
            state.open_waits
            or state.delayed_steps
            or state.active_hooks
            or state.waiting_signal_waits
            or state.open_children
        )
        or state.status in TERMINAL_STATUSES
    ):
        return ()  # most appends: nothing is open
    found = [OpenItem("wait", w, state.waits[w].resume_at) for w in sorted(state.open_waits)]
    if state.delayed_steps:
        found += [
            OpenItem("retry", s, state.steps[s].retry_after) for s in sorted(state.delayed_steps)
        ]
    if state.active_hooks:
        found += [OpenItem("hook", h) for h in sorted(state.active_hooks)]
    for queue in state.waiting_signal_waits.values():
        found += [OpenItem("signal", w) for w in queue]
    if state.open_children:
        found += [OpenItem("child", c) for c in sorted(state.open_children)]
    return tuple(found)


def micros(moment: datetime) -> int:
    """Microseconds since the epoch of an aware time after it (in integers: no float between;
    the index works it out on every append, and a ``timestamp()`` costs twice as much)."""
    since = moment - _EPOCH
    return (since.days * 86_400 + since.seconds) * 1_000_000 + since.microseconds


def _stamp(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds")


def _more(first: str, others: int) -> str:
    return first if not others else f"{first} (+{others} more)"


def waiting_for(state: RunState) -> str | None:
    """What moves the run on, in one line (see ``RunRow.waiting_for``)."""
    status = state.status
    if status is not _RUN_RUNNING:  # (most appends are to a running run)
        if status in TERMINAL_STATUSES:
            return None
        if status is _PENDING:
            return "start"
    failure = state.task_failure
    if failure is not None:
        if failure.retry_at is None:
            return f"operator: workflow task failed (attempt {failure.attempt}), retries exhausted"
        return f"workflow task retry at {_stamp(failure.retry_at)} (attempt {failure.attempt})"
    if state.active_steps:
        steps = state.steps
        first: str | None = None
        running = 0
        for step_id in state.active_steps:  # the running step first by step id, and how many
            if steps[step_id].status is _RUNNING:
                running += 1
                if first is None or step_id < first:
                    first = step_id
        if first is not None:
            step = steps[first]
            found = f"step {step.step_id} (attempt {step.attempt})"
            return found if running == 1 else f"{found} (+{running - 1} more)"
    if not (
        state.open_waits
        or state.delayed_steps
        or state.waiting_signal_waits
        or state.active_hooks
        or state.open_children
    ):
        return None  # nothing is open: only its next decision moves it on
    timed: list[tuple[datetime, str]] = [
        (state.waits[w].resume_at, f"timer until {_stamp(state.waits[w].resume_at)}")
        for w in state.open_waits
    ]
    for step_id in state.delayed_steps:
        due = state.steps[step_id].retry_after
        if due is not None:
            timed.append((due, f"retry of step {step_id} at {_stamp(due)}"))
    if timed:
        timed.sort()
        return _more(timed[0][1], len(timed) - 1)
    inputs = [
        f"signal {name}"
        for name in sorted(state.waiting_signal_waits)
        for _ in state.waiting_signal_waits[name]
    ]
    inputs.extend(f"hook {h}" for h in sorted(state.active_hooks))
    inputs.extend(f"child {c}" for c in state.blocking_children)
    if inputs:
        return _more(inputs[0], len(inputs) - 1)
    return None


def last_error(state: RunState) -> str | None:
    """The run's error; else its failing workflow task's; else the error of a step that has
    not completed (the first by step id)."""
    if state.error:
        return state.error
    failure = state.task_failure
    if failure is not None:
        return f"{failure.error_type}: {failure.message}".rstrip(": ")
    steps = state.steps
    for step in steps.values():  # most runs: no step has an error
        if step.error:
            break
    else:
        return None
    first: str | None = None
    error = None
    for step_id, step in steps.items():
        if step.error and step.status is not _COMPLETED and (first is None or step_id < first):
            first, error = step_id, step.error
    return error


#: ``RunRow``'s fields, in its order (``row_fields`` gives their values).
ROW_FIELDS = (
    "run_id",
    "workflow",
    "status",
    "build",
    "created_at",
    "updated_at",
    "waiting_for",
    "last_error",
    "parent_run_id",
    "continued_to",
    "last_sequence",
)


def row_fields(state: RunState) -> tuple[Any, ...]:
    """The values of the run's row, in ``ROW_FIELDS``' order (a store writes one on every
    append: a tuple, not a dict)."""
    outcome = state.outcome
    return (
        state.run_id,
        state.spec.name,
        state.public_status(),
        state.spec.runtime_build_id,
        state.created_at,
        state.updated_at or state.created_at,
        waiting_for(state),
        last_error(state),
        None if state.parent is None else state.parent.run_id,
        None if outcome is None else outcome.successor_run_id,
        state.last_sequence,
    )


def row_values(state: RunState) -> dict[str, Any]:
    """The fields of the run's row (``RunRow``'s), as plain values."""
    return dict(zip(ROW_FIELDS, row_fields(state), strict=True))


def row_of(state: RunState) -> RunRow:
    """The index row of a run, from its state."""
    return RunRow(**row_values(state))

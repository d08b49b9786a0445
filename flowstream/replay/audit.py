"""Audit: re-check a committed history and replay its decisions against the current code.

``audit_history`` validates the history (contiguous sequences from 1, legal transitions), then
walks it: at every point where the engine asked workflow code for a decision, it asks the current
code again with exactly the history of that moment and checks that ``decide`` produces the
events that follow (``workflow_task_failed`` records are the engine's, never checked as
decisions). It uses the same functions as the live engine and processor
(``engine_repair``, ``is_suspended``, ``decide``), so a passing audit means today's code would
have written the same history.

It also names the run's liveness condition at the end of its history (``replay.liveness``): a
run that is not terminal and waits on nothing (``NEEDS_DRIVE``) violates the liveness
invariant, and is reported as a problem of its own (``stalled``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from flowstream.errors import CorruptHistoryError, FlowError, NonDeterministicError
from flowstream.model.base import canonical_json, json_equal
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import EventEnvelope, FlowEvent, RunFailed
from flowstream.model.spec import WorkflowSpec
from flowstream.replay.context import HistoryView, WorkflowInvocation
from flowstream.replay.decide import decide, engine_repair, is_suspended
from flowstream.replay.liveness import Condition, condition
from flowstream.replay.state import RunState
from flowstream.replay.task_failures import task_failure_error
from flowstream.runtime import FlowRuntime

__all__ = ["DECISION_EVENTS", "RunAudit", "audit_history"]

#: Event types only a workflow decision appends (engine repairs and host inputs excluded).
DECISION_EVENTS = frozenset(
    {
        "step_created",
        "step_started",
        "wait_created",
        "signal_wait_created",
        "hook_created",
        "child_workflow_requested",
        "run_completed",
        "run_failed",
        "run_cancelled",
        "run_timed_out",
        "run_continued_as_new",
        "run_progress_recorded",
    }
)


@dataclass(slots=True)
class RunAudit:
    """What the audit of one run found."""

    run_id: str
    events: int
    decisions_checked: int = 0
    problems: list[str] = field(default_factory=list)
    nondeterministic: bool = False
    skipped: str | None = None
    #: Some of its records could not be read (``problems`` names them): it was not replayed.
    corrupt: bool = False
    #: The run's liveness condition at the end of its history (``None`` when it is corrupt).
    condition: Condition | None = None

    @property
    def stalled(self) -> bool:
        """Nothing will move the run unless it is driven (the liveness invariant's violation)."""
        return self.condition is not None and self.condition.is_stalled

    @property
    def ok(self) -> bool:
        return not self.problems


def _same(replayed: Sequence[FlowEvent], recorded: Sequence[EventEnvelope]) -> bool:
    if len(recorded) < len(replayed):
        return False
    return all(
        json_equal(r.model_dump(mode="json"), e.event.model_dump(mode="json"))
        for r, e in zip(replayed, recorded, strict=False)
    )


async def audit_history(
    history: Sequence[EventEnvelope],
    runtime_for: Callable[[WorkflowSpec], FlowRuntime | None],
    *,
    now: datetime | None = None,
) -> RunAudit:
    """Validate ``history``, name its liveness condition at ``now`` (default: its last event's
    time) and replay each of its decisions with the runtime for its spec."""
    run_id = history[0].run_id if history else "<empty>"
    report = RunAudit(run_id, len(history))
    try:
        final = RunState.from_history(history)
    except CorruptHistoryError as exc:
        report.problems.append(str(exc))
        return report
    report.condition = condition(final, now or history[-1].timestamp)
    if report.condition.is_stalled:
        report.problems.append(report.condition.describe())
    state = RunState.first(history[0])
    runtime = runtime_for(state.spec)
    if runtime is None:
        build = state.spec.runtime_build_id or "<unpinned>"
        report.skipped = f"no runtime given serves workflow {state.spec.name} of build {build}"
        return report
    index = 1
    while index < len(history):
        envelope = history[index]
        advance = 1
        # A decision after a failed workflow task was its retry, however it came (so the
        # task's retry counts as due); a run_failed the task-retry policy wrote is the engine's.
        if (
            envelope.event.type in DECISION_EVENTS
            and not engine_repair(state)
            and not is_suspended(state, envelope.timestamp, retry_task=True)
            and not _ended_by_task_failures(state, envelope.event)
        ):
            advance = await _check_decision(report, state, history, index, runtime)
        for following in history[index : index + advance]:
            state.apply(following)
        index += advance
    return report


def _ended_by_task_failures(state: RunState, event: FlowEvent) -> bool:
    failure = state.task_failure
    return (
        isinstance(event, RunFailed)
        and failure is not None
        and failure.retry_at is None
        and event.error == task_failure_error(failure)
    )


async def _check_decision(
    report: RunAudit,
    state: RunState,
    history: Sequence[EventEnvelope],
    index: int,
    runtime: FlowRuntime,
) -> int:
    """Replay the decision recorded at ``history[index]``; returns how many events it spans."""
    envelope = history[index]
    invocation = WorkflowInvocation(
        state.run_id, state.spec, state.input, HistoryView(history, index), state
    )
    try:
        command = runtime.run_workflow(invocation)
        if inspect.isawaitable(command):
            command = await command
        if not isinstance(command, RuntimeCommand):
            raise FlowError(f"run_workflow returned {type(command).__name__}")
        decision = decide(state, command, envelope.timestamp)
    except NonDeterministicError as exc:
        report.nondeterministic = True
        report.problems.append(f"at sequence {envelope.sequence}: {exc.reason}")
        return 1
    except Exception as exc:  # workflow code or validation failed on a recorded history
        if envelope.event.type == "run_cancelled":
            return 1  # a forced cancellation: the host ended the run, not workflow code
        report.problems.append(
            f"at sequence {envelope.sequence}: replay raised {type(exc).__name__}: {exc}"
        )
        return 1
    report.decisions_checked += 1
    recorded = history[index : index + len(decision.events)]
    if decision.events and _same(decision.events, recorded):
        return len(decision.events)
    if envelope.event.type == "run_cancelled":
        return 1  # forced cancellation by the host
    report.nondeterministic = True
    history_side = [e.event.model_dump(mode="json") for e in recorded] or [
        envelope.event.model_dump(mode="json")
    ]
    replay_side = [e.model_dump(mode="json") for e in decision.events]
    report.problems.append(
        f"at sequence {envelope.sequence}: the decision differs: "
        f"history={canonical_json(history_side)}; replay={canonical_json(replay_side)}"
    )
    return 1

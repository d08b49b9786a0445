"""The liveness condition: what a run is doing, or that nothing will ever move it.

Invariant 7 of the design: every non-terminal run is always in one named condition. The
conditions, in the order ``condition`` tests them (the first that holds names the run):

1. ``TERMINAL``: the run has ended.
2. ``PARKED``: the host does not serve the run's runtime build; a host that does moves it.
3. ``FAILING``: its last workflow task failed; the retry is a durable deadline, or (automatic
   retries exhausted) it waits for an operator's ``drive`` after a fix.
4. ``NEEDS_DRIVE`` when the engine has events of its own to append before workflow code runs
   (the start, a failure settlement, a signal to pair with its wait): no input will come.
5. ``RUNNING_STEP``: a step attempt started and has no outcome yet; its handler reports it.
6. ``WAITING_DEADLINE``: a timer or a delayed step retry, kept in the wakeup index by due time.
7. ``WAITING_INPUT``: a signal wait, a hook or a blocking child.
8. ``NEEDS_DRIVE`` otherwise: only a decision moves the run, and nothing will ask for one. That
   is the invariant's violation (a crash between an input's event and the next decision leaves
   it), which the hosts' scans find and repair by driving the run.

The function is pure: a state, a moment and (optionally) which builds the host admits. A host
knows more than one state shows (that it is driving the run right now: ``DRIVING``; whether it
runs a step's handler, whether a child of another run has ended); the engine's ``Liveness``
part adds that.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from flowstream.model.snapshot import RunStatus, StepStatus
from flowstream.replay.decide import engine_repair, is_suspended
from flowstream.replay.state import RunState

__all__ = ["Condition", "ConditionKind", "condition", "stalled"]


class ConditionKind(StrEnum):
    TERMINAL = "terminal"
    PARKED = "parked"
    FAILING = "failing"
    RUNNING_STEP = "running_step"
    WAITING_DEADLINE = "waiting_deadline"
    WAITING_INPUT = "waiting_input"
    NEEDS_DRIVE = "needs_drive"
    #: A host is driving the run right now (only a host knows: ``condition`` never says it).
    DRIVING = "driving"


@dataclass(frozen=True, slots=True)
class Condition:
    """The named condition of one run, with the one line that says it."""

    kind: ConditionKind
    run_id: str
    text: str
    #: When it moves on by itself: the deadline waited for, or a failed task's retry.
    due: datetime | None = None
    #: The ids it waits on or runs (waits, hooks, children, steps).
    subjects: tuple[str, ...] = ()

    @property
    def is_stalled(self) -> bool:
        """Nothing will move the run unless it is driven."""
        return self.kind is ConditionKind.NEEDS_DRIVE

    def describe(self, *, drive_command: str = "flowstream drive") -> str:
        """The line; a host whose operators drive a run with another command names it."""
        return self.text.replace("`flowstream drive ", f"`{drive_command} ")


def stalled(run_id: str, reason: str = "nothing will move it") -> Condition:
    """The invariant's violation: ``reason`` says why, and the line says how to repair it."""
    return Condition(
        ConditionKind.NEEDS_DRIVE,
        run_id,
        f"stalled: {reason}; run `flowstream drive {run_id}`",
    )


def _stamp(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds")


def _listed(parts: list[str], limit: int = 3) -> str:
    shown = "; ".join(parts[:limit])
    return shown if len(parts) <= limit else f"{shown} and {len(parts) - limit} more"


def condition(
    state: RunState,
    now: datetime,
    *,
    admits: Callable[[str | None], bool] | None = None,
) -> Condition:
    """The condition of ``state`` at ``now``; ``admits`` says which runtime builds the asking
    host serves (``None``: do not check)."""
    run_id = state.run_id
    if state.is_terminal:
        text = state.status.value
        if state.error:
            text += f": {state.error}"
        return Condition(ConditionKind.TERMINAL, run_id, text)
    build = state.spec.runtime_build_id
    if admits is not None and not admits(build):
        return Condition(
            ConditionKind.PARKED,
            run_id,
            f"parked: runtime build {build or '<unpinned>'!r} is not served here",
        )
    failing = _failing(state)
    if failing is not None:
        return failing
    if engine_repair(state):
        return stalled(run_id, _repair_reason(state))
    running = sorted(s for s in state.active_steps if state.steps[s].status is StepStatus.RUNNING)
    if running:
        parts = [f"step {s} attempt {state.steps[s].attempt} running" for s in running]
        return Condition(
            ConditionKind.RUNNING_STEP, run_id, _listed(parts), subjects=tuple(running)
        )
    if not is_suspended(state, now) and not state.due_retries(now):
        return stalled(run_id)  # a decision is due (a step to start, say) and none comes
    deadlines = sorted(state.wakeups(), key=lambda w: (w.due, w.subject_id))
    if deadlines:
        parts = []
        for wakeup in deadlines:
            late = ", overdue" if wakeup.due <= now else ""
            if wakeup.kind == "wait":
                parts.append(
                    f"waiting for timer {wakeup.subject_id} (due {_stamp(wakeup.due)}{late})"
                )
            else:
                step = state.steps[wakeup.subject_id]
                parts.append(
                    f"waiting to retry step {wakeup.subject_id} after attempt {step.attempt} "
                    f"(retry at {_stamp(wakeup.due)}{late})"
                )
        return Condition(
            ConditionKind.WAITING_DEADLINE,
            run_id,
            _listed(parts),
            due=deadlines[0].due,
            subjects=tuple(w.subject_id for w in deadlines),
        )
    inputs = _inputs(state)
    if inputs:
        return Condition(
            ConditionKind.WAITING_INPUT,
            run_id,
            _listed([text for _, text in inputs]),
            subjects=tuple(subject for subject, _ in inputs),
        )
    return stalled(run_id)


def _failing(state: RunState) -> Condition | None:
    failure = state.task_failure
    if failure is None:
        return None
    error = f"{failure.error_type} {failure.message}".strip()
    retry_at = failure.retry_at
    if retry_at is None:
        when = f"automatic retries exhausted; fix it and run `flowstream drive {state.run_id}`"
    else:
        when = f"retry at {_stamp(retry_at)}"
    return Condition(
        ConditionKind.FAILING,
        state.run_id,
        f"failing: {error} (attempt {failure.attempt}, {when})",
        due=retry_at,
    )


def _repair_reason(state: RunState) -> str:
    if state.status is RunStatus.PENDING:
        return "created but not started"
    if state.fail_run_failure is not None:
        return f"step {state.fail_run_failure.step_id} failed the run, not yet settled"
    return "a received signal is not yet paired with its wait"


def _inputs(state: RunState) -> list[tuple[str, str]]:
    """What external input the run waits for: (subject id, text), in a stable order."""
    found: list[tuple[str, str]] = []
    for name in sorted(state.waiting_signal_waits):
        for wait_id in state.waiting_signal_waits[name]:
            found.append((wait_id, f"waiting for signal {name!r} (wait {wait_id})"))
    for hook_id in sorted(state.active_hooks):
        found.append((hook_id, f"waiting for hook {hook_id}"))
    for child_id in state.blocking_children:
        child = state.children[child_id]
        found.append((child_id, f"waiting for child {child_id} (run {child.run_id})"))
    return found

"""The event state machine: one transition per event type, and the table ``RunState.apply`` uses.

Each transition checks that its event may follow the state it is given, raising
``InvalidTransitionError`` otherwise, and then advances that state in place. Only
``RunState.apply`` calls them, after the checks every event shares (run, schema version, sequence,
not after a terminal event).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from flowstream.errors import InvalidTransitionError
from flowstream.model.events import (
    ChildCancellationPolicy,
    ChildWorkflowRequested,
    ChildWorkflowResolved,
    EventEnvelope,
    HookCreated,
    HookDisposed,
    HookReceived,
    RunCancellationRequested,
    RunCancelled,
    RunCompleted,
    RunContinuedAsNew,
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
    WorkflowTaskFailed,
)
from flowstream.model.snapshot import HookStatus, RunStatus, StepStatus, WaitStatus
from flowstream.model.spec import ExhaustedAction
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
)

if TYPE_CHECKING:
    from flowstream.replay.state import RunState

__all__ = ["TRANSITIONS", "reject"]


def reject(state: RunState, message: str) -> NoReturn:
    """Refuse an event that may not follow ``state``."""
    raise InvalidTransitionError(message, run_id=state.run_id)


def _require_started(state: RunState, what: str) -> None:
    if state.status is RunStatus.PENDING:
        reject(state, f"{what} before run_started")


# -- run lifecycle ---------------------------------------------------------------------------------


def _on_started(state: RunState, event: RunStarted, envelope: EventEnvelope) -> None:
    if state.status is not RunStatus.PENDING:
        reject(state, "run_started is only legal once, from pending")
    state.status = RunStatus.RUNNING


def _terminal(state: RunState, outcome: TerminalOutcome, status: RunStatus) -> None:
    _require_started(state, f"terminal event {outcome.type}")
    if outcome.type != "continued_as_new":
        blocking = [
            c
            for c in state.open_children
            if state.children[c].cancellation_policy is ChildCancellationPolicy.REQUEST_CANCELLATION
        ]
        if blocking:
            reject(state, f"cannot terminate while child workflow {blocking[0]} is open")
    state.outcome = outcome
    state.status = status


def _on_completed(state: RunState, event: RunCompleted, envelope: EventEnvelope) -> None:
    if state.status is RunStatus.CANCELLING:
        reject(state, "run_completed while cancelling; return cancel or fail")
    _terminal(state, TerminalOutcome(type="completed", output=event.output), RunStatus.COMPLETED)
    state.output = event.output


def _on_failed(state: RunState, event: RunFailed, envelope: EventEnvelope) -> None:
    _terminal(state, TerminalOutcome(type="failed", error=event.error), RunStatus.FAILED)
    state.error = event.error


def _on_cancellation_requested(
    state: RunState, event: RunCancellationRequested, envelope: EventEnvelope
) -> None:
    if state.cancellation is not None:
        reject(state, "run_cancellation_requested appears twice")
    state.cancellation = CancellationState(event.reason, envelope.timestamp, envelope.sequence)
    state.status = RunStatus.CANCELLING
    # Work that existed before the request becomes non-actionable.
    for step_id in list(state.active_steps):
        step = state.steps[step_id]
        step.status = StepStatus.CANCELLED
        step.retry_after = None
        step.error = "cancelled by run cancellation request"
    state.active_steps.clear()
    state.delayed_steps.clear()
    for wait_id in state.open_waits:
        state.waits[wait_id].status = WaitStatus.CANCELLED
    state.open_waits.clear()
    for hook_id in state.active_hooks:
        state.hooks[hook_id].status = HookStatus.CANCELLED
    state.active_hooks.clear()
    for queue in state.waiting_signal_waits.values():
        for wait_id in queue:
            state.signal_waits[wait_id].status = WaitStatus.CANCELLED
    state.waiting_signal_waits.clear()


def _on_cancelled(state: RunState, event: RunCancelled, envelope: EventEnvelope) -> None:
    if state.status is RunStatus.PENDING:  # cancelled before it ever started
        state.status = RunStatus.RUNNING
    _terminal(state, TerminalOutcome(type="cancelled", error=event.reason), RunStatus.CANCELLED)
    state.error = event.reason


def _on_timed_out(state: RunState, event: RunTimedOut, envelope: EventEnvelope) -> None:
    reason = event.reason or f"workflow timed out at {event.deadline.isoformat()}"
    _terminal(state, TerminalOutcome(type="timed_out", error=reason), RunStatus.FAILED)
    state.error = reason


def _on_retry_exhausted(state: RunState, event: RunRetryExhausted, envelope: EventEnvelope) -> None:
    step = state.steps.get(event.step_id)
    if (
        step is None
        or step.status is not StepStatus.FAILED
        or step.retry.on_exhausted is not ExhaustedAction.FAIL_RUN
        or step.attempt != event.attempt
        or step.error != event.error
    ):
        reject(state, f"run_retry_exhausted does not match a failed fail-run step {event.step_id}")
    _terminal(
        state,
        TerminalOutcome(type="retry_exhausted", error=event.error, step_id=event.step_id),
        RunStatus.FAILED,
    )
    state.error = event.error


def _on_continued(state: RunState, event: RunContinuedAsNew, envelope: EventEnvelope) -> None:
    if state.status is not RunStatus.RUNNING:
        reject(state, "run_continued_as_new is only legal while running")
    if state.open_children:
        reject(state, "cannot continue as new with an open child workflow")
    if any(state.waiting_signal_waits.values()):
        reject(state, "cannot continue as new with an open signal wait")
    if any(state.unconsumed_signals.values()):
        reject(state, "cannot continue as new with an unconsumed signal")
    _terminal(
        state,
        TerminalOutcome(type="continued_as_new", successor_run_id=event.successor_run_id),
        RunStatus.CONTINUED_AS_NEW,
    )
    state.continuation_input = event.input


def _on_progress(state: RunState, event: RunProgressRecorded, envelope: EventEnvelope) -> None:
    progress = event.progress
    if progress.progress_id in state.progress:
        reject(state, f"progress {progress.progress_id} recorded twice")
    if progress.total is not None and progress.completed > progress.total:
        reject(state, f"progress {progress.progress_id} has completed > total")
    state.progress[progress.progress_id] = progress


def _on_task_failed(state: RunState, event: WorkflowTaskFailed, envelope: EventEnvelope) -> None:
    _require_started(state, "workflow_task_failed")
    expected = 1 if state.task_failure is None else state.task_failure.attempt + 1
    if event.attempt != expected:
        reject(state, f"workflow_task_failed attempt {event.attempt} where {expected} is next")
    if event.undone_hook is not None:
        hook = state.hooks.get(event.undone_hook)
        if hook is None or hook.status is not HookStatus.ACTIVE:
            reject(state, f"workflow_task_failed undoes hook {event.undone_hook}, not active")
        del state.hooks[event.undone_hook]
        state.active_hooks.discard(event.undone_hook)
    state.task_failure = TaskFailure(event.attempt, event.error_type, event.message, event.retry_at)


# -- steps -----------------------------------------------------------------------------------------


def _step(state: RunState, step_id: str, what: str) -> StepState:
    step = state.steps.get(step_id)
    if step is None:
        reject(state, f"{what} for unknown step {step_id}")
    assert step is not None
    return step


def _running_step(state: RunState, step_id: str, attempt: int, what: str) -> StepState:
    step = _step(state, step_id, what)
    if step.status is not StepStatus.RUNNING or step.attempt != attempt:
        reject(
            state,
            f"{what} for step {step_id} attempt {attempt}, but the step is "
            f"{step.status.value} at attempt {step.attempt}",
        )
    return step


def _on_step_created(state: RunState, event: StepCreated, envelope: EventEnvelope) -> None:
    _require_started(state, "step_created")
    if event.step_id in state.steps:
        reject(state, f"step {event.step_id} created twice")
    state.steps[event.step_id] = StepState(event.step_id, event.step_name, event.input, event.retry)
    state.active_steps.add(event.step_id)


def _on_step_started(state: RunState, event: StepStarted, envelope: EventEnvelope) -> None:
    step = _step(state, event.step_id, "step_started")
    if step.status is not StepStatus.PENDING or event.attempt != step.attempt + 1:
        reject(
            state,
            f"step_started attempt {event.attempt} for step {event.step_id} that is "
            f"{step.status.value} at attempt {step.attempt}",
        )
    if event.attempt > step.retry.max_attempts:
        reject(state, f"step {event.step_id} started beyond its retry budget")
    step.status = StepStatus.RUNNING
    step.attempt = event.attempt
    step.retry_after = None
    state.delayed_steps.discard(event.step_id)


def _on_step_completed(state: RunState, event: StepCompleted, envelope: EventEnvelope) -> None:
    step = _step(state, event.step_id, "step_completed")
    if step.status is not StepStatus.RUNNING:
        reject(state, f"step_completed for step {event.step_id} that is {step.status.value}")
    step.status = StepStatus.COMPLETED
    step.output = event.output
    step.error = None
    state.active_steps.discard(event.step_id)


def _on_step_retrying(state: RunState, event: StepRetrying, envelope: EventEnvelope) -> None:
    step = _running_step(state, event.step_id, event.attempt, "step_retrying")
    if event.attempt >= step.retry.max_attempts:
        reject(state, f"step_retrying for step {event.step_id} beyond its retry budget")
    delayed = step.retry.delay_ms > 0
    if delayed and event.retry_after is None:
        reject(state, f"delayed retry of step {event.step_id} without retry_after")
    if not delayed and event.retry_after is not None:
        reject(state, f"immediate retry of step {event.step_id} with retry_after")
    step.status = StepStatus.PENDING
    step.error = event.error
    step.retry_after = event.retry_after
    if event.retry_after is not None:
        state.delayed_steps.add(event.step_id)


def _on_step_failed(state: RunState, event: StepFailed, envelope: EventEnvelope) -> None:
    step = _running_step(state, event.step_id, event.attempt, "step_failed")
    if event.attempt < step.retry.max_attempts:
        reject(state, f"step_failed for step {event.step_id} before its budget is exhausted")
    _fail_step(state, step, event.error, exhausted=True)


def _on_step_non_retryable(
    state: RunState, event: StepNonRetryable, envelope: EventEnvelope
) -> None:
    step = _running_step(state, event.step_id, event.attempt, "step_non_retryable")
    _fail_step(state, step, event.error, exhausted=False)


def _fail_step(state: RunState, step: StepState, error: str, *, exhausted: bool) -> None:
    step.status = StepStatus.FAILED
    step.error = error
    state.active_steps.discard(step.step_id)
    if step.retry.on_exhausted is ExhaustedAction.FAIL_RUN and state.fail_run_failure is None:
        state.fail_run_failure = FailRunFailure(step.step_id, step.attempt, error, exhausted)


def _on_step_cancelled(state: RunState, event: StepCancelled, envelope: EventEnvelope) -> None:
    step = _step(state, event.step_id, "step_cancelled")
    if step.status not in (StepStatus.PENDING, StepStatus.RUNNING):
        reject(state, f"step_cancelled for step {event.step_id} that is {step.status.value}")
    step.status = StepStatus.CANCELLED
    step.error = event.reason
    step.retry_after = None
    state.active_steps.discard(event.step_id)
    state.delayed_steps.discard(event.step_id)


# -- timers ----------------------------------------------------------------------------------------


def _on_wait_created(state: RunState, event: WaitCreated, envelope: EventEnvelope) -> None:
    _require_started(state, "wait_created")
    if event.wait_id in state.waits:
        reject(state, f"wait {event.wait_id} created twice")
    state.waits[event.wait_id] = WaitState(event.wait_id, event.resume_at)
    state.open_waits.add(event.wait_id)


def _on_wait_completed(state: RunState, event: WaitCompleted, envelope: EventEnvelope) -> None:
    wait = state.waits.get(event.wait_id)
    if wait is None or wait.status is not WaitStatus.WAITING:
        reject(state, f"wait_completed for wait {event.wait_id} that is not waiting")
    assert wait is not None
    wait.status = WaitStatus.COMPLETED
    state.open_waits.discard(event.wait_id)


# -- signals ---------------------------------------------------------------------------------------


def _on_signal_received(state: RunState, event: SignalReceived, envelope: EventEnvelope) -> None:
    if event.signal_id in state.signals:
        reject(state, f"signal {event.signal_id} received twice")
    if event.name not in state.spec.signal_names:
        reject(state, f"signal name {event.name!r} is not declared by the workflow spec")
    state.signals[event.signal_id] = SignalState(
        event.signal_id, event.name, event.payload, envelope.sequence
    )
    state.unconsumed_signals.setdefault(event.name, deque()).append(event.signal_id)


def _on_signal_wait_created(
    state: RunState, event: SignalWaitCreated, envelope: EventEnvelope
) -> None:
    _require_started(state, "signal_wait_created")
    if event.wait_id in state.signal_waits:
        reject(state, f"signal wait {event.wait_id} created twice")
    if event.signal_name not in state.spec.signal_names:
        reject(state, f"signal name {event.signal_name!r} is not declared by the workflow spec")
    state.signal_waits[event.wait_id] = SignalWaitState(
        event.wait_id, event.signal_name, envelope.sequence
    )
    state.waiting_signal_waits.setdefault(event.signal_name, deque()).append(event.wait_id)


def _on_signal_wait_completed(
    state: RunState, event: SignalWaitCompleted, envelope: EventEnvelope
) -> None:
    wait = state.signal_waits.get(event.wait_id)
    signal = state.signals.get(event.signal_id)
    if wait is None or signal is None or wait.status is not WaitStatus.WAITING:
        reject(state, f"signal_wait_completed pairs unknown or closed wait {event.wait_id}")
    assert wait is not None and signal is not None
    waits = state.waiting_signal_waits.get(wait.signal_name)
    signals = state.unconsumed_signals.get(signal.name)
    if (
        signal.name != wait.signal_name
        or not waits
        or not signals
        or waits[0] != event.wait_id
        or signals[0] != event.signal_id
    ):
        reject(
            state,
            f"signal wait {event.wait_id} must pair, in FIFO order, the oldest waiting wait "
            "with the oldest unconsumed signal of the same name",
        )
    assert waits is not None and signals is not None
    waits.popleft()
    signals.popleft()
    wait.status = WaitStatus.COMPLETED
    wait.signal_id = event.signal_id
    signal.consumed_by = event.wait_id


# -- hooks -----------------------------------------------------------------------------------------


def _on_hook_created(state: RunState, event: HookCreated, envelope: EventEnvelope) -> None:
    _require_started(state, "hook_created")
    if event.hook_id in state.hooks:
        reject(state, f"hook {event.hook_id} created twice")
    state.hooks[event.hook_id] = HookState(
        event.hook_id, event.token_digest, event.metadata, sequence=envelope.sequence
    )
    state.active_hooks.add(event.hook_id)


def _on_hook_received(state: RunState, event: HookReceived, envelope: EventEnvelope) -> None:
    hook = state.hooks.get(event.hook_id)
    if hook is None or hook.status is not HookStatus.ACTIVE:
        reject(state, f"hook_received for hook {event.hook_id} that is not active")
    assert hook is not None
    hook.status = HookStatus.RECEIVED
    hook.payload = event.payload
    hook.received = True
    state.active_hooks.discard(event.hook_id)


def _on_hook_disposed(state: RunState, event: HookDisposed, envelope: EventEnvelope) -> None:
    hook = state.hooks.get(event.hook_id)
    if hook is None or hook.status not in (HookStatus.ACTIVE, HookStatus.RECEIVED):
        reject(state, f"hook_disposed for hook {event.hook_id} that is not active or received")
    assert hook is not None
    hook.status = HookStatus.DISPOSED
    state.active_hooks.discard(event.hook_id)


# -- children --------------------------------------------------------------------------------------


def _on_child_requested(
    state: RunState, event: ChildWorkflowRequested, envelope: EventEnvelope
) -> None:
    _require_started(state, "child_workflow_requested")
    if event.child_id in state.children:
        reject(state, f"child workflow {event.child_id} requested twice")
    state.children[event.child_id] = ChildState(
        event.child_id,
        event.child_run_id,
        event.spec,
        event.input,
        event.cancellation_policy,
        envelope.sequence,
    )
    state.open_children.add(event.child_id)


def _on_child_resolved(
    state: RunState, event: ChildWorkflowResolved, envelope: EventEnvelope
) -> None:
    child = state.children.get(event.child_id)
    if child is None or child.outcome is not None:
        reject(state, f"child_workflow_resolved for child {event.child_id} that is not open")
    if event.outcome.type == "continued_as_new":
        reject(state, "a child resolves to the outcome of the last run of its chain")
    assert child is not None
    child.outcome = event.outcome
    state.open_children.discard(event.child_id)


TRANSITIONS: dict[type[Any], Callable[[RunState, Any, EventEnvelope], None]] = {
    RunStarted: _on_started,
    RunCompleted: _on_completed,
    RunFailed: _on_failed,
    RunCancellationRequested: _on_cancellation_requested,
    RunCancelled: _on_cancelled,
    RunTimedOut: _on_timed_out,
    RunRetryExhausted: _on_retry_exhausted,
    RunContinuedAsNew: _on_continued,
    RunProgressRecorded: _on_progress,
    WorkflowTaskFailed: _on_task_failed,
    StepCreated: _on_step_created,
    StepStarted: _on_step_started,
    StepCompleted: _on_step_completed,
    StepRetrying: _on_step_retrying,
    StepFailed: _on_step_failed,
    StepNonRetryable: _on_step_non_retryable,
    StepCancelled: _on_step_cancelled,
    WaitCreated: _on_wait_created,
    WaitCompleted: _on_wait_completed,
    SignalReceived: _on_signal_received,
    SignalWaitCreated: _on_signal_wait_created,
    SignalWaitCompleted: _on_signal_wait_completed,
    HookCreated: _on_hook_created,
    HookReceived: _on_hook_received,
    HookDisposed: _on_hook_disposed,
    ChildWorkflowRequested: _on_child_requested,
    ChildWorkflowResolved: _on_child_resolved,
}

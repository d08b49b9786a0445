"""The pure decision core: (run state, command, now) → events to append and steps to run.

Nothing here touches a store, a clock or the network; the embedded engine, the Kafka processor
and the audit tool all call these functions, so the same history always yields the same decision.

Rules enforced (each raises before anything is appended):

1. An identity that reappears must carry the same definition, else ``NonDeterministicError`` with
   ``history=…; replay=…`` (hook tokens are compared as digests and never printed).
2. A command that cannot make progress (a terminal step, an all-terminal batch, a completed wait,
   a resolved child…) is an ``InvalidTransitionError``, never a spin.
3. Batches validate the whole identity set before any member advances.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from flowstream.errors import InvalidTransitionError, NonDeterministicError
from flowstream.model.base import JSON, canonical_json, json_equal, validate_identifier
from flowstream.model.commands import (
    MAX_BATCH_SIZE,
    CancelCommand,
    ChildWorkflowCommand,
    CompleteCommand,
    ContinueAsNewCommand,
    CreateHookCommand,
    FailCommand,
    RecordProgressCommand,
    RuntimeCommand,
    ScheduleStepCommand,
    ScheduleStepsCommand,
    StartChildWorkflowCommand,
    StartChildWorkflowsCommand,
    StepCommand,
    TimeoutCommand,
    WaitForSignalCommand,
    WaitUntilCommand,
)
from flowstream.model.events import (
    ChildWorkflowRequested,
    FlowEvent,
    HookCreated,
    RunCancelled,
    RunCompleted,
    RunContinuedAsNew,
    RunFailed,
    RunProgressRecorded,
    RunRetryExhausted,
    RunStarted,
    RunTimedOut,
    SignalWaitCompleted,
    SignalWaitCreated,
    StepCancelled,
    StepCompleted,
    StepCreated,
    StepFailed,
    StepNonRetryable,
    StepRetrying,
    StepStarted,
    WaitCreated,
)
from flowstream.model.snapshot import HookStatus, RunStatus, StepStatus, WaitStatus
from flowstream.replay.state import RunState
from flowstream.replay.task_failures import task_retry_pending

__all__ = [
    "BATCH_ABORT_REASON",
    "Decision",
    "decide",
    "derived_run_id",
    "engine_repair",
    "is_suspended",
    "step_outcome_events",
    "token_digest",
]

BATCH_ABORT_REASON = "concurrent batch aborted after sibling failure {}; step outcome is unknown"
_RUN_NAMESPACE = uuid.UUID("0b9e4a4e-8c1f-5d0a-a7f3-2c6d91e8b5f4")


@dataclass(slots=True)
class Decision:
    """Events to append at the run's last sequence, then steps to execute (by id)."""

    events: list[FlowEvent] = field(default_factory=list)
    run_steps: list[str] = field(default_factory=list)
    suspend: bool = False


def token_digest(token: str) -> str:
    """The SHA-256 hex digest under which a hook token is stored and indexed."""
    return hashlib.sha256(token.encode()).hexdigest()


def derived_run_id(run_id: str, kind: str, key: str) -> str:
    """Deterministic id for a child or successor run (never random: replays agree)."""
    return uuid.uuid5(_RUN_NAMESPACE, f"{kind}/{len(run_id)}/{run_id}/{key}").hex


def _differs(state: RunState, what: str, history: object, replay: object) -> NonDeterministicError:
    return NonDeterministicError(
        state.run_id,
        f"{what} differs: history={canonical_json(history)}; replay={canonical_json(replay)}",
    )


def _no_progress(state: RunState, message: str) -> InvalidTransitionError:
    return InvalidTransitionError(message, run_id=state.run_id)


# -- engine-owned events, before workflow code runs --------------------------------------------


def engine_repair(state: RunState) -> list[FlowEvent]:
    """Events the engine appends before asking workflow code: start, failure settlement, pairing.

    A fail-run step failure (retry exhausted or non-retryable) settles every unsettled step with
    a ``step_cancelled`` marker and then ends the run, in one atomic append; a history where that
    settlement was interrupted is finished here before any workflow code runs.
    """
    if state.is_terminal:
        return []
    if state.status is RunStatus.PENDING:
        return [RunStarted()]
    failure = state.fail_run_failure
    if failure is not None:
        events: list[FlowEvent] = []
        reason = BATCH_ABORT_REASON.format(failure.step_id)
        for step_id in sorted(state.active_steps):
            step = state.steps[step_id]
            events.append(StepCancelled(step_id=step_id, attempt=step.attempt, reason=reason))
        if failure.exhausted:
            events.append(
                RunRetryExhausted(
                    step_id=failure.step_id, attempt=failure.attempt, error=failure.error
                )
            )
        else:
            events.append(RunFailed(error=f"step {failure.step_id} failed: {failure.error}"))
        return events
    pairs: list[FlowEvent] = []
    for name, waits in state.waiting_signal_waits.items():
        signals = state.unconsumed_signals.get(name)
        if waits and signals:
            for wait_id, signal_id in zip(waits, signals, strict=False):
                pairs.append(SignalWaitCompleted(wait_id=wait_id, signal_id=signal_id))
    return pairs


def is_suspended(state: RunState, now: datetime, *, retry_task: bool = False) -> bool:
    """Whether the run waits on durable external state, so workflow code must not run.

    A failed workflow task whose retry is not due suspends the run too, unless ``retry_task``
    (an operator retry, or a host that knows the task was retried).
    """
    if state.open_waits or state.active_hooks or state.blocking_children:
        return True
    if any(state.waiting_signal_waits.values()):
        return True
    # Only future retries hold the run: a sibling that may run now (an immediate retry, a due
    # retry, an attempt to redeliver) is not blocked by one that must wait.
    held = state.delayed_steps and not state.due_retries(now)
    if held and state.active_steps <= state.delayed_steps:
        return True
    return not retry_task and task_retry_pending(state, now)


# -- step outcomes ------------------------------------------------------------------------------


def step_outcome_events(
    state: RunState,
    step_id: str,
    attempt: int,
    *,
    output: JSON = None,
    error: str | None = None,
    retryable: bool = True,
    now: datetime,
) -> list[FlowEvent]:
    """The event that records one attempt's outcome; empty when the attempt is stale.

    A stale outcome (the step was cancelled, or another owner already recorded it) is dropped:
    the history is the authority, not the process that ran the handler.
    """
    if not state.attempt_running(step_id, attempt):
        return []
    step = state.steps[step_id]
    if error is None:
        return [StepCompleted(step_id=step_id, output=output)]
    if not retryable:
        return [StepNonRetryable(step_id=step_id, attempt=attempt, error=error)]
    if attempt >= step.retry.max_attempts:
        return [StepFailed(step_id=step_id, attempt=attempt, error=error)]
    delay = step.retry.delay_for(state.run_id, step_id, attempt)
    retry_after = now + timedelta(milliseconds=delay) if delay > 0 else None
    return [StepRetrying(step_id=step_id, attempt=attempt, error=error, retry_after=retry_after)]


# -- workflow commands --------------------------------------------------------------------------


def decide(state: RunState, command: RuntimeCommand, now: datetime) -> Decision:
    """Validate the one command workflow code returned and turn it into a decision."""
    match command:
        case ScheduleStepCommand(step=step):
            return _schedule(state, (step,), now, batch=False)
        case ScheduleStepsCommand(steps=steps):
            return _schedule(state, steps, now, batch=True)
        case CompleteCommand(output=output):
            if state.status is RunStatus.CANCELLING:
                raise _no_progress(
                    state, "returned complete while cancelling; return cancel or fail"
                )
            return Decision([RunCompleted(output=output)])
        case FailCommand(error=error):
            return Decision([RunFailed(error=error)])
        case CancelCommand():
            if state.cancellation is None:
                raise _no_progress(state, "returned cancel without a durable cancellation request")
            return Decision([RunCancelled(reason=state.cancellation.reason)])
        case TimeoutCommand(deadline=deadline, reason=reason):
            return Decision([RunTimedOut(deadline=deadline, reason=reason)])
        case RecordProgressCommand(progress=progress):
            existing = state.progress.get(progress.progress_id)
            if existing is None:
                return Decision([RunProgressRecorded(progress=progress)])
            if existing == progress:
                raise _no_progress(
                    state, f"rescheduled progress {progress.progress_id} without progress"
                )
            raise _differs(
                state,
                f"progress {progress.progress_id}",
                existing.model_dump(mode="json"),
                progress.model_dump(mode="json"),
            )
        case ContinueAsNewCommand(input=new_input):
            return _continue(state, new_input)
        case WaitUntilCommand(wait_id=wait_id, resume_at=resume_at):
            return _wait_until(state, wait_id, resume_at)
        case WaitForSignalCommand(wait_id=wait_id, signal_name=name):
            return _wait_for_signal(state, wait_id, name)
        case CreateHookCommand():
            return _create_hook(state, command)
        case StartChildWorkflowCommand(child=child):
            return _children(state, (child,))
        case StartChildWorkflowsCommand(children=children):
            return _children(state, children)
    raise InvalidTransitionError(
        f"unsupported command {type(command).__name__}", run_id=state.run_id
    )


def _check_step(state: RunState, command: StepCommand) -> None:
    step = state.steps.get(command.step_id)
    if step is None:
        return
    if step.step_name != command.step_name:
        raise _differs(state, f"step {command.step_id} name", step.step_name, command.step_name)
    if not json_equal(step.input, command.input):
        raise _differs(state, f"step {command.step_id} input", step.input, command.input)
    if step.retry != command.retry:
        raise _differs(
            state,
            f"step {command.step_id} retry policy",
            step.retry.model_dump(mode="json"),
            command.retry.model_dump(mode="json"),
        )


def _check_retry_deadline(state: RunState, command: StepCommand, now: datetime) -> None:
    """A delayed retry's deadline must be representable, checked before the step exists."""
    retry = command.retry
    longest = retry.max_delay_ms if retry.backoff.value == "exponential" else retry.delay_ms
    try:
        now + timedelta(milliseconds=longest)
    except OverflowError:
        raise _no_progress(
            state, f"retry delay {longest}ms cannot be represented as a UTC deadline"
        ) from None


def _schedule(
    state: RunState, commands: Sequence[StepCommand], now: datetime, *, batch: bool
) -> Decision:
    if not commands:
        raise _no_progress(state, "schedule_steps needs at least one step")
    if len(commands) > MAX_BATCH_SIZE:
        raise _no_progress(state, f"schedule_steps accepts at most {MAX_BATCH_SIZE} steps")
    ids = [validate_identifier("step", c.step_id) for c in commands]
    if len(set(ids)) != len(ids):
        raise _no_progress(state, "schedule_steps needs unique step ids")
    for command in commands:
        _check_step(state, command)
        if command.step_id not in state.steps:
            _check_retry_deadline(state, command, now)

    terminal = (StepStatus.COMPLETED, StepStatus.FAILED, StepStatus.CANCELLED)
    existing = [state.steps.get(i) for i in ids]
    if all(s is not None and s.status in terminal for s in existing):
        if not batch:
            step = existing[0]
            assert step is not None
            if step.status is StepStatus.CANCELLED:
                raise _no_progress(
                    state,
                    f"rescheduled cancelled step {step.step_id}; cancellation cleanup must use "
                    "a distinct stable identity",
                )
            raise _no_progress(state, f"rescheduled terminal step {step.step_id} without progress")
        raise _no_progress(state, "rescheduled only terminal steps without progress")

    decision = Decision()
    for command in commands:
        if command.step_id not in state.steps:
            decision.events.append(
                StepCreated(
                    step_id=command.step_id,
                    step_name=command.step_name,
                    input=command.input,
                    retry=command.retry,
                )
            )
    for command, step in zip(commands, existing, strict=True):
        if step is None:
            decision.events.append(StepStarted(step_id=command.step_id, attempt=1))
            decision.run_steps.append(command.step_id)
        elif step.status is StepStatus.RUNNING:
            decision.run_steps.append(command.step_id)
        elif step.status is StepStatus.PENDING:
            if step.retry_after is not None and step.retry_after > now:
                continue
            decision.events.append(StepStarted(step_id=command.step_id, attempt=step.attempt + 1))
            decision.run_steps.append(command.step_id)
    if not decision.events and not decision.run_steps:
        decision.suspend = True
    return decision


def _continue(state: RunState, new_input: JSON) -> Decision:
    if state.status is RunStatus.CANCELLING:
        raise _no_progress(state, "cannot continue as new while cancelling")
    if state.open_children:
        raise _no_progress(state, "cannot continue as new while a child workflow is open")
    if any(state.waiting_signal_waits.values()) or any(state.unconsumed_signals.values()):
        raise _no_progress(
            state, "cannot continue as new with an open signal wait or an unconsumed signal"
        )
    successor = derived_run_id(state.run_id, "continue", str(state.last_sequence))
    return Decision([RunContinuedAsNew(successor_run_id=successor, input=new_input)])


def _wait_until(state: RunState, wait_id: str, resume_at: datetime) -> Decision:
    validate_identifier("wait", wait_id)
    if resume_at.tzinfo is None:
        raise _no_progress(state, f"wait {wait_id} needs a timezone-aware UTC deadline")
    wait = state.waits.get(wait_id)
    if wait is None:
        return Decision([WaitCreated(wait_id=wait_id, resume_at=resume_at)], suspend=True)
    if wait.resume_at != resume_at:
        raise _differs(
            state, f"wait {wait_id} resume_at", wait.resume_at.isoformat(), resume_at.isoformat()
        )
    if wait.status is WaitStatus.WAITING:
        return Decision(suspend=True)
    if wait.status is WaitStatus.CANCELLED:
        raise _no_progress(
            state,
            f"rescheduled cancelled wait {wait_id}; use a distinct stable identity for cleanup",
        )
    raise _no_progress(state, f"rescheduled completed wait {wait_id} without progress")


def _wait_for_signal(state: RunState, wait_id: str, name: str) -> Decision:
    validate_identifier("signal wait", wait_id)
    if name not in state.spec.signal_names:
        raise _no_progress(state, f"signal name {name!r} is not declared by the workflow spec")
    wait = state.signal_waits.get(wait_id)
    if wait is None:
        return Decision([SignalWaitCreated(wait_id=wait_id, signal_name=name)])
    if wait.signal_name != name:
        raise _differs(state, f"signal wait {wait_id} name", wait.signal_name, name)
    if wait.status is WaitStatus.WAITING:
        return Decision(suspend=True)
    if wait.status is WaitStatus.CANCELLED:
        raise _no_progress(
            state,
            f"rescheduled cancelled signal wait {wait_id}; use a distinct stable identity",
        )
    raise _no_progress(state, f"rescheduled completed signal wait {wait_id} without progress")


def _create_hook(state: RunState, command: CreateHookCommand) -> Decision:
    hook_id = validate_identifier("hook", command.hook_id)
    if command.token is not None:
        digest = token_digest(command.token.get_secret_value())
    else:
        assert command.token_digest is not None
        digest = command.token_digest
    hook = state.hooks.get(hook_id)
    if hook is None:
        return Decision(
            [HookCreated(hook_id=hook_id, token_digest=digest, metadata=command.metadata)],
            suspend=True,
        )
    if not hmac.compare_digest(hook.token_digest, digest):
        raise NonDeterministicError(
            state.run_id,
            f"hook {hook_id} token differs: history token and replay token are different "
            "(values redacted)",
        )
    if not json_equal(hook.metadata, command.metadata):
        raise _differs(state, f"hook {hook_id} metadata", hook.metadata, command.metadata)
    if hook.status is HookStatus.ACTIVE:
        return Decision(suspend=True)
    if hook.status is HookStatus.CANCELLED:
        raise _no_progress(
            state, f"rescheduled cancelled hook {hook_id}; use a distinct stable identity"
        )
    raise _no_progress(state, f"rescheduled {hook.status.value} hook {hook_id} without progress")


def _children(state: RunState, children: Sequence[ChildWorkflowCommand]) -> Decision:
    if not children:
        raise _no_progress(state, "start_child_workflows needs at least one child")
    if len(children) > MAX_BATCH_SIZE:
        raise _no_progress(state, f"start_child_workflows accepts at most {MAX_BATCH_SIZE}")
    ids = [validate_identifier("child workflow", c.child_id) for c in children]
    if len(set(ids)) != len(ids):
        raise _no_progress(state, "start_child_workflows needs unique child ids")
    known = [c for c in children if c.child_id in state.children]
    missing = [c for c in children if c.child_id not in state.children]
    # New children are requested after every known one, so the batch must already list them in
    # that order: known children first, in request order, then the new ones. Any other order
    # would be accepted now and refused by the next replay, after the new children ran.
    durable_order = sorted(
        (c.child_id for c in known), key=lambda i: state.children[i].requested_sequence
    )
    if ids != durable_order + [c.child_id for c in missing]:
        raise NonDeterministicError(
            state.run_id,
            "child workflow batch order differs: history="
            f"{canonical_json(durable_order)} (new children follow); replay={canonical_json(ids)}",
        )
    for child in known:
        durable = state.children[child.child_id]
        if (
            durable.spec != child.spec
            or not json_equal(durable.input, child.input)
            or durable.cancellation_policy != child.cancellation_policy
        ):
            raise _differs(
                state,
                f"child workflow {child.child_id}",
                {
                    "spec": durable.spec.model_dump(mode="json"),
                    "input": durable.input,
                    "cancellation_policy": durable.cancellation_policy.value,
                },
                {
                    "spec": child.spec.model_dump(mode="json"),
                    "input": child.input,
                    "cancellation_policy": child.cancellation_policy.value,
                },
            )
    if not missing and all(state.children[i].outcome is not None for i in ids):
        raise _no_progress(state, "rescheduled only resolved child workflows without progress")
    events: list[FlowEvent] = [
        ChildWorkflowRequested(
            child_id=c.child_id,
            child_run_id=derived_run_id(state.run_id, "child", c.child_id),
            spec=c.spec,
            input=c.input,
            cancellation_policy=c.cancellation_policy,
        )
        for c in missing
    ]
    return Decision(events, suspend=not events)

"""``condition``: every non-terminal run is in one named condition, and the line that says it;
a run nothing will move is ``NEEDS_DRIVE`` (the liveness invariant's violation)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from flowstream.model.events import (
    ChildWorkflowRequested,
    FlowEvent,
    HookCreated,
    HookReceived,
    RunCompleted,
    RunCreated,
    RunFailed,
    RunStarted,
    SignalReceived,
    SignalWaitCreated,
    StepCompleted,
    StepCreated,
    StepRetrying,
    StepStarted,
    WaitCompleted,
    WaitCreated,
    WorkflowTaskFailed,
)
from flowstream.model.spec import RetryPolicy
from flowstream.replay.decide import engine_repair, is_suspended, token_digest
from flowstream.replay.liveness import ConditionKind, condition
from flowstream.replay.state import RunState
from tests.support import EPOCH, envelope, spec

SPEC = spec("liveness", signal_names=("approve",))
PINNED = spec("liveness", runtime_build_id="b2")
DUE = EPOCH + timedelta(minutes=5)


def state_of(*events: FlowEvent, started: bool = True, workflow: object = SPEC) -> RunState:
    head: list[FlowEvent] = [RunCreated(spec=workflow)]  # type: ignore[arg-type]
    if started:
        head.append(RunStarted())
    return RunState.from_history(
        envelope("r1", i, e) for i, e in enumerate([*head, *events], start=1)
    )


STEP = StepCreated(step_id="charge", step_name="charge", retry=RetryPolicy.fixed(3, 60_000))

CASES: dict[str, tuple[tuple[FlowEvent, ...], ConditionKind, str]] = {
    "a timer": (
        (WaitCreated(wait_id="t1", resume_at=DUE),),
        ConditionKind.WAITING_DEADLINE,
        "waiting for timer t1 (due 2026-01-01T00:05:00+00:00)",
    ),
    "a delayed retry": (
        (
            STEP,
            StepStarted(step_id="charge", attempt=1),
            StepRetrying(step_id="charge", attempt=1, error="boom", retry_after=DUE),
        ),
        ConditionKind.WAITING_DEADLINE,
        "waiting to retry step charge after attempt 1 (retry at 2026-01-01T00:05:00+00:00)",
    ),
    "a signal wait": (
        (SignalWaitCreated(wait_id="w1", signal_name="approve"),),
        ConditionKind.WAITING_INPUT,
        "waiting for signal 'approve' (wait w1)",
    ),
    "a hook": (
        (HookCreated(hook_id="h1", token_digest=token_digest("t")),),
        ConditionKind.WAITING_INPUT,
        "waiting for hook h1",
    ),
    "a child": (
        (ChildWorkflowRequested(child_id="c1", child_run_id="kid", spec=spec("kid")),),
        ConditionKind.WAITING_INPUT,
        "waiting for child c1 (run kid)",
    ),
    "a running step": (
        (STEP, StepStarted(step_id="charge", attempt=1)),
        ConditionKind.RUNNING_STEP,
        "step charge attempt 1 running",
    ),
    "a completed timer": (
        (WaitCreated(wait_id="t1", resume_at=DUE), WaitCompleted(wait_id="t1")),
        ConditionKind.NEEDS_DRIVE,
        "stalled: nothing will move it; run `flowstream drive r1`",
    ),
    "a received hook": (
        (
            HookCreated(hook_id="h1", token_digest=token_digest("t")),
            HookReceived(hook_id="h1", payload=1),
        ),
        ConditionKind.NEEDS_DRIVE,
        "stalled: nothing will move it; run `flowstream drive r1`",
    ),
    "an unpaired signal": (
        (
            SignalWaitCreated(wait_id="w1", signal_name="approve"),
            SignalReceived(signal_id="s1", name="approve"),
        ),
        ConditionKind.NEEDS_DRIVE,
        "stalled: a received signal is not yet paired with its wait; run `flowstream drive r1`",
    ),
    "a completed step": (
        (STEP, StepStarted(step_id="charge", attempt=1), StepCompleted(step_id="charge")),
        ConditionKind.NEEDS_DRIVE,
        "stalled: nothing will move it; run `flowstream drive r1`",
    ),
    "a completed run": ((RunCompleted(output=1),), ConditionKind.TERMINAL, "completed"),
    "a failed run": ((RunFailed(error="no stock"),), ConditionKind.TERMINAL, "failed: no stock"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_run_is_in_one_named_condition(case: str) -> None:
    events, kind, text = CASES[case]
    found = condition(state_of(*events), EPOCH)
    assert found.kind is kind
    assert found.describe() == text
    assert found.is_stalled is (kind is ConditionKind.NEEDS_DRIVE)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_stalled_run_is_exactly_a_live_one_that_waits_on_nothing_or_on_the_engine(
    case: str,
) -> None:
    state = state_of(*CASES[case][0])
    running = any(s.status.value == "running" for s in state.steps.values())
    waits = is_suspended(state, EPOCH) and not engine_repair(state)
    expected = not state.is_terminal and not running and not waits
    assert condition(state, EPOCH).is_stalled is expected


def test_a_created_run_that_never_started_is_stalled() -> None:
    found = condition(state_of(started=False), EPOCH)
    assert found.describe() == "stalled: created but not started; run `flowstream drive r1`"


def test_a_deadline_names_its_due_time_and_subject_and_whether_it_is_overdue() -> None:
    state = state_of(WaitCreated(wait_id="t1", resume_at=DUE))
    found = condition(state, EPOCH)
    assert found.due == DUE
    assert found.subjects == ("t1",)
    late = condition(state, DUE)
    assert late.describe() == "waiting for timer t1 (due 2026-01-01T00:05:00+00:00, overdue)"


def test_a_run_whose_build_is_not_admitted_is_parked() -> None:
    found = condition(state_of(workflow=PINNED), EPOCH, admits=lambda build: build == "b1")
    assert found.kind is ConditionKind.PARKED
    assert found.describe() == "parked: runtime build 'b2' is not served here"
    assert condition(state_of(workflow=PINNED), EPOCH, admits=lambda b: True).is_stalled


@pytest.mark.parametrize(
    ("retry_at", "tail"),
    [
        (DUE, "retry at 2026-01-01T00:05:00+00:00)"),
        (None, "automatic retries exhausted; fix it and run `flowstream drive r1`)"),
    ],
)
def test_a_failing_workflow_task_says_its_error_and_next_retry(
    retry_at: datetime | None, tail: str
) -> None:
    failed = WorkflowTaskFailed(attempt=1, error_type="KeyError", message="'x'", retry_at=retry_at)
    found = condition(state_of(failed), EPOCH)
    assert found.kind is ConditionKind.FAILING
    assert found.describe() == f"failing: KeyError 'x' (attempt 1, {tail}"
    assert found.due == retry_at


def test_a_step_to_start_beside_a_delayed_retry_is_stalled_until_a_decision() -> None:
    immediate = StepCreated(step_id="now", step_name="now", retry=RetryPolicy.fixed(3, 0))
    state = state_of(
        STEP,
        immediate,
        StepStarted(step_id="charge", attempt=1),
        StepStarted(step_id="now", attempt=1),
        StepRetrying(step_id="charge", attempt=1, error="boom", retry_after=DUE),
        StepRetrying(step_id="now", attempt=1, error="boom"),
    )
    assert condition(state, EPOCH).is_stalled

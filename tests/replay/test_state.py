"""``RunState``: the one place the event state machine is enforced. Every history here is written
by hand; each illegal one must be reported as ``CorruptHistoryError`` naming the run and the
sequence, and each legal one must project the expected snapshot."""

from __future__ import annotations

from datetime import timedelta

import pytest

from flowstream.errors import CorruptHistoryError, InvalidTransitionError
from flowstream.model.events import (
    ChildCancellationPolicy,
    ChildWorkflowRequested,
    ChildWorkflowResolved,
    FlowEvent,
    HookCreated,
    HookDisposed,
    HookReceived,
    RunCancellationRequested,
    RunCancelled,
    RunCompleted,
    RunContinuedAsNew,
    RunCreated,
    RunFailed,
    RunProgressRecorded,
    RunRetryExhausted,
    RunStarted,
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
from flowstream.model.snapshot import HookStatus, RunStatus, StepStatus, WaitStatus
from flowstream.model.spec import RetryPolicy
from flowstream.replay.decide import token_digest
from flowstream.replay.state import RunState, Wakeup, project
from tests.support import EPOCH, envelope, spec

SPEC = spec("state", signal_names=("go", "stop"))
CHILD = spec("child")
DIGEST = token_digest("t")
LATER = EPOCH + timedelta(minutes=1)
NONE = RetryPolicy.none()
TWO = RetryPolicy.fixed(2, 0)
DELAYED = RetryPolicy.fixed(3, 1000)
CONTINUE = RetryPolicy.none().continue_workflow_on_failure()


def history(*events: FlowEvent, run_id: str = "r1") -> list:  # type: ignore[type-arg]
    """``run_created`` + ``run_started`` + ``events`` as envelopes."""
    all_events = [RunCreated(spec=SPEC, input={"i": 1}), RunStarted(), *events]
    return [envelope(run_id, i, e) for i, e in enumerate(all_events, start=1)]


def step(step_id: str = "s", retry: RetryPolicy = NONE) -> StepCreated:
    return StepCreated(step_id=step_id, step_name="n", retry=retry)


def started(step_id: str = "s", attempt: int = 1) -> StepStarted:
    return StepStarted(step_id=step_id, attempt=attempt)


def child(
    child_id: str = "c",
    policy: ChildCancellationPolicy = ChildCancellationPolicy.REQUEST_CANCELLATION,
) -> ChildWorkflowRequested:
    return ChildWorkflowRequested(
        child_id=child_id, child_run_id=f"run-{child_id}", spec=CHILD, cancellation_policy=policy
    )


ILLEGAL: dict[str, tuple[FlowEvent, ...]] = {
    "started twice": (RunStarted(),),
    "created twice": (RunCreated(spec=SPEC),),
    "step created twice": (step(), step()),
    "step started without creation": (started(),),
    "step attempt skipped": (step(retry=TWO), started(attempt=2)),
    "step started beyond budget": (
        step(retry=TWO),
        started(),
        StepRetrying(step_id="s", attempt=1, error="e"),
        started(attempt=2),
        StepRetrying(step_id="s", attempt=2, error="e"),
    ),
    "step completed while pending": (step(), StepCompleted(step_id="s")),
    "step completed twice": (
        step(),
        started(),
        StepCompleted(step_id="s"),
        StepCompleted(step_id="s"),
    ),
    "step failed before budget": (
        step(retry=TWO),
        started(),
        StepFailed(step_id="s", attempt=1, error="e"),
    ),
    "failure for another attempt": (
        step(retry=TWO),
        started(),
        StepFailed(step_id="s", attempt=2, error="e"),
    ),
    "delayed retry without deadline": (
        step(retry=DELAYED),
        started(),
        StepRetrying(step_id="s", attempt=1, error="e"),
    ),
    "immediate retry with deadline": (
        step(retry=TWO),
        started(),
        StepRetrying(step_id="s", attempt=1, error="e", retry_after=LATER),
    ),
    "cancelled after completion": (
        step(),
        started(),
        StepCompleted(step_id="s"),
        StepCancelled(step_id="s", attempt=1, reason="x"),
    ),
    "retry exhausted without failure": (
        step(),
        started(),
        RunRetryExhausted(step_id="s", attempt=1, error="e"),
    ),
    "retry exhausted with other error": (
        step(),
        started(),
        StepFailed(step_id="s", attempt=1, error="e"),
        RunRetryExhausted(step_id="s", attempt=1, error="other"),
    ),
    "retry exhausted for continue policy": (
        step(retry=CONTINUE),
        started(),
        StepFailed(step_id="s", attempt=1, error="e"),
        RunRetryExhausted(step_id="s", attempt=1, error="e"),
    ),
    "wait created twice": (
        WaitCreated(wait_id="w", resume_at=LATER),
        WaitCreated(wait_id="w", resume_at=LATER),
    ),
    "wait completed twice": (
        WaitCreated(wait_id="w", resume_at=LATER),
        WaitCompleted(wait_id="w"),
        WaitCompleted(wait_id="w"),
    ),
    "undeclared signal": (SignalReceived(signal_id="x", name="nope"),),
    "signal received twice": (
        SignalReceived(signal_id="x", name="go"),
        SignalReceived(signal_id="x", name="go"),
    ),
    "undeclared signal wait": (SignalWaitCreated(wait_id="w", signal_name="nope"),),
    "signal pairing across names": (
        SignalReceived(signal_id="x", name="stop"),
        SignalWaitCreated(wait_id="w", signal_name="go"),
        SignalWaitCompleted(wait_id="w", signal_id="x"),
    ),
    "signal pairing skips the oldest signal": (
        SignalReceived(signal_id="x1", name="go"),
        SignalReceived(signal_id="x2", name="go"),
        SignalWaitCreated(wait_id="w", signal_name="go"),
        SignalWaitCompleted(wait_id="w", signal_id="x2"),
    ),
    "signal reused": (
        SignalReceived(signal_id="x", name="go"),
        SignalWaitCreated(wait_id="w1", signal_name="go"),
        SignalWaitCompleted(wait_id="w1", signal_id="x"),
        SignalWaitCreated(wait_id="w2", signal_name="go"),
        SignalWaitCompleted(wait_id="w2", signal_id="x"),
    ),
    "hook received twice": (
        HookCreated(hook_id="h", token_digest=DIGEST),
        HookReceived(hook_id="h"),
        HookReceived(hook_id="h"),
    ),
    "hook disposed unknown": (HookDisposed(hook_id="h"),),
    "child requested twice": (child(), child()),
    "child resolved twice": (
        child(),
        ChildWorkflowResolved(child_id="c", outcome=TerminalOutcome(type="completed")),
        ChildWorkflowResolved(child_id="c", outcome=TerminalOutcome(type="completed")),
    ),
    "child resolved as continued": (
        child(),
        ChildWorkflowResolved(
            child_id="c", outcome=TerminalOutcome(type="continued_as_new", successor_run_id="x")
        ),
    ),
    "terminal with an open child": (child(), RunCompleted()),
    "continued with an open child": (
        child(ChildCancellationPolicy.ABANDON),
        RunContinuedAsNew(successor_run_id="n"),
    ),
    "continued with an unconsumed signal": (
        SignalReceived(signal_id="x", name="go"),
        RunContinuedAsNew(successor_run_id="n"),
    ),
    "continued with an open signal wait": (
        SignalWaitCreated(wait_id="w", signal_name="go"),
        RunContinuedAsNew(successor_run_id="n"),
    ),
    "completed while cancelling": (RunCancellationRequested(reason="r"), RunCompleted()),
    "cancellation requested twice": (RunCancellationRequested(), RunCancellationRequested()),
    "event after terminal": (RunFailed(error="e"), StepCreated(step_id="late", step_name="n")),
    "progress recorded twice": (
        RunProgressRecorded(progress=WorkflowProgress(progress_id="p", completed=1)),
        RunProgressRecorded(progress=WorkflowProgress(progress_id="p", completed=2)),
    ),
    "progress beyond total": (
        RunProgressRecorded(progress=WorkflowProgress(progress_id="p", completed=3, total=2)),
    ),
}


@pytest.mark.parametrize("case", sorted(ILLEGAL))
def test_illegal_histories_are_corrupt(case: str) -> None:
    envelopes = history(*ILLEGAL[case])
    with pytest.raises(CorruptHistoryError) as caught:
        RunState.from_history(envelopes)
    assert caught.value.run_id == "r1"
    assert f"sequence {len(envelopes)}" in str(caught.value)  # the last event is the bad one
    # Every prefix before the bad event is fine.
    RunState.from_history(envelopes[:-1])


@pytest.mark.parametrize(
    ("envelopes", "fragment"),
    [
        ([], "empty"),
        ([envelope("r1", 1, RunStarted())], "run_created"),
        ([envelope("r1", 2, RunCreated(spec=SPEC))], "run_created"),
        ([envelope("r1", 1, RunCreated(spec=SPEC)), envelope("r1", 3, RunStarted())], "sequence 3"),
        ([envelope("r1", 1, RunCreated(spec=SPEC)), envelope("r1", 1, RunStarted())], "sequence 1"),
    ],
)
def test_histories_must_start_at_one_with_run_created_and_stay_contiguous(
    envelopes: list,
    fragment: str,  # type: ignore[type-arg]
) -> None:
    with pytest.raises(CorruptHistoryError) as caught:
        RunState.from_history(envelopes)
    assert fragment in str(caught.value)


def test_apply_rejects_without_changing_the_state() -> None:
    state = RunState.from_history(history(step(), started()))
    with pytest.raises(InvalidTransitionError):
        state.apply(envelope("r1", 5, StepCompleted(step_id="ghost")))
    assert state.last_sequence == 4
    assert len(state.history) == 4
    state.apply(envelope("r1", 5, StepCompleted(step_id="s", output=1)))
    assert state.steps["s"].output == 1


# -- legal histories project the expected snapshot ---------------------------------------


def test_a_step_lifecycle_projects_status_attempt_and_output() -> None:
    snapshot = project(
        history(
            step(retry=DELAYED),
            started(),
            StepRetrying(step_id="s", attempt=1, error="e1", retry_after=LATER),
        )
    )
    assert snapshot.status is RunStatus.SUSPENDED
    s = snapshot.steps["s"]
    assert (s.status, s.attempt, s.error, s.retry_after) == (StepStatus.PENDING, 1, "e1", LATER)

    done = project(
        history(
            step(retry=DELAYED),
            started(),
            StepRetrying(step_id="s", attempt=1, error="e1", retry_after=LATER),
            started(attempt=2),
            StepCompleted(step_id="s", output={"ok": 1}),
            RunCompleted(output=7),
        )
    )
    s = done.steps["s"]
    assert (s.status, s.attempt, s.output, s.retry_after) == (
        StepStatus.COMPLETED,
        2,
        {"ok": 1},
        None,
    )
    assert done.status is RunStatus.COMPLETED and done.output == 7


def test_non_retryable_and_exhaustion_project_failed_outcomes() -> None:
    non_retryable = project(
        history(
            step(retry=TWO),
            started(),
            StepNonRetryable(step_id="s", attempt=1, error="bad"),
            RunFailed(error="bad"),
        )
    )
    assert non_retryable.steps["s"].status is StepStatus.FAILED
    assert non_retryable.outcome is not None and non_retryable.outcome.type == "failed"

    exhausted = project(
        history(
            step(),
            started(),
            StepFailed(step_id="s", attempt=1, error="e"),
            RunRetryExhausted(step_id="s", attempt=1, error="e"),
        )
    )
    assert exhausted.status is RunStatus.FAILED
    assert exhausted.outcome is not None
    assert (exhausted.outcome.type, exhausted.outcome.step_id) == ("retry_exhausted", "s")


def test_a_cancellation_request_makes_earlier_work_non_actionable() -> None:
    state = RunState.from_history(
        history(
            step("running"),
            started("running"),
            step("delayed", DELAYED),
            started("delayed"),
            StepRetrying(step_id="delayed", attempt=1, error="e", retry_after=LATER),
            WaitCreated(wait_id="w", resume_at=LATER),
            HookCreated(hook_id="h", token_digest=DIGEST),
            SignalWaitCreated(wait_id="sw", signal_name="go"),
            RunCancellationRequested(reason="bye"),
        )
    )
    snapshot = state.snapshot()
    assert snapshot.status is RunStatus.CANCELLING
    assert snapshot.steps["running"].status is StepStatus.CANCELLED
    assert snapshot.steps["delayed"].status is StepStatus.CANCELLED
    assert snapshot.steps["delayed"].retry_after is None
    assert snapshot.waits["w"].status is WaitStatus.CANCELLED
    assert snapshot.hooks["h"].status is HookStatus.CANCELLED
    assert snapshot.signal_waits["sw"].status is WaitStatus.CANCELLED
    assert snapshot.cancellation is not None and snapshot.cancellation.sequence == 11
    assert state.wakeups() == []
    assert not state.has_open_suspension()


def test_signals_pair_fifo_and_unconsumed_signals_are_kept() -> None:
    snapshot = project(
        history(
            SignalReceived(signal_id="a", name="go", payload=1),
            SignalReceived(signal_id="b", name="go", payload=2),
            SignalWaitCreated(wait_id="w1", signal_name="go"),
            SignalWaitCompleted(wait_id="w1", signal_id="a"),
        )
    )
    assert snapshot.signal_waits["w1"].signal_id == "a"
    assert [(s.signal_id, s.consumed_by) for s in snapshot.signals] == [("a", "w1"), ("b", None)]


def test_a_signal_may_arrive_before_the_run_starts() -> None:
    envelopes = [
        envelope("r1", 1, RunCreated(spec=SPEC)),
        envelope("r1", 2, SignalReceived(signal_id="early", name="go")),
        envelope("r1", 3, RunStarted()),
    ]
    assert project(envelopes).signals[0].signal_id == "early"


def test_wakeups_are_open_timers_and_delayed_retries() -> None:
    state = RunState.from_history(
        history(
            WaitCreated(wait_id="w", resume_at=LATER),
            step(retry=DELAYED),
            started(),
            StepRetrying(
                step_id="s", attempt=1, error="e", retry_after=LATER + timedelta(seconds=1)
            ),
        )
    )
    assert sorted(state.wakeups(), key=lambda w: w.due) == [
        Wakeup(LATER, "r1", "wait", "w"),
        Wakeup(LATER + timedelta(seconds=1), "r1", "retry", "s"),
    ]
    assert state.due_retries(LATER) == []
    assert state.due_retries(LATER + timedelta(seconds=1)) == ["s"]


def test_an_abandoned_child_does_not_block_a_cancelled_parent() -> None:
    snapshot = project(
        history(
            child("c", ChildCancellationPolicy.ABANDON), RunCancellationRequested(), RunCancelled()
        )
    )
    assert snapshot.status is RunStatus.CANCELLED
    assert snapshot.children["c"].outcome is None


def test_a_snapshot_round_trips_through_json() -> None:
    snapshot = project(history(HookCreated(hook_id="h", token_digest=DIGEST, metadata={"k": 1})))
    again = type(snapshot).model_validate_json(snapshot.model_dump_json())
    assert again == snapshot
    assert DIGEST not in snapshot.model_dump_json()

"""Reference §4: ``WorkflowRunSnapshot``, run statuses, terminal outcomes, and inspection."""

from __future__ import annotations

from datetime import timedelta

import pytest

from flowstream.errors import InvalidTransitionError
from flowstream.model.events import (
    ChildCancellationPolicy,
    ChildWorkflowRequested,
    FlowEvent,
    HookCreated,
    RunCancellationRequested,
    RunCancelled,
    RunCompleted,
    RunContinuedAsNew,
    RunCreated,
    RunFailed,
    RunProgressRecorded,
    RunRetryExhausted,
    RunTimedOut,
    SignalReceived,
    SignalWaitCompleted,
    SignalWaitCreated,
    StepCreated,
    StepFailed,
    StepRetrying,
    StepStarted,
    TerminalOutcome,
    WaitCreated,
    WorkflowProgress,
)
from flowstream.model.snapshot import TERMINAL_STATUSES, RunStatus, StepStatus
from flowstream.model.spec import RetryPolicy
from flowstream.replay.context import StepInvocation, WorkflowContext
from flowstream.replay.decide import token_digest
from flowstream.replay.state import project
from flowstream.stores.base import EventStore
from tests.semantics.helpers import CHILD, DELAYED, LATER, SPEC, append, begin, engine_for
from tests.support import EPOCH, Crash, FakeClock, run
from tests.support.stores import StoreFactory


def _status(store: EventStore, run_id: str = "r1") -> RunStatus:
    return store.state(run_id).snapshot().status


def test_a_created_run_that_has_not_started_is_pending(store: EventStore, clock: FakeClock) -> None:
    """§4 WorkflowRunStatus: pending (created, not started)."""
    engine, _ = engine_for(store, clock, lambda ctx: ctx.complete())
    assert run(engine.start("r1", SPEC, drive=False)).status is RunStatus.PENDING
    assert run(engine.drive("r1")).status is RunStatus.COMPLETED


def test_a_run_executing_a_step_is_running(store: EventStore, clock: FakeClock) -> None:
    """§4 WorkflowRunStatus: running."""
    seen: list[RunStatus] = []

    def work(invocation: StepInvocation) -> object:
        seen.append(_status(store))
        return 1

    engine, _ = engine_for(
        store,
        clock,
        lambda ctx: ctx.complete() if ctx.step_completed("s") else ctx.schedule_step("s", "work"),
        {"work": work},
    )
    run(engine.start("r1", SPEC))
    assert seen == [RunStatus.RUNNING]


@pytest.mark.parametrize(
    "events",
    [
        pytest.param([WaitCreated(wait_id="w", resume_at=LATER)], id="waiting-wait"),
        pytest.param([HookCreated(hook_id="h", token_digest=token_digest("t"))], id="active-hook"),
        pytest.param(
            [
                StepCreated(step_id="s", step_name="work", retry=DELAYED),
                StepStarted(step_id="s", attempt=1),
                StepRetrying(step_id="s", attempt=1, error="e", retry_after=LATER),
            ],
            id="retry-after",
        ),
        pytest.param(
            [ChildWorkflowRequested(child_id="c", child_run_id="c1", spec=CHILD)], id="open-child"
        ),
        pytest.param([SignalWaitCreated(wait_id="sw", signal_name="go")], id="signal-wait"),
    ],
)
def test_suspended_is_derived_from_an_open_suspension(
    store: EventStore, events: list[FlowEvent]
) -> None:
    """§4: Suspended is derived at the end of projection: Running and has_open_suspension() (a
    Waiting wait, Active hook, step with retry_after, open child, Waiting signal wait)."""
    begin(store)
    assert _status(store) is RunStatus.RUNNING
    append(store, "r1", *events)
    assert _status(store) is RunStatus.SUSPENDED
    assert store.state("r1").status is RunStatus.RUNNING  # derived, never stored


def test_a_cancellation_request_makes_the_run_cancelling(store: EventStore) -> None:
    """§4 WorkflowRunStatus: cancelling (after RunCancellationRequested)."""
    begin(store, RunCancellationRequested(reason="r"))
    assert _status(store) is RunStatus.CANCELLING


@pytest.mark.parametrize(
    ("event", "status", "outcome", "error"),
    [
        (
            RunCompleted(output=7),
            RunStatus.COMPLETED,
            TerminalOutcome(type="completed", output=7),
            None,
        ),
        (RunFailed(error="e"), RunStatus.FAILED, TerminalOutcome(type="failed", error="e"), "e"),
        (
            RunCancelled(reason="bye"),
            RunStatus.CANCELLED,
            TerminalOutcome(type="cancelled", error="bye"),
            "bye",
        ),
        (
            RunTimedOut(deadline=LATER),
            RunStatus.FAILED,
            TerminalOutcome(type="timed_out", error=f"workflow timed out at {LATER.isoformat()}"),
            f"workflow timed out at {LATER.isoformat()}",
        ),
        (
            RunContinuedAsNew(successor_run_id="next", input=1),
            RunStatus.CONTINUED_AS_NEW,
            TerminalOutcome(type="continued_as_new", successor_run_id="next"),
            None,
        ),
    ],
    ids=["completed", "failed", "cancelled", "timed-out", "continued"],
)
def test_terminal_events_project_status_outcome_and_error(
    store: EventStore,
    event: FlowEvent,
    status: RunStatus,
    outcome: TerminalOutcome,
    error: str | None,
) -> None:
    """§4 terminal outcomes and status mapping: RunTimedOut projects status failed with error
    "workflow timed out at {deadline}"; RunCancelled → cancelled and error = reason. Terminal
    statuses are completed | failed | cancelled | continued_as_new."""
    begin(store, event)
    snapshot = store.state("r1").snapshot()
    assert (snapshot.status, snapshot.outcome, snapshot.error) == (status, outcome, error)
    assert snapshot.is_terminal and status in TERMINAL_STATUSES


def test_retry_exhausted_projects_failed_with_its_own_outcome(store: EventStore) -> None:
    """§4: RunRetryExhausted projects status failed, distinguished only by terminal_outcome."""
    begin(
        store,
        StepCreated(step_id="s", step_name="work", retry=RetryPolicy.none()),
        StepStarted(step_id="s", attempt=1),
        StepFailed(step_id="s", attempt=1, error="boom"),
        RunRetryExhausted(step_id="s", attempt=1, error="boom"),
    )
    snapshot = store.state("r1").snapshot()
    assert snapshot.status is RunStatus.FAILED
    assert snapshot.outcome == TerminalOutcome(type="retry_exhausted", error="boom", step_id="s")


def test_no_terminal_event_while_a_request_cancellation_child_is_open(store: EventStore) -> None:
    """§4: any terminal event (except continuation) is rejected by projection while a
    RequestCancellation-policy child is still open; an abandoned child does not block it."""
    begin(store, ChildWorkflowRequested(child_id="c", child_run_id="c1", spec=CHILD))
    with pytest.raises(InvalidTransitionError, match="child workflow c is open"):
        append(store, "r1", RunFailed(error="e"))
    begin(
        store,
        ChildWorkflowRequested(
            child_id="c",
            child_run_id="c2",
            spec=CHILD,
            cancellation_policy=ChildCancellationPolicy.ABANDON,
        ),
        RunFailed(error="e"),
        run_id="r2",
    )
    assert _status(store, "r2") is RunStatus.FAILED


def test_sub_snapshots_carry_their_durable_fields(store: EventStore, clock: FakeClock) -> None:
    """§4 sub-snapshots: StepSnapshot{status, attempt, error (most recent), retry_after},
    SignalSnapshot{received_sequence, consumed_by}, SignalWaitSnapshot{created_sequence,
    signal_id}, ChildWorkflowSnapshot{run_id, spec, input, policy, requested_sequence, outcome},
    CancellationSnapshot{reason, requested_at, sequence}; progress in event order."""
    begin(
        store,
        StepCreated(step_id="s", step_name="work", input={"n": 1}, retry=DELAYED),
        StepStarted(step_id="s", attempt=1),
        StepRetrying(step_id="s", attempt=1, error="first", retry_after=LATER),
        SignalWaitCreated(wait_id="sw", signal_name="go"),  # 6
        SignalReceived(signal_id="sig", name="go", payload=1),  # 7
        SignalWaitCompleted(wait_id="sw", signal_id="sig"),
        ChildWorkflowRequested(child_id="c", child_run_id="c1", spec=CHILD, input=2),  # 9
        RunProgressRecorded(progress=WorkflowProgress(progress_id="b", completed=1)),
        RunProgressRecorded(progress=WorkflowProgress(progress_id="a", completed=2)),
    )
    clock.advance(seconds=5)
    append(store, "r1", RunCancellationRequested(reason="why"))  # 12
    snapshot = store.state("r1").snapshot()
    step = snapshot.steps["s"]
    assert (step.status, step.attempt, step.error, step.retry_after, step.input) == (
        StepStatus.CANCELLED,  # the request made it non-actionable (§5.5)
        1,
        "cancelled by run cancellation request",
        None,
        {"n": 1},
    )
    [signal] = snapshot.signals
    assert (signal.received_sequence, signal.consumed_by, signal.payload) == (7, "sw", 1)
    wait = snapshot.signal_waits["sw"]
    assert (wait.created_sequence, wait.signal_id) == (6, "sig")
    child = snapshot.children["c"]
    assert (child.run_id, child.spec, child.input, child.requested_sequence, child.outcome) == (
        "c1",
        CHILD,
        2,
        9,
        None,
    )
    assert child.cancellation_policy is ChildCancellationPolicy.REQUEST_CANCELLATION
    assert snapshot.cancellation is not None
    assert (snapshot.cancellation.reason, snapshot.cancellation.sequence) == ("why", 12)
    assert snapshot.cancellation.requested_at == EPOCH + timedelta(seconds=5)
    assert [p.progress_id for p in snapshot.progress] == ["b", "a"]


def test_the_most_recent_attempt_error_is_in_the_step_snapshot(store: EventStore) -> None:
    """§4 StepSnapshot.error: final or most recent attempt error."""
    begin(
        store,
        StepCreated(step_id="s", step_name="work", retry=DELAYED),
        StepStarted(step_id="s", attempt=1),
        StepRetrying(step_id="s", attempt=1, error="first", retry_after=LATER),
    )
    step = store.state("r1").snapshot().steps["s"]
    assert (step.status, step.error, step.retry_after) == (StepStatus.PENDING, "first", LATER)


def test_a_snapshot_is_a_projection_of_the_history(store: EventStore, clock: FakeClock) -> None:
    """Seeds "A snapshot is a projection": the snapshot is what the complete, ordered history
    projects to."""
    engine, _ = engine_for(store, clock, lambda ctx: ctx.wait_until("w", LATER))
    snapshot = run(engine.start("r1", SPEC))
    assert project(store.read("r1")) == snapshot == engine.snapshot("r1")


def test_process_loss_never_creates_a_terminal_outcome(
    stores: StoreFactory, clock: FakeClock
) -> None:
    """§4 / seeds: ordinary process loss should not create a terminal outcome; a replacement
    worker continues the non-terminal run."""
    if not stores.durable:
        pytest.skip("process loss needs a durable store")
    store = stores.open(clock=clock)
    crash = {"on": True}

    def work(invocation: StepInvocation) -> object:
        if crash["on"]:
            raise Crash
        return "done"

    def workflow(ctx: WorkflowContext) -> object:
        if ctx.step_completed("s"):
            return ctx.complete(ctx.step_output("s"))
        return ctx.schedule_step("s", "work")

    engine, _ = engine_for(store, clock, workflow, {"work": work})
    with pytest.raises(Crash):
        run(engine.start("r1", SPEC))
    store = stores.reopen(store, clock=clock)
    assert _status(store) is RunStatus.RUNNING
    crash["on"] = False
    engine, _ = engine_for(store, clock, workflow, {"work": work})
    assert run(engine.drive("r1")).output == "done"


def test_the_summary_counts_statuses_and_only_live_suspensions(
    store: EventStore, clock: FakeClock
) -> None:
    """§4 WorkflowRunSummary: counts per status; suspension counters only for non-terminal
    runs."""
    begin(store, WaitCreated(wait_id="w", resume_at=LATER), run_id="waiting")
    begin(store, HookCreated(hook_id="h", token_digest=token_digest("t")), run_id="hooked")
    begin(store, WaitCreated(wait_id="w", resume_at=LATER), RunCancelled(), run_id="ended")
    append(store, "pending", RunCreated(spec=SPEC))
    engine, _ = engine_for(store, clock, lambda ctx: ctx.complete())
    summary = engine.summary()
    assert summary.total_runs == 4
    assert summary.by_status == {
        RunStatus.SUSPENDED: 2,
        RunStatus.CANCELLED: 1,
        RunStatus.PENDING: 1,
    }
    assert (summary.open_waits, summary.active_hooks) == (1, 1)


def test_open_suspensions_list_each_kind_of_live_runs_only(
    store: EventStore, clock: FakeClock
) -> None:
    """§4 WorkflowRunSuspension: wait{due}, hook, retry{due}, child, signal, for non-terminal
    runs, sorted by run id."""
    begin(
        store,
        WaitCreated(wait_id="w", resume_at=LATER),
        HookCreated(hook_id="h", token_digest=token_digest("t")),
        StepCreated(step_id="s", step_name="work", retry=DELAYED),
        StepStarted(step_id="s", attempt=1),
        StepRetrying(step_id="s", attempt=1, error="e", retry_after=EPOCH),
        SignalWaitCreated(wait_id="sw", signal_name="go"),
        ChildWorkflowRequested(child_id="c", child_run_id="c1", spec=CHILD),
        run_id="b",
    )
    begin(store, WaitCreated(wait_id="w", resume_at=LATER), run_id="a")
    begin(store, WaitCreated(wait_id="w", resume_at=LATER), RunCancelled(), run_id="z")
    engine, _ = engine_for(store, clock, lambda ctx: ctx.complete())
    found = engine.list_open_suspensions(EPOCH)
    assert [(s.run_id, s.kind, s.subject_id) for s in found] == [
        ("a", "wait", "w"),
        ("b", "wait", "w"),
        ("b", "retry", "s"),
        ("b", "hook", "h"),
        ("b", "signal", "sw"),
        ("b", "child", "c"),
    ]
    due = {(s.run_id, s.kind): (s.due, s.is_due) for s in found}
    assert due[("b", "retry")] == (EPOCH, True)
    assert due[("b", "wait")] == (LATER, False)

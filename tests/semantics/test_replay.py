"""Reference §5: the drive loop, what replay compares, the no-progress rules, history
validation on every read, and what a cancellation request does to the projection."""

from __future__ import annotations

import contextlib

import pytest

from flowstream.errors import (
    CorruptHistoryError,
    EventConflictError,
    InvalidTransitionError,
    NonDeterministicError,
    RunConflictError,
    RuntimeBuildUnavailableError,
)
from flowstream.model.commands import ChildWorkflowCommand, RuntimeCommand
from flowstream.model.events import (
    ChildWorkflowRequested,
    FlowEvent,
    HookCreated,
    RunCancellationRequested,
    RunCancelled,
    RunCompleted,
    RunCreated,
    RunStarted,
    SignalReceived,
    SignalWaitCreated,
    StepCompleted,
    StepCreated,
    StepFailed,
    StepRetrying,
    StepStarted,
    WaitCreated,
)
from flowstream.model.snapshot import HookStatus, RunStatus, StepStatus, WaitStatus
from flowstream.model.spec import RetryPolicy
from flowstream.replay.context import WorkflowContext
from flowstream.replay.decide import BATCH_ABORT_REASON, decide, token_digest
from flowstream.stores.base import EventStore
from tests.semantics.helpers import CHILD, DELAYED, LATER, SPEC, append, begin, engine_for, types_of
from tests.support import EPOCH, FakeClock, envelope, run, spec
from tests.support.stores import StoreFactory

NONE = RetryPolicy.none()


def _complete_after_step(ctx: WorkflowContext) -> RuntimeCommand:
    if ctx.step_completed("s"):
        return ctx.complete(ctx.step_output("s"))
    return ctx.schedule_step("s", "work")


# -- §5.1 the drive loop -------------------------------------------------------------------------


def test_a_terminal_run_is_returned_without_invoking_workflow_code(
    store: EventStore, clock: FakeClock
) -> None:
    """§5.1 step 1: list → project; Terminal → return the snapshot."""
    engine, runtime = engine_for(store, clock, lambda ctx: ctx.complete(1))
    run(engine.start("r1", SPEC))
    calls = len(runtime.workflow_calls)
    assert run(engine.drive("r1")).status is RunStatus.COMPLETED
    assert len(runtime.workflow_calls) == calls == 1


def test_run_started_does_not_consume_the_replay_budget(
    store: EventStore, clock: FakeClock
) -> None:
    """§5.1 step 2: Pending → append RunStarted (does not consume replay budget) and loop."""
    engine, _ = engine_for(
        store, clock, lambda ctx: ctx.wait_until("w", LATER), max_replay_iterations=1
    )
    assert run(engine.start("r1", SPEC)).status is RunStatus.SUSPENDED


def test_a_terminal_command_within_the_budget_never_reports_the_limit(
    store: EventStore, clock: FakeClock
) -> None:
    """§5.1 step 10: terminal commands return; with max_replay_iterations = 1 a run whose one
    decision completes it is completed, not ReplayLimitExceeded."""
    begin(store)
    engine, _ = engine_for(store, clock, lambda ctx: ctx.complete(1), max_replay_iterations=1)
    assert run(engine.drive("r1")).status is RunStatus.COMPLETED


def test_admission_comes_before_workflow_code_and_any_write(
    store: EventStore, clock: FakeClock
) -> None:
    """§5.1 step 3: runtime-build admission; failure → RuntimeBuildUnavailable with no history
    appended."""
    append(store, "r1", RunCreated(spec=spec("semantics", runtime_build_id="build-2")))
    engine, runtime = engine_for(store, clock, lambda ctx: ctx.complete())
    with pytest.raises(RuntimeBuildUnavailableError):
        run(engine.drive("r1"))
    assert types_of(store) == ["run_created"] and runtime.workflow_calls == []


def test_an_interrupted_batch_failure_is_settled_before_workflow_code(
    store: EventStore, clock: FakeClock
) -> None:
    """§5.1 step 4 / §6.3.6: a StepFailed (FailRun) without the run's terminal event gets the
    missing StepCancelled markers, then RunRetryExhausted, before workflow code is invoked.
    flowstream appends the settlement in one atomic batch (the reference: one event per
    iteration), so it cannot be interrupted half-way again."""
    begin(
        store,
        StepCreated(step_id="a", step_name="work", retry=NONE),
        StepCreated(step_id="b", step_name="work", retry=NONE),
        StepStarted(step_id="a", attempt=1),
        StepStarted(step_id="b", attempt=1),
        StepFailed(step_id="a", attempt=1, error="boom"),
    )
    engine, runtime = engine_for(store, clock, lambda ctx: ctx.complete())
    snapshot = run(engine.drive("r1"))
    assert runtime.workflow_calls == []
    assert snapshot.outcome is not None and snapshot.outcome.type == "retry_exhausted"
    assert snapshot.steps["b"].error == BATCH_ABORT_REASON.format("a")
    last = store.read("r1")[-2:]
    assert [e.event.type for e in last] == ["step_cancelled", "run_retry_exhausted"]
    assert last[0].sequence + 1 == last[1].sequence


def test_a_lost_child_creation_is_repaired_during_reconciliation(
    store: EventStore, clock: FakeClock
) -> None:
    """§5.1 step 5: reconcile first-class children: create missing child runs, drive them,
    append ChildWorkflowResolved."""
    begin(store, ChildWorkflowRequested(child_id="c", child_run_id="c-run", spec=CHILD, input=2))

    def parent(ctx: WorkflowContext) -> RuntimeCommand:
        outcome = ctx.child_workflow_outcome("c")
        assert outcome is not None
        return ctx.complete(outcome.output)

    engine, _ = engine_for(
        store, clock, {"semantics": parent, "child": lambda ctx: ctx.complete(ctx.input)}
    )
    assert run(engine.drive("r1")).output == 2
    assert types_of(store, "c-run") == ["run_created", "run_started", "run_completed"]


def test_signal_waits_pair_oldest_with_oldest_before_workflow_code(
    store: EventStore, clock: FakeClock
) -> None:
    """§5.1 step 7: pair the oldest Waiting signal wait with the oldest unconsumed signal of the
    same name and append SignalWaitCompleted before workflow code runs (flowstream appends every
    pair due in one batch)."""
    begin(
        store,
        SignalWaitCreated(wait_id="w1", signal_name="go"),
        SignalWaitCreated(wait_id="w2", signal_name="go"),
        SignalReceived(signal_id="first", name="go", payload=1),
        SignalReceived(signal_id="second", name="go", payload=2),
    )
    payloads: list[object] = []

    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        payloads.append((ctx.signal_payload("w1"), ctx.signal_payload("w2")))
        return ctx.complete()

    engine, _ = engine_for(store, clock, workflow)
    run(engine.drive("r1"))
    assert payloads == [(1, 2)]
    assert types_of(store)[-3:] == [
        "signal_wait_completed",
        "signal_wait_completed",
        "run_completed",
    ]


@pytest.mark.parametrize(
    "events",
    [
        pytest.param([WaitCreated(wait_id="w", resume_at=EPOCH)], id="wait-past-due"),
        pytest.param([HookCreated(hook_id="h", token_digest=token_digest("t"))], id="hook"),
        pytest.param([SignalWaitCreated(wait_id="sw", signal_name="go")], id="signal-wait"),
        pytest.param(
            [
                StepCreated(step_id="s", step_name="work", retry=DELAYED),
                StepStarted(step_id="s", attempt=1),
                StepRetrying(step_id="s", attempt=1, error="e", retry_after=LATER),
            ],
            id="future-retry",
        ),
    ],
)
def test_drive_does_not_invoke_workflow_code_while_suspended(
    store: EventStore, clock: FakeClock, events: list[FlowEvent]
) -> None:
    """§5.1 step 9: any Waiting wait, Active hook, Waiting signal wait, or a future retry with no
    due retry → return the snapshot without invoking workflow code. Timers are never completed
    by drive, even past their resume_at."""
    begin(store, *events)
    engine, runtime = engine_for(store, clock, lambda ctx: ctx.complete())
    clock.advance(minutes=30)  # past the timer's deadline, before the retry's
    snapshot = run(engine.drive("r1"))
    assert snapshot.status is RunStatus.SUSPENDED and runtime.workflow_calls == []


def test_each_decision_is_made_on_the_history_the_previous_one_committed(
    store: EventStore, clock: FakeClock
) -> None:
    """§5.1 step 10 / seeds "Return one command at a time": after a command commits the engine
    projects history again and calls the workflow again."""

    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        done = sum(ctx.progress(p) is not None for p in ("a", "b"))
        return ctx.complete(done) if done == 2 else ctx.record_progress("ab"[done], done)

    engine, runtime = engine_for(store, clock, workflow)
    assert run(engine.start("r1", SPEC)).output == 2
    assert [c.history_types[-1] for c in runtime.workflow_calls] == [
        "run_started",
        "run_progress_recorded",
        "run_progress_recorded",
    ]


def test_a_lost_append_race_is_replayed_never_surfaced(store: EventStore, clock: FakeClock) -> None:
    """§5.1: every append is at expected = last_sequence; an EventConflict makes the loop re-read
    and retry, and is never surfaced from drive."""

    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        if not store.state("r1").signals:  # another writer commits while this one decides
            append(store, "r1", SignalReceived(signal_id="late", name="go"))
            return ctx.fail("decided on a stale history")
        return ctx.complete("fresh")

    engine, runtime = engine_for(store, clock, workflow)
    assert run(engine.start("r1", SPEC)).output == "fresh"
    assert len(runtime.workflow_calls) == 2
    with pytest.raises(EventConflictError) as caught:
        store.append_if_sequence("r1", 2, [RunCompleted()])
    assert (caught.value.expected_sequence, caught.value.actual_sequence) == (2, 4)


# -- §5.2 what replay compares ------------------------------------------------------------------


def test_a_drifted_child_is_nondeterministic(store: EventStore) -> None:
    """§5.2: a child workflow compares (spec, input, cancellation_policy) → "child workflow X
    differs"; batch sibling order drift → "child workflow batch order differs"."""
    begin(
        store,
        ChildWorkflowRequested(child_id="a", child_run_id="ra", spec=CHILD, input=1),
        ChildWorkflowRequested(child_id="b", child_run_id="rb", spec=CHILD, input=2),
    )
    state = store.state("r1")
    a, b = (ChildWorkflowCommand(child_id=i, spec=CHILD, input=n) for i, n in (("a", 1), ("b", 2)))
    with pytest.raises(NonDeterministicError, match="child workflow a differs"):
        decide(state, RuntimeCommand.start_child_workflow("a", CHILD, 9), EPOCH)
    with pytest.raises(NonDeterministicError, match="child workflow a differs"):
        decide(state, RuntimeCommand.start_child_workflow("a", spec("other"), 1), EPOCH)
    with pytest.raises(NonDeterministicError, match="batch order differs"):
        decide(state, RuntimeCommand.start_child_workflows([b, a]), EPOCH)


def test_a_reordered_child_batch_with_a_new_child_is_nondeterministic(store: EventStore) -> None:
    """§3.1 / §5.2 StartChildWorkflows: the batch keeps a stable order, validated before
    appending anything: a new child placed before a durable sibling is order drift (issue 16
    item 6, fixed in the chains work)."""
    begin(store, ChildWorkflowRequested(child_id="a", child_run_id="ra", spec=CHILD))
    new, a = (ChildWorkflowCommand(child_id=i, spec=CHILD) for i in ("new", "a"))
    with pytest.raises(NonDeterministicError, match="batch order"):
        decide(store.state("r1"), RuntimeCommand.start_child_workflows([new, a]), EPOCH)


def test_the_diff_is_compact_json_and_object_key_order_does_not_matter(
    store: EventStore,
) -> None:
    """§5.2 / §13: comparison is exact JSON equality (object key order-insensitive, 1 and 1.0
    differ), and the error shows history=<compact json>; replay=<compact json>."""
    begin(store, StepCreated(step_id="s", step_name="work", input={"a": 1, "b": [1, 2]}))
    state = store.state("r1")
    decision = decide(
        state, RuntimeCommand.schedule_step("s", "work", {"b": [1, 2], "a": 1}), EPOCH
    )
    assert decision.run_steps == ["s"]
    with pytest.raises(NonDeterministicError) as caught:
        decide(state, RuntimeCommand.schedule_step("s", "work", {"a": 1.0, "b": [1, 2]}), EPOCH)
    assert 'history={"a":1,"b":[1,2]}; replay={"a":1.0,"b":[1,2]}' in str(caught.value)
    assert caught.value.run_id == "r1"


@pytest.mark.parametrize(
    ("changed", "reason"),
    [
        ({"spec": spec("semantics", version="2")}, "workflow spec differs"),
        ({"input": {"n": 2}}, "workflow input differs"),
    ],
)
def test_a_restart_with_another_spec_or_input_is_a_run_conflict(
    store: EventStore, clock: FakeClock, changed: dict[str, object], reason: str
) -> None:
    """§5.2 Start: start_with_id compares the persisted spec and input → RunConflict{"workflow
    spec differs" | "workflow input differs"} without appending."""
    engine, _ = engine_for(store, clock, lambda ctx: ctx.wait_until("w", LATER))
    run(engine.start("r1", SPEC, {"n": 1}))
    before = store.read("r1")
    arguments: dict[str, object] = {"spec": SPEC, "input": {"n": 1}, **changed}
    with pytest.raises(RunConflictError, match=reason):
        run(engine.start("r1", arguments["spec"], arguments["input"]))  # type: ignore[arg-type]
    assert store.read("r1") == before


# -- §5.3 no progress ----------------------------------------------------------------------------


def test_reemitting_a_failed_continue_workflow_step_stops_without_replay_spam(
    store: EventStore, clock: FakeClock
) -> None:
    """§5.3: a workflow that keeps re-emitting a failed continue_workflow step without looking at
    step_failed hits InvalidTransition: 2 workflow invocations, 1 step invocation."""

    def work(invocation: object) -> object:
        raise ConnectionError("down")

    engine, runtime = engine_for(
        store,
        clock,
        lambda ctx: ctx.schedule_step("s", "work", None, NONE.continue_workflow_on_failure()),
        {"work": work},
    )
    with contextlib.suppress(InvalidTransitionError):
        run(engine.start("r1", SPEC))
    assert (len(runtime.workflow_calls), len(runtime.step_calls)) == (2, 1)
    assert types_of(store).count("step_started") == 1
    assert store.state("r1").steps["s"].status is StepStatus.FAILED


# -- §5.4 history validation on every read -------------------------------------------------------


def _corrupt(case: str) -> list[object]:
    ok = [RunCreated(spec=SPEC), RunStarted()]
    if case == "not-created-first":
        return [envelope("r1", 1, RunStarted())]
    if case == "gap":
        return [envelope("r1", 1, ok[0]), envelope("r1", 3, ok[1])]
    if case == "foreign":
        return [envelope("r1", 1, ok[0]), envelope("other", 2, ok[1])]
    if case == "after-terminal":
        events = [*ok, RunCompleted(), StepCreated(step_id="s", step_name="work")]
    elif case == "duplicate-step":
        events = [
            *ok,
            StepCreated(step_id="s", step_name="n"),
            StepCreated(step_id="s", step_name="n"),
        ]
    else:  # a signal wait before run_started
        events = [ok[0], SignalWaitCreated(wait_id="x", signal_name="go")]
    return [envelope("r1", i, e) for i, e in enumerate(events, start=1)]


@pytest.mark.parametrize(
    "case",
    ["not-created-first", "gap", "foreign", "after-terminal", "duplicate-step", "wait-early"],
)
def test_a_corrupt_stored_history_is_reported_on_read(stores: StoreFactory, case: str) -> None:
    """§5.4: project_run rejects, on every read: first event not run_created, non-contiguous
    sequence, an envelope for another run, any event after a terminal state, duplicate creates,
    signal_* before run_started (here: a signal wait; a signal itself is kept, see below)."""
    store = stores.open()
    stores.write_raw_history(store, "r1", _corrupt(case))  # type: ignore[arg-type]
    with pytest.raises(CorruptHistoryError):
        store.state("r1")


def test_a_signal_to_a_run_that_has_not_started_is_kept(store: EventStore) -> None:
    """§5.4: the reference rejects signal_received before run_started. flowstream keeps it
    (deliberate): a client may signal a run created with start(drive=False) before anything
    drives it; the signal is kept unconsumed until a signal wait takes it."""
    append(store, "r1", RunCreated(spec=SPEC), SignalReceived(signal_id="early", name="go"))
    append(store, "r1", RunStarted())
    assert [s.signal_id for s in store.state("r1").snapshot().signals] == ["early"]


# -- §5.5 what a cancellation request does to the projection -------------------------------------


def test_a_cancellation_request_makes_pre_existing_work_non_actionable(store: EventStore) -> None:
    """§5.5: RunCancellationRequested marks every pre-existing Pending/Running step Cancelled
    (clears retry_after), Waiting waits, Active hooks and Waiting signal waits Cancelled;
    cleanup must use new ids."""
    begin(
        store,
        StepCreated(step_id="running", step_name="work"),
        StepStarted(step_id="running", attempt=1),
        StepCreated(step_id="retrying", step_name="work", retry=DELAYED),
        StepStarted(step_id="retrying", attempt=1),
        StepRetrying(step_id="retrying", attempt=1, error="e", retry_after=LATER),
        StepCreated(step_id="done", step_name="work"),
        StepStarted(step_id="done", attempt=1),
        StepCompleted(step_id="done", output=1),
        WaitCreated(wait_id="w", resume_at=LATER),
        HookCreated(hook_id="h", token_digest=token_digest("t")),
        SignalWaitCreated(wait_id="sw", signal_name="go"),
        RunCancellationRequested(reason="stop"),
    )
    state = store.state("r1")
    snapshot = state.snapshot()
    assert snapshot.steps["running"].status is StepStatus.CANCELLED
    assert snapshot.steps["retrying"].status is StepStatus.CANCELLED
    assert snapshot.steps["retrying"].retry_after is None
    assert snapshot.steps["done"].status is StepStatus.COMPLETED
    assert snapshot.waits["w"].status is WaitStatus.CANCELLED
    assert snapshot.hooks["h"].status is HookStatus.CANCELLED
    assert snapshot.signal_waits["sw"].status is WaitStatus.CANCELLED
    assert store.due_wakeups(LATER) == []
    with pytest.raises(InvalidTransitionError, match="distinct stable identity"):
        decide(state, RuntimeCommand.schedule_step("running", "work"), EPOCH)


def test_an_outcome_of_work_the_request_cancelled_is_dropped(
    store: EventStore, clock: FakeClock
) -> None:
    """§5.5: pre-request work is non-actionable: the outcome of an attempt that was running when
    the request arrived is dropped (the history is the authority, not the handler)."""
    begin(
        store,
        StepCreated(step_id="s", step_name="work"),
        StepStarted(step_id="s", attempt=1),
        RunCancellationRequested(reason="stop"),
    )
    engine, _ = engine_for(store, clock, lambda ctx: ctx.cancel())
    before = store.read("r1")
    assert run(engine.record_step_outcome("r1", "s", 1, output="late")) is False
    assert store.read("r1") == before


def test_a_direct_cancel_leaves_suspensions_but_inspection_skips_them(
    store: EventStore, clock: FakeClock
) -> None:
    """§5.5: a direct RunCancelled (force cancel) does not touch open suspensions: the snapshot
    still shows the wait waiting and the hook active, but the run is terminal and inspection
    skips it."""
    begin(
        store,
        WaitCreated(wait_id="w", resume_at=LATER),
        HookCreated(hook_id="h", token_digest=token_digest("t")),
    )
    engine, _ = engine_for(store, clock, lambda ctx: ctx.complete())
    snapshot = run(engine.force_cancel("r1", "now"))
    assert snapshot.status is RunStatus.CANCELLED
    assert snapshot.waits["w"].status is WaitStatus.WAITING
    assert snapshot.hooks["h"].status is HookStatus.ACTIVE
    assert engine.list_open_suspensions() == []
    assert store.due_wakeups(LATER) == [] and engine.next_wakeup() is None
    assert types_of(store)[-1] == "run_cancelled"
    with pytest.raises(InvalidTransitionError):
        run(engine.resume_hook_by_token("t", 1))


def test_a_forced_cancel_after_the_request_ends_the_run(store: EventStore) -> None:
    """§5.5 / §8.1: RunCancelled is accepted from Cancelling too (the immediate path)."""
    begin(store, RunCancellationRequested(reason="a"), RunCancelled(reason="a"))
    assert store.state("r1").snapshot().status is RunStatus.CANCELLED

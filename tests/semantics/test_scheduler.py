"""Reference §7: the scheduler and the wake-up paths: timers, delayed retries, the wakeup index,
signals, hooks, and child completion."""

from __future__ import annotations

from datetime import timedelta

import pytest

from flowstream.errors import InvalidTransitionError, RunConflictError
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import (
    RunContinuedAsNew,
    RunCreated,
    RunFailed,
    RunStarted,
    StepCreated,
    StepRetrying,
    StepStarted,
    WaitCreated,
)
from flowstream.model.snapshot import RunStatus
from flowstream.model.spec import RetryPolicy
from flowstream.replay.context import WorkflowContext
from flowstream.replay.state import Wakeup
from flowstream.stores.base import EventStore
from tests.semantics.helpers import DELAYED, LATER, SPEC, append, begin, engine_for, types_of
from tests.support import EPOCH, FakeClock, run, spec
from tests.support.stores import StoreFactory


def napper(ctx: WorkflowContext) -> RuntimeCommand:
    """Sleeps on timer ``w`` until LATER, then completes."""
    if ctx.wait_completed("w"):
        return ctx.complete("woke")
    return ctx.wait_until("w", LATER)


def approver(ctx: WorkflowContext) -> RuntimeCommand:
    """Waits for one ``go`` signal and completes with its payload."""
    if ctx.signal_received("sw"):
        return ctx.complete(ctx.signal_payload("sw"))
    return ctx.wait_for_signal("sw", "go")


def hooked(ctx: WorkflowContext) -> RuntimeCommand:
    """Waits on hook ``h``; completes with its payload, or "disposed"."""
    if ctx.hook_disposed("h"):
        return ctx.complete("disposed")
    if ctx.hook_received("h"):
        return ctx.complete(ctx.hook_payload("h"))
    return ctx.create_hook("h", f"token-of-{ctx.run_id}")


# -- timers --------------------------------------------------------------------------------------


def test_resume_wait_completes_the_timer_then_drives(store: EventStore, clock: FakeClock) -> None:
    """§7 timers: resume_wait(run, wait) appends WaitCompleted then drives."""
    engine, _ = engine_for(store, clock, napper)
    run(engine.start("r1", SPEC))
    snapshot = run(engine.resume_wait("r1", "w", now=LATER))
    assert snapshot.output == "woke"
    assert types_of(store)[-2:] == ["wait_completed", "run_completed"]


def test_a_redelivered_timer_appends_nothing(store: EventStore, clock: FakeClock) -> None:
    """§7 timers: redelivery after completion, or after the run is terminal, is a silent no-op
    (no new event)."""
    engine, _ = engine_for(store, clock, napper)
    run(engine.start("r1", SPEC))
    run(engine.resume_wait("r1", "w", now=LATER))
    before = store.read("r1")
    assert run(engine.resume_wait("r1", "w", now=LATER)).status is RunStatus.COMPLETED
    assert store.read("r1") == before


def test_a_timer_of_an_ended_run_is_a_silent_no_op(store: EventStore, clock: FakeClock) -> None:
    """§7 timers: a resume after the run is terminal appends nothing (a force-cancelled run
    keeps its wait waiting, §5.5)."""
    engine, _ = engine_for(store, clock, napper)
    run(engine.start("r1", SPEC))
    run(engine.force_cancel("r1"))
    before = store.read("r1")
    assert run(engine.resume_wait("r1", "w", now=LATER)).status is RunStatus.CANCELLED
    assert store.read("r1") == before


def test_a_timer_cannot_be_resumed_before_its_deadline(store: EventStore, clock: FakeClock) -> None:
    """§7 timers: a direct resume of an open timer before its persisted deadline is rejected."""
    engine, _ = engine_for(store, clock, napper)
    run(engine.start("r1", SPEC))
    with pytest.raises(InvalidTransitionError, match="not yet"):
        run(engine.resume_wait("r1", "w", now=LATER - timedelta(seconds=1)))
    assert types_of(store)[-1] == "wait_created"


def test_the_due_scan_resumes_each_due_timer_once(store: EventStore, clock: FakeClock) -> None:
    """§7 timers: resume_due_waits(now) completes what is due; concurrent or repeated scans:
    only the scan that commits wait_completed reports it."""
    engine, _ = engine_for(store, clock, napper)
    for run_id in ("r1", "r2"):
        run(engine.start(run_id, SPEC))
    early = run(engine.resume_due(LATER - timedelta(seconds=1)))
    assert early.resumed == []
    first = run(engine.resume_due(LATER))
    second = run(engine.resume_due(LATER))
    assert sorted(first.resumed) == ["r1", "r2"] and second.resumed == []
    assert [types_of(store, r).count("wait_completed") for r in ("r1", "r2")] == [1, 1]


# -- delayed retries and the wakeup index --------------------------------------------------------


def test_due_retries_of_a_batch_rerun_together(store: EventStore, clock: FakeClock) -> None:
    """§7 delayed retries: a pending step with retry_after ≤ now is due; resume_due_retries(now)
    drives the run with the cutoff now; all due siblings of a batch re-run."""
    calls: dict[str, int] = {}

    def flaky(invocation: object) -> object:
        step_id = invocation.step_id  # type: ignore[attr-defined]
        calls[step_id] = calls.get(step_id, 0) + 1
        if calls[step_id] == 1:
            raise ConnectionError("once")
        return step_id

    ids = ("a", "b")

    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        if all(ctx.step_completed(i) for i in ids):
            return ctx.complete()
        return ctx.schedule_steps(
            [ctx.step(i, "flaky", None, RetryPolicy.fixed(2, 5000)) for i in ids]
        )

    engine, _ = engine_for(store, clock, workflow, {"flaky": flaky})
    assert run(engine.start("r1", SPEC)).status is RunStatus.SUSPENDED
    tick = run(engine.resume_due(EPOCH + timedelta(seconds=5)))
    assert tick.resumed == ["r1"]
    assert engine.snapshot("r1").status is RunStatus.COMPLETED
    assert calls == {"a": 2, "b": 2}


def test_the_wakeup_index_names_run_kind_subject_and_due_time(store: EventStore) -> None:
    """§7 store discovery: list_due_wakeups(now) and next_scheduled_wakeup() →
    ScheduledWakeup{run_id, kind: wait|retry, subject_id, scheduled_at}."""
    begin(store, WaitCreated(wait_id="w", resume_at=LATER), run_id="timer")
    soon = EPOCH + timedelta(minutes=1)
    begin(
        store,
        StepCreated(step_id="s", step_name="work", retry=DELAYED),
        StepStarted(step_id="s", attempt=1),
        StepRetrying(step_id="s", attempt=1, error="e", retry_after=soon),
        run_id="retry",
    )
    assert store.next_wakeup() == Wakeup(soon, "retry", "retry", "s")
    assert store.due_wakeups(soon) == [Wakeup(soon, "retry", "retry", "s")]
    assert store.due_wakeups(LATER) == [
        Wakeup(soon, "retry", "retry", "s"),
        Wakeup(LATER, "timer", "wait", "w"),
    ]


@pytest.mark.parametrize(
    "end",
    [RunFailed(error="e"), RunContinuedAsNew(successor_run_id="next")],
    ids=["terminal", "continuation"],
)
def test_a_run_that_ends_closes_its_wakeups(store: EventStore, end: object) -> None:
    """§7 store discovery: the wakeup index is closed on cancellation, continuation and terminal
    events (cancellation: §5.5)."""
    begin(store, WaitCreated(wait_id="w", resume_at=LATER), end)  # type: ignore[arg-type]
    assert store.due_wakeups(LATER) == [] and store.next_wakeup() is None


def test_the_scan_leaves_a_run_it_cannot_serve_and_resumes_the_others(
    store: EventStore, clock: FakeClock
) -> None:
    """§7 FlowScheduler: group the due wakeups by run and resume each run once; a run whose
    build is not served here is left for a compatible worker, with nothing appended (the
    reference preflights every route before enqueueing anything; here each run is resumed or
    reported on its own, so one unservable run does not hold the others)."""
    engine, _ = engine_for(store, clock, napper)
    run(engine.start("r1", SPEC))
    pinned = spec("semantics", runtime_build_id="elsewhere")
    append(store, "pinned", RunCreated(spec=pinned))
    append(store, "pinned", RunStarted(), WaitCreated(wait_id="w", resume_at=LATER))
    before = store.read("pinned")
    tick = run(engine.resume_due(LATER))
    assert tick.resumed == ["r1"] and set(tick.failed) == {"pinned"}
    assert store.read("pinned") == before


def test_a_suspended_run_needs_no_process_to_stay_alive(
    stores: StoreFactory, clock: FakeClock
) -> None:
    """Seeds "Suspension does not hold a worker": the process may disappear while a run waits;
    a new one, from the store alone, resumes it when the timer is due."""
    if not stores.durable:
        pytest.skip("a process restart needs a durable store")
    store = stores.open(clock=clock)
    engine, _ = engine_for(store, clock, napper)
    run(engine.start("r1", SPEC))
    store = stores.reopen(store, clock=clock)
    engine, _ = engine_for(store, clock, napper)
    assert engine.next_wakeup() == Wakeup(LATER, "r1", "wait", "w")
    clock.set(LATER)
    assert run(engine.resume_due()).resumed == ["r1"]
    assert engine.snapshot("r1").output == "woke"


# -- signals -------------------------------------------------------------------------------------


def test_a_signal_is_pushed_and_paired_during_the_drive(
    store: EventStore, clock: FakeClock
) -> None:
    """§7 signals: pushed by send_signal; pairing during drive (§5.1 step 7)."""
    engine, _ = engine_for(store, clock, approver)
    run(engine.start("r1", SPEC))
    snapshot = run(engine.send_signal("r1", "sig-1", "go", {"ok": 1}))
    assert snapshot.output == {"ok": 1}
    assert types_of(store)[-3:] == ["signal_received", "signal_wait_completed", "run_completed"]


def test_a_signal_id_is_delivered_once_and_cannot_change(
    store: EventStore, clock: FakeClock
) -> None:
    """§6.6 / §7: WorkflowSignal.signal_id is caller-owned: the same signal again appends
    nothing; the same id with other content is a conflict (SignalConflict)."""
    engine, _ = engine_for(store, clock, lambda ctx: ctx.wait_until("w", LATER))
    run(engine.start("r1", SPEC))
    run(engine.send_signal("r1", "sig-1", "go", 1))
    before = store.read("r1")
    run(engine.send_signal("r1", "sig-1", "go", 1))
    assert store.read("r1") == before
    with pytest.raises(RunConflictError):
        run(engine.send_signal("r1", "sig-1", "go", 2))


@pytest.mark.parametrize("entry", ["signal", "hook"])
def test_a_redelivery_with_other_json_is_a_conflict(
    store: EventStore, clock: FakeClock, entry: str
) -> None:
    """§5.2 / §13: identity comparisons are exact JSON equality, so a redelivery whose payload
    is 1 where the durable one is true carries other content: a conflict, not a duplicate."""
    engine, _ = engine_for(store, clock, hooked)
    run(engine.start("r1", SPEC))
    if entry == "signal":
        run(engine.send_signal("r1", "s1", "go", True))
        again = engine.send_signal("r1", "s1", "go", 1)
    else:
        run(engine.resume_hook("r1", "h", True))
        again = engine.resume_hook("r1", "h", 1)
    with pytest.raises(RunConflictError):
        run(again)


# -- hooks ---------------------------------------------------------------------------------------


def test_a_hook_is_resumed_by_id_or_by_token(store: EventStore, clock: FakeClock) -> None:
    """§7 hooks: pushed by resume_hook(run, hook, payload) and resume_hook_by_token(token,
    payload)."""
    engine, _ = engine_for(store, clock, hooked)
    run(engine.start("r1", SPEC))
    run(engine.start("r2", SPEC))
    assert run(engine.resume_hook("r1", "h", "by-id")).output == "by-id"
    assert run(engine.resume_hook_by_token("token-of-r2", "by-token")).output == "by-token"


def test_an_unknown_token_is_refused_without_echoing_it(
    store: EventStore, clock: FakeClock
) -> None:
    """§7 / §10: public token lookup only finds known hooks (HookTokenNotFound); the error never
    prints the token."""
    engine, _ = engine_for(store, clock, hooked)
    run(engine.start("r1", SPEC))
    with pytest.raises(InvalidTransitionError) as caught:
        run(engine.resume_hook_by_token("not-a-real-token", 1))
    assert "not-a-real-token" not in str(caught.value)


def test_a_late_identical_callback_by_token_is_a_no_op(store: EventStore, clock: FakeClock) -> None:
    """§7 / §10: the reference answers a late callback (hook no longer active) with
    HookTokenNotFound. flowstream answers an identical redelivery with the run's state and
    appends nothing (deliberate: callbacks are retried by senders, and a retry must not fail),
    and still refuses other content."""
    engine, _ = engine_for(store, clock, hooked)
    run(engine.start("r1", SPEC))
    run(engine.resume_hook_by_token("token-of-r1", "first"))
    before = store.read("r1")
    assert run(engine.resume_hook_by_token("token-of-r1", "first")).output == "first"
    assert store.read("r1") == before
    with pytest.raises(RunConflictError):
        run(engine.resume_hook_by_token("token-of-r1", "second"))


def test_dispose_hook_closes_it_and_drives(store: EventStore, clock: FakeClock) -> None:
    """§7 hooks: dispose_hook(run, hook) → HookDisposed, then the run is driven (workflow code
    reads hook_disposed)."""
    engine, _ = engine_for(store, clock, hooked)
    run(engine.start("r1", SPEC))
    assert run(engine.dispose_hook("r1", "h")).output == "disposed"
    assert "hook_disposed" in types_of(store)


# -- child completion ----------------------------------------------------------------------------


def test_a_child_that_advances_on_its_own_wakes_its_parent(
    store: EventStore, clock: FakeClock
) -> None:
    """§7 child completion: the reference has no reverse path (the host must re-drive the
    parent). flowstream drives the parent when its child ends (deliberate: no run waits on a
    host remembering to drive it; the issue 16 liveness invariant)."""

    def parent(ctx: WorkflowContext) -> RuntimeCommand:
        outcome = ctx.child_workflow_outcome("c")
        if outcome is None:
            return ctx.start_child_workflow("c", spec("child", signal_names=("go",)))
        return ctx.complete(outcome.output)

    engine, _ = engine_for(store, clock, {"semantics": parent, "child": approver})
    run(engine.start("r1", SPEC))
    child_run = engine.snapshot("r1").children["c"].run_id
    run(engine.send_signal(child_run, "s1", "go", "from-child"))
    assert engine.snapshot("r1").output == "from-child"

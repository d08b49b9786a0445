"""Statuses, progress and inspection (issue 4): Pending, Running, Suspended (derived), Cancelling
and the terminal outcomes; ``record_progress``; ``summary`` and ``list_open_suspensions``.

The scenarios take ``flows`` and run in both modes (``tests.support.flows``). The tests on the
``store`` fixture use a run started without driving, a simulated crash, or the embedded engine's
inspection API (``summary``, ``list_open_suspensions``); docs/parity.md lists them."""

from __future__ import annotations

from datetime import timedelta

import pytest

from flowstream.engine import FlowEngine
from flowstream.errors import InvalidTransitionError
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import WorkflowProgress
from flowstream.model.snapshot import RunStatus
from flowstream.model.spec import RetryPolicy
from flowstream.replay.context import StepInvocation, WorkflowContext
from flowstream.stores.base import EventStore
from tests.support import EPOCH, Crash, FakeClock, event_types, make_runtime, run, spec, task_failed
from tests.support.flows import Flows

SPEC = spec("status", signal_names=("go",))
DUE = EPOCH + timedelta(minutes=1)


def parks_on(ctx: WorkflowContext) -> RuntimeCommand:
    """Parks on the kind of suspension named in its input."""
    kind = ctx.input
    if ctx.cancellation_request() is not None:
        if not ctx.hook_received("cleanup"):
            return ctx.create_hook("cleanup", f"cleanup-{ctx.run_id}")
        return ctx.cancel()
    if kind == "wait":
        return ctx.wait_until("w", DUE)
    if kind == "hook":
        return ctx.create_hook("h", f"token-{ctx.run_id}")
    if kind == "signal":
        return ctx.wait_for_signal("sw", "go")
    if kind == "retry":
        return ctx.schedule_step("s", "flaky", None, RetryPolicy.fixed(3, 60_000))
    if kind == "child":
        return ctx.start_child_workflow("c", spec("child"), "hook")
    if kind == "crash":
        return ctx.schedule_step("s", "crash")
    return ctx.complete(kind)


def flaky(invocation: StepInvocation) -> object:
    raise ConnectionError("later")


def crash(invocation: StepInvocation) -> object:
    raise Crash


def make_engine(store: EventStore, clock: FakeClock) -> FlowEngine:
    runtime = make_runtime({"*": parks_on}, {"flaky": flaky, "crash": crash})
    return FlowEngine(store, runtime, clock=clock)


@pytest.mark.parametrize("kind", ["wait", "hook", "signal", "retry", "child"])
def test_suspended_is_derived_from_open_work(flows: Flows, kind: str) -> None:
    flow = flows(make_runtime({"*": parks_on}, {"flaky": flaky, "crash": crash}))
    snapshot = flow.start("r1", SPEC, kind)
    assert snapshot.status is RunStatus.SUSPENDED
    assert not snapshot.is_terminal
    # Suspension is a projection, not an event.
    assert "suspended" not in " ".join(event_types(flow.history("r1")))
    assert flow.state("r1").status is RunStatus.RUNNING


def test_pending_running_cancelling_and_terminal_statuses(
    store: EventStore, clock: FakeClock
) -> None:
    engine = make_engine(store, clock)
    assert run(engine.start("pending", SPEC, "hook", drive=False)).status is RunStatus.PENDING
    with pytest.raises(Crash):
        run(engine.start("running", SPEC, "crash"))
    assert engine.snapshot("running").status is RunStatus.RUNNING
    run(engine.start("cancelling", SPEC, "hook"))
    assert run(engine.request_cancellation("cancelling")).status is RunStatus.CANCELLING
    assert run(engine.start("done", SPEC, "finished")).status is RunStatus.COMPLETED


def test_timeout_is_a_failed_status_with_a_timed_out_outcome(flows: Flows) -> None:
    deadline = EPOCH + timedelta(hours=1)
    flow = flows(make_runtime(lambda ctx: ctx.timeout(deadline, "too slow")))
    snapshot = flow.start("r1", SPEC)
    assert snapshot.status is RunStatus.FAILED
    assert snapshot.outcome is not None and snapshot.outcome.type == "timed_out"
    assert snapshot.error == "too slow"


def test_summary_counts_runs_per_status_and_open_suspensions(
    store: EventStore, clock: FakeClock
) -> None:
    engine = make_engine(store, clock)
    for kind in ("wait", "hook", "signal", "retry"):
        run(engine.start(f"r-{kind}", SPEC, kind))
    run(engine.start("r-done", SPEC, "finished"))
    run(engine.start("r-pending", SPEC, "wait", drive=False))
    run(engine.start("r-cancel", SPEC, "wait"))
    run(engine.force_cancel("r-cancel"))

    summary = engine.summary()
    assert summary.total_runs == 7
    assert summary.by_status[RunStatus.SUSPENDED] == 4
    assert summary.by_status[RunStatus.COMPLETED] == 1
    assert summary.by_status[RunStatus.PENDING] == 1
    assert summary.by_status[RunStatus.CANCELLED] == 1
    assert (summary.open_waits, summary.active_hooks, summary.open_signal_waits) == (1, 1, 1)
    assert summary.pending_retries == 1


def test_open_suspensions_are_listed_with_due_flags(store: EventStore, clock: FakeClock) -> None:
    engine = make_engine(store, clock)
    for kind in ("wait", "hook", "signal", "retry"):
        run(engine.start(f"r-{kind}", SPEC, kind))
    run(engine.start("r-gone", SPEC, "wait"))
    run(engine.force_cancel("r-gone"))

    found = engine.list_open_suspensions(DUE)
    by_run = {(s.run_id, s.kind, s.subject_id): s for s in found}
    assert set(by_run) == {
        ("r-wait", "wait", "w"),
        ("r-hook", "hook", "h"),
        ("r-signal", "signal", "sw"),
        ("r-retry", "retry", "s"),
    }
    assert by_run[("r-wait", "wait", "w")].due == DUE
    assert by_run[("r-retry", "retry", "s")].due == DUE  # a minute after the failure at EPOCH
    assert by_run[("r-hook", "hook", "h")].due is None
    due_now = {(s.run_id, s.kind) for s in found if s.is_due}
    assert due_now == {("r-wait", "wait"), ("r-retry", "retry")}
    earlier = engine.list_open_suspensions(DUE - timedelta(microseconds=1))
    assert not any(s.is_due for s in earlier)


# -- progress --------------------------------------------------------------------------------------


def test_progress_is_recorded_and_visible(flows: Flows) -> None:
    def reports(ctx: WorkflowContext) -> RuntimeCommand:
        for index in range(1, 4):
            if ctx.progress(f"batch-{index}") is None:
                return ctx.record_progress(f"batch-{index}", index, 3, f"batch {index} of 3")
        return ctx.complete()

    flow = flows(make_runtime(reports))
    snapshot = flow.start("r1", SPEC)
    assert snapshot.progress == [
        WorkflowProgress(progress_id=f"batch-{i}", completed=i, total=3, message=f"batch {i} of 3")
        for i in (1, 2, 3)
    ]
    assert event_types(flow.history("r1")).count("run_progress_recorded") == 3


def test_re_recording_identical_progress_is_an_invalid_transition(flows: Flows) -> None:
    flow = flows(make_runtime(lambda ctx: ctx.record_progress("p", 1, 2)))
    snapshot = flow.start("r1", SPEC)
    caught = task_failed(snapshot, flow.history("r1"), error=InvalidTransitionError)
    assert "without progress" in caught.message
    assert event_types(flow.history("r1")).count("run_progress_recorded") == 1


def test_progress_beyond_its_total_is_rejected(flows: Flows) -> None:
    flow = flows(make_runtime(lambda ctx: ctx.record_progress("p", 5, 2)))
    with pytest.raises(InvalidTransitionError):
        flow.start("r1", SPEC)
    # (the run waits for a fix: it never settles, so its history is read as it is now)
    assert event_types(flow.history_now("r1")) == ["run_created", "run_started"]

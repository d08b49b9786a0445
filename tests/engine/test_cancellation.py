"""Cancellation (issue 4): a durable, idempotent request; open work made non-actionable; cleanup
with new ids; ``cancel()`` (or ``fail``) to finish; ``complete`` refused while cancelling; and
``force_cancel`` that ends a run without running workflow code.

The scenarios take ``flows`` and run in both modes (``tests.support.flows``). The tests on the
``store`` fixture stop a handler with a simulated crash, plant a history, or start a run
without driving it, which have no Kafka analogue; docs/parity.md lists them."""

from __future__ import annotations

from datetime import timedelta

import pytest

from flowstream.engine import FlowEngine
from flowstream.errors import InvalidTransitionError, RunConflictError
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import RunCreated, RunStarted, StepCreated, StepFailed, StepStarted
from flowstream.model.snapshot import HookStatus, RunStatus, StepStatus, WaitStatus
from flowstream.model.spec import RetryPolicy
from flowstream.replay.context import StepInvocation, WorkflowContext
from flowstream.stores.base import EventStore
from tests.support import (
    EPOCH,
    Crash,
    FakeClock,
    event_types,
    events_of,
    make_runtime,
    run,
    spec,
    task_failed,
)
from tests.support.flows import Flows

SPEC = spec("cancellable", signal_names=("go",))
LATER = EPOCH + timedelta(hours=1)


def parked(kind: str):  # type: ignore[no-untyped-def]
    """Parks on one kind of open work; on cancellation runs step ``cleanup`` then cancels."""

    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        if ctx.cancellation_request() is not None:
            if not ctx.step_completed("cleanup"):
                return ctx.schedule_step("cleanup", "cleanup", {"run": ctx.run_id})
            return ctx.cancel()
        if kind == "hook":
            return ctx.create_hook("h", "cancel-test-token")
        if kind == "wait":
            return ctx.wait_until("w", LATER)
        if kind == "signal":
            return ctx.wait_for_signal("sw", "go")
        return ctx.schedule_step("s", "work")

    return workflow


def cleanup(invocation: StepInvocation) -> object:
    return "cleaned"


def test_a_cancellation_request_runs_cleanup_then_cancels(flows: Flows) -> None:
    runtime = make_runtime(parked("hook"), {"cleanup": cleanup})
    flow = flows(runtime)
    flow.start("r1", SPEC)
    snapshot = flow.cancel("r1", "customer asked")

    assert snapshot.status is RunStatus.CANCELLED
    assert snapshot.error == "customer asked"
    assert snapshot.outcome is not None and snapshot.outcome.type == "cancelled"
    assert snapshot.hooks["h"].status is HookStatus.CANCELLED
    assert snapshot.steps["cleanup"].output == "cleaned"
    assert snapshot.cancellation is not None and snapshot.cancellation.reason == "customer asked"
    types = event_types(flow.history("r1"))
    assert types[3:] == [
        "run_cancellation_requested",
        "step_created",
        "step_started",
        "step_completed",
        "run_cancelled",
    ]
    assert [c.step_id for c in runtime.step_calls] == ["cleanup"]


@pytest.mark.parametrize("kind", ["hook", "wait", "signal"])
def test_open_suspensions_become_non_actionable(
    store: EventStore, clock: FakeClock, kind: str
) -> None:
    def slow_cleanup(invocation: StepInvocation) -> object:
        raise Crash  # stop in the Cancelling state to inspect it

    engine = FlowEngine(store, make_runtime(parked(kind), {"cleanup": slow_cleanup}), clock=clock)
    run(engine.start("r1", SPEC))
    with pytest.raises(Crash):
        run(engine.request_cancellation("r1", "stop"))
    snapshot = engine.snapshot("r1")
    assert snapshot.status is RunStatus.CANCELLING
    if kind == "hook":
        assert snapshot.hooks["h"].status is HookStatus.CANCELLED
        with pytest.raises(InvalidTransitionError):
            run(engine.resume_hook("r1", "h", 1))
    elif kind == "wait":
        assert snapshot.waits["w"].status is WaitStatus.CANCELLED
        assert engine.next_wakeup() is None
        assert store.due_wakeups(LATER) == []  # (resume_due would re-run the crashed step)
    else:
        assert snapshot.signal_waits["sw"].status is WaitStatus.CANCELLED
    assert engine.list_open_suspensions() == []


def test_a_running_step_is_cancelled_and_cannot_be_rescheduled(
    store: EventStore, clock: FakeClock
) -> None:
    def work(invocation: StepInvocation) -> object:
        raise Crash

    def stubborn(ctx: WorkflowContext) -> RuntimeCommand:
        return ctx.schedule_step("s", "work")  # ignores the request, reuses the old id

    engine = FlowEngine(store, make_runtime(parked("step"), {"work": work}), clock=clock)
    with pytest.raises(Crash):
        run(engine.start("r1", SPEC))
    assert engine.snapshot("r1").steps["s"].status is StepStatus.RUNNING
    stubborn_engine = FlowEngine(store, make_runtime(stubborn, {"work": work}), clock=clock)
    snapshot = run(stubborn_engine.request_cancellation("r1", "stop"))
    caught = task_failed(snapshot, store.read("r1"), error=InvalidTransitionError)
    assert "distinct stable identity" in caught.message
    snapshot = engine.snapshot("r1")
    assert snapshot.steps["s"].status is StepStatus.CANCELLED
    assert event_types(store.read("r1"))[-2] == "run_cancellation_requested"


def test_a_cancellation_request_is_idempotent_and_conflicts_on_another_reason(
    flows: Flows,
) -> None:
    def waits_for_cleanup_hook(ctx: WorkflowContext) -> RuntimeCommand:
        if ctx.cancellation_request() is None:
            return ctx.create_hook("h", "first-token")
        if not ctx.hook_received("cleanup"):
            return ctx.create_hook("cleanup", "cleanup-token")
        return ctx.cancel()

    flow = flows(make_runtime(waits_for_cleanup_hook))
    flow.start("r1", SPEC)
    first = flow.cancel("r1", "stop")
    assert first.status is RunStatus.CANCELLING
    flow.cancel("r1", "stop")
    assert len(events_of(flow.history("r1"), "run_cancellation_requested")) == 1
    with pytest.raises(RunConflictError):
        flow.cancel("r1", "another reason")
    assert flow.resume_hook("r1", "cleanup", None).status is RunStatus.CANCELLED
    terminal = flow.cancel("r1", "stop")
    assert terminal.status is RunStatus.CANCELLED
    assert event_types(flow.history("r1"))[-1] == "run_cancelled"


def test_complete_while_cancelling_is_an_invalid_transition(flows: Flows) -> None:
    def completes(ctx: WorkflowContext) -> RuntimeCommand:
        if ctx.cancellation_request() is None and not ctx.hook_received("h"):
            return ctx.create_hook("h", "complete-token")
        return ctx.complete("done anyway")

    flow = flows(make_runtime(completes))
    flow.start("r1", SPEC)
    snapshot = flow.cancel("r1", "stop")
    caught = task_failed(snapshot, flow.history("r1"), error=InvalidTransitionError)
    assert "cancel" in caught.message
    assert event_types(flow.history("r1"))[-2] == "run_cancellation_requested"
    assert flow.snapshot("r1").status is RunStatus.CANCELLING


def test_fail_while_cancelling_is_allowed(flows: Flows) -> None:
    def fails(ctx: WorkflowContext) -> RuntimeCommand:
        if ctx.cancellation_request() is None:
            return ctx.create_hook("h", "fail-token")
        return ctx.fail("could not clean up")

    flow = flows(make_runtime(fails))
    flow.start("r1", SPEC)
    snapshot = flow.cancel("r1", "stop")
    assert snapshot.status is RunStatus.FAILED
    assert snapshot.error == "could not clean up"


def test_cancel_without_a_request_is_an_invalid_transition(flows: Flows) -> None:
    flow = flows(make_runtime(lambda ctx: ctx.cancel()))
    snapshot = flow.start("r1", SPEC)
    caught = task_failed(snapshot, flow.history("r1"), error=InvalidTransitionError)
    assert "cancellation request" in caught.message
    assert event_types(flow.history("r1")) == [
        "run_created",
        "run_started",
        "workflow_task_failed",
    ]


def test_force_cancel_ends_the_run_without_workflow_code(flows: Flows) -> None:
    runtime = make_runtime(parked("wait"), {"cleanup": cleanup})
    flow = flows(runtime)
    flow.start("r1", SPEC)
    calls = len(runtime.workflow_calls)
    snapshot = flow.cancel("r1", "operator", force=True)
    assert snapshot.status is RunStatus.CANCELLED
    assert snapshot.error == "operator"
    assert len(runtime.workflow_calls) == calls
    assert runtime.step_calls == []
    assert event_types(flow.history("r1"))[-1] == "run_cancelled"
    assert flow.next_wakeup() is None
    again = flow.cancel("r1", "twice", force=True)
    assert again.error == "operator"
    assert len(events_of(flow.history("r1"), "run_cancelled")) == 1


def test_force_cancel_frees_the_hook_token(flows: Flows) -> None:
    def approval(ctx: WorkflowContext) -> RuntimeCommand:
        if not ctx.hook_received("h"):
            return ctx.create_hook("h", "cancel-test-token")
        return ctx.complete(ctx.hook_payload("h"))

    flow = flows(make_runtime(approval))
    flow.start("r1", SPEC)
    flow.cancel("r1", force=True)
    assert flow.start("r2", SPEC).status is RunStatus.SUSPENDED
    assert flow.resume_hook_by_token("cancel-test-token", 1).run_id == flow.id("r2")


def test_force_cancel_of_a_pending_run(store: EventStore, clock: FakeClock) -> None:
    runtime = make_runtime(parked("hook"))
    engine = FlowEngine(store, runtime, clock=clock)
    run(engine.start("r1", SPEC, drive=False))
    snapshot = run(engine.force_cancel("r1", "never mind"))
    assert snapshot.status is RunStatus.CANCELLED
    assert runtime.workflow_calls == []


def test_cancellation_of_a_pending_run_ends_it_cancelled(
    store: EventStore, clock: FakeClock
) -> None:
    runtime = make_runtime(parked("hook"), {"cleanup": cleanup})
    engine = FlowEngine(store, runtime, clock=clock)
    run(engine.start("r1", SPEC, drive=False))
    snapshot = run(engine.request_cancellation("r1", "never mind"))
    assert snapshot.status is RunStatus.CANCELLED
    assert "hook_created" not in event_types(store.read("r1"))


def test_a_durable_step_exhaustion_wins_over_a_later_cancellation_request(
    store: EventStore, clock: FakeClock
) -> None:
    # The step failed for good, then the process died before run_retry_exhausted.
    store.append_if_sequence(
        "r1",
        0,
        [
            RunCreated(spec=SPEC, input="step"),
            RunStarted(),
            StepCreated(step_id="s", step_name="work", retry=RetryPolicy.none()),
            StepStarted(step_id="s", attempt=1),
            StepFailed(step_id="s", attempt=1, error="boom"),
        ],
    )
    runtime = make_runtime(parked("step"), {"cleanup": cleanup})
    snapshot = run(FlowEngine(store, runtime, clock=clock).request_cancellation("r1", "late"))
    assert snapshot.status is RunStatus.FAILED
    assert snapshot.outcome is not None and snapshot.outcome.type == "retry_exhausted"
    assert runtime.workflow_calls == []
    assert event_types(store.read("r1"))[-2:] == [
        "run_cancellation_requested",
        "run_retry_exhausted",
    ]

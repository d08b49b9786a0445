"""Workflow-task failures (issue 16): workflow code that raises, returns something that is not a
command, or decides against its own history leaves a durable ``workflow_task_failed`` record,
is retried with capped backoff (and at once on new input or an operator retry), can fail the
run by policy, and never grows the history without bound.

The scenarios take ``flows`` and run in both modes (``tests.support.flows``): on Kafka the task
retry policy is the processor's settings, and its timer scan retries at the processor's clock.
A plain ``drive`` (asking nothing of a run that waits) is the embedded engine's host call; the
Kafka mode has the operator's retry, which asks the code again (docs/parity.md)."""

from __future__ import annotations

import asyncio
import itertools
from datetime import datetime, timedelta

import pytest

from flowstream.engine import FlowEngine
from flowstream.errors import InvalidTransitionError
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import EventEnvelope, RunCreated, RunStarted, WorkflowTaskFailed
from flowstream.model.snapshot import RunStatus
from flowstream.model.spec import RetryPolicy
from flowstream.replay.audit import audit_history
from flowstream.replay.context import StepInvocation, WorkflowContext
from flowstream.replay.state import RunState, Wakeup
from flowstream.replay.task_failures import MESSAGE_LIMIT, TaskRetryPolicy
from flowstream.runtime import FlowRuntime
from flowstream.stores.base import EventStore
from tests.support import (
    EPOCH,
    FakeClock,
    envelope,
    event_types,
    events_of,
    make_runtime,
    run,
    spec,
    task_failed,
)
from tests.support.flows import EmbeddedFlow, Flow, Flows

SPEC = spec("task-failures", signal_names=("go",))


def one_step(ctx: WorkflowContext) -> RuntimeCommand:
    if not ctx.step_completed("a"):
        return ctx.schedule_step("a", "echo", {"id": "a"})
    return ctx.complete(ctx.step_output("a"))


def echo(invocation: StepInvocation) -> object:
    return "out"


class Bug:
    """Workflow code that raises ``KeyError`` after its step while ``on`` (the bug), and
    completes once it is fixed."""

    def __init__(self) -> None:
        self.on = True
        self.calls = 0

    def __call__(self, ctx: WorkflowContext) -> RuntimeCommand:
        self.calls += 1
        if not ctx.step_completed("a"):
            return ctx.schedule_step("a", "echo", {"id": "a"})
        if self.on:
            settings: dict[str, str] = {}
            return ctx.complete(settings["region-of-customer"])
        return ctx.complete(ctx.step_output("a"))


def engine_for(
    store: EventStore, clock: FakeClock, bug: Bug, policy: TaskRetryPolicy | None = None
) -> FlowEngine:
    runtime = make_runtime(bug, {"echo": echo})
    return FlowEngine(store, runtime, clock=clock, task_retry=policy)


def flow_for(flows: Flows, bug: Bug, policy: TaskRetryPolicy | None = None) -> Flow:
    return flows(make_runtime(bug, {"echo": echo}), task_retry=policy)


def failures(flow: Flow, run_id: str = "r1") -> list[WorkflowTaskFailed]:
    return events_of(flow.history(run_id), "workflow_task_failed")


def fire_next(flow: Flow) -> datetime:
    """Move the clock to the next durable deadline and resume what is due there."""
    wakeup = flow.next_wakeup()
    assert wakeup is not None, "nothing is due any more"
    flow.clock.set(wakeup.due)
    flow.fire_due()
    return wakeup.due


def plain_drive(flow: Flow, run_id: str) -> None:
    """Embedded: a drive that asks no code of a run waiting for its retry. A processor has no
    such call (an operator's retry asks the code again: docs/parity.md), so on Kafka the
    scenario goes on without it."""
    if isinstance(flow, EmbeddedFlow):
        run(flow.engine.drive(run_id))


# -- one failure -----------------------------------------------------------------------------------


def test_a_raising_workflow_records_one_failure_and_stays_running(flows: Flows) -> None:
    bug = Bug()
    flow = flow_for(flows, bug)
    snapshot = flow.start("r1", SPEC)
    failure = task_failed(snapshot, flow.history("r1"), error="KeyError")
    assert failure.attempt == 1
    assert "region-of-customer" in failure.message
    assert failure.retry_at == EPOCH + timedelta(seconds=1)
    assert snapshot.status is RunStatus.RUNNING
    assert snapshot.task_failure is not None
    assert snapshot.task_failure.error_type == "KeyError"
    assert flow.snapshot("r1").task_failure == snapshot.task_failure
    assert event_types(flow.history("r1")) == [
        "run_created",
        "run_started",
        "step_created",
        "step_started",
        "step_completed",
        "workflow_task_failed",
    ]
    # the run is suspended on the retry: another drive before it is due asks no code
    calls = bug.calls
    plain_drive(flow, "r1")
    assert flow.snapshot("r1").task_failure == snapshot.task_failure
    assert bug.calls == calls
    assert flow.next_wakeup() == Wakeup(failure.retry_at, flow.id("r1"), "task", "attempt-1")


def test_the_retry_runs_at_its_due_time_and_a_fixed_workflow_completes(flows: Flows) -> None:
    bug = Bug()
    flow = flow_for(flows, bug)
    flow.start("r1", SPEC)
    flow.clock.advance(milliseconds=999)
    flow.fire_due()
    assert len(failures(flow)) == 1  # not due yet
    assert fire_next(flow) == EPOCH + timedelta(seconds=1)
    second = failures(flow)[-1]
    assert (second.attempt, second.retry_at) == (2, EPOCH + timedelta(seconds=3))

    bug.on = False
    fire_next(flow)
    snapshot = flow.snapshot("r1")
    assert snapshot.status is RunStatus.COMPLETED and snapshot.output == "out"
    assert snapshot.task_failure is None
    assert flow.next_wakeup() is None
    assert len(failures(flow)) == 2


def test_backoff_doubles_up_to_its_cap_and_then_waits_for_input(flows: Flows) -> None:
    policy = TaskRetryPolicy(initial_ms=1_000, max_interval_ms=5_000, max_automatic=7)
    flow = flow_for(flows, Bug(), policy)
    flow.start("r1", SPEC)
    while flow.next_wakeup() is not None:
        fire_next(flow)
    recorded = failures(flow)
    assert [f.attempt for f in recorded] == [1, 2, 3, 4, 5, 6, 7]
    delays = [
        (e.event.retry_at - e.timestamp).total_seconds()
        for e in failure_envelopes(flow)
        if isinstance(e.event, WorkflowTaskFailed) and e.event.retry_at is not None
    ]
    assert delays == [1, 2, 4, 5, 5, 5]
    assert recorded[-1].retry_at is None
    snapshot = flow.snapshot("r1")
    assert snapshot.status is RunStatus.RUNNING
    assert snapshot.task_failure is not None and snapshot.task_failure.retry_at is None


def failure_envelopes(flow: Flow) -> list[EventEnvelope]:
    return [e for e in flow.history("r1") if e.event.type == "workflow_task_failed"]


def test_the_default_policy_stops_retrying_by_itself_after_ten_failures(flows: Flows) -> None:
    bug = Bug()
    flow = flow_for(flows, bug)
    flow.start("r1", SPEC)
    while flow.next_wakeup() is not None:
        fire_next(flow)
    recorded = failures(flow)
    assert [f.attempt for f in recorded] == list(range(1, 11))
    assert [f.retry_at is None for f in recorded] == [False] * 9 + [True]
    due = [f.retry_at for f in recorded[:-1] if f.retry_at is not None]
    delays = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(due)]
    assert delays == [2, 4, 8, 16, 32, 64, 128, 256]

    # nothing drives it by itself any more: ticks and plain drives append nothing
    flow.clock.advance(days=1)
    calls = bug.calls
    flow.fire_due()
    plain_drive(flow, "r1")
    assert bug.calls == calls and len(failures(flow)) == 10

    # an operator retry asks the code once more
    snapshot = flow.retry("r1")
    assert snapshot.task_failure is not None and snapshot.task_failure.attempt == 11
    assert snapshot.task_failure.retry_at is None
    bug.on = False
    assert flow.retry("r1").status is RunStatus.COMPLETED


def test_the_delay_is_capped_at_three_hundred_seconds() -> None:
    policy = TaskRetryPolicy()
    assert [policy.delay_ms(a) for a in (1, 2, 9, 10, 50, 10_000)] == [
        1_000,
        2_000,
        256_000,
        300_000,
        300_000,
        300_000,
    ]
    with pytest.raises(ValueError):
        TaskRetryPolicy(max_automatic=0)
    with pytest.raises(ValueError):
        TaskRetryPolicy(initial_ms=10, max_interval_ms=5)


def test_fail_after_fails_the_run_with_the_error(flows: Flows) -> None:
    flow = flow_for(flows, Bug(), TaskRetryPolicy(fail_after=3))
    flow.start("r1", SPEC)
    fire_next(flow)
    fire_next(flow)
    snapshot = flow.snapshot("r1")
    assert snapshot.status is RunStatus.FAILED
    assert snapshot.error is not None
    assert "KeyError" in snapshot.error and "region-of-customer" in snapshot.error
    assert "3 times" in snapshot.error
    assert event_types(flow.history("r1"))[-2:] == ["workflow_task_failed", "run_failed"]
    assert [f.attempt for f in failures(flow)] == [1, 2, 3]
    assert failures(flow)[-1].retry_at is None
    assert flow.next_wakeup() is None


def test_fail_after_one_fails_the_run_at_the_first_failure(flows: Flows) -> None:
    flow = flow_for(flows, Bug(), TaskRetryPolicy(fail_after=1))
    snapshot = flow.start("r1", SPEC)
    assert snapshot.status is RunStatus.FAILED
    assert snapshot.error == "workflow task failed once: KeyError: 'region-of-customer'"


# -- new input retries at once ---------------------------------------------------------------------


def test_a_signal_retries_the_task_at_once(flows: Flows) -> None:
    broken = {"on": True}

    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        if broken["on"]:
            raise RuntimeError("not configured yet")
        return ctx.complete("configured")

    flow = flows(make_runtime(workflow))
    snapshot = flow.start("r1", SPEC)
    assert snapshot.task_failure is not None and snapshot.task_failure.retry_at is not None
    # still broken: the signal is progress, so the count starts again and the retry is asked now
    snapshot = flow.signal("r1", "go", id="s1")
    failure = task_failed(snapshot, flow.history("r1"), error=RuntimeError)
    assert failure.attempt == 1
    broken["on"] = False
    snapshot = flow.signal("r1", "go", id="s2")  # the clock has not moved
    assert snapshot.status is RunStatus.COMPLETED and snapshot.task_failure is None
    assert event_types(flow.history("r1"))[-3:] == [
        "workflow_task_failed",
        "signal_received",
        "run_completed",
    ]


def test_an_invalid_return_is_recorded_as_an_invalid_command(flows: Flows) -> None:
    flow = flows(make_runtime(lambda ctx: None))  # type: ignore[arg-type]
    failure = task_failed(flow.start("r1", SPEC), flow.history("r1"), error="InvalidCommand")
    assert failure.message == "run_workflow returned NoneType, not a RuntimeCommand"


def test_the_message_is_the_exception_text_cut_to_its_limit(flows: Flows) -> None:
    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        raise ValueError("x" * 2_000)

    flow = flows(make_runtime(workflow))
    failure = task_failed(flow.start("r1", SPEC), flow.history("r1"), error=ValueError)
    assert failure.message == "x" * MESSAGE_LIMIT


def test_an_async_workflow_that_raises_is_recorded_the_same_way(flows: Flows) -> None:
    async def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        await asyncio.sleep(0)
        raise LookupError("no tenant")

    flow = flows(make_runtime(workflow))
    failure = task_failed(flow.start("r1", SPEC), flow.history("r1"), error=LookupError)
    assert failure.message == "no tenant"


# -- nondeterminism --------------------------------------------------------------------------------


def test_nondeterminism_is_recorded_and_retried_like_any_failure(flows: Flows) -> None:
    version = {"v": 1}
    broken = {"on": True}

    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        if not ctx.step_completed("a"):
            retry = RetryPolicy.fixed(3, 60_000)
            return ctx.schedule_step("a", "work", {"v": version["v"]}, retry=retry)
        return ctx.complete(ctx.step_output("a"))

    def work(invocation: StepInvocation) -> object:
        if broken["on"]:
            raise RuntimeError("step failed")
        return "worked"

    flow = flows(make_runtime(workflow, {"work": work}))
    flow.start("r1", SPEC)  # attempt 1 failed; its retry waits a minute
    version["v"] = 2  # a deployment that changed the step's input
    broken["on"] = False
    fire_next(flow)
    failure = failures(flow)[-1]
    assert failure.error_type == "NonDeterministicError"
    assert "history=" in failure.message and "replay=" in failure.message
    assert flow.snapshot("r1").task_failure is not None
    version["v"] = 1  # rolled back
    fire_next(flow)
    assert flow.snapshot("r1").status is RunStatus.COMPLETED


# -- replay and audit ------------------------------------------------------------------------------


def audit(flow: Flow, runtime: FlowRuntime) -> object:
    return run(audit_history(flow.history("r1"), lambda spec: runtime))


def test_a_history_with_failure_records_replays_to_the_same_decisions(flows: Flows) -> None:
    bug = Bug()
    flow = flow_for(flows, bug)
    flow.start("r1", SPEC)
    fire_next(flow)
    flow.retry("r1")  # an operator retry before the due time
    bug.on = False
    fire_next(flow)
    history = flow.history("r1")
    assert event_types(history).count("workflow_task_failed") == 3
    assert history[-1].event.type == "run_completed"

    report = audit(flow, make_runtime(bug, {"echo": echo}))
    assert report.ok, report.problems  # type: ignore[attr-defined]
    assert report.decisions_checked == 2  # type: ignore[attr-defined]

    # the same run without the failures decides exactly the same events
    flow.start("r2", SPEC)
    decisions = [e.event for e in history if e.event.type != "workflow_task_failed"]
    assert [e.event for e in flow.history("r2")] == decisions


def test_a_run_the_policy_failed_audits_clean(flows: Flows) -> None:
    bug = Bug()
    flow = flow_for(flows, bug, TaskRetryPolicy(fail_after=2))
    flow.start("r1", SPEC)
    fire_next(flow)
    assert flow.snapshot("r1").status is RunStatus.FAILED
    report = audit(flow, make_runtime(bug, {"echo": echo}))
    assert report.ok, report.problems  # type: ignore[attr-defined]


def test_a_workflow_fail_after_task_failures_is_still_checked(flows: Flows) -> None:
    """A run_failed the workflow returned is a decision the audit replays, failures or not."""
    bug = Bug()

    def fails_when_fixed(ctx: WorkflowContext) -> RuntimeCommand:
        if bug.on:
            raise RuntimeError("broken")
        return ctx.fail("gave up")

    flow = flows(make_runtime(fails_when_fixed))
    flow.start("r1", SPEC)
    bug.on = False
    flow.retry("r1")
    assert flow.snapshot("r1").status is RunStatus.FAILED
    report = audit(flow, make_runtime(lambda ctx: ctx.fail("another reason")))
    assert not report.ok  # type: ignore[attr-defined]


# -- bounded history -------------------------------------------------------------------------------


def test_fifty_rounds_of_failures_grow_the_history_by_at_most_max_automatic(
    flows: Flows,
) -> None:
    def always(ctx: WorkflowContext) -> RuntimeCommand:
        raise RuntimeError("always broken")

    flow = flows(make_runtime(always))
    flow.start("r1", SPEC)
    for _ in range(50):
        flow.clock.advance(seconds=400)
        flow.fire_due()
        plain_drive(flow, "r1")
    assert len(failures(flow)) == TaskRetryPolicy().max_automatic
    assert len(flow.history("r1")) == 2 + TaskRetryPolicy().max_automatic


# -- the record's state machine --------------------------------------------------------------------


def test_failure_records_follow_the_state_machine() -> None:
    created = envelope("r1", 1, RunCreated(spec=SPEC))
    state = RunState.first(created)
    failed = WorkflowTaskFailed(attempt=1, error_type="KeyError", message="k")
    with pytest.raises(InvalidTransitionError, match="before run_started"):
        state.apply(envelope("r1", 2, failed))
    state.apply(envelope("r1", 2, RunStarted()))
    with pytest.raises(InvalidTransitionError, match="attempt 2 where 1 is next"):
        state.apply(envelope("r1", 3, failed.model_copy(update={"attempt": 2})))
    state.apply(envelope("r1", 3, failed))
    state.apply(envelope("r1", 4, failed.model_copy(update={"attempt": 2})))
    assert state.task_failure is not None and state.task_failure.attempt == 2
    assert state.wakeups() == []  # no retry_at: no deadline


# -- item 7: the replay-iteration limit ------------------------------------------------------------


def test_a_run_that_completes_on_the_last_allowed_iteration_is_returned(
    store: EventStore, clock: FakeClock
) -> None:
    """start, schedule, complete: three iterations; the limit of three must not raise."""
    engine = FlowEngine(
        store, make_runtime(one_step, {"echo": echo}), clock=clock, max_replay_iterations=3
    )
    snapshot = run(engine.start("r1", SPEC))
    assert snapshot.status is RunStatus.COMPLETED
    assert event_types(store.read("r1"))[-1] == "run_completed"

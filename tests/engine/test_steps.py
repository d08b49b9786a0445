"""Steps (issue 3): durability before the handler, at-least-once redelivery of the same attempt,
retries (immediate, fixed, exponential with deterministic jitter), exhaustion and non-retryable
failures, and the no-progress rule.

The scenarios take ``flows`` and run in both modes (``tests.support.flows``): on Kafka the
processor runs the handlers and its timer scan fires delayed retries at its clock. The tests on
the ``store`` fixture crash a handler, plant a history, reopen a store, count a store's
durability waits or call the host's ``resume_due`` with its own cutoff; docs/parity.md lists
them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from flowstream.engine import FlowEngine
from flowstream.errors import (
    FlowError,
    InvalidTransitionError,
    NonRetryableError,
    SerializationError,
    UnknownOutcomeError,
)
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import RunCreated, RunStarted, StepCreated, StepStarted
from flowstream.model.snapshot import RunStatus, StepStatus
from flowstream.model.spec import RetryPolicy
from flowstream.replay.context import StepInvocation, WorkflowContext
from flowstream.replay.state import Wakeup
from flowstream.stores.base import EventStore
from flowstream.stores.memory import MemoryEventStore
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
from tests.support.flows import EmbeddedFlow, Flows
from tests.support.stores import StoreFactory

SPEC = spec("steps")


def one_step(retry: RetryPolicy | None = None, *, fallback: bool = False):  # type: ignore[no-untyped-def]
    """A workflow that runs step ``s`` (handler ``work``) and completes with its output."""

    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        if ctx.step_completed("s"):
            return ctx.complete(ctx.step_output("s"))
        if fallback and ctx.step_failed("s") is not None:
            return ctx.complete({"fallback": ctx.step_failed("s")})
        return ctx.schedule_step("s", "work", {"item": 7}, retry)

    return workflow


def failing(times: int, exc: type[Exception] = ConnectionError):  # type: ignore[no-untyped-def]
    """A handler that fails ``times`` times, then returns its attempt number."""
    calls = {"n": 0}

    def handler(invocation: StepInvocation) -> object:
        calls["n"] += 1
        if calls["n"] <= times:
            raise exc(f"failure {calls['n']}")
        return {"attempt": invocation.attempt}

    return handler


# -- durability and redelivery -------------------------------------------------------------------


def test_step_created_and_started_are_durable_before_the_handler_runs(flows: Flows) -> None:
    seen: list[list[str]] = []
    look: list[Any] = []

    def work(invocation: StepInvocation) -> object:
        seen.append(event_types(look[0].history_now(invocation.run_id)))
        assert invocation.history[-1].event.type == "step_started"
        return 1

    flow = flows(make_runtime(one_step(), {"work": work}))
    look.append(flow)
    flow.start("r1", SPEC)
    assert seen == [["run_created", "run_started", "step_created", "step_started"]]


class _GroupCommitStore(MemoryEventStore):
    """A memory store that tracks what ``wait_durable`` has covered, as a group-commit store
    (RocksDB's default) would: appends become durable only when a host waits for them."""

    def __init__(self, *, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.appends = 0
        self.durable = 0

    def append_if_sequence(self, run_id, expected_sequence, events):  # type: ignore[no-untyped-def]
        appended = super().append_if_sequence(run_id, expected_sequence, events)
        self.appends += 1
        return appended

    async def wait_durable(self) -> None:
        self.durable = self.appends


@pytest.mark.parametrize("eager", [False, True], ids=["strict", "eager"])
def test_eager_steps_start_the_handler_before_its_record_is_durable_never_the_result(
    clock: FakeClock, eager: bool
) -> None:
    store = _GroupCommitStore(clock=clock)
    at_handler: list[tuple[int, int]] = []

    def work(invocation: StepInvocation) -> object:
        at_handler.append((store.durable, store.appends))
        return 1

    engine = FlowEngine(
        store, make_runtime(one_step(), {"work": work}), clock=clock, eager_steps=eager
    )
    snapshot = run(engine.start("r1", SPEC))
    [(durable, appended)] = at_handler
    if eager:
        assert durable < appended  # step_started was not waited for
    else:
        assert durable == appended  # every append, step_started included, was durable
    assert snapshot.output == 1
    assert store.durable == store.appends  # the state start() reports is durable either way


def test_step_invocation_carries_identity_attempt_input_and_key(flows: Flows) -> None:
    runtime = make_runtime(one_step(), {"work": lambda inv: 1})
    flow = flows(runtime)
    flow.start("order-9", SPEC)
    [invocation] = runtime.step_calls
    assert invocation.run_id == flow.id("order-9")
    assert invocation.step_id == "s"
    assert invocation.step_name == "work"
    assert invocation.attempt == 1
    assert invocation.input == {"item": 7}
    assert flow.id("order-9") in invocation.idempotency_key and "s" in invocation.idempotency_key


def test_crash_after_the_side_effect_reruns_the_same_attempt_with_the_same_key(
    store: EventStore, clock: FakeClock
) -> None:
    ledger: dict[str, int] = {}  # an external system that deduplicates by idempotency key
    crashes = {"left": 1}

    def charge(invocation: StepInvocation) -> object:
        ledger.setdefault(invocation.idempotency_key, invocation.attempt)
        if crashes["left"]:
            crashes["left"] -= 1
            raise Crash  # the process dies before step_completed is committed
        return {"charged": len(ledger)}

    first = make_runtime(one_step(), {"work": charge})
    with pytest.raises(Crash):
        run(FlowEngine(store, first, clock=clock).start("r1", SPEC))
    assert event_types(store.read("r1"))[-1] == "step_started"

    second = make_runtime(one_step(), {"work": charge})
    snapshot = run(FlowEngine(store, second, clock=clock).drive("r1"))
    assert snapshot.output == {"charged": 1}
    assert first.step_calls[0].attempt == second.step_calls[0].attempt == 1
    assert first.step_calls[0].idempotency_key == second.step_calls[0].idempotency_key
    history = store.read("r1")
    assert len(events_of(history, "step_started")) == 1
    assert len(events_of(history, "step_completed")) == 1


def test_a_running_step_found_in_history_is_redelivered_without_a_new_start(
    store: EventStore, clock: FakeClock
) -> None:
    store.append_if_sequence(
        "r1",
        0,
        [
            RunCreated(spec=SPEC),
            RunStarted(),
            StepCreated(step_id="s", step_name="work", input={"item": 7}),
            StepStarted(step_id="s", attempt=1),
        ],
    )
    runtime = make_runtime(one_step(), {"work": lambda inv: inv.attempt})
    snapshot = run(FlowEngine(store, runtime, clock=clock).drive("r1"))
    assert snapshot.output == 1
    assert [c.attempt for c in runtime.step_calls] == [1]
    assert event_types(store.read("r1"))[4:] == ["step_completed", "run_completed"]


def test_idempotency_key_is_stable_across_attempts_and_distinct_per_step(flows: Flows) -> None:
    def two(ctx: WorkflowContext) -> RuntimeCommand:
        if not ctx.step_completed("s"):
            return ctx.schedule_step("s", "work", None)
        if not ctx.step_completed("t"):
            return ctx.schedule_step("t", "ok", None)
        return ctx.complete()

    runtime = make_runtime(two, {"work": failing(2), "ok": lambda inv: 1})
    flows(runtime).start("r1", SPEC)
    keys = {c.step_id: set() for c in runtime.step_calls}  # type: ignore[var-annotated]
    for call in runtime.step_calls:
        keys[call.step_id].add(call.idempotency_key)
    assert [c.attempt for c in runtime.calls_of("s")] == [1, 2, 3]
    assert len(keys["s"]) == 1 and len(keys["t"]) == 1
    assert keys["s"] != keys["t"]


# -- retries ------------------------------------------------------------------------------------


def test_immediate_retries_run_in_the_same_drive(flows: Flows) -> None:
    flow = flows(make_runtime(one_step(), {"work": failing(2)}))
    snapshot = flow.start("r1", SPEC)
    assert snapshot.status is RunStatus.COMPLETED
    assert snapshot.output == {"attempt": 3}
    retries = events_of(flow.history("r1"), "step_retrying")
    assert [(r.attempt, r.retry_after) for r in retries] == [(1, None), (2, None)]
    assert retries[0].error == "ConnectionError: failure 1"


def test_fixed_delay_retry_is_a_durable_deadline_resumed_by_the_scheduler(flows: Flows) -> None:
    runtime = make_runtime(one_step(RetryPolicy.fixed(3, 1000)), {"work": failing(1)})
    flow = flows(runtime)
    snapshot = flow.start("r1", SPEC)

    due = EPOCH + timedelta(seconds=1)
    assert snapshot.status is RunStatus.SUSPENDED
    assert snapshot.steps["s"].status is StepStatus.PENDING
    assert snapshot.steps["s"].retry_after == due
    assert flow.next_wakeup() == Wakeup(due, flow.id("r1"), "retry", "s")
    calls = len(runtime.workflow_calls)

    assert flow.retry("r1").status is RunStatus.SUSPENDED  # not yet due
    flow.clock.set(due - timedelta(milliseconds=1))
    flow.fire_due()
    assert len(runtime.workflow_calls) == calls and len(runtime.step_calls) == 1

    flow.clock.set(due)
    flow.fire_due()
    final = flow.snapshot("r1")
    assert final.status is RunStatus.COMPLETED
    assert final.output == {"attempt": 2}
    assert flow.next_wakeup() is None


def test_resume_due_uses_the_scheduler_cutoff_even_when_the_clock_lags(
    store: EventStore, clock: FakeClock
) -> None:
    engine = FlowEngine(
        store, make_runtime(one_step(RetryPolicy.fixed(2, 5000)), {"work": failing(1)}), clock=clock
    )
    run(engine.start("r1", SPEC))
    tick = run(engine.resume_due(EPOCH + timedelta(seconds=5)))
    assert tick.resumed == ["r1"]
    assert engine.snapshot("r1").status is RunStatus.COMPLETED


def test_exponential_delays_use_deterministic_jitter(flows: Flows) -> None:
    policy = RetryPolicy.exponential(4, 100, 1000)
    flow = flows(make_runtime(one_step(policy), {"work": failing(99)}))
    flow.start("r1", SPEC)
    for _ in range(3):
        wakeup = flow.next_wakeup()
        assert wakeup is not None
        flow.clock.set(wakeup.due)
        flow.fire_due()
    history = flow.history("r1")
    retries = events_of(history, "step_retrying")
    starts = [e for e in history if e.event.type == "step_retrying"]
    delays = [r.retry_after - s.timestamp for r, s in zip(retries, starts, strict=True)]
    assert len(delays) == 3
    for attempt, delay in enumerate(delays, start=1):
        cap = min(100 * 2 ** (attempt - 1), 1000)
        assert timedelta(milliseconds=1) <= delay <= timedelta(milliseconds=cap)
        # a function of run, step and attempt alone: the same every time
        assert delay == timedelta(milliseconds=policy.delay_for(flow.id("r1"), "s", attempt))


def test_exhausted_fail_run_policy_ends_the_run(flows: Flows) -> None:
    runtime = make_runtime(one_step(RetryPolicy.fixed(2, 0)), {"work": failing(99)})
    flow = flows(runtime)
    snapshot = flow.start("r1", SPEC)
    assert snapshot.status is RunStatus.FAILED
    assert snapshot.outcome is not None
    assert snapshot.outcome.type == "retry_exhausted"
    assert snapshot.outcome.step_id == "s"
    assert snapshot.steps["s"].status is StepStatus.FAILED
    assert event_types(flow.history("r1"))[-2:] == ["step_failed", "run_retry_exhausted"]
    assert len(runtime.step_calls) == 2
    assert len(runtime.workflow_calls) == 2  # never asked again after the failure


def test_exhausted_continue_workflow_policy_hands_the_failure_to_workflow_code(
    flows: Flows,
) -> None:
    policy = RetryPolicy.fixed(2, 0).continue_workflow_on_failure()
    flow = flows(make_runtime(one_step(policy, fallback=True), {"work": failing(99)}))
    snapshot = flow.start("r1", SPEC)
    assert snapshot.status is RunStatus.COMPLETED
    assert snapshot.output == {"fallback": "ConnectionError: failure 2"}
    assert "run_retry_exhausted" not in event_types(flow.history("r1"))


@pytest.mark.parametrize("exc", [NonRetryableError, UnknownOutcomeError])
def test_non_retryable_errors_skip_the_retry_budget(flows: Flows, exc: type[Exception]) -> None:
    runtime = make_runtime(one_step(RetryPolicy.fixed(5, 1000)), {"work": failing(1, exc)})
    flow = flows(runtime)
    snapshot = flow.start("r1", SPEC)
    assert len(runtime.step_calls) == 1
    assert snapshot.status is RunStatus.FAILED
    assert snapshot.steps["s"].status is StepStatus.FAILED
    assert "failure 1" in (snapshot.error or "")
    assert event_types(flow.history("r1"))[-2:] == ["step_non_retryable", "run_failed"]
    assert "step_retrying" not in event_types(flow.history("r1"))


def test_non_retryable_with_continue_workflow_is_seen_by_workflow_code(flows: Flows) -> None:
    policy = RetryPolicy.fixed(5, 0).continue_workflow_on_failure()
    runtime = make_runtime(one_step(policy, fallback=True), {"work": failing(1, NonRetryableError)})
    snapshot = flows(runtime).start("r1", SPEC)
    assert snapshot.output == {"fallback": "NonRetryableError: failure 1"}
    assert len(runtime.step_calls) == 1


def test_a_delayed_retry_survives_a_restart(
    stores: StoreFactory, store: EventStore, clock: FakeClock
) -> None:
    engine = FlowEngine(
        store,
        make_runtime(one_step(RetryPolicy.fixed(2, 60_000)), {"work": failing(1)}),
        clock=clock,
    )
    run(engine.start("r1", SPEC))
    reopened = stores.reopen(store, clock=clock)
    later = clock.advance(minutes=1)
    runtime = make_runtime(
        one_step(RetryPolicy.fixed(2, 60_000)), {"work": lambda inv: inv.attempt}
    )
    engine = FlowEngine(reopened, runtime, clock=clock)
    assert engine.next_wakeup() == Wakeup(later, "r1", "retry", "s")
    assert run(engine.resume_due(later)).resumed == ["r1"]
    assert engine.snapshot("r1").output == 2


# -- no progress, typed decoding -----------------------------------------------------------------


def test_rescheduling_a_terminal_step_is_an_invalid_transition_not_a_loop(flows: Flows) -> None:
    runtime = make_runtime(lambda ctx: ctx.schedule_step("s", "work"), {"work": lambda inv: 1})
    flow = flows(runtime)
    snapshot = flow.start("r1", SPEC)
    caught = task_failed(snapshot, flow.history("r1"), error=InvalidTransitionError)
    assert "terminal step s" in caught.message
    assert len(runtime.workflow_calls) == 2
    assert len(runtime.step_calls) == 1
    assert event_types(flow.history("r1"))[-2] == "step_completed"


def test_rescheduling_a_failed_continue_workflow_step_is_an_invalid_transition(
    flows: Flows,
) -> None:
    policy = RetryPolicy.none().continue_workflow_on_failure()
    runtime = make_runtime(one_step(policy), {"work": failing(99)})
    flow = flows(runtime)
    task_failed(flow.start("r1", SPEC), flow.history("r1"), error=InvalidTransitionError)
    assert len(runtime.step_calls) == 1
    assert len(runtime.workflow_calls) == 2


class Receipt(BaseModel):
    receipt_id: str


def test_typed_decoding_failures_are_serialization_errors(flows: Flows) -> None:
    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        if not ctx.step_completed("s"):
            return ctx.schedule_step("s", "work")
        return ctx.complete(ctx.step_output_as("s", Receipt).receipt_id)  # type: ignore[union-attr]

    flow = flows(make_runtime(workflow, {"work": lambda inv: {"wrong": "shape"}}))
    snapshot = flow.start("r1", SPEC)
    caught = task_failed(snapshot, flow.history("r1"), error=SerializationError)
    assert "Receipt" in caught.message
    assert event_types(flow.history("r1"))[-2] == "step_completed"

    ok = flows(make_runtime(workflow, {"work": lambda inv: {"receipt_id": "rc-1"}}))
    assert ok.start("r2", SPEC).output == "rc-1"


def test_a_non_json_step_output_is_reported_as_a_flow_error(flows: Flows) -> None:
    # A datetime is stored as its ISO text (``model.payloads``); an arbitrary object is not JSON.
    runtime = make_runtime(one_step(RetryPolicy.none()), {"work": lambda inv: {"at": object()}})
    flow = flows(runtime)
    try:
        snapshot = flow.start("r1", SPEC)
    except FlowError:
        assert isinstance(flow, EmbeddedFlow)
        assert event_types(flow.history("r1"))[-1] == "step_started"
    else:
        assert snapshot.steps["s"].status is StepStatus.FAILED


def test_an_unrepresentable_retry_delay_is_rejected_before_the_step_runs(flows: Flows) -> None:
    runtime = make_runtime(one_step(RetryPolicy.fixed(2, 10**15)), {"work": failing(1)})
    flow = flows(runtime)
    task_failed(flow.start("r1", SPEC), flow.history("r1"), error=InvalidTransitionError)
    assert runtime.step_calls == []
    assert event_types(flow.history("r1")) == [
        "run_created",
        "run_started",
        "workflow_task_failed",
    ]

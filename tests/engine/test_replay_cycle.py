"""The replay cycle (issue 3): history → snapshot → run_workflow → one validated command → append
at the expected sequence → repeat, until a durable wait or a terminal outcome.

The scenarios take ``flows`` and run in both modes (``tests.support.flows``); the processor runs
the same cycle (``PartitionEngine`` is a ``FlowEngine``). The tests on the ``store`` fixture are
the cycle's internals: races between writers, crashes, stores that return bad histories, the
iteration bound (an engine option), a reopened store; docs/parity.md lists them."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from flowstream.engine import FlowEngine
from flowstream.errors import (
    CorruptHistoryError,
    EventConflictError,
    LimitExceededError,
    RunConflictError,
    RunNotFoundError,
)
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import (
    EventEnvelope,
    FlowEvent,
    RunCompleted,
    RunCreated,
    RunStarted,
    SignalReceived,
    StepCompleted,
    StepCreated,
)
from flowstream.model.snapshot import RunStatus, StepStatus
from flowstream.replay.context import StepInvocation, WorkflowContext
from flowstream.stores.base import EventStore
from flowstream.stores.memory import MemoryEventStore
from tests.support import (
    Crash,
    FakeClock,
    envelope,
    event_types,
    events_of,
    make_runtime,
    run,
    spec,
    task_failed,
)
from tests.support.flows import EmbeddedFlow, Flows
from tests.support.stores import StoreFactory

SPEC = spec("three-steps")


def three_steps(ctx: WorkflowContext) -> RuntimeCommand:
    for step_id in ("a", "b", "c"):
        if not ctx.step_completed(step_id):
            return ctx.schedule_step(step_id, "echo", {"id": step_id})
    return ctx.complete([ctx.step_output(s) for s in ("a", "b", "c")])


def echo(invocation: StepInvocation) -> object:
    assert isinstance(invocation.input, dict)
    return f"out-{invocation.input['id']}"


def assert_contiguous(history: Sequence[EventEnvelope]) -> None:
    assert [e.sequence for e in history] == list(range(1, len(history) + 1))
    assert len({e.event_id for e in history}) == len(history)


def test_a_run_replays_one_decision_per_cycle_until_it_completes(flows: Flows) -> None:
    runtime = make_runtime(three_steps, {"echo": echo})
    flow = flows(runtime)
    snapshot = flow.start("order-1", SPEC, {"x": 1})

    assert snapshot.status is RunStatus.COMPLETED
    assert snapshot.output == ["out-a", "out-b", "out-c"]
    history = flow.history("order-1")
    assert event_types(history) == [
        "run_created",
        "run_started",
        *["step_created", "step_started", "step_completed"] * 3,
        "run_completed",
    ]
    assert_contiguous(history)
    assert history[-1].event.event_key() == "flow.run.completed"
    assert history[4].event.event_key() == "flow.step.completed"
    # One invocation per decision, each over the complete history committed so far.
    calls = runtime.workflow_calls
    assert [c.last_sequence for c in calls] == [2, 5, 8, 11]
    assert all(c.history_types[0] == "run_created" for c in calls)
    assert [c.step_id for c in runtime.step_calls] == ["a", "b", "c"]


def test_snapshot_is_a_projection_of_the_history(flows: Flows) -> None:
    flow = flows(make_runtime(three_steps, {"echo": echo}))
    flow.start("r1", SPEC, {"x": 1})
    snapshot = flow.snapshot("r1")
    assert snapshot.run_id == flow.id("r1")
    assert snapshot.spec == SPEC
    assert snapshot.input == {"x": 1}
    assert snapshot.last_sequence == len(flow.history("r1"))
    assert snapshot.steps["b"].status is StepStatus.COMPLETED
    assert snapshot.steps["b"].output == "out-b"
    assert snapshot.steps["b"].attempt == 1
    assert snapshot.outcome is not None and snapshot.outcome.type == "completed"
    assert snapshot.updated_at == flow.clock.now
    if isinstance(flow, EmbeddedFlow):
        assert flow.engine.list_runs() == ["r1"]  # (a Kafka deployment is read per run)


def test_a_completed_run_is_never_recomputed(flows: Flows) -> None:
    runtime = make_runtime(three_steps, {"echo": echo})
    flow = flows(runtime)
    flow.start("r1", SPEC)
    before = flow.history("r1")
    calls = (len(runtime.workflow_calls), len(runtime.step_calls))
    again = flow.retry("r1")
    assert again.status is RunStatus.COMPLETED
    assert flow.history("r1") == before
    assert (len(runtime.workflow_calls), len(runtime.step_calls)) == calls


def test_committed_step_outputs_are_not_recomputed_by_a_new_engine(
    store: EventStore, clock: FakeClock
) -> None:
    crash_on = {"b"}

    def flaky_echo(invocation: StepInvocation) -> object:
        if invocation.step_id in crash_on:
            crash_on.clear()
            raise Crash
        return echo(invocation)

    first = make_runtime(three_steps, {"echo": flaky_echo})
    with pytest.raises(Crash):
        run(FlowEngine(store, first, clock=clock).start("r1", SPEC))
    assert [c.step_id for c in first.step_calls] == ["a", "b"]

    second = make_runtime(three_steps, {"echo": flaky_echo})
    snapshot = run(FlowEngine(store, second, clock=clock).drive("r1"))
    assert snapshot.status is RunStatus.COMPLETED
    assert [c.step_id for c in second.step_calls] == ["b", "c"]  # never "a" again
    assert len(events_of(store.read("r1"), "step_completed")) == 3


def test_start_is_idempotent_for_the_same_spec_and_input(flows: Flows) -> None:
    flow = flows(make_runtime(three_steps, {"echo": echo}))
    flow.start("r1", SPEC, {"x": 1})
    length = len(flow.history("r1"))
    again = flow.start("r1", SPEC, {"x": 1})
    assert again.status is RunStatus.COMPLETED
    assert len(flow.history("r1")) == length
    assert len(events_of(flow.history("r1"), "run_created")) == 1


@pytest.mark.parametrize(
    ("other_spec", "other_input", "fragment"),
    [
        (spec("three-steps", version="2"), {"x": 1}, "spec"),
        (SPEC, {"x": 2}, "input"),
    ],
)
def test_start_with_another_spec_or_input_conflicts(
    flows: Flows, other_spec: object, other_input: object, fragment: str
) -> None:
    flow = flows(make_runtime(three_steps, {"echo": echo}))
    if isinstance(flow, EmbeddedFlow):
        run(flow.engine.start("r1", SPEC, {"x": 1}, drive=False))
    else:
        flow.start("r1", SPEC, {"x": 1})  # no run that is not started (docs/parity.md)
    before = flow.history("r1")
    with pytest.raises(RunConflictError) as caught:
        flow.start("r1", other_spec, other_input)  # type: ignore[arg-type]
    assert fragment in str(caught.value)
    assert caught.value.run_id == flow.id("r1")
    assert flow.history("r1") == before


def test_start_without_driving_leaves_a_pending_run(store: EventStore, clock: FakeClock) -> None:
    runtime = make_runtime(three_steps, {"echo": echo})
    engine = FlowEngine(store, runtime, clock=clock)
    snapshot = run(engine.start("r1", SPEC, drive=False))
    assert snapshot.status is RunStatus.PENDING
    assert runtime.workflow_calls == []
    assert run(engine.drive("r1")).status is RunStatus.COMPLETED


def test_unknown_run_is_run_not_found(flows: Flows) -> None:
    flow = flows(make_runtime(three_steps, {"echo": echo}))
    with pytest.raises(RunNotFoundError):
        flow.retry("ghost")
    with pytest.raises(RunNotFoundError):
        flow.snapshot("ghost")
    with pytest.raises(RunNotFoundError):
        flow.history("ghost")


def test_workflow_code_must_return_a_runtime_command(flows: Flows) -> None:
    flow = flows(make_runtime(lambda ctx: {"not": "a command"}))
    task_failed(flow.start("r1", SPEC), flow.history("r1"), error="InvalidCommand")
    assert event_types(flow.history("r1")) == [
        "run_created",
        "run_started",
        "workflow_task_failed",
    ]


def test_replay_iterations_are_bounded(store: EventStore) -> None:
    def forever(ctx: WorkflowContext) -> RuntimeCommand:
        return ctx.record_progress(f"p{len(ctx.history)}", len(ctx.history))

    engine = FlowEngine(store, make_runtime(forever), max_replay_iterations=5)
    with pytest.raises(LimitExceededError):
        run(engine.start("r1", SPEC))
    assert len(events_of(engine.history("r1"), "run_progress_recorded")) <= 5


# -- concurrency --------------------------------------------------------------------------------


class RacingStore(MemoryEventStore):
    """Lets another writer commit a signal just before the engine's first step append."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.raced = 0
        self.conflicts = 0

    def append_if_sequence(
        self, run_id: str, expected_sequence: int, events: Sequence[FlowEvent]
    ) -> list[EventEnvelope]:
        if not self.raced and any(isinstance(e, StepCreated) for e in events):
            self.raced += 1
            super().append_if_sequence(
                run_id, expected_sequence, [SignalReceived(signal_id="s1", name="poke")]
            )
        try:
            return super().append_if_sequence(run_id, expected_sequence, events)
        except EventConflictError:
            self.conflicts += 1
            raise


def test_a_lost_append_race_rereads_and_replays() -> None:
    store = RacingStore()
    racing_spec = spec("three-steps", signal_names=("poke",))
    runtime = make_runtime(three_steps, {"echo": echo})
    snapshot = run(FlowEngine(store, runtime).start("r1", racing_spec))
    assert snapshot.status is RunStatus.COMPLETED
    assert store.raced == 1 and store.conflicts == 1
    history = store.read("r1")
    assert_contiguous(history)
    assert event_types(history)[:4] == [
        "run_created",
        "run_started",
        "signal_received",
        "step_created",
    ]
    # The decision was replayed over the newer history, not appended on top of it.
    assert runtime.workflow_calls[1].history_types[-1] == "signal_received"
    assert len(events_of(history, "step_completed")) == 3


async def _slow_three_steps(ctx: WorkflowContext) -> RuntimeCommand:
    await asyncio.sleep(0)
    return three_steps(ctx)


async def _slow_echo(invocation: StepInvocation) -> object:
    for _ in range(3):
        await asyncio.sleep(0)
    return echo(invocation)


def test_two_engines_with_async_steps_converge_on_one_history(store: EventStore) -> None:
    # Workflow code is synchronous here; the drivers interleave while steps await.
    runtime = make_runtime(three_steps, {"echo": _slow_echo})
    first, second = FlowEngine(store, runtime), FlowEngine(store, runtime)
    run(first.start("r1", SPEC, drive=False))

    async def both() -> list[object]:
        return await asyncio.gather(first.drive("r1"), second.drive("r1"), second.drive("r1"))

    results = run(both())
    assert all(r.status is RunStatus.COMPLETED for r in results)  # type: ignore[attr-defined]
    history = store.read("r1")
    assert_contiguous(history)
    completed = [e.step_id for e in events_of(history, "step_completed")]
    assert completed == ["a", "b", "c"]
    assert len(events_of(history, "step_started")) == 3  # redelivery reuses the attempt
    assert len(events_of(history, "run_completed")) == 1
    assert {c.attempt for c in runtime.step_calls} == {1}


def test_two_engines_driving_one_run_converge_on_one_history(store: EventStore) -> None:
    runtime = make_runtime(_slow_three_steps, {"echo": _slow_echo})
    first, second = FlowEngine(store, runtime), FlowEngine(store, runtime)
    run(first.start("r1", SPEC, drive=False))

    async def both() -> list[object]:
        return await asyncio.gather(first.drive("r1"), second.drive("r1"))

    results = run(both())
    assert all(r.status is RunStatus.COMPLETED for r in results)  # type: ignore[attr-defined]
    history = store.read("r1")
    assert_contiguous(history)
    completed = [e.step_id for e in events_of(history, "step_completed")]
    assert sorted(completed) == ["a", "b", "c"]
    assert len(events_of(history, "run_completed")) == 1


def test_a_decision_made_on_a_stale_history_is_not_appended(store: EventStore) -> None:
    # While workflow code awaits, another writer completes the run; the stale decision must be
    # discarded and replayed, not validated against (and appended after) the newer history.
    async def racing(ctx: WorkflowContext) -> RuntimeCommand:
        seen = ctx.history[-1].sequence
        await asyncio.sleep(0)
        store.append_if_sequence("r1", seen, [RunCompleted(output="written by another worker")])
        await asyncio.sleep(0)
        return ctx.complete("stale")

    engine = FlowEngine(store, make_runtime(racing))
    snapshot = run(engine.start("r1", SPEC))
    assert snapshot.output == "written by another worker"
    assert len(events_of(store.read("r1"), "run_completed")) == 1


# -- process loss and corrupt histories ------------------------------------------------------------


def test_process_loss_never_creates_a_terminal_outcome(store: EventStore, clock: FakeClock) -> None:
    def dies(invocation: StepInvocation) -> object:
        raise Crash

    with pytest.raises(Crash):
        run(
            FlowEngine(store, make_runtime(three_steps, {"echo": dies}), clock=clock).start(
                "r1", SPEC
            )
        )
    snapshot = FlowEngine(store, make_runtime(three_steps, {"echo": echo})).snapshot("r1")
    assert snapshot.status is RunStatus.RUNNING
    assert not snapshot.is_terminal
    assert snapshot.outcome is None
    replacement = FlowEngine(store, make_runtime(three_steps, {"echo": echo}), clock=clock)
    assert run(replacement.drive("r1")).status is RunStatus.COMPLETED


def test_a_run_survives_a_restart_of_a_durable_store(
    stores: StoreFactory, store: EventStore, clock: FakeClock
) -> None:
    def dies(invocation: StepInvocation) -> object:
        if invocation.step_id == "b":
            raise Crash
        return echo(invocation)

    with pytest.raises(Crash):
        run(
            FlowEngine(store, make_runtime(three_steps, {"echo": dies}), clock=clock).start(
                "r1", SPEC
            )
        )
    reopened = stores.reopen(store, clock=clock)
    runtime = make_runtime(three_steps, {"echo": echo})
    snapshot = run(FlowEngine(reopened, runtime, clock=clock).drive("r1"))
    assert snapshot.output == ["out-a", "out-b", "out-c"]
    assert [c.step_id for c in runtime.step_calls] == ["b", "c"]
    assert [c.attempt for c in runtime.step_calls] == [1, 1]


def test_a_corrupt_history_is_reported_not_executed(
    stores: StoreFactory, store: EventStore
) -> None:
    created = RunCreated(spec=SPEC)
    stores.write_raw_history(
        store,
        "r1",
        [
            envelope("r1", 1, created),
            envelope("r1", 2, RunStarted()),
            envelope("r1", 3, StepCompleted(step_id="a", output="forged")),
        ],
    )
    runtime = make_runtime(three_steps, {"echo": echo})
    engine = FlowEngine(store, runtime)
    with pytest.raises(CorruptHistoryError) as caught:
        run(engine.drive("r1"))
    assert caught.value.run_id == "r1"
    assert "sequence 3" in str(caught.value)
    assert runtime.workflow_calls == [] and runtime.step_calls == []
    with pytest.raises(CorruptHistoryError):
        engine.snapshot("r1")


class ForgingStore(MemoryEventStore):
    """A store whose backend hands back a history with a gap."""

    def _load(self, run_id: str) -> list[EventEnvelope] | None:
        history = super()._load(run_id)
        if history is None or len(history) < 3:
            return history
        return [history[0], *history[2:]]


def test_a_store_subclass_returning_a_gap_is_reported() -> None:
    store = ForgingStore()
    engine = FlowEngine(store, make_runtime(three_steps, {"echo": echo}))
    run(engine.start("r1", SPEC))
    store._states.clear()  # forget the cache: the next read loads from the backend
    with pytest.raises(CorruptHistoryError):
        engine.history("r1")
    with pytest.raises(CorruptHistoryError):
        run(engine.drive("r1"))


# -- invocations are immutable inputs ------------------------------------------------------

_LIVE_STATE_BUG = (
    "BUG: WorkflowInvocation/StepInvocation (engine.py _drive_one and _call_step) receive the "
    "store's cached RunState and its live history list, so workflow code sees later events and "
    "can corrupt what the store returns"
)


def test_workflow_code_cannot_corrupt_the_stored_history(store: EventStore) -> None:
    def vandal(ctx: WorkflowContext) -> RuntimeCommand:
        history = ctx.history
        try:
            history.clear()  # type: ignore[attr-defined]
        except (AttributeError, TypeError):
            pass
        return ctx.complete(1)

    run(FlowEngine(store, make_runtime(vandal)).start("r1", SPEC))
    assert event_types(store.read("r1")) == ["run_created", "run_started", "run_completed"]


def test_an_invocation_is_a_stable_view_of_the_history_it_was_given(store: EventStore) -> None:
    contexts: list[WorkflowContext] = []

    def keeps(ctx: WorkflowContext) -> RuntimeCommand:
        contexts.append(ctx)
        return three_steps(ctx)

    run(FlowEngine(store, make_runtime(keeps, {"echo": echo})).start("r1", SPEC))
    first = contexts[0]
    # The history a context was given stays what it was; the read helpers are only meant to be
    # used while run_workflow runs (documented on WorkflowContext).
    assert len(first.history) == 2
    assert [e.sequence for e in first.history] == [1, 2]

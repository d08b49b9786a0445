"""Child workflows (issue 4): single and batch requests, requests durable before any child runs,
resolutions recorded in request order, outcomes seen by the parent, cancellation policies, the
depth limit, and repair of a child whose creation was lost.

The scenarios take ``flows`` and run in both modes (``tests.support.flows``); on Kafka the
children live on other partitions and report by command. The tests on the ``store`` fixture
plant histories (a lost creation, old links, a drifted batch, a cycle) or set the engine's
child-depth option, which a processor does not take; docs/parity.md lists them."""

from __future__ import annotations

from itertools import pairwise

import pytest

from flowstream.engine import FlowEngine
from flowstream.errors import (
    CorruptHistoryError,
    InvalidTransitionError,
    LimitExceededError,
    NonDeterministicError,
)
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import (
    ChildCancellationPolicy,
    ChildWorkflowRequested,
    ChildWorkflowResolved,
    ParentLink,
    RunContinuedAsNew,
    RunCreated,
    RunStarted,
    TerminalOutcome,
)
from flowstream.model.snapshot import RunStatus
from flowstream.replay.context import StepInvocation, WorkflowContext
from flowstream.replay.decide import derived_run_id
from flowstream.stores.base import EventStore
from tests.support import FakeClock, event_types, events_of, make_runtime, run, spec, task_failed
from tests.support.flows import EmbeddedFlow, Flows

PARENT = spec("parent")
CHILD = spec("child")
ABANDON = ChildCancellationPolicy.ABANDON


def child(ctx: WorkflowContext) -> RuntimeCommand:
    """Doubles its input in a step; fails when asked; waits on a hook when asked; cancels."""
    assert isinstance(ctx.input, dict)
    if ctx.cancellation_request() is not None:
        return ctx.cancel()
    if ctx.input.get("fail"):
        return ctx.fail("child refused")
    if ctx.input.get("hook") and not ctx.hook_received("h"):
        return ctx.create_hook("h", f"child-token-{ctx.input['n']}")
    if not ctx.step_completed("double"):
        return ctx.schedule_step("double", "double", ctx.input["n"])
    return ctx.complete(ctx.step_output("double"))


def double(invocation: StepInvocation) -> object:
    assert isinstance(invocation.input, int)
    return invocation.input * 2


def one_child(
    input: dict[str, object],
    policy: ChildCancellationPolicy = ChildCancellationPolicy.REQUEST_CANCELLATION,
):  # type: ignore[no-untyped-def]
    def parent(ctx: WorkflowContext) -> RuntimeCommand:
        if ctx.cancellation_request() is not None:
            return ctx.cancel()
        outcome = ctx.child_workflow_outcome("c")
        if outcome is None:
            return ctx.start_child_workflow("c", CHILD, input, policy)
        return ctx.complete(outcome.model_dump(mode="json", exclude_none=True))

    return parent


def runtime_for(parent_fn, **steps):  # type: ignore[no-untyped-def]
    return make_runtime({"parent": parent_fn, "child": child}, {"double": double, **steps})


def test_a_child_runs_and_the_parent_records_its_outcome(flows: Flows) -> None:
    flow = flows(runtime_for(one_child({"n": 21})))
    snapshot = flow.start("p1", PARENT)
    assert snapshot.status is RunStatus.COMPLETED
    assert snapshot.output == {"type": "completed", "output": 42}
    child_run = snapshot.children["c"].run_id
    assert child_run == derived_run_id(flow.id("p1"), "child", "c")
    assert event_types(flow.history("p1"))[2:4] == [
        "child_workflow_requested",
        "child_workflow_resolved",
    ]
    child_snapshot = flow.snapshot(child_run)
    assert child_snapshot.status is RunStatus.COMPLETED
    assert child_snapshot.parent is not None
    assert (child_snapshot.parent.run_id, child_snapshot.parent.child_id) == (flow.id("p1"), "c")
    assert child_snapshot.spec == CHILD


def test_a_failed_child_is_an_outcome_for_the_parent(flows: Flows) -> None:
    flow = flows(runtime_for(one_child({"n": 1, "fail": True})))
    snapshot = flow.start("p1", PARENT)
    assert snapshot.status is RunStatus.COMPLETED
    assert snapshot.output == {"type": "failed", "error": "child refused"}


def test_a_suspended_child_suspends_the_parent_and_its_completion_wakes_it(
    flows: Flows,
) -> None:
    runtime = runtime_for(one_child({"n": 5, "hook": True}))
    flow = flows(runtime)
    snapshot = flow.start("p1", PARENT)
    assert snapshot.status is RunStatus.SUSPENDED
    child_run = snapshot.children["c"].run_id
    assert flow.snapshot(child_run).status is RunStatus.SUSPENDED
    parent_calls = len(runtime.workflow_calls_of(flow.id("p1")))
    flow.retry("p1")
    assert len(runtime.workflow_calls_of(flow.id("p1"))) == parent_calls

    flow.resume_hook(child_run, "h", "ok")
    assert flow.snapshot(child_run).status is RunStatus.COMPLETED
    assert flow.snapshot("p1").output == {"type": "completed", "output": 10}


def batch_parent(ids: list[str]):  # type: ignore[no-untyped-def]
    def parent(ctx: WorkflowContext) -> RuntimeCommand:
        outcomes = [ctx.child_workflow_outcome(i) for i in ids]
        if any(o is None for o in outcomes):
            return ctx.start_child_workflows(
                [ctx.child_workflow(i, CHILD, {"n": n}) for n, i in enumerate(ids, start=1)]
            )
        return ctx.complete([o.output for o in outcomes])  # type: ignore[union-attr]

    return parent


def test_a_batch_of_children_is_requested_atomically_and_resolved_in_order(
    flows: Flows,
) -> None:
    seen_requests: list[list[str]] = []
    flow: EmbeddedFlow | None = None

    def watching_child(ctx: WorkflowContext) -> RuntimeCommand:
        if flow is not None and not ctx.step_completed("double"):
            parent_history = flow.store.read("p1")
            seen_requests.append(
                [e.child_id for e in events_of(parent_history, "child_workflow_requested")]
            )
        return child(ctx)

    runtime = make_runtime(
        {"parent": batch_parent(["a", "b", "c"]), "child": watching_child}, {"double": double}
    )
    made = flows(runtime)
    if isinstance(made, EmbeddedFlow):
        flow = made
    snapshot = made.start("p1", PARENT)
    assert snapshot.output == [2, 4, 6]
    if flow is not None:
        assert seen_requests and all(r == ["a", "b", "c"] for r in seen_requests)
    # (On Kafka a child's code cannot read its parent's partition: its start is sent in the
    # transaction that records the whole batch, so no child exists before the batch does.)
    history = made.history("p1")
    requested = [e for e in history if e.event.type == "child_workflow_requested"]
    assert len({e.timestamp for e in requested}) == 1  # one atomic append
    assert [e.sequence for e in requested] == [3, 4, 5]
    resolved = [e.child_id for e in events_of(history, "child_workflow_resolved")]
    if made.mode == "embedded":
        assert resolved == ["a", "b", "c"]
    else:
        # Difference by design (docs/parity.md, "children report as they end"): each child
        # lives on its own partition, and the parent records its outcome when it arrives.
        assert sorted(resolved) == ["a", "b", "c"]


@pytest.mark.parametrize(("ids", "fragment"), [([], "at least one"), (["a", "a"], "unique")])
def test_invalid_child_batches_append_nothing(flows: Flows, ids: list[str], fragment: str) -> None:
    runtime = runtime_for(
        lambda ctx: ctx.start_child_workflows([ctx.child_workflow(i, CHILD, {"n": 1}) for i in ids])
    )
    flow = flows(runtime)
    snapshot = flow.start("p1", PARENT)
    caught = task_failed(snapshot, flow.history("p1"), error=InvalidTransitionError)
    assert fragment in caught.message
    assert event_types(flow.history("p1")) == [
        "run_created",
        "run_started",
        "workflow_task_failed",
    ]
    assert not any(flow.exists(derived_run_id(flow.id("p1"), "child", i)) for i in ids)


def test_rescheduling_a_resolved_child_is_an_invalid_transition(flows: Flows) -> None:
    runtime = runtime_for(lambda ctx: ctx.start_child_workflow("c", CHILD, {"n": 1}))
    flow = flows(runtime)
    snapshot = flow.start("p1", PARENT)
    caught = task_failed(snapshot, flow.history("p1"), error=InvalidTransitionError)
    assert "resolved" in caught.message
    assert len(runtime.workflow_calls_of(flow.id("p1"))) == 2


def test_cancelling_a_parent_requests_cancellation_of_its_child(flows: Flows) -> None:
    flow = flows(runtime_for(one_child({"n": 1, "hook": True})))
    child_run = flow.start("p1", PARENT).children["c"].run_id
    snapshot = flow.cancel("p1", "customer left")
    assert snapshot.status is RunStatus.CANCELLED
    assert snapshot.children["c"].outcome is not None
    assert snapshot.children["c"].outcome.type == "cancelled"
    child_snapshot = flow.snapshot(child_run)
    assert child_snapshot.status is RunStatus.CANCELLED
    assert child_snapshot.cancellation is not None
    assert child_snapshot.cancellation.reason == "customer left"


def test_an_abandoned_child_keeps_running_when_its_parent_is_cancelled(flows: Flows) -> None:
    flow = flows(runtime_for(one_child({"n": 4, "hook": True}, ABANDON)))
    child_run = flow.start("p1", PARENT).children["c"].run_id
    snapshot = flow.cancel("p1", "stop")
    assert snapshot.status is RunStatus.CANCELLED
    child_snapshot = flow.snapshot(child_run)
    assert child_snapshot.status is RunStatus.SUSPENDED
    assert child_snapshot.cancellation is None
    assert flow.resume_hook(child_run, "h", 1).status is RunStatus.COMPLETED


@pytest.mark.parametrize(
    ("policy", "child_status"),
    [
        pytest.param(ChildCancellationPolicy.REQUEST_CANCELLATION, RunStatus.CANCELLED),
        (ABANDON, RunStatus.SUSPENDED),
    ],
)
def test_force_cancel_follows_the_child_policy(
    flows: Flows, policy: ChildCancellationPolicy, child_status: RunStatus
) -> None:
    runtime = runtime_for(one_child({"n": 4, "hook": True}, policy))
    flow = flows(runtime)
    child_run = flow.start("p1", PARENT).children["c"].run_id
    calls = len(runtime.workflow_calls)
    snapshot = flow.cancel("p1", "now", force=True)
    assert snapshot.status is RunStatus.CANCELLED
    # On Kafka the child lives elsewhere and is sent a forced cancel; the parent does not wait
    # for it (docs/parity.md, "effects on other runs arrive later").
    flow.until(child_run, lambda child: child.status is child_status)
    assert len(runtime.workflow_calls) == calls  # no workflow code ran


def refusal(engine: FlowEngine, run_id: str, error: type[Exception]) -> str:
    """The message of the workflow-task failure that records a refused decision of ``run_id``."""
    failure = engine.snapshot(run_id).task_failure
    assert failure is not None and failure.error_type == error.__name__
    return failure.message


def test_the_child_depth_limit_is_enforced_before_appending(
    store: EventStore, clock: FakeClock
) -> None:
    def recursive(ctx: WorkflowContext) -> RuntimeCommand:
        outcome = ctx.child_workflow_outcome("deeper")
        if outcome is None:
            return ctx.start_child_workflow("deeper", spec("recursive"), None)
        return ctx.complete()

    engine = FlowEngine(store, make_runtime(recursive), clock=clock, max_child_depth=2)
    run(engine.start("root", spec("recursive")))
    runs = store.list_runs()
    assert len(runs) == 3  # root (0), child (1), grandchild (2)
    deepest = [r for r in runs if store.state(r).depth == 2]
    assert len(deepest) == 1
    assert "depth" in refusal(engine, deepest[0], LimitExceededError)
    assert "child_workflow_requested" not in event_types(store.read(deepest[0]))


def requested_child(store: EventStore, child_id: str, input: object) -> str:
    """``p1`` has requested child ``child_id`` and nothing else happened; its child run id."""
    child_run = derived_run_id("p1", "child", child_id)
    store.append_if_sequence(
        "p1",
        0,
        [
            RunCreated(spec=PARENT),
            RunStarted(),
            ChildWorkflowRequested(
                child_id=child_id, child_run_id=child_run, spec=CHILD, input=input
            ),
        ],
    )
    return child_run


def test_a_lost_child_creation_is_repaired_once(store: EventStore, clock: FakeClock) -> None:
    child_run = requested_child(store, "c", {"n": 3})
    runtime = runtime_for(one_child({"n": 3}))
    engine = FlowEngine(store, runtime, clock=clock)
    snapshot = run(engine.drive("p1"))
    assert snapshot.output == {"type": "completed", "output": 6}
    assert sorted(store.list_runs()) == sorted(["p1", child_run])
    assert len(events_of(store.read(child_run), "run_created")) == 1
    assert len(runtime.workflow_calls_of("p1")) == 1  # only after the child resolved


def test_force_cancel_with_a_lost_child_creation_still_cancels(
    store: EventStore, clock: FakeClock
) -> None:
    requested_child(store, "c", {"n": 3})
    engine = FlowEngine(store, runtime_for(one_child({"n": 3})), clock=clock)
    snapshot = run(engine.force_cancel("p1", "stop"))
    assert snapshot.status is RunStatus.CANCELLED


def test_a_child_that_continues_as_new_resolves_with_its_last_outcome(flows: Flows) -> None:
    def looping_child(ctx: WorkflowContext) -> RuntimeCommand:
        assert isinstance(ctx.input, int)
        if ctx.input < 3:
            return ctx.continue_as_new(ctx.input + 1)
        return ctx.complete(ctx.input)

    def parent(ctx: WorkflowContext) -> RuntimeCommand:
        outcome = ctx.child_workflow_outcome("loop")
        if outcome is None:
            return ctx.start_child_workflow("loop", CHILD, 0)
        return ctx.complete(outcome.model_dump(mode="json", exclude_none=True))

    flow = flows(make_runtime({"parent": parent, "child": looping_child}))
    snapshot = flow.start("p1", PARENT)
    assert snapshot.output == {"type": "completed", "output": 3}
    chain = flow.continuation_chain(snapshot.children["loop"].run_id)
    assert len(chain) == 4
    for hop, (predecessor, successor) in enumerate(pairwise(chain), start=1):
        assert flow.state(successor).parent == ParentLink(
            run_id=predecessor,
            continued=True,
            hop=hop,
            child_id="loop",
            reports_to=flow.id("p1"),
            root=chain[0],
        )


def test_a_child_chain_made_before_links_named_the_parent_still_resolves_it(
    store: EventStore, clock: FakeClock
) -> None:
    root = requested_child(store, "loop", 0)
    store.append_if_sequence(
        root,
        0,
        [
            RunCreated(
                spec=CHILD, input=0, parent=ParentLink(run_id="p1", child_id="loop"), depth=1
            ),
            RunStarted(),
            RunContinuedAsNew(successor_run_id="old-2", input=1),
        ],
    )
    # The successor's link has neither hop nor parent, as links were written before.
    store.append_if_sequence(
        "old-2",
        0,
        [RunCreated(spec=CHILD, input=1, parent=ParentLink(run_id=root, continued=True), depth=1)],
    )

    def parent(ctx: WorkflowContext) -> RuntimeCommand:
        outcome = ctx.child_workflow_outcome("loop")
        assert outcome is not None
        return ctx.complete(outcome.output)

    runtime = make_runtime({"parent": parent, "child": lambda ctx: ctx.complete(ctx.input)})
    engine = FlowEngine(store, runtime, clock=clock)
    assert run(engine.drive("old-2")).status is RunStatus.COMPLETED
    assert engine.snapshot("p1").output == 1


def resolved_batch_history(store: EventStore, ids: list[str]) -> None:
    """``p1`` requested the children ``ids`` in one batch, and each has resolved."""
    store.append_if_sequence(
        "p1",
        0,
        [
            RunCreated(spec=PARENT),
            RunStarted(),
            *(
                ChildWorkflowRequested(
                    child_id=i, child_run_id=derived_run_id("p1", "child", i), spec=CHILD
                )
                for i in ids
            ),
            *(
                ChildWorkflowResolved(child_id=i, outcome=TerminalOutcome(type="completed"))
                for i in ids
            ),
        ],
    )


def batch_order_error(engine: FlowEngine, run_id: str) -> str:
    """The nondeterminism a drive reports: raised, or recorded as a workflow-task failure."""
    try:
        run(engine.drive(run_id))
    except NonDeterministicError as exc:
        return str(exc)
    [failure] = events_of(engine.store.read(run_id), "workflow_task_failed")
    return str(failure.model_dump_json())


@pytest.mark.parametrize(
    "replayed",
    [
        pytest.param(["a", "x", "b"], id="new-child-between"),
        pytest.param(["x", "a", "b"], id="new-child-first"),
        pytest.param(["b", "a", "x"], id="known-children-swapped"),
    ],
)
def test_a_drifted_child_batch_is_refused_before_a_new_child_is_requested(
    store: EventStore, clock: FakeClock, replayed: list[str]
) -> None:
    resolved_batch_history(store, ["a", "b"])
    runtime = runtime_for(
        lambda ctx: ctx.start_child_workflows([ctx.child_workflow(i, CHILD) for i in replayed])
    )
    engine = FlowEngine(store, runtime, clock=clock)
    message = batch_order_error(engine, "p1")
    assert "child workflow batch order differs" in message
    assert [e.child_id for e in events_of(store.read("p1"), "child_workflow_requested")] == [
        "a",
        "b",
    ]
    assert not store.exists(derived_run_id("p1", "child", "x"))


def test_a_batch_may_add_new_children_after_the_known_ones(
    store: EventStore, clock: FakeClock
) -> None:
    resolved_batch_history(store, ["a", "b"])

    def parent(ctx: WorkflowContext) -> RuntimeCommand:
        if ctx.child_workflow_outcome("c") is None:
            return ctx.start_child_workflows(
                [ctx.child_workflow(i, CHILD, {"n": 1} if i == "c" else None) for i in "abc"]
            )
        return ctx.complete()

    snapshot = run(FlowEngine(store, runtime_for(parent), clock=clock).drive("p1"))
    assert snapshot.status is RunStatus.COMPLETED
    requested = events_of(store.read("p1"), "child_workflow_requested")
    assert [e.child_id for e in requested] == ["a", "b", "c"]


def test_an_ancestry_cycle_is_reported_before_a_child_is_requested(
    store: EventStore, clock: FakeClock
) -> None:
    """Two runs that name each other as parent: the ancestry walk stops instead of looping."""
    for run_id, parent_id in (("p1", "p2"), ("p2", "p1")):
        store.append_if_sequence(
            run_id,
            0,
            [
                RunCreated(spec=PARENT, parent=ParentLink(run_id=parent_id, child_id="c")),
                RunStarted(),
            ],
        )
    engine = FlowEngine(store, runtime_for(one_child({"n": 1})), clock=clock)
    run(engine.drive("p1"))
    message = refusal(engine, "p1", CorruptHistoryError)
    assert "ancestry" in message and "cycle" in message
    assert event_types(store.read("p1")) == ["run_created", "run_started", "workflow_task_failed"]

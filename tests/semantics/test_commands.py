"""Reference §3: ``RuntimeCommand`` variants, ``WorkflowContext`` helpers, and the invocations.

Engine semantics of each command are checked on a real run; the refusals (nondeterminism, no
progress) are checked in ``decide``, the pure core every host calls, on the state a real run
left in the store, so they do not depend on how a host reports a refused decision.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import BaseModel

from flowstream.errors import (
    HookTokenConflictError,
    InvalidTransitionError,
    NonDeterministicError,
    SerializationError,
)
from flowstream.model.commands import (
    MAX_BATCH_SIZE,
    ChildWorkflowCommand,
    RuntimeCommand,
    StepCommand,
)
from flowstream.model.events import (
    ChildWorkflowRequested,
    ChildWorkflowResolved,
    HookCreated,
    HookReceived,
    RunCancellationRequested,
    RunCreated,
    RunStarted,
    SignalWaitCreated,
    StepCompleted,
    StepCreated,
    StepStarted,
    TerminalOutcome,
    WaitCompleted,
    WaitCreated,
)
from flowstream.model.snapshot import RunStatus
from flowstream.model.spec import RetryPolicy
from flowstream.replay.context import StepInvocation, WorkflowContext
from flowstream.replay.decide import decide, token_digest
from flowstream.replay.state import RunState
from flowstream.stores.base import EventStore
from tests.semantics.helpers import CHILD, LATER, SPEC, append, begin, engine_for, types_of
from tests.support import EPOCH, FakeClock, run, spec

NOW = EPOCH + timedelta(minutes=1)


def _state(store: EventStore, *events: object) -> RunState:
    begin(store, *events)  # type: ignore[arg-type]
    return store.state("r1")


def _refuses(state: RunState, command: RuntimeCommand, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        decide(state, command, NOW)


# -- terminal commands ---------------------------------------------------------------------------


def test_complete_appends_run_completed(store: EventStore, clock: FakeClock) -> None:
    """§3.1 Complete: append RunCompleted."""
    engine, _ = engine_for(store, clock, lambda ctx: ctx.complete({"ok": True}))
    snapshot = run(engine.start("r1", SPEC))
    assert (snapshot.status, snapshot.output) == (RunStatus.COMPLETED, {"ok": True})
    assert types_of(store)[-1] == "run_completed"


def test_complete_is_refused_while_cancelling(store: EventStore) -> None:
    """§3.1 Complete: InvalidTransition if the run is Cancelling ("must return cancel or fail")."""
    state = _state(store, RunCancellationRequested(reason="r"))
    _refuses(state, RuntimeCommand.complete(1), InvalidTransitionError, "cancel or fail")


def test_fail_appends_run_failed(store: EventStore, clock: FakeClock) -> None:
    """§3.1 Fail: append RunFailed."""
    engine, _ = engine_for(store, clock, lambda ctx: ctx.fail("bad input"))
    snapshot = run(engine.start("r1", SPEC))
    assert (snapshot.status, snapshot.error) == (RunStatus.FAILED, "bad input")
    assert snapshot.outcome == TerminalOutcome(type="failed", error="bad input")


def test_cancel_needs_a_durable_cancellation_request(store: EventStore) -> None:
    """§3.1 Cancel: only valid if a durable cancellation request exists; appends RunCancelled
    with the request's reason."""
    _refuses(_state(store), RuntimeCommand.cancel(), InvalidTransitionError, "without a durable")
    append(store, "r1", RunCancellationRequested(reason="asked"))
    [event] = decide(store.state("r1"), RuntimeCommand.cancel(), NOW).events
    assert event.type == "run_cancelled" and event.reason == "asked"


def test_timeout_appends_run_timed_out(store: EventStore, clock: FakeClock) -> None:
    """§3.1 Timeout: append RunTimedOut (typed timeout after cleanup)."""
    engine, _ = engine_for(store, clock, lambda ctx: ctx.timeout(LATER, "too slow"))
    snapshot = run(engine.start("r1", SPEC))
    assert snapshot.status is RunStatus.FAILED
    assert snapshot.outcome == TerminalOutcome(type="timed_out", error="too slow")


def test_continue_as_new_is_refused_while_cancelling_or_with_an_unconsumed_signal(
    store: EventStore,
) -> None:
    """§3.1 ContinueAsNew: rejected while Cancelling or with any unconsumed signal."""
    from flowstream.model.events import SignalReceived

    state = _state(store, SignalReceived(signal_id="s1", name="go"))
    _refuses(state, RuntimeCommand.continue_as_new(1), InvalidTransitionError, "unconsumed")
    append(store, "r1", RunCancellationRequested())
    _refuses(
        store.state("r1"), RuntimeCommand.continue_as_new(1), InvalidTransitionError, "cancelling"
    )


# -- progress ------------------------------------------------------------------------------------


def test_record_progress_appends_a_new_id_and_replays(store: EventStore, clock: FakeClock) -> None:
    """§3.1 RecordProgress: a new id is appended and the run replays."""

    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        if ctx.progress("p") is None:
            return ctx.record_progress("p", 1, 2, "half")
        return ctx.complete(ctx.progress("p").completed)  # type: ignore[union-attr]

    engine, _ = engine_for(store, clock, workflow)
    assert run(engine.start("r1", SPEC)).output == 1
    assert types_of(store)[-2:] == ["run_progress_recorded", "run_completed"]


def test_record_progress_again_is_no_progress_and_changed_is_nondeterministic(
    store: EventStore,
) -> None:
    """§3.1 RecordProgress: same id & equal value → InvalidTransition "rescheduled progress X
    without progress"; different value → NonDeterministic."""
    from flowstream.model.events import RunProgressRecorded, WorkflowProgress

    progress = WorkflowProgress(progress_id="p", completed=1, total=2)
    state = _state(store, RunProgressRecorded(progress=progress))
    _refuses(
        state,
        RuntimeCommand.record_progress("p", 1, 2),
        InvalidTransitionError,
        "rescheduled progress p without progress",
    )
    _refuses(state, RuntimeCommand.record_progress("p", 2, 2), NonDeterministicError, "progress p")


# -- children ------------------------------------------------------------------------------------


def test_start_child_workflow_requests_parent_first_with_an_engine_made_run_id(
    store: EventStore, clock: FakeClock
) -> None:
    """§3.1 StartChildWorkflow: parent-first ChildWorkflowRequested (the engine generates the
    child run id); the child is created and driven during reconciliation; its outcome is
    recorded as ChildWorkflowResolved."""

    def parent(ctx: WorkflowContext) -> RuntimeCommand:
        outcome = ctx.child_workflow_outcome("c")
        if outcome is None:
            return ctx.start_child_workflow("c", CHILD, 21)
        return ctx.complete(outcome.output)

    order: list[tuple[str, str]] = []
    store.add_listener(lambda batch: order.extend((e.run_id, e.event.type) for e in batch))
    engine, _ = engine_for(
        store, clock, {"semantics": parent, "child": lambda ctx: ctx.complete(ctx.input * 2)}
    )
    assert run(engine.start("r1", SPEC)).output == 42
    [requested] = [e.event for e in store.read("r1") if isinstance(e.event, ChildWorkflowRequested)]
    child_run = requested.child_run_id
    assert order.index(("r1", "child_workflow_requested")) < order.index((child_run, "run_created"))
    assert order.index((child_run, "run_completed")) < order.index(
        ("r1", "child_workflow_resolved")
    )
    assert types_of(store)[-2:] == ["child_workflow_resolved", "run_completed"]


def test_reemitting_a_resolved_child_is_no_progress(store: EventStore) -> None:
    """§3.1 StartChildWorkflow: re-emitting an already resolved child → InvalidTransition."""
    state = _state(
        store,
        ChildWorkflowRequested(child_id="c", child_run_id="c1", spec=CHILD),
        ChildWorkflowResolved(child_id="c", outcome=TerminalOutcome(type="completed")),
    )
    _refuses(
        state,
        RuntimeCommand.start_child_workflow("c", CHILD),
        InvalidTransitionError,
        "resolved",
    )


@pytest.mark.parametrize(
    "children",
    [
        pytest.param([], id="empty"),
        pytest.param(["a", "a"], id="duplicate-ids"),
        pytest.param([f"c{i}" for i in range(MAX_BATCH_SIZE + 1)], id="too-many"),
    ],
)
def test_a_child_batch_is_validated_whole_before_anything_is_appended(
    store: EventStore, children: list[str]
) -> None:
    """§3.1 StartChildWorkflows: validate the whole batch (non-empty, bounded size, unique
    non-empty ids) before appending anything. The bound is 256 here, 64 in the reference."""
    state = _state(store)
    batch = [ChildWorkflowCommand(child_id=c, spec=CHILD) for c in children]
    with pytest.raises(InvalidTransitionError):
        decide(state, RuntimeCommand.start_child_workflows(batch), NOW)
    assert store.state("r1").children == {}


def test_a_child_batch_is_requested_in_order_and_resolved_in_request_order(
    store: EventStore, clock: FakeClock
) -> None:
    """§3.1 StartChildWorkflows: append all missing requests in order (before any child runs);
    advance siblings; resolve in request order."""
    ids = ["c3", "c1", "c2"]

    def parent(ctx: WorkflowContext) -> RuntimeCommand:
        if all(ctx.child_workflow_outcome(i) for i in ids):
            return ctx.complete()
        return ctx.start_child_workflows([ctx.child_workflow(i, CHILD, i) for i in ids])

    engine, _ = engine_for(
        store, clock, {"semantics": parent, "child": lambda ctx: ctx.complete(ctx.input)}
    )
    run(engine.start("r1", SPEC))
    history = store.read("r1")
    requests = [e for e in history if e.event.type == "child_workflow_requested"]
    resolved = [e.event.child_id for e in history if e.event.type == "child_workflow_resolved"]
    assert [e.event.child_id for e in requests] == resolved == ids
    first = requests[0].sequence
    assert [e.sequence for e in requests] == [first, first + 1, first + 2]  # one atomic batch


# -- steps ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "what"),
    [
        (RuntimeCommand.schedule_step("s", "other", {"n": 1}), "name"),
        (RuntimeCommand.schedule_step("s", "work", {"n": 2}), "input"),
        (
            RuntimeCommand.schedule_step("s", "work", {"n": 1}, RetryPolicy.fixed(9, 0)),
            "retry policy",
        ),
    ],
)
def test_schedule_step_must_match_the_durable_step(
    store: EventStore, command: RuntimeCommand, what: str
) -> None:
    """§3.1 ScheduleStep: an existing id must match name/input/retry (NonDeterministic)."""
    state = _state(store, StepCreated(step_id="s", step_name="work", input={"n": 1}))
    _refuses(state, command, NonDeterministicError, f"step s {what} differs")


def test_a_batch_with_one_drifted_member_is_refused_whole(store: EventStore) -> None:
    """§3.1 ScheduleSteps / seeds: each existing id must match; the complete identity set is
    validated before any member advances."""
    state = _state(store, StepCreated(step_id="a", step_name="work", input=1))
    batch = [
        StepCommand(step_id="new", step_name="work"),
        StepCommand(step_id="a", step_name="work", input=2),
    ]
    _refuses(state, RuntimeCommand.schedule_steps(batch), NonDeterministicError, "step a input")


def test_rescheduling_a_terminal_step_is_no_progress(store: EventStore) -> None:
    """§3.1 ScheduleStep: re-scheduling a terminal step → InvalidTransition "rescheduled
    terminal step X without progress"."""
    state = _state(
        store,
        StepCreated(step_id="s", step_name="work"),
        StepStarted(step_id="s", attempt=1),
        StepCompleted(step_id="s", output=1),
    )
    _refuses(
        state,
        RuntimeCommand.schedule_step("s", "work"),
        InvalidTransitionError,
        "rescheduled terminal step s without progress",
    )


def test_a_step_batch_needs_unique_ids_and_some_non_terminal_step(store: EventStore) -> None:
    """§3.1 ScheduleSteps: non-empty, unique non-empty ids; if all are terminal →
    InvalidTransition "rescheduled only terminal steps without progress"."""
    state = _state(
        store,
        StepCreated(step_id="a", step_name="work"),
        StepStarted(step_id="a", attempt=1),
        StepCompleted(step_id="a", output=1),
    )
    a, b = StepCommand(step_id="a", step_name="work"), StepCommand(step_id="b", step_name="work")
    _refuses(state, RuntimeCommand.schedule_steps([]), InvalidTransitionError, "at least one")
    _refuses(state, RuntimeCommand.schedule_steps([b, b]), InvalidTransitionError, "unique")
    _refuses(
        state,
        RuntimeCommand.schedule_steps([a]),
        InvalidTransitionError,
        "rescheduled only terminal steps without progress",
    )
    decision = decide(state, RuntimeCommand.schedule_steps([a, b]), NOW)
    assert decision.run_steps == ["b"]


# -- timers, hooks, signal waits -----------------------------------------------------------------


def test_wait_until_creates_a_wait_and_suspends(store: EventStore, clock: FakeClock) -> None:
    """§3.1 WaitUntil: new → WaitCreated and suspend; Waiting → suspend."""
    engine, _ = engine_for(store, clock, lambda ctx: ctx.wait_until("w", LATER))
    snapshot = run(engine.start("r1", SPEC))
    assert snapshot.status is RunStatus.SUSPENDED
    assert snapshot.waits["w"].resume_at == LATER
    decision = decide(store.state("r1"), RuntimeCommand.wait_until("w", LATER), NOW)
    assert decision.suspend and not decision.events


def test_wait_until_refuses_another_deadline_and_a_spent_wait(store: EventStore) -> None:
    """§3.1 WaitUntil: an existing wait must have the same resume_at (NonDeterministic);
    Cancelled → InvalidTransition "…use a distinct stable identity". A Completed wait replays
    in the reference; here re-emitting it is no progress (deliberate, §5.3)."""
    state = _state(store, WaitCreated(wait_id="w", resume_at=LATER))
    _refuses(
        state,
        RuntimeCommand.wait_until("w", LATER + timedelta(seconds=1)),
        NonDeterministicError,
        "wait w resume_at differs",
    )
    append(store, "r1", WaitCompleted(wait_id="w"))
    _refuses(
        store.state("r1"),
        RuntimeCommand.wait_until("w", LATER),
        InvalidTransitionError,
        "without progress",
    )
    append(store, "r1", WaitCreated(wait_id="w2", resume_at=LATER), RunCancellationRequested())
    _refuses(
        store.state("r1"),
        RuntimeCommand.wait_until("w2", LATER),
        InvalidTransitionError,
        "distinct stable identity",
    )


def test_create_hook_claims_its_token_atomically(store: EventStore, clock: FakeClock) -> None:
    """§3.1 CreateHook: new → atomic token claim + HookCreated; HookTokenConflict if the token is
    active elsewhere (the message names the owner, never the token)."""
    engine, _ = engine_for(store, clock, lambda ctx: ctx.create_hook("h", "shared-token"))
    run(engine.start("r1", SPEC))
    with pytest.raises(HookTokenConflictError) as caught:
        run(engine.start("r2", SPEC))
    assert "shared-token" not in str(caught.value)
    assert (caught.value.owner_run_id, caught.value.owner_hook_id) == ("r1", "h")
    assert "hook_created" not in types_of(store, "r2")


def test_a_token_is_free_again_once_its_hook_is_not_active(
    store: EventStore, clock: FakeClock
) -> None:
    """§3.1 CreateHook / §10: tokens are unique among active hooks of non-terminal runs; once
    the hook was received, the token may be claimed again."""

    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        if ctx.hook_received("h"):
            return ctx.complete(ctx.hook_payload("h"))
        return ctx.create_hook("h", "reused-token")

    engine, _ = engine_for(store, clock, workflow)
    run(engine.start("r1", SPEC))
    run(engine.resume_hook("r1", "h", 1))
    run(engine.start("r2", SPEC))
    assert run(engine.resume_hook_by_token("reused-token", 2)).run_id == "r2"


def test_create_hook_must_match_the_durable_token_and_metadata(store: EventStore) -> None:
    """§3.1 CreateHook: an existing hook must have the same token & metadata (NonDeterministic,
    token redacted); Active → suspend; Cancelled → InvalidTransition."""
    state = _state(
        store, HookCreated(hook_id="h", token_digest=token_digest("t1"), metadata={"m": 1})
    )
    with pytest.raises(NonDeterministicError, match="values redacted") as caught:
        decide(state, RuntimeCommand.create_hook("h", "t2", {"m": 1}), NOW)
    assert "t1" not in str(caught.value) and "t2" not in str(caught.value)
    _refuses(
        state, RuntimeCommand.create_hook("h", "t1", {"m": 2}), NonDeterministicError, "metadata"
    )
    assert decide(state, RuntimeCommand.create_hook("h", "t1", {"m": 1}), NOW).suspend
    append(store, "r1", RunCancellationRequested())
    _refuses(
        store.state("r1"),
        RuntimeCommand.create_hook("h", "t1", {"m": 1}),
        InvalidTransitionError,
        "cancelled hook",
    )


def test_recreating_a_received_hook_is_no_progress(store: EventStore) -> None:
    """§3.1 CreateHook: Received/Disposed → replay in the reference; here re-emitting it is no
    progress (deliberate, §5.3): workflow code reads hook_payload instead."""
    state = _state(
        store,
        HookCreated(hook_id="h", token_digest=token_digest("t1")),
        HookReceived(hook_id="h", payload=1),
    )
    _refuses(state, RuntimeCommand.create_hook("h", "t1"), InvalidTransitionError, "received")


def test_wait_for_signal_needs_a_declared_name_and_the_durable_one(store: EventStore) -> None:
    """§3.1 WaitForSignal: the name must be declared in the spec; new → SignalWaitCreated then
    replay; an existing wait must have the same name (NonDeterministic); Cancelled →
    InvalidTransition."""
    state = _state(store)
    _refuses(
        state,
        RuntimeCommand.wait_for_signal("w", "undeclared"),
        InvalidTransitionError,
        "not declared",
    )
    decision = decide(state, RuntimeCommand.wait_for_signal("w", "go"), NOW)
    assert [e.type for e in decision.events] == ["signal_wait_created"] and not decision.suspend
    append(store, "r1", SignalWaitCreated(wait_id="w", signal_name="go"))
    _refuses(
        store.state("r1"),
        RuntimeCommand.wait_for_signal("w", "stop"),
        NonDeterministicError,
        "signal wait w name differs",
    )
    append(store, "r1", RunCancellationRequested())
    _refuses(
        store.state("r1"),
        RuntimeCommand.wait_for_signal("w", "go"),
        InvalidTransitionError,
        "cancelled signal wait",
    )


# -- §3.2 the context ----------------------------------------------------------------------------


class Order(BaseModel):
    order_id: str


def test_context_reads_come_from_the_history(store: EventStore, clock: FakeClock) -> None:
    """§3.2: run_id(), input(), input_as(), spec(), has_patch_marker(), history() and
    logical_time() (the timestamp of the last committed event) are derived from history."""
    seen: list[tuple[object, ...]] = []
    pinned = spec("semantics", patch_markers=("new-branch",))

    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        seen.append(
            (
                ctx.run_id,
                ctx.input_as(Order).order_id,
                ctx.spec.name,
                ctx.has_patch_marker("new-branch"),
                ctx.has_patch_marker("other"),
                len(ctx.history),
                ctx.logical_time(),
            )
        )
        return ctx.complete()

    engine, _ = engine_for(store, clock, workflow)
    append(store, "r1", RunCreated(spec=pinned, input={"order_id": "o-1"}))
    clock.advance(seconds=3)
    run(engine.drive("r1"))
    assert seen == [("r1", "o-1", "semantics", True, False, 2, EPOCH + timedelta(seconds=3))]


def test_decoding_into_an_application_type_fails_loudly(store: EventStore) -> None:
    """Seeds / §3.2 input_as, step_output_as: a decode failure is FlowError::Serialization, no
    fallback value."""
    append(store, "r1", RunCreated(spec=SPEC, input={"wrong": 1}), RunStarted())
    with pytest.raises(SerializationError, match="Order"):
        WorkflowContext(store.state("r1")).input_as(Order)


def test_deterministic_id_is_stable_per_run_and_name(store: EventStore) -> None:
    """§3.2 deterministic_id(name): a UUIDv5 over the run id and name (flowstream's namespace
    and framing differ from the reference's: ids are only compared within flowstream)."""
    begin(store)
    begin(store, run_id="r2")
    one, two = WorkflowContext(store.state("r1")), WorkflowContext(store.state("r2"))
    assert one.deterministic_id("a") == WorkflowContext(store.state("r1")).deterministic_id("a")
    assert one.deterministic_id("a") != one.deterministic_id("b")
    assert one.deterministic_id("a") != two.deterministic_id("a")


def test_context_reports_steps_children_and_cancellation(store: EventStore) -> None:
    """§3.2: step_output/step_completed/step_failed (error of the failed step),
    child_workflow_run_id/child_workflow_outcome and cancellation_request() read projection."""
    from flowstream.model.events import StepFailed

    none = RetryPolicy.none()
    begin(
        store,
        StepCreated(step_id="ok", step_name="work"),
        StepStarted(step_id="ok", attempt=1),
        StepCompleted(step_id="ok", output={"v": 1}),
        StepCreated(step_id="bad", step_name="work", retry=none.continue_workflow_on_failure()),
        StepStarted(step_id="bad", attempt=1),
        StepFailed(step_id="bad", attempt=1, error="boom"),
        ChildWorkflowRequested(child_id="c", child_run_id="c-run", spec=CHILD),
        RunCancellationRequested(reason="bye"),
    )
    ctx = WorkflowContext(store.state("r1"))
    assert (ctx.step_completed("ok"), ctx.step_output("ok")) == (True, {"v": 1})
    assert (ctx.step_failed("bad"), ctx.step_failed("ok"), ctx.step_output("bad")) == (
        "boom",
        None,
        None,
    )
    assert (ctx.child_workflow_run_id("c"), ctx.child_workflow_outcome("c")) == ("c-run", None)
    request = ctx.cancellation_request()
    assert request is not None and request.reason == "bye"


def test_context_reports_signals_hooks_and_waits(store: EventStore) -> None:
    """§3.2: signal_payload(wait_id), hook_payload(id), hook_disposed(id), wait_completed(id)."""
    from flowstream.model.events import HookDisposed, SignalReceived, SignalWaitCompleted

    begin(
        store,
        SignalWaitCreated(wait_id="sw", signal_name="go"),
        SignalReceived(signal_id="s1", name="go", payload={"yes": True}),
        SignalWaitCompleted(wait_id="sw", signal_id="s1"),
        HookCreated(hook_id="h", token_digest=token_digest("t1")),
        HookReceived(hook_id="h", payload=[1]),
        HookCreated(hook_id="gone", token_digest=token_digest("t2")),
        HookDisposed(hook_id="gone"),
        WaitCreated(wait_id="w", resume_at=LATER),
        WaitCompleted(wait_id="w"),
    )
    ctx = WorkflowContext(store.state("r1"))
    assert (ctx.signal_received("sw"), ctx.signal_payload("sw")) == (True, {"yes": True})
    assert (ctx.hook_received("h"), ctx.hook_payload("h"), ctx.hook_disposed("h")) == (
        True,
        [1],
        False,
    )
    assert (ctx.hook_disposed("gone"), ctx.hook_received("gone")) == (True, False)
    assert (ctx.wait_completed("w"), ctx.wait_completed("nope")) == (True, False)


# -- §3.3 the invocations ------------------------------------------------------------------------


def test_a_step_invocation_carries_identity_attempt_history_and_key(
    store: EventStore, clock: FakeClock
) -> None:
    """§3.3 StepInvocation{run_id, step_id, attempt (1-based), step_name, input, history,
    idempotency_key}."""
    engine, runtime = engine_for(
        store,
        clock,
        lambda ctx: (
            ctx.complete() if ctx.step_completed("s") else ctx.schedule_step("s", "work", {"n": 1})
        ),
        {"work": lambda inv: None},
    )
    run(engine.start("r1", SPEC))
    [call] = runtime.step_calls
    assert isinstance(call, StepInvocation)
    assert (call.run_id, call.step_id, call.step_name, call.attempt, call.input) == (
        "r1",
        "s",
        "work",
        1,
        {"n": 1},
    )
    assert call.history[-1].event.type == "step_started"
    assert call.idempotency_key == "flow:r1:s"

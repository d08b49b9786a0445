"""Reference §8: run cancellation, child workflows, continue-as-new, versioning and rollout."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from flowstream.engine import RuntimeBuilds
from flowstream.errors import (
    InvalidTransitionError,
    RunConflictError,
    RuntimeBuildUnavailableError,
)
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import (
    ChildCancellationPolicy,
    ChildWorkflowRequested,
    RunContinuedAsNew,
    RunCreated,
    SignalWaitCreated,
    StepCreated,
    StepFailed,
    StepStarted,
)
from flowstream.model.snapshot import RunStatus
from flowstream.model.spec import RetryPolicy, WorkflowSpec
from flowstream.replay.context import WorkflowContext
from flowstream.replay.decide import decide
from flowstream.stores.base import EventStore
from tests.semantics.helpers import CHILD, LATER, SPEC, begin, engine_for, types_of
from tests.support import EPOCH, FakeClock, run, spec
from tests.support.stores import StoreFactory

ABANDON = ChildCancellationPolicy.ABANDON
PINNED = spec("semantics", runtime_build_id="build-1")


def cleaning(ctx: WorkflowContext) -> RuntimeCommand:
    """Waits on a timer; on cancellation runs step ``cleanup`` (a new id), then cancels."""
    if ctx.cancellation_request() is not None:
        if not ctx.step_completed("cleanup"):
            return ctx.schedule_step("cleanup", "cleanup")
        return ctx.cancel()
    return ctx.wait_until("w", LATER)


def parent_of(policy: ChildCancellationPolicy):  # type: ignore[no-untyped-def]
    def parent(ctx: WorkflowContext) -> RuntimeCommand:
        if ctx.cancellation_request() is not None:
            outcome = ctx.child_workflow_outcome("c")
            if policy is ABANDON or outcome is not None:
                return ctx.cancel()
        outcome = ctx.child_workflow_outcome("c")
        if outcome is None:
            return ctx.start_child_workflow("c", CHILD, None, policy)
        return ctx.complete(outcome.type)

    return parent


def sleeper(ctx: WorkflowContext) -> RuntimeCommand:
    if ctx.cancellation_request() is not None:
        return ctx.cancel()
    return ctx.wait_until("w", LATER)


# -- §8.1 run cancellation -----------------------------------------------------------------------


def test_a_cancellation_request_runs_cleanup_with_new_ids_then_cancels(
    store: EventStore, clock: FakeClock
) -> None:
    """§8.1: request_cancellation appends RunCancellationRequested, then drives; workflow code
    sees ctx.cancellation_request(), schedules cleanup with new step ids, then returns cancel()
    (→ RunCancelled{reason = request.reason})."""
    engine, _ = engine_for(store, clock, cleaning, {"cleanup": lambda inv: "clean"})
    run(engine.start("r1", SPEC))
    snapshot = run(engine.request_cancellation("r1", "customer"))
    assert (snapshot.status, snapshot.error) == (RunStatus.CANCELLED, "customer")
    assert snapshot.steps["cleanup"].output == "clean"
    types = types_of(store)
    assert types.index("run_cancellation_requested") < types.index("step_created")
    assert types[-1] == "run_cancelled"


@pytest.mark.parametrize("ending", ["fail", "timeout"])
def test_a_cancelling_run_may_end_failed_or_timed_out(
    store: EventStore, clock: FakeClock, ending: str
) -> None:
    """§8.1: while cancelling, workflow code returns cancel(), or fail(..), or timeout(..)."""

    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        if ctx.cancellation_request() is None:
            return ctx.wait_until("w", LATER)
        return ctx.fail("gave up") if ending == "fail" else ctx.timeout(LATER, "late")

    engine, _ = engine_for(store, clock, workflow)
    run(engine.start("r1", SPEC))
    snapshot = run(engine.request_cancellation("r1"))
    assert snapshot.status is RunStatus.FAILED
    assert snapshot.outcome is not None
    assert snapshot.outcome.type == ("failed" if ending == "fail" else "timed_out")


def test_the_request_is_idempotent_and_cannot_change(store: EventStore, clock: FakeClock) -> None:
    """§8.1: a repeat with an equal request is idempotent; a different request → RunConflict
    "cancellation request differs from the durable request"."""

    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        return ctx.create_hook("cleanup-hook" if ctx.cancellation_request() else "h", ctx.run_id)

    engine, _ = engine_for(store, clock, workflow)
    run(engine.start("r1", SPEC))
    run(engine.request_cancellation("r1", "same"))
    before = store.read("r1")
    run(engine.request_cancellation("r1", "same"))
    assert store.read("r1") == before
    with pytest.raises(RunConflictError, match="differs from the durable request"):
        run(engine.request_cancellation("r1", "other"))


def test_a_terminal_run_is_returned_unchanged_without_admission(
    store: EventStore, clock: FakeClock
) -> None:
    """§8.1: request_cancellation of a terminal leaf returns it unchanged (no admission
    needed); force cancel needs no admission either."""
    begin(store, of=PINNED)
    engine, _ = engine_for(store, clock, sleeper)  # serves only unpinned runs
    snapshot = run(engine.force_cancel("r1", "ops"))
    assert snapshot.status is RunStatus.CANCELLED
    before = store.read("r1")
    assert run(engine.request_cancellation("r1", "again")).status is RunStatus.CANCELLED
    assert store.read("r1") == before
    with pytest.raises(RuntimeBuildUnavailableError):
        run(engine.start("r2", PINNED))
    assert not store.exists("r2")


def test_a_durable_step_failure_wins_over_a_racing_cancellation(
    store: EventStore, clock: FakeClock
) -> None:
    """§8.1 racing terminal: if a durable final step failure exists, restart completes
    RunRetryExhausted even after a later cancellation request (no RunCancelled)."""
    begin(
        store,
        StepCreated(step_id="s", step_name="work", retry=RetryPolicy.none()),
        StepStarted(step_id="s", attempt=1),
        StepFailed(step_id="s", attempt=1, error="boom"),
    )
    engine, runtime = engine_for(store, clock, sleeper)
    snapshot = run(engine.request_cancellation("r1", "late"))
    assert snapshot.outcome is not None and snapshot.outcome.type == "retry_exhausted"
    assert "run_cancelled" not in types_of(store) and runtime.workflow_calls == []


def test_force_cancel_ends_the_run_without_workflow_code(
    store: EventStore, clock: FakeClock
) -> None:
    """§8.1 immediate: force_cancel(run_id, reason) appends RunCancelled directly (no cleanup,
    no workflow code)."""
    engine, runtime = engine_for(store, clock, cleaning)
    run(engine.start("r1", SPEC))
    calls = len(runtime.workflow_calls)
    snapshot = run(engine.force_cancel("r1", "now"))
    assert (snapshot.status, snapshot.error) == (RunStatus.CANCELLED, "now")
    assert len(runtime.workflow_calls) == calls and types_of(store)[-1] == "run_cancelled"


@pytest.mark.parametrize("policy", list(ChildCancellationPolicy))
def test_force_cancel_follows_each_childs_policy(
    store: EventStore, clock: FakeClock, policy: ChildCancellationPolicy
) -> None:
    """§8.1 immediate: termination recursively force-cancels open RequestCancellation children
    first (resolving them in the parent), and leaves Abandon children alone."""
    engine, _ = engine_for(store, clock, {"semantics": parent_of(policy), "child": sleeper})
    run(engine.start("r1", SPEC))
    child_run = engine.snapshot("r1").children["c"].run_id
    run(engine.force_cancel("r1", "ops"))
    child = engine.snapshot(child_run)
    parent = engine.snapshot("r1")
    if policy is ABANDON:
        assert child.status is RunStatus.SUSPENDED and parent.children["c"].outcome is None
    else:
        assert child.status is RunStatus.CANCELLED
        outcome = parent.children["c"].outcome
        assert outcome is not None and outcome.type == "cancelled"
    assert parent.status is RunStatus.CANCELLED


def test_force_cancel_targets_the_active_leaf(store: EventStore, clock: FakeClock) -> None:
    """§8.1 immediate: force cancel targets the active continuation leaf."""

    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        return ctx.continue_as_new(1) if ctx.input is None else ctx.wait_until("w", LATER)

    engine, _ = engine_for(store, clock, workflow)
    leaf = run(engine.start("r1", SPEC)).run_id
    assert run(engine.force_cancel("r1", "ops")).run_id == leaf
    assert engine.snapshot(leaf).status is RunStatus.CANCELLED


def _lost_abandoned_child(store: EventStore) -> None:
    begin(
        store,
        ChildWorkflowRequested(
            child_id="c", child_run_id="lost", spec=CHILD, cancellation_policy=ABANDON
        ),
    )


def test_cancellation_restores_a_lost_abandoned_child(store: EventStore, clock: FakeClock) -> None:
    """§8.2: an abandoned child whose stream was lost is restored by cleanup-aware cancellation
    and driven; the parent still finishes cancelling."""
    _lost_abandoned_child(store)
    engine, _ = engine_for(store, clock, {"semantics": parent_of(ABANDON), "child": sleeper})
    assert run(engine.request_cancellation("r1")).status is RunStatus.CANCELLED
    assert types_of(store, "lost") == ["run_created", "run_started", "wait_created"]


def test_force_cancel_restores_a_lost_abandoned_child(store: EventStore, clock: FakeClock) -> None:
    """§8.1 immediate: termination leaves Abandon children alone, restoring only
    run_created/run_started if their stream is missing."""
    _lost_abandoned_child(store)
    engine, _ = engine_for(store, clock, {"semantics": parent_of(ABANDON), "child": sleeper})
    assert run(engine.force_cancel("r1", "ops")).status is RunStatus.CANCELLED
    assert store.exists("lost")


# -- §8.2 children -------------------------------------------------------------------------------


def test_the_default_child_policy_is_request_cancellation() -> None:
    """§8.2: ChildWorkflowCancellationPolicy: request_cancellation (default) | abandon."""
    command = RuntimeCommand.start_child_workflow("c", CHILD)
    assert command.child.cancellation_policy is ChildCancellationPolicy.REQUEST_CANCELLATION


@pytest.mark.parametrize("policy", list(ChildCancellationPolicy))
def test_an_open_child_of_either_policy_blocks_normal_progress(
    store: EventStore, clock: FakeClock, policy: ChildCancellationPolicy
) -> None:
    """§8.2: both policies block normal parent progress while the child is open."""
    engine, runtime = engine_for(store, clock, {"semantics": parent_of(policy), "child": sleeper})
    snapshot = run(engine.start("r1", SPEC))
    assert snapshot.status is RunStatus.SUSPENDED
    parent_calls = len(runtime.workflow_calls_of("r1"))
    run(engine.drive("r1"))
    assert len(runtime.workflow_calls_of("r1")) == parent_calls


def test_a_parent_cancellation_reaches_its_earlier_children(
    store: EventStore, clock: FakeClock
) -> None:
    """§8.2: children requested before the parent's request get the same CancellationRequest;
    the parent stays Cancelling until they are terminal, and their outcomes are recorded."""
    policy = ChildCancellationPolicy.REQUEST_CANCELLATION
    engine, _ = engine_for(store, clock, {"semantics": parent_of(policy), "child": sleeper})
    run(engine.start("r1", SPEC))
    child_run = engine.snapshot("r1").children["c"].run_id
    snapshot = run(engine.request_cancellation("r1", "stop all"))
    child = engine.snapshot(child_run)
    assert child.cancellation is not None and child.cancellation.reason == "stop all"
    assert child.status is RunStatus.CANCELLED
    assert snapshot.children["c"].outcome is not None
    assert snapshot.status is RunStatus.CANCELLED


def test_an_abandoned_child_keeps_running_and_does_not_block(
    store: EventStore, clock: FakeClock
) -> None:
    """§8.2: abandon children are left running; their open state does not block the parent's
    cancellation."""
    engine, _ = engine_for(store, clock, {"semantics": parent_of(ABANDON), "child": sleeper})
    run(engine.start("r1", SPEC))
    child_run = engine.snapshot("r1").children["c"].run_id
    assert run(engine.request_cancellation("r1")).status is RunStatus.CANCELLED
    child = engine.snapshot(child_run)
    assert child.status is RunStatus.SUSPENDED and child.cancellation is None


def test_a_child_requested_after_the_request_is_cleanup_work(
    store: EventStore, clock: FakeClock
) -> None:
    """§8.2: a child requested after the cancellation request is cleanup work and runs
    normally."""

    def parent(ctx: WorkflowContext) -> RuntimeCommand:
        if ctx.cancellation_request() is None:
            return ctx.wait_until("w", LATER)
        outcome = ctx.child_workflow_outcome("cleanup")
        if outcome is None:
            return ctx.start_child_workflow("cleanup", CHILD, "undo")
        return ctx.cancel()

    def child(ctx: WorkflowContext) -> RuntimeCommand:
        return ctx.complete(ctx.input)

    engine, _ = engine_for(store, clock, {"semantics": parent, "child": child})
    run(engine.start("r1", SPEC))
    snapshot = run(engine.request_cancellation("r1"))
    outcome = snapshot.children["cleanup"].outcome
    assert outcome is not None and (outcome.type, outcome.output) == ("completed", "undo")
    assert snapshot.status is RunStatus.CANCELLED


def test_the_child_depth_limit_refuses_a_request_before_appending(
    store: EventStore, clock: FakeClock
) -> None:
    """§8.2: depth limit with_max_child_workflow_depth (default 32; 0 disables) →
    ChildWorkflowDepthExceeded."""

    def nesting(ctx: WorkflowContext) -> RuntimeCommand:
        outcome = ctx.child_workflow_outcome("c")
        if outcome is None:
            return ctx.start_child_workflow("c", SPEC, None)
        return ctx.complete(outcome.type)

    engine, _ = engine_for(store, clock, nesting, max_child_depth=2)
    run(engine.start("r1", SPEC))
    child = engine.snapshot(engine.snapshot("r1").children["c"].run_id)  # depth 1
    grandchild = engine.snapshot(child.children["c"].run_id)  # depth 2, the deepest allowed
    # The refusal is the grandchild's workflow-task failure, recorded instead of its request.
    assert grandchild.children == {} and grandchild.task_failure is not None
    assert grandchild.task_failure.error_type == "LimitExceededError"
    assert "depth would exceed 2" in grandchild.task_failure.message
    assert types_of(store, grandchild.run_id)[-2:] == ["run_started", "workflow_task_failed"]
    default, _ = engine_for(store, clock, nesting)
    assert default._max_child_depth == 32


def test_a_parent_cannot_continue_as_new_with_an_open_child(store: EventStore) -> None:
    """§8.2 / §8.3: a parent cannot continue-as-new with an open child; nor with an open signal
    wait."""
    begin(store, ChildWorkflowRequested(child_id="c", child_run_id="c1", spec=CHILD))
    with pytest.raises(InvalidTransitionError, match="child workflow is open"):
        decide(store.state("r1"), RuntimeCommand.continue_as_new(1), EPOCH)
    begin(store, SignalWaitCreated(wait_id="sw", signal_name="go"), run_id="r2")
    with pytest.raises(InvalidTransitionError, match="open signal wait"):
        decide(store.state("r2"), RuntimeCommand.continue_as_new(1), EPOCH)


def test_a_parent_records_the_last_outcome_of_a_continuing_child(
    store: EventStore, clock: FakeClock
) -> None:
    """§8.2: child continue-as-new chains are followed; the parent records only the terminal
    leaf outcome."""

    def parent(ctx: WorkflowContext) -> RuntimeCommand:
        outcome = ctx.child_workflow_outcome("c")
        if outcome is None:
            return ctx.start_child_workflow("c", CHILD, 0)
        return ctx.complete(outcome.output)

    def counting(ctx: WorkflowContext) -> RuntimeCommand:
        assert isinstance(ctx.input, int)
        return ctx.complete(ctx.input) if ctx.input == 2 else ctx.continue_as_new(ctx.input + 1)

    engine, _ = engine_for(store, clock, {"semantics": parent, "child": counting})
    snapshot = run(engine.start("r1", SPEC))
    assert snapshot.output == 2
    assert snapshot.children["c"].outcome is not None
    assert snapshot.children["c"].outcome.type == "completed"


# -- §8.3 continue-as-new ------------------------------------------------------------------------


def looping(ctx: WorkflowContext) -> RuntimeCommand:
    """Counts to 2 across segments; each segment runs step ``s`` (the same id every time)."""
    assert isinstance(ctx.input, int)
    if not ctx.step_completed("s"):
        return ctx.schedule_step("s", "work", ctx.input)
    if ctx.input == 2:
        return ctx.complete(ctx.step_output("s"))
    return ctx.continue_as_new(ctx.input + 1)


FULL = WorkflowSpec(
    name="semantics",
    version="7",
    runtime_build_id="build-1",
    patch_markers=("p1",),
    signal_names=("go",),
)


def test_a_continued_run_hands_its_exact_spec_and_new_input_to_its_successor(
    store: EventStore, clock: FakeClock
) -> None:
    """§8.3: the predecessor commits RunContinuedAsNew (status continued_as_new, outcome
    continued_as_new{successor}); drive creates the successor with the exact inherited
    WorkflowSpec (build id, patch markers, signal names) and the new input, and keeps driving.
    Stable step ids may repeat in different segments."""
    engine, _ = engine_for(
        store, clock, looping, {"work": lambda inv: inv.input}, builds=RuntimeBuilds("build-1")
    )
    leaf = run(engine.start("r1", FULL, 0))
    chain = engine.continuation_chain("r1")
    assert len(chain) == 3 and leaf.run_id == chain[-1] and leaf.output == 2
    root = engine.snapshot("r1")
    assert root.status is RunStatus.CONTINUED_AS_NEW
    assert root.outcome is not None and root.outcome.successor_run_id == chain[1]
    for index, run_id in enumerate(chain):
        created = store.read(run_id)[0].event
        assert isinstance(created, RunCreated)
        assert (created.spec, created.input) == (FULL, index)
        assert store.state(run_id).steps["s"].output == index


def test_drive_returns_the_active_leaf(store: EventStore, clock: FakeClock) -> None:
    """§8.3: drive returns the active leaf snapshot; continuation_chain(root) returns all
    segments."""

    def once(ctx: WorkflowContext) -> RuntimeCommand:
        return ctx.continue_as_new(1) if ctx.input is None else ctx.wait_until("w", LATER)

    engine, _ = engine_for(store, clock, once)
    run(engine.start("r1", SPEC))
    leaf = run(engine.drive("r1"))
    assert leaf.run_id != "r1" and leaf.status is RunStatus.SUSPENDED
    assert engine.continuation_chain("r1") == ["r1", leaf.run_id]


def test_the_successor_run_id_is_derived_not_random(stores: StoreFactory, clock: FakeClock) -> None:
    """§8.3: the reference draws the successor id as a UUIDv4. flowstream derives it from the run
    id and the link's sequence (deliberate: every id from durable inputs, so a replay or another
    processor names the same successor)."""
    ids = []
    for _ in range(2):  # two independent stores, the same history
        store = stores.open(clock=clock)
        engine, _ = engine_for(
            store,
            clock,
            lambda ctx: ctx.continue_as_new(1) if ctx.input is None else ctx.complete(),
        )
        run(engine.start("r1", SPEC))
        ids.append(engine.continuation_chain("r1")[1])
    assert ids[0] == ids[1]


def test_a_lost_successor_is_repaired_from_the_durable_link(
    store: EventStore, clock: FakeClock
) -> None:
    """§8.3: a missing successor after a crash is repaired code-free from the predecessor's
    durable link."""
    begin(store, RunContinuedAsNew(successor_run_id="next", input=5))
    engine, runtime = engine_for(store, clock, lambda ctx: ctx.complete(ctx.input))
    assert run(engine.drive("r1")).output == 5
    assert [c.run_id for c in runtime.workflow_calls] == ["next"]
    created = store.read("next")[0].event
    assert isinstance(created, RunCreated) and created.spec == SPEC


@pytest.mark.parametrize("entry", ["drive", "start", "signal", "cancel"])
def test_every_entry_point_repairs_a_lost_successor(
    store: EventStore, clock: FakeClock, entry: str
) -> None:
    """§8.3: the missing successor is repaired from the link by drive, by signal redelivery, by
    cancellation and by start retries."""
    begin(store, RunContinuedAsNew(successor_run_id="next", input=5))

    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        if ctx.cancellation_request() is not None:
            return ctx.cancel()
        return ctx.wait_until("w", LATER)

    engine, _ = engine_for(store, clock, workflow)
    if entry == "drive":
        run(engine.drive("r1"))
    elif entry == "start":
        run(engine.start("r1", SPEC))
    elif entry == "signal":
        run(engine.send_signal("r1", "s1", "go"))
    else:
        run(engine.request_cancellation("r1"))
    created = store.read("next")[0].event
    assert isinstance(created, RunCreated) and (created.spec, created.input) == (SPEC, 5)


def test_signals_and_cancellation_follow_the_leaf_timers_are_segment_addressed(
    store: EventStore, clock: FakeClock
) -> None:
    """§8.3: host controls (cancellation, signals) accept any predecessor id and follow the
    leaf; wait resolutions use the exact run id that created them."""

    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        if ctx.input is None:
            return ctx.continue_as_new(1)
        if ctx.cancellation_request() is not None:
            return ctx.cancel()
        if ctx.signal_received("sw"):
            return ctx.wait_until("w", LATER)
        return ctx.wait_for_signal("sw", "go")

    engine, _ = engine_for(store, clock, workflow)
    leaf = run(engine.start("r1", SPEC)).run_id
    assert run(engine.send_signal("r1", "s1", "go")).run_id == leaf
    assert engine.snapshot(leaf).waits["w"].resume_at == LATER
    with pytest.raises(InvalidTransitionError):
        run(engine.resume_wait("r1", "w", now=LATER))  # the root never created w
    assert run(engine.request_cancellation("r1")).run_id == leaf
    assert engine.snapshot(leaf).status is RunStatus.CANCELLED


# -- §8.4 versioning and rollout -----------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [{"name": ""}, {"name": "x", "version": ""}],
    ids=["empty-name", "empty-version"],
)
def test_a_spec_needs_a_name_and_a_version(fields: dict[str, str]) -> None:
    """§8.4: WorkflowSpec.validate() requires non-empty name/version."""
    with pytest.raises(ValidationError):
        WorkflowSpec(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("build", ["", " b", "a\\b", "a\nb", "-b", "b/"])
def test_runtime_build_ids_are_checked(build: str) -> None:
    """§8.4: RuntimeBuildId rejects empty, whitespace, backslash, newline, leading '-',
    trailing '/'."""
    with pytest.raises(ValidationError):
        spec("x", runtime_build_id=build)


@pytest.mark.parametrize(
    ("builds", "served"),
    [
        (RuntimeBuilds(), {None}),
        (RuntimeBuilds("b2", frozenset({"b1"})), {"b1", "b2"}),
        (RuntimeBuilds("b2", accept_unpinned=True), {"b2", None}),
    ],
    ids=["unconfigured", "current-and-compatible", "accept-unpinned"],
)
def test_build_admission(
    store: EventStore, clock: FakeClock, builds: RuntimeBuilds, served: set[str | None]
) -> None:
    """§8.4: an engine without compatibility config executes only unpinned runs; a configured
    engine admits its current build plus listed builds, and rejects unpinned runs unless
    accept_unpinned(); a refusal is RuntimeBuildUnavailable with no history appended."""
    engine, _ = engine_for(store, clock, lambda ctx: ctx.complete(), builds=builds)
    for index, build in enumerate([None, "b1", "b2", "b3"]):
        run_id = f"r{index}"
        pinned = spec("semantics", runtime_build_id=build)
        if build in served:
            assert run(engine.start(run_id, pinned)).status is RunStatus.COMPLETED
        else:
            with pytest.raises(RuntimeBuildUnavailableError):
                run(engine.start(run_id, pinned))
            assert not store.exists(run_id)


@pytest.mark.parametrize("entry", ["signal", "hook", "wait", "dispose", "cancel", "drive"])
def test_admission_precedes_every_action_specific_write(
    store: EventStore, clock: FakeClock, entry: str
) -> None:
    """§8.4: admission is checked before workflow invocation and before any action-specific
    write (signal, hook, timer, cancellation request)."""

    def workflow(ctx: WorkflowContext) -> RuntimeCommand:
        if not ctx.wait_completed("w"):
            return ctx.wait_until("w", EPOCH)
        return ctx.create_hook("h", f"t-{ctx.run_id}")

    pinned = spec("semantics", runtime_build_id="b1", signal_names=("go",))
    serving, _ = engine_for(store, clock, workflow, builds=RuntimeBuilds("b1"))
    run(serving.start("r1", pinned))
    if entry in ("hook", "dispose"):
        run(serving.resume_wait("r1", "w"))
    before = store.read("r1")
    other, runtime = engine_for(store, clock, workflow)
    attempt = {
        "signal": lambda: other.send_signal("r1", "s1", "go"),
        "hook": lambda: other.resume_hook("r1", "h", 1),
        "wait": lambda: other.resume_wait("r1", "w"),
        "dispose": lambda: other.dispose_hook("r1", "h"),
        "cancel": lambda: other.request_cancellation("r1"),
        "drive": lambda: other.drive("r1"),
    }[entry]
    with pytest.raises(RuntimeBuildUnavailableError):
        run(attempt())
    assert store.read("r1") == before and runtime.workflow_calls == []


def test_the_spec_version_is_not_used_for_admission(store: EventStore, clock: FakeClock) -> None:
    """§8.4: version is an application label; it is not used for admission."""
    engine, _ = engine_for(store, clock, lambda ctx: ctx.complete(ctx.spec.version))
    assert run(engine.start("r1", spec("semantics", version="2026.9"))).output == "2026.9"


@pytest.mark.parametrize(
    "markers",
    [
        ("Upper",),
        ("-lead",),
        ("trail-",),
        ("a" * 129,),
        ("dup", "dup"),
        tuple(f"m{i}" for i in range(257)),
    ],
    ids=["upper", "leading", "trailing", "too-long", "duplicate", "too-many"],
)
def test_patch_marker_grammar(markers: tuple[str, ...]) -> None:
    """§8.4 patch markers: 1..128 bytes of lowercase letters/digits/'-_.', starting and ending
    with a letter or digit; ≤ 256; duplicates rejected."""
    with pytest.raises(ValidationError):
        spec("x", patch_markers=markers)


def test_patch_markers_are_pinned_sorted_and_cannot_change(
    store: EventStore, clock: FakeClock
) -> None:
    """§8.4: markers are serialized sorted, pinned in run_created, read with has_patch_marker;
    changing them on a restart → RunConflict "workflow spec differs"."""
    marked = spec("semantics", patch_markers=("b-2", "a.1"))
    assert marked.patch_markers == ("a.1", "b-2")
    engine, _ = engine_for(store, clock, lambda ctx: ctx.complete(ctx.has_patch_marker("b-2")))
    assert run(engine.start("r1", marked)).output is True
    with pytest.raises(RunConflictError, match="workflow spec differs"):
        run(engine.start("r1", spec("semantics", patch_markers=("a.1",))))
    created = store.read("r1")[0].event
    assert isinstance(created, RunCreated) and created.spec.patch_markers == ("a.1", "b-2")

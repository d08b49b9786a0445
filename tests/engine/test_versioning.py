"""Versioning (issue 4): ``runtime_build_id`` pins a run to code that can replay it (refusals
append nothing), compatible builds and unpinned acceptance, and immutable patch markers.

The patch-marker scenarios take ``flows`` and run in both modes (``tests.support.flows``). The
build tests compare engines of other builds over one store; on Kafka that is a rollout of
workers, tested by tests/processor/test_rollout.py (docs/parity.md)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from flowstream.engine import FlowEngine, RuntimeBuilds
from flowstream.errors import RunConflictError, RuntimeBuildUnavailableError
from flowstream.model.commands import RuntimeCommand
from flowstream.model.snapshot import RunStatus
from flowstream.model.spec import MAX_PATCH_MARKERS, WorkflowSpec
from flowstream.replay.context import WorkflowContext
from flowstream.stores.base import EventStore
from tests.support import EPOCH, FakeClock, event_types, make_runtime, run, spec
from tests.support.flows import Flows

PINNED_V1 = spec("pinned", runtime_build_id="v1", signal_names=("go",))
UNPINNED = spec("pinned", signal_names=("go",))


def waiter(ctx: WorkflowContext) -> RuntimeCommand:
    if not ctx.hook_received("h"):
        return ctx.create_hook("h", f"token-{ctx.run_id}")
    if not ctx.wait_completed("w"):
        return ctx.wait_until("w", EPOCH + timedelta(minutes=1))
    return ctx.complete("done")


def engine(store: EventStore, clock: FakeClock, builds: RuntimeBuilds | None = None) -> FlowEngine:
    return FlowEngine(store, make_runtime(waiter), clock=clock, builds=builds)


V1 = RuntimeBuilds(current="v1")
V2 = RuntimeBuilds(current="v2")


def test_a_run_pinned_elsewhere_is_refused_and_nothing_is_appended(
    store: EventStore, clock: FakeClock
) -> None:
    run(engine(store, clock, V1).start("r1", PINNED_V1, drive=False))
    other = engine(store, clock, V2)
    with pytest.raises(RuntimeBuildUnavailableError) as caught:
        run(other.drive("r1"))
    err = caught.value
    assert err.run_id == "r1"
    assert err.required_build_id == "v1" and err.current_build_id == "v2"
    assert "v1" in str(err) and "v2" in str(err)
    assert event_types(store.read("r1")) == ["run_created"]  # not even run_started
    assert other.runtime.workflow_calls == []  # type: ignore[attr-defined]


def test_every_entry_point_refuses_an_unservable_run(store: EventStore, clock: FakeClock) -> None:
    v1 = engine(store, clock, V1)
    run(v1.start("r1", PINNED_V1))
    before = store.read("r1")
    v2 = engine(store, clock, V2)
    attempts = [
        v2.send_signal("r1", "s1", "go", None),
        v2.resume_hook("r1", "h", "ok"),
        v2.resume_hook_by_token("token-r1", "ok"),
        v2.request_cancellation("r1", "stop"),
        v2.drive("r1"),
    ]
    for attempt in attempts:
        with pytest.raises(RuntimeBuildUnavailableError):
            run(attempt)
    assert store.read("r1") == before
    with pytest.raises(RuntimeBuildUnavailableError):
        run(v2.start("r2", PINNED_V1))
    assert not store.exists("r2")


def test_the_scheduler_leaves_unservable_runs_for_a_compatible_worker(
    store: EventStore, clock: FakeClock
) -> None:
    v1 = engine(store, clock, V1)
    run(v1.start("r1", PINNED_V1))
    run(v1.resume_hook("r1", "h", "ok"))
    before = store.read("r1")
    tick = run(engine(store, clock, V2).resume_due(EPOCH + timedelta(minutes=1)))
    assert tick.resumed == [] and isinstance(tick.failed["r1"], RuntimeBuildUnavailableError)
    assert store.read("r1") == before
    tick = run(v1.resume_due(EPOCH + timedelta(minutes=1)))
    assert tick.resumed == ["r1"]
    assert v1.snapshot("r1").status is RunStatus.COMPLETED


def test_compatible_builds_are_served(store: EventStore, clock: FakeClock) -> None:
    run(engine(store, clock, V1).start("r1", PINNED_V1, drive=False))
    compatible = engine(store, clock, RuntimeBuilds(current="v2", compatible=frozenset({"v1"})))
    assert run(compatible.drive("r1")).status is RunStatus.SUSPENDED


def test_unpinned_runs_need_explicit_acceptance_on_a_pinned_engine(
    store: EventStore, clock: FakeClock
) -> None:
    run(engine(store, clock).start("r1", UNPINNED, drive=False))
    with pytest.raises(RuntimeBuildUnavailableError) as caught:
        run(engine(store, clock, V2).drive("r1"))
    assert caught.value.required_build_id is None
    assert event_types(store.read("r1")) == ["run_created"]
    accepting = engine(store, clock, RuntimeBuilds(current="v2", accept_unpinned=True))
    assert run(accepting.drive("r1")).status is RunStatus.SUSPENDED


def test_an_unconfigured_engine_serves_only_unpinned_runs(
    store: EventStore, clock: FakeClock
) -> None:
    run(engine(store, clock, V1).start("pinned", PINNED_V1, drive=False))
    plain = engine(store, clock)
    with pytest.raises(RuntimeBuildUnavailableError):
        run(plain.drive("pinned"))
    assert run(plain.start("free", UNPINNED)).status is RunStatus.SUSPENDED


def test_force_cancel_needs_no_admission(store: EventStore, clock: FakeClock) -> None:
    run(engine(store, clock, V1).start("r1", PINNED_V1))
    snapshot = run(engine(store, clock, V2).force_cancel("r1", "retired build"))
    assert snapshot.status is RunStatus.CANCELLED


@pytest.mark.parametrize("build", ["", "has space", "back\\slash", "-leading", "trailing/", "a\nb"])
def test_invalid_build_ids_are_rejected(build: str) -> None:
    with pytest.raises(ValidationError):
        WorkflowSpec(name="x", runtime_build_id=build)


# -- patch markers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "markers",
    [
        ("Upper",),
        ("-leading",),
        ("trailing-",),
        ("has space",),
        ("",),
        ("x" * 129,),
        ("dup", "dup"),
        tuple(f"m{i}" for i in range(MAX_PATCH_MARKERS + 1)),
    ],
)
def test_invalid_patch_markers_are_rejected(markers: tuple[str, ...]) -> None:
    with pytest.raises(ValidationError):
        WorkflowSpec(name="x", patch_markers=markers)


def test_patch_markers_are_a_sorted_set() -> None:
    marked = WorkflowSpec(name="x", patch_markers=("b.2", "a-1", "c_3"))
    assert marked.patch_markers == ("a-1", "b.2", "c_3")
    assert marked == WorkflowSpec(name="x", patch_markers=("c_3", "a-1", "b.2"))


def test_workflow_code_branches_on_pinned_patch_markers(flows: Flows) -> None:
    def branching(ctx: WorkflowContext) -> RuntimeCommand:
        return ctx.complete("new" if ctx.has_patch_marker("new-pricing") else "old")

    flow = flows(make_runtime(branching))
    old = flow.start("old-run", spec("pricing"))
    new = flow.start("new-run", spec("pricing", patch_markers=("new-pricing",)))
    assert (old.output, new.output) == ("old", "new")
    assert flow.history("new-run")[0].event.spec.patch_markers == ("new-pricing",)  # type: ignore[union-attr]


def test_patch_markers_cannot_change_on_restart(flows: Flows) -> None:
    flow = flows(make_runtime(waiter))
    flow.start("r1", spec("pricing"))
    before = flow.history("r1")
    with pytest.raises(RunConflictError) as caught:
        flow.start("r1", spec("pricing", patch_markers=("new-pricing",)))
    assert "spec" in str(caught.value)
    assert flow.history("r1") == before

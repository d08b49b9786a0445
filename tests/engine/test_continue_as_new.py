"""continue_as_new (issue 4): the run ends as continued-as-new and a successor starts with the new
input and the identical spec; the chain can be listed; open signals block it; a crash between the
link and the successor's creation is repaired without duplication.

The scenarios take ``flows`` and run in both modes (``tests.support.flows``); on Kafka a chain's
runs spread over partitions. The tests on the ``store`` fixture plant histories (a crash before
the successor, a mismatched successor, a cycle) or compare engines with other options over one
store; docs/parity.md lists them."""

from __future__ import annotations

from itertools import pairwise

import pytest

from flowstream.engine import FlowEngine, RuntimeBuilds
from flowstream.errors import (
    CorruptHistoryError,
    FlowError,
    InvalidTransitionError,
    LimitExceededError,
)
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import ParentLink, RunContinuedAsNew, RunCreated, RunStarted
from flowstream.model.snapshot import RunStatus, WorkflowRunSnapshot
from flowstream.replay.context import WorkflowContext
from flowstream.stores.base import EventStore
from tests.support import FakeClock, event_types, events_of, make_runtime, run, spec, task_failed
from tests.support.flows import Flows

SPEC = spec(
    "looper",
    version="7",
    runtime_build_id="build-1",
    patch_markers=("fix-rounding",),
    signal_names=("poke",),
)
BUILDS = RuntimeBuilds(current="build-1")


def engine_for(store: EventStore, workflow, clock: FakeClock) -> FlowEngine:  # type: ignore[no-untyped-def]
    return FlowEngine(store, make_runtime(workflow), clock=clock, builds=BUILDS)


def counter(ctx: WorkflowContext) -> RuntimeCommand:
    """Continues as new with ``n + 1`` until ``n == 3``."""
    assert isinstance(ctx.input, dict)
    n = ctx.input["n"]
    if n < 3:
        return ctx.continue_as_new({"n": n + 1})
    return ctx.complete({"n": n, "patched": ctx.has_patch_marker("fix-rounding")})


def test_a_run_continues_into_successors_with_the_identical_spec(flows: Flows) -> None:
    flow = flows(make_runtime(counter), builds=BUILDS)
    leaf = flow.start("root", SPEC, {"n": 0})
    assert leaf.status is RunStatus.COMPLETED
    assert leaf.output == {"n": 3, "patched": True}
    assert leaf.run_id != flow.id("root")

    chain = flow.continuation_chain("root")
    assert len(chain) == 4 and chain[0] == flow.id("root") and chain[-1] == leaf.run_id
    assert len(set(chain)) == 4
    for index, (predecessor, successor) in enumerate(pairwise(chain)):
        before = flow.snapshot(predecessor)
        after = flow.snapshot(successor)
        assert before.status is RunStatus.CONTINUED_AS_NEW
        assert before.outcome is not None and before.outcome.successor_run_id == successor
        assert after.spec == SPEC  # version, build id, patch markers, signal names
        assert after.input == {"n": index + 1}
        assert after.parent is not None
        assert after.parent.run_id == predecessor and after.parent.continued
        [link] = events_of(flow.history(predecessor), "run_continued_as_new")
        assert link.input == {"n": index + 1}


def test_drive_and_start_of_the_root_return_the_active_leaf(flows: Flows) -> None:
    flow = flows(make_runtime(counter), builds=BUILDS)
    leaf = flow.start("root", SPEC, {"n": 0})
    assert flow.retry("root").run_id == leaf.run_id
    assert flow.start("root", SPEC, {"n": 0}).run_id == leaf.run_id
    assert len(flow.continuation_chain("root")) == 4


def test_signals_and_cancellation_addressed_to_the_root_reach_the_leaf(flows: Flows) -> None:
    def waits_in_second_segment(ctx: WorkflowContext) -> RuntimeCommand:
        assert isinstance(ctx.input, dict)
        if ctx.input["n"] == 0:
            return ctx.continue_as_new({"n": 1})
        if ctx.cancellation_request() is not None:
            return ctx.cancel()
        if not ctx.signal_received("w"):
            return ctx.wait_for_signal("w", "poke")
        return ctx.create_hook("h", "leaf-token")

    flow = flows(make_runtime(waits_in_second_segment), builds=BUILDS)
    leaf = flow.start("root", SPEC, {"n": 0})
    assert leaf.status is RunStatus.SUSPENDED
    after_signal = flow.signal("root", "poke", 1, id="s1")
    assert after_signal.run_id == leaf.run_id
    assert flow.snapshot(leaf.run_id).signals[0].signal_id == "s1"
    assert flow.snapshot("root").signals == []
    cancelled = flow.cancel("root", "bye")
    assert cancelled.run_id == leaf.run_id
    assert cancelled.status is RunStatus.CANCELLED


def test_an_unconsumed_signal_blocks_continuation(flows: Flows) -> None:
    def continues_after_hook(ctx: WorkflowContext) -> RuntimeCommand:
        if not ctx.hook_received("h"):
            return ctx.create_hook("h", "blocker-token")
        return ctx.continue_as_new({"n": 1})

    flow = flows(make_runtime(continues_after_hook), builds=BUILDS)
    flow.start("root", SPEC, {"n": 0})
    flow.signal("root", "poke", "unread", id="s1")
    snapshot = flow.resume_hook("root", "h", None)
    caught = task_failed(snapshot, flow.history("root"), error=InvalidTransitionError)
    assert "signal" in caught.message
    assert event_types(flow.history("root"))[-2] == "hook_received"
    assert flow.continuation_chain("root") == [flow.id("root")]


def test_continuation_is_refused_while_cancelling(flows: Flows) -> None:
    def continues_on_cancel(ctx: WorkflowContext) -> RuntimeCommand:
        if ctx.cancellation_request() is None:
            return ctx.create_hook("h", "cancel-token")
        return ctx.continue_as_new({"n": 1})

    flow = flows(make_runtime(continues_on_cancel), builds=BUILDS)
    flow.start("root", SPEC, {"n": 0})
    task_failed(flow.cancel("root", "stop"), flow.history("root"), error=InvalidTransitionError)
    assert event_types(flow.history("root"))[-2] == "run_cancellation_requested"


def test_a_crash_between_the_link_and_the_successor_is_repaired_once(
    store: EventStore, clock: FakeClock
) -> None:
    store.append_if_sequence(
        "root",
        0,
        [
            RunCreated(spec=SPEC, input={"n": 2}),
            RunStarted(),
            RunContinuedAsNew(successor_run_id="root-2", input={"n": 3}),
        ],
    )
    assert store.list_runs() == ["root"]  # the process died before creating "root-2"
    engine = engine_for(store, counter, clock)
    leaf = run(engine.drive("root"))
    assert leaf.run_id == "root-2"
    assert leaf.output == {"n": 3, "patched": True}
    run(engine.drive("root"))
    run(engine.drive("root-2"))
    assert engine.list_runs() == ["root", "root-2"]
    assert len(events_of(store.read("root-2"), "run_created")) == 1
    assert store.read("root-2")[0].event.spec == SPEC  # type: ignore[union-attr]
    assert engine.continuation_chain("root") == ["root", "root-2"]


def test_the_successor_id_is_deterministic(clock: FakeClock) -> None:
    from flowstream.stores.memory import MemoryEventStore

    ids = []
    for _ in range(2):
        engine = engine_for(MemoryEventStore(clock=clock), counter, clock)
        run(engine.start("root", SPEC, {"n": 2}))
        ids.append(engine.continuation_chain("root"))
    assert ids[0] == ids[1]


def test_a_successor_that_does_not_match_its_link_is_reported(
    store: EventStore, clock: FakeClock
) -> None:
    store.append_if_sequence(
        "root",
        0,
        [
            RunCreated(spec=SPEC, input={"n": 2}),
            RunStarted(),
            RunContinuedAsNew(successor_run_id="root-2", input={"n": 3}),
        ],
    )
    store.append_if_sequence("root-2", 0, [RunCreated(spec=SPEC, input={"n": 99})])
    engine = engine_for(store, counter, clock)
    with pytest.raises(FlowError):
        run(engine.drive("root"))
    assert event_types(store.read("root-2")) == ["run_created"]


# -- bounds: the hop limit and the cycle guard (issue 16 item 5) ------------------------------


def forever(ctx: WorkflowContext) -> RuntimeCommand:
    """Continues as new every time, never waiting: a spin."""
    assert isinstance(ctx.input, dict)
    return ctx.continue_as_new({"n": ctx.input["n"] + 1})


def test_each_successor_link_stores_its_hop(flows: Flows) -> None:
    flow = flows(make_runtime(counter), builds=BUILDS)
    flow.start("root", SPEC, {"n": 0})
    chain = flow.continuation_chain("root")
    assert flow.snapshot("root").parent is None
    hops = [flow.state(r).parent.hop for r in chain[1:]]  # type: ignore[union-attr]
    assert hops == [1, 2, 3]


def hop_refusal(snapshot: WorkflowRunSnapshot) -> str:
    """The recorded refusal of ``snapshot``'s continuation: its workflow-task failure."""
    failure = snapshot.task_failure
    assert failure is not None and failure.error_type == LimitExceededError.__name__
    return failure.message


def test_a_workflow_that_always_continues_stops_at_the_hop_limit(flows: Flows) -> None:
    flow = flows(make_runtime(forever), builds=BUILDS, max_continuations=5)
    leaf = flow.start("root", SPEC, {"n": 0})
    message = hop_refusal(leaf)
    assert "hop 6" in message and "max_continuations=5" in message  # (its root: below)
    chain = flow.continuation_chain("root")
    assert len(chain) == 6
    assert leaf.run_id == chain[-1] and leaf.status is RunStatus.RUNNING
    # The refused hop appended no link: the last run records why it is not moving.
    assert event_types(flow.history(leaf.run_id)) == [
        "run_created",
        "run_started",
        "workflow_task_failed",
    ]
    retried = flow.retry("root")  # refused again, and recorded again
    assert retried.task_failure is not None and retried.task_failure.attempt == 2
    assert len(flow.continuation_chain("root")) == 6


def test_the_hop_limit_refusal_names_the_chains_root(flows: Flows) -> None:
    """Each link names its chain's root, so the refusal names it wherever the refused run lives
    (on Kafka the first runs of the chain live on other partitions)."""
    flow = flows(make_runtime(forever), builds=BUILDS, max_continuations=5)
    leaf = flow.start("root", SPEC, {"n": 0})
    assert f"root {flow.id('root')}," in hop_refusal(leaf)
    chain = flow.continuation_chain("root")
    assert {flow.state(r).parent.root for r in chain[1:]} == {chain[0]}  # type: ignore[union-attr]


def test_a_chain_whose_links_name_no_root_is_walked_back_to_it(
    store: EventStore, clock: FakeClock
) -> None:
    """Links written before they named their chain's root: the refusal walks back to it."""
    store.append_if_sequence(
        "root",
        0,
        [
            RunCreated(spec=SPEC, input={"n": 0}),
            RunStarted(),
            RunContinuedAsNew(successor_run_id="root-2", input={"n": 1}),
        ],
    )
    old_link = ParentLink(run_id="root", continued=True, hop=1)
    store.append_if_sequence("root-2", 0, [RunCreated(spec=SPEC, input={"n": 1}, parent=old_link)])
    engine = FlowEngine(
        store, make_runtime(forever), clock=clock, builds=BUILDS, max_continuations=1
    )
    leaf = run(engine.drive("root-2", retry_task=True))
    assert leaf.run_id == "root-2"
    assert "hop 2 of the continuation chain of root root," in hop_refusal(leaf)


def test_the_hop_limit_can_be_raised_or_disabled(store: EventStore, clock: FakeClock) -> None:
    engine = FlowEngine(
        store, make_runtime(counter), clock=clock, builds=BUILDS, max_continuations=3
    )
    assert run(engine.start("root", SPEC, {"n": 0})).output == {"n": 3, "patched": True}
    unlimited = FlowEngine(
        store, make_runtime(counter), clock=clock, builds=BUILDS, max_continuations=0
    )
    assert run(unlimited.start("other", SPEC, {"n": -10})).output == {"n": 3, "patched": True}
    assert len(unlimited.continuation_chain("other")) == 14
    with pytest.raises(ValueError):
        FlowEngine(store, make_runtime(counter), max_continuations=-1)


def test_the_limit_applies_to_growth_and_a_higher_one_lets_the_chain_go_on(
    store: EventStore, clock: FakeClock
) -> None:
    def engine(limit: int) -> FlowEngine:
        return FlowEngine(
            store, make_runtime(forever), clock=clock, builds=BUILDS, max_continuations=limit
        )

    assert "hop 5" in hop_refusal(run(engine(4).start("root", SPEC, {"n": 0})))
    assert len(engine(4).continuation_chain("root")) == 5
    # A chain longer than a lowered limit is still walked; it cannot grow.
    assert "hop 5" in hop_refusal(run(engine(2).drive("root", retry_task=True)))
    assert "hop 7" in hop_refusal(run(engine(6).drive("root", retry_task=True)))
    assert len(engine(2).continuation_chain("root")) == 7


def plant_cycle(store: EventStore) -> None:
    """``root`` continues into ``root-2``, which continues back into ``root``: each run's
    ``run_created`` matches the link that points to it, so only a cycle guard stops a walk."""
    store.append_if_sequence(
        "root",
        0,
        [
            RunCreated(
                spec=SPEC, input={"n": 1}, parent=ParentLink(run_id="root-2", continued=True)
            ),
            RunStarted(),
            RunContinuedAsNew(successor_run_id="root-2", input={"n": 2}),
        ],
    )
    store.append_if_sequence(
        "root-2",
        0,
        [
            RunCreated(spec=SPEC, input={"n": 2}, parent=ParentLink(run_id="root", continued=True)),
            RunStarted(),
            RunContinuedAsNew(successor_run_id="root", input={"n": 1}),
        ],
    )


def test_a_continuation_cycle_is_reported_by_every_chain_walk(
    store: EventStore, clock: FakeClock
) -> None:
    plant_cycle(store)
    engine = engine_for(store, counter, clock)
    walks = {
        "drive": lambda: run(engine.drive("root")),
        "start": lambda: run(engine.start("root", SPEC, {"n": 1})),
        "signal": lambda: run(engine.send_signal("root", "s1", "poke")),
        "cancel": lambda: run(engine.request_cancellation("root", "stop")),
        "force cancel": lambda: run(engine.force_cancel("root", "stop")),
        "chain": lambda: engine.continuation_chain("root"),
    }
    for what, walk in walks.items():
        with pytest.raises(CorruptHistoryError) as caught:
            walk()
        assert "cycle" in str(caught.value), what
    assert sorted(engine.list_runs()) == ["root", "root-2"]
    assert len(store.read("root")) == 3 and len(store.read("root-2")) == 3

"""A processor's continuation chains without a broker (issue 16 item 5): ``PartitionEngine`` over
a memory store, with the ``StartRun`` commands it emits fed back by hand as the processor would.
Successors carry their hop, a workflow that always continues stops at the hop limit, a start
that would lead a chain back into itself is refused instead of cycling through ``cmd.start``, and
the last run of a child's chain resolves the child."""

from __future__ import annotations

import pytest

from flowstream.errors import CorruptHistoryError, LimitExceededError
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import ParentLink, RunContinuedAsNew, RunCreated, RunStarted
from flowstream.model.messages import CommandMessage, ResolveChild, StartRun
from flowstream.processor.engine import PartitionEngine
from flowstream.replay.context import WorkflowContext
from flowstream.replay.decide import derived_run_id
from flowstream.stores.memory import MemoryEventStore
from tests.support import FakeClock, make_runtime, run, spec

SPEC = spec("looper")


def forever(ctx: WorkflowContext) -> RuntimeCommand:
    assert isinstance(ctx.input, int)
    return ctx.continue_as_new(ctx.input + 1)


def partition(store: MemoryEventStore, sent: list[CommandMessage]) -> PartitionEngine:
    return PartitionEngine(
        store,
        {None: make_runtime(forever)},
        dispatch=lambda run_id, steps: None,
        emit=sent.append,
        clock=FakeClock(),
        max_continuations=3,
    )


def deliver(engine: PartitionEngine, start: StartRun) -> None:
    engine.create(start.run_id, start.spec, start.input, parent=start.parent, depth=start.depth)
    run(engine.advance(start.run_id))


def test_successor_starts_carry_their_hop_and_the_chain_stops_at_the_limit() -> None:
    store = MemoryEventStore()
    sent: list[CommandMessage] = []
    engine = partition(store, sent)
    deliver(engine, StartRun(run_id="root", spec=SPEC, input=0))
    hops = []
    with pytest.raises(LimitExceededError) as caught:
        while True:
            start = sent.pop()
            assert isinstance(start, StartRun) and start.parent is not None
            hops.append(start.parent.hop)
            deliver(engine, start)
    assert hops == [1, 2, 3]
    assert "hop 4" in str(caught.value) and "root root" in str(caught.value)
    assert len(store.list_runs()) == 4 and not sent


def test_a_start_that_leads_a_chain_back_into_itself_is_refused() -> None:
    store = MemoryEventStore()
    store.append_if_sequence(
        "root",
        0,
        [
            RunCreated(spec=SPEC, input=1, parent=ParentLink(run_id="root-2", continued=True)),
            RunStarted(),
            RunContinuedAsNew(successor_run_id="root-2", input=2),
        ],
    )
    store.append_if_sequence(
        "root-2",
        0,
        [
            RunCreated(spec=SPEC, input=2, parent=ParentLink(run_id="root", continued=True, hop=1)),
            RunStarted(),
            RunContinuedAsNew(successor_run_id="root", input=1),
        ],
    )
    sent: list[CommandMessage] = []
    engine = partition(store, sent)
    run(engine.advance("root"))
    [start] = sent
    assert isinstance(start, StartRun) and start.run_id == "root-2"
    deliver(engine, start)  # root-2's link matches: it is root's successor
    [_, back] = sent
    assert isinstance(back, StartRun) and back.run_id == "root"
    with pytest.raises(CorruptHistoryError) as caught:
        deliver(engine, back)
    assert "hop 2" in str(caught.value) and "not followed" in str(caught.value)
    assert len(sent) == 2


def test_the_last_run_of_a_child_chain_resolves_the_child() -> None:
    """A child that continues as new: its successors carry the parent and the child id, so the
    chain's last run reports to the parent although its own link names only its predecessor."""
    store = MemoryEventStore()
    sent: list[CommandMessage] = []
    engine = PartitionEngine(
        store,
        {
            None: make_runtime(
                lambda ctx: ctx.continue_as_new(1) if ctx.input == 0 else ctx.complete("done")
            )
        },
        dispatch=lambda run_id, steps: None,
        emit=sent.append,
        clock=FakeClock(),
    )
    child_run = derived_run_id("parent-1", "child", "kid")
    deliver(
        engine,
        StartRun(
            run_id=child_run,
            spec=SPEC,
            input=0,
            parent=ParentLink(run_id="parent-1", child_id="kid"),
            depth=1,
        ),
    )
    [start] = sent
    assert isinstance(start, StartRun) and start.parent is not None
    assert (start.parent.reports_to, start.parent.child_id, start.parent.hop) == (
        "parent-1",
        "kid",
        1,
    )
    deliver(engine, start)
    resolve = sent[-1]
    assert isinstance(resolve, ResolveChild)
    assert (resolve.run_id, resolve.child_id, resolve.child_run_id) == (
        "parent-1",
        "kid",
        child_run,
    )
    assert resolve.outcome.type == "completed" and resolve.outcome.output == "done"

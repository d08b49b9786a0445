"""A processor's continuation chains without a broker (issue 16 item 5): ``PartitionEngine`` over
a memory store, with the commands it emits fed back by hand as the processor would.
Successors carry their hop, a workflow that always continues stops at the hop limit, a start
that would lead a chain back into itself is refused instead of cycling through ``cmd.start``, the
last run of a child's chain resolves the child, and commands for a continued run, or for a child
elsewhere that a forced cancel must end, go on by command."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from flowstream.errors import CorruptHistoryError
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import (
    ChildWorkflowRequested,
    ParentLink,
    RunContinuedAsNew,
    RunCreated,
    RunStarted,
)
from flowstream.model.messages import (
    CancelRun,
    CommandMessage,
    ResolveChild,
    RetryRun,
    SendSignal,
    StartRun,
)
from flowstream.processor.engine import PartitionEngine
from flowstream.replay.context import WorkflowContext
from flowstream.replay.decide import derived_run_id
from flowstream.settings import Settings
from flowstream.stores.base import EventStore
from flowstream.stores.memory import MemoryEventStore
from tests.support import FakeClock, make_runtime, run, spec

SPEC = spec("looper")


def forever(ctx: WorkflowContext) -> RuntimeCommand:
    assert isinstance(ctx.input, int)
    return ctx.continue_as_new(ctx.input + 1)


class Recorder:
    """An ``Emit`` that keeps what is sent, and which commands went behind a start."""

    def __init__(self, sent: list[CommandMessage]) -> None:
        self.sent = sent
        self.behind: list[CommandMessage] = []

    def __call__(self, command: CommandMessage, *, behind_start: bool = False) -> None:
        self.sent.append(command)
        if behind_start:
            self.behind.append(command)


def partition(store: EventStore, sent: list[CommandMessage]) -> PartitionEngine:
    return PartitionEngine(
        store,
        {None: make_runtime(forever)},
        dispatch=lambda run_id, steps: None,
        emit=Recorder(sent),
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
    while sent:
        start = sent.pop()
        assert isinstance(start, StartRun) and start.parent is not None
        hops.append(start.parent.hop)
        deliver(engine, start)
    assert hops == [1, 2, 3]
    assert len(store.list_runs()) == 4
    [last] = [r for r in store.list_runs() if not store.state(r).is_terminal]
    failure = engine.snapshot(last).task_failure
    assert failure is not None and failure.error_type == "LimitExceededError"
    assert "hop 4" in failure.message and "root root" in failure.message


def test_the_refusal_names_the_root_when_the_chain_began_on_other_partitions() -> None:
    """Each hop on a partition of its own (a store holding that run alone): the refused run
    reads no run before it, and its link names the chain's root."""
    starts = [StartRun(run_id="root", spec=SPEC, input=0)]
    engines: list[tuple[MemoryEventStore, PartitionEngine]] = []
    while starts:
        start = starts.pop()
        assert start.parent is None or start.parent.root == "root"
        store, sent = MemoryEventStore(), list[CommandMessage]()
        engines.append((store, partition(store, sent)))
        deliver(engines[-1][1], start)
        starts.extend(sent)
    assert len(engines) == 4
    store, engine = engines[-1]
    [last] = store.list_runs()
    failure = engine.snapshot(last).task_failure
    assert failure is not None and failure.error_type == "LimitExceededError"
    assert "hop 4" in failure.message and "root root," in failure.message


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
        emit=Recorder(sent),
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


def continued_root(store: MemoryEventStore) -> str:
    """``root`` continued as new into the successor the engine derived; the successor's id."""
    successor = derived_run_id("root", "continue", "2")
    store.append_if_sequence(
        "root",
        0,
        [
            RunCreated(spec=SPEC, input=0),
            RunStarted(),
            RunContinuedAsNew(successor_run_id=successor, input=1),
        ],
    )
    return successor


def test_signals_cancellations_and_retries_for_a_continued_run_go_on_to_its_successor() -> None:
    store = MemoryEventStore()
    successor = continued_root(store)
    sent: list[CommandMessage] = []
    recorder = Recorder(sent)
    engine = PartitionEngine(
        store,
        {None: make_runtime(forever)},
        dispatch=lambda run_id, steps: None,
        emit=recorder,
        clock=FakeClock(),
    )
    run(engine.send_signal("root", "s1", "go", 7))
    run(engine.request_cancellation("root", "stop"))
    run(engine.force_cancel("root", "now"))
    assert engine.forward_retry("root")
    forwarded = [
        SendSignal(run_id=successor, signal_id="s1", name="go", payload=7),
        CancelRun(run_id=successor, reason="stop"),
        CancelRun(run_id=successor, reason="now", force=True),
        RetryRun(run_id=successor),
    ]
    # Each goes on behind the successor's start; the retry sends that start again first.
    assert recorder.behind == forwarded
    [again] = [m for m in sent if isinstance(m, StartRun)]
    assert again.run_id == successor and again.input == 1 and again.parent is not None
    assert (again.parent.run_id, again.parent.hop) == ("root", 1)
    assert sent == [*forwarded[:3], again, forwarded[3]]
    assert not engine.forward_retry(successor)  # not created here yet: nothing to follow
    assert len(store.read("root")) == 3


def test_commands_are_not_forwarded_along_a_link_the_engine_did_not_derive() -> None:
    store = MemoryEventStore()
    store.append_if_sequence(
        "root",
        0,
        [RunCreated(spec=SPEC), RunStarted(), RunContinuedAsNew(successor_run_id="root")],
    )
    sent: list[CommandMessage] = []
    with pytest.raises(CorruptHistoryError) as caught:
        run(partition(store, sent).request_cancellation("root", "stop"))
    assert "not forwarded" in str(caught.value) and not sent


def test_a_forced_cancel_reaches_children_elsewhere_and_through_their_chain() -> None:
    store = MemoryEventStore()
    successor = continued_root(store)  # a child here that continued as new
    elsewhere = derived_run_id("p1", "child", "remote")
    store.append_if_sequence(
        "p1",
        0,
        [
            RunCreated(spec=SPEC),
            RunStarted(),
            ChildWorkflowRequested(child_id="remote", child_run_id=elsewhere, spec=SPEC),
            ChildWorkflowRequested(child_id="here", child_run_id="root", spec=SPEC, input=0),
        ],
    )
    sent: list[CommandMessage] = []
    snapshot = run(partition(store, sent).force_cancel("p1", "now"))
    assert snapshot.status.value == "cancelled"
    assert [CancelRun(run_id=r, reason="now", force=True) for r in (elsewhere, successor)] == [
        m for m in sent if isinstance(m, CancelRun)
    ]
    outcomes = {c.child_id: c.outcome for c in snapshot.children.values()}
    assert {k: o.type for k, o in outcomes.items() if o is not None} == {
        "remote": "cancelled",
        "here": "cancelled",
    }


def test_the_processor_hop_limit_is_a_setting() -> None:
    assert Settings().max_continuations == 1_000
    assert Settings.from_env({"FLOWSTREAM_MAX_CONTINUATIONS": "0"}).max_continuations == 0
    with pytest.raises(ValidationError):
        Settings.from_env({"FLOWSTREAM_MAX_CONTINUATIONS": "-1"})


def test_a_forwarded_command_keeps_its_ids() -> None:
    """A client's command id (and signal id) go on with it, so its outcome can follow."""
    store = MemoryEventStore()
    successor = continued_root(store)
    sent: list[CommandMessage] = []
    engine = partition(store, sent)
    signal = SendSignal(run_id="root", signal_id="s1", name="go", command_id="cmd-1")
    assert engine.forward(signal) == successor
    assert sent == [signal.model_copy(update={"run_id": successor})]
    assert engine.forward(SendSignal(run_id=successor, signal_id="s1", name="go")) is None

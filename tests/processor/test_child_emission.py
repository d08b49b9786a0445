"""A processor's children without a broker: ``PartitionEngine`` over a real ``PartitionStore``
whose transactions a test seals and commits by hand. A child's start, and a cancellation passed
on to it, are produced once, in the transaction that records them; an operator's retry and an
abort's re-drive send them again; a forced cancel never creates an abandoned child that lives
on another partition here."""

from __future__ import annotations

from pathlib import Path

from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import ChildCancellationPolicy, ChildWorkflowResolved, TerminalOutcome
from flowstream.model.messages import CancelRun, CommandMessage, StartRun
from flowstream.processor.engine import PartitionEngine
from flowstream.replay.context import WorkflowContext
from flowstream.stores.partition import PartitionStore
from tests.support import FakeClock, make_runtime, run, spec

PARENT = spec("parent")
KID = spec("kid")
KIDS = ("a", "b", "c")


def fan_out(ctx: WorkflowContext) -> RuntimeCommand:
    if ctx.run_id == "parent" and any(ctx.child_workflow_outcome(k) is None for k in KIDS):
        policy = ChildCancellationPolicy(str(ctx.input or "request_cancellation"))
        return ctx.start_child_workflows([ctx.child_workflow(k, KID, k, policy) for k in KIDS])
    return ctx.complete("done")


class Partition:
    def __init__(self, root: Path) -> None:
        self.store = PartitionStore(0, root / "p0", lambda *_: None, clock=FakeClock())
        self.sent: list[CommandMessage] = []
        self.behind: list[CommandMessage] = []
        self.engine = PartitionEngine(
            self.store,
            {None: make_runtime(fan_out)},
            dispatch=lambda run_id, steps: None,
            emit=self.emit,
            clock=FakeClock(),
        )

    def emit(self, command: CommandMessage, *, behind_start: bool = False) -> None:
        self.sent.append(command)
        if behind_start:
            self.behind.append(command)

    def commit(self) -> None:
        self.store.seal()
        self.store.commit_sealed(None)

    def starts(self) -> list[str]:
        found = [m.run_id for m in self.sent if isinstance(m, StartRun)]
        self.sent.clear()
        return found

    def resolve(self, kid: str) -> None:
        state = self.store.state("parent")
        self.store.append_if_sequence(
            "parent",
            state.last_sequence,
            [ChildWorkflowResolved(child_id=kid, outcome=TerminalOutcome(type="completed"))],
        )
        run(self.engine.advance("parent"))


def kid_runs(partition: Partition, *kids: str) -> list[str]:
    children = partition.store.state("parent").children
    return [children[k].run_id for k in kids]


def test_a_child_start_goes_out_once_with_its_request(tmp_path: Path) -> None:
    p = Partition(tmp_path)
    p.engine.create("parent", PARENT)
    run(p.engine.advance("parent"))
    assert p.starts() == kid_runs(p, *KIDS)
    run(p.engine.advance("parent"))  # again in the same transaction: sent already
    assert p.starts() == []
    p.commit()
    p.resolve("a")  # a child's report drives the parent: the others are not sent again
    p.commit()
    assert p.starts() == []
    run(p.engine.advance("parent", retry_task=True))  # an operator's retry sends them again
    assert p.starts() == kid_runs(p, "b", "c")


def test_a_cancellation_goes_on_to_the_children_once(tmp_path: Path) -> None:
    p = Partition(tmp_path)
    p.engine.create("parent", PARENT)
    run(p.engine.advance("parent"))
    p.commit()
    p.sent.clear()
    run(p.engine.request_cancellation("parent", "stop"))
    cancels = [CancelRun(run_id=r, reason="stop") for r in kid_runs(p, *KIDS)]
    assert p.sent == cancels and p.behind == cancels  # on cmd.start, behind each start
    p.commit()
    p.sent.clear()
    p.resolve("a")
    assert p.sent == []


def test_an_abort_throws_the_request_away_and_its_redrive_sends_the_start_again(
    tmp_path: Path,
) -> None:
    p = Partition(tmp_path)
    p.engine.create("parent", PARENT)
    run(p.engine.advance("parent"))
    assert len(p.starts()) == 3
    p.store.seal()
    assert p.store.discard() == {"parent"}  # the abort: nothing of it was committed
    assert not p.store.exists("parent")
    p.engine.create("parent", PARENT)  # the start is read again
    run(p.engine.advance("parent"))
    assert len(p.starts()) == 3


def test_a_forced_cancel_sends_an_abandoned_child_elsewhere_its_start_not_a_copy_here(
    tmp_path: Path,
) -> None:
    p = Partition(tmp_path)
    p.engine.create("parent", PARENT, "abandon")
    run(p.engine.advance("parent"))
    p.commit()
    p.sent.clear()
    snapshot = run(p.engine.force_cancel("parent", "ops"))
    assert snapshot.status.value == "cancelled"
    assert p.starts() == kid_runs(p, *KIDS)
    assert [r for r in kid_runs(p, *KIDS) if p.store.exists(r)] == []

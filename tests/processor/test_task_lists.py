"""What the loop asks of the owned partitions on every iteration, kept between changes: the
active and restoring tasks (``TaskManager``) follow every taking, activation, rebuild and drop,
and the consumer positions the transactions send follow every position a command moves, and
every rewind of an abort (the list itself is kept while nothing moved, and so is the named copy
a lane sends). The liveness scan, which skips its work until a partition is due,
still sees a partition the moment it becomes active."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from flowstream import wire
from flowstream.kafka import clients
from flowstream.model.events import RunCreated, RunStarted, SignalReceived
from flowstream.processor import sweeps
from flowstream.processor.boundary import FailureBoundary
from flowstream.processor.engine import PartitionEngine
from flowstream.processor.metrics import ProcessorMetrics
from flowstream.processor.sweeps import Sweeper
from flowstream.processor.tasks import PartitionTask, TaskManager
from flowstream.processor.txn.pipeline import POSITIONS, TransactionPipeline
from flowstream.processor.txn.slot import Record
from flowstream.stores.partition import PartitionStore
from flowstream.topology import CMD_CANCEL, CMD_HOOK, CMD_SIGNAL, CMD_START, CMD_TIMER
from tests.support import FakeClock, make_runtime, spec

TOPICS = {name: f"t.{name}" for name in (CMD_START, CMD_SIGNAL, CMD_HOOK, CMD_CANCEL, CMD_TIMER)}
SPEC = spec("lists", signal_names=("go",))


def _never_decides(ctx: Any) -> Any:
    return ctx.wait_for_signal("w1", "go")


class Tasks:
    """A ``TaskManager`` over real partition stores in ``root`` (no broker: nothing is taken
    from a consumer, tasks are owned directly)."""

    def __init__(self, root: Path) -> None:
        self.clock = FakeClock()
        self.runtime = make_runtime(_never_decides)
        ctx: Any = SimpleNamespace(topics=TOPICS, writer="w/1")
        self.manager = TaskManager(ctx, self.build, state_root=root)
        self.root = root

    def build(self, partition: int, path: Path, positions: dict[str, int]) -> PartitionTask:
        store = PartitionStore(partition, path, lambda *record: None, clock=self.clock)
        engine = PartitionEngine(
            store,
            {None: self.runtime},  # type: ignore[dict-item]
            dispatch=lambda run_id, steps: None,
            emit=lambda command, behind_start=False: None,
            clock=self.clock,
        )
        return PartitionTask(partition, store, engine, dict(positions), dict(positions))

    def task(self, partition: int, **positions: int) -> PartitionTask:
        moved = {TOPICS[name]: at for name, at in positions.items()}
        return self.build(partition, self.root / f"p{partition}", moved)


@pytest.fixture
def tasks(tmp_path: Path) -> Any:
    owned = Tasks(tmp_path)
    yield owned
    owned.manager.close()


def _partitions(tasks: list[PartitionTask]) -> list[int]:
    return sorted(t.partition for t in tasks)


def _positions(manager: TaskManager) -> set[tuple[str, int, int]]:
    return {(tp.topic, tp.partition, tp.offset) for tp in manager.positions()}


def test_the_active_and_restoring_tasks_follow_each_change(tasks: Tasks) -> None:
    manager = tasks.manager
    first, second = tasks.task(0), tasks.task(1)
    manager.own(first)
    manager.own(second)
    assert _partitions(manager.active()) == [] and _partitions(manager.restoring()) == [0, 1]
    manager.activate(first)
    assert manager.active() == [first] and manager.restoring() == [second]
    manager.activate(second)
    assert _partitions(manager.active()) == [0, 1] and manager.restoring() == []
    rebuilt = manager.rebuild(second, "a test rebuilds it")
    assert manager.active() == [first] and manager.restoring() == [rebuilt]
    manager.drop({0})
    assert manager.active() == [] and manager.restoring() == [rebuilt]
    manager.close()
    assert manager.active() == [] and manager.restoring() == []


def test_the_positions_sent_follow_every_move_and_rewind(tasks: Tasks) -> None:
    manager = tasks.manager
    first = tasks.task(0, **{CMD_START: 5, CMD_SIGNAL: -1001})
    second = tasks.task(1, **{CMD_START: 7})
    manager.own(first)
    manager.own(second)
    assert manager.positions() == []  # nothing restored yet
    manager.activate(first)
    assert _positions(manager) == {("t.cmd.start", 0, 5)}  # an unknown position is not sent
    first.positions["t.cmd.start"] = 6  # a command was consumed
    first.positions["t.cmd.signal"] = 3
    assert _positions(manager) == {("t.cmd.start", 0, 6), ("t.cmd.signal", 0, 3)}
    manager.activate(second)
    assert _positions(manager) == {
        ("t.cmd.start", 0, 6),
        ("t.cmd.signal", 0, 3),
        ("t.cmd.start", 1, 7),
    }
    first.positions = dict(first.committed)  # an abort rewinds to the last commit
    assert _positions(manager) == {("t.cmd.start", 0, 5), ("t.cmd.start", 1, 7)}


def _stalled(task: PartitionTask, run_id: str) -> None:
    """A run its last owner left right after its signal, before the decision."""
    store = task.store
    store.append_if_sequence(run_id, 0, [RunCreated(spec=SPEC, input=None), RunStarted()])
    store.append_if_sequence(run_id, 2, [SignalReceived(signal_id="s", name="go")])
    store.commit_local(None)


def test_a_partition_that_becomes_active_is_scanned_once_due_however_the_others_stand(
    tasks: Tasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [100.0]
    monkeypatch.setattr(sweeps, "time", SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(sweeps, "SCAN_INTERVAL_S", 5.0)
    first, second = tasks.task(0), tasks.task(1)
    for task in (first, second):
        task.restoring = False
        _stalled(task, f"stalled-{task.partition}")
    active = [first]
    ctx: Any = SimpleNamespace(metrics=ProcessorMetrics(), clock=tasks.clock)
    letters: Any = SimpleNamespace(for_run=lambda *args: None)
    sweeper = Sweeper(
        ctx,
        SimpleNamespace(active=lambda: list(active)),  # type: ignore[arg-type]
        FailureBoundary(ctx, letters),
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
    )

    def scan_at(at: float) -> tuple[list[str], list[str]]:
        now[0] = at
        sweeper.scan()
        return list(first.to_drive), list(second.to_drive)

    assert scan_at(100.0) == ([], [])  # the first look starts the partition's scan: due at 105
    active.append(second)
    assert scan_at(101.0) == ([], [])  # its scan starts now, before the first is due: at 106
    assert scan_at(104.9) == ([], [])
    assert scan_at(105.0) == (["stalled-0"], [])
    assert scan_at(105.5) == (["stalled-0"], [])
    assert scan_at(106.0) == (["stalled-0"], ["stalled-1"])
    first.to_drive.clear()
    second.to_drive.clear()
    # Partition 1 taken again (a reset): its new task starts a scan of its own.
    replaced = tasks.build(1, tasks.root / "p1-again", {})
    replaced.restoring = False
    active[1] = replaced
    _stalled(replaced, "stalled-again")
    scan_at(106.5)
    scan_at(111.4)
    assert list(replaced.to_drive) == []
    scan_at(111.5)
    assert list(replaced.to_drive) == ["stalled-again"]
    for task in (first, second, replaced):
        task.store.close()


def test_the_positions_list_is_the_same_object_until_something_moves(tasks: Tasks) -> None:
    """The pipeline tells unmoved positions by identity (``Txn.sent``): the list is kept while
    nothing moved, and made again for a move, a rewind and a change of the active tasks."""
    manager = tasks.manager
    first, second = tasks.task(0, **{CMD_START: 5}), tasks.task(1, **{CMD_START: 7})
    manager.own(first)
    manager.own(second)
    manager.activate(first)
    kept = manager.positions()
    assert manager.positions() is kept
    first.positions["t.cmd.start"] = 6
    moved = manager.positions()
    assert moved is not kept and _positions(manager) == {("t.cmd.start", 0, 6)}
    assert manager.positions() is moved
    manager.activate(second)
    both = manager.positions()
    assert both is not moved and _positions(manager) == {
        ("t.cmd.start", 0, 6),
        ("t.cmd.start", 1, 7),
    }
    first.positions = dict(first.committed)  # a rewind
    rewound = manager.positions()
    assert rewound is not both and _positions(manager) == {
        ("t.cmd.start", 0, 5),
        ("t.cmd.start", 1, 7),
    }
    manager.drop({1})
    assert manager.positions() is not rewound and _positions(manager) == {("t.cmd.start", 0, 5)}


def _tps(**offsets: int) -> list[Any]:
    return [
        clients.TopicPartition(f"t.cmd.{name[0]}", int(name[1:]), o) for name, o in offsets.items()
    ]


def _pipeline() -> TransactionPipeline:
    return TransactionPipeline(
        SimpleNamespace(),
        lambda slot: None,
        stuck_s=1.0,
        metrics=None,
        events_topic="t.events",
        lanes=(object(), object()),
    )


def _sealed(pipeline: TransactionPipeline, offsets: list[Any], writer: str) -> list[Any]:
    records: list[Any] = []
    pipeline._record_positions(records, offsets, writer)
    return records


def test_a_seal_records_the_positions_of_the_partitions_they_moved_only() -> None:
    """A ``positions`` record goes to each events partition whose command positions differ from
    those a transaction recorded last (when it wrote nothing else there), with every command
    topic of it; the same list is one identity test, an equal new list records nothing, and after
    an abort everything again."""
    pipeline = _pipeline()

    def recorded(records: list[Any]) -> dict[int, tuple[str, dict[str, int]]]:
        assert all(r.topic == "t.events" and r.headers == wire.POSITIONS_HEADERS for r in records)
        return {r.partition: wire.split_positions(r.value) for r in records}

    first = _tps(s0=5, h0=1, s1=7, h1=0)
    assert recorded(_sealed(pipeline, first, "w/1")) == {
        0: ("w/1", {"t.cmd.s": 5, "t.cmd.h": 1}),
        1: ("w/1", {"t.cmd.s": 7, "t.cmd.h": 0}),
    }
    assert _sealed(pipeline, first, "w/1") == []
    assert _sealed(pipeline, _tps(s0=5, h0=1, s1=7, h1=0), "w/1") == []
    moved = _tps(s0=5, h0=1, s1=8, h1=0)
    assert recorded(_sealed(pipeline, moved, "w/1")) == {1: ("w/1", {"t.cmd.s": 8, "t.cmd.h": 0})}
    pipeline.forget_positions()  # an abort: what was recorded may be gone
    assert set(recorded(_sealed(pipeline, moved, "w/2"))) == {0, 1}


def test_the_positions_ride_on_the_last_record_the_transaction_writes_to_the_partition() -> None:
    """Where the transaction writes to the events partition anyway, its positions are a header of
    the last such record (never of a record that may be left out or replaced by its fallback,
    nor of another topic's): no record of their own."""
    pipeline = _pipeline()
    event = wire.event_headers("w/1")
    records = [
        Record("t.events", 0, b"r1", b"\xc3\x01a", event),
        Record("t.events", 0, b"r1", b"\xc3\x01b", event),
        Record("t.deadletter", 1, b"", b"bad"),
        Record("t.events", 1, b"r2", b"\xc3\x01c", event),
        Record("t.events", 1, b"", b"dead", None, fallback=Record("t.events", 1, b"", b"")),
        Record("t.events", 1, b"", b"drop", None, droppable=True),
    ]
    pipeline._record_positions(records, _tps(s0=5, s1=7, s2=9), "w/1")

    def carried(record: Any) -> dict[str, int] | None:
        found = [v for k, v in record.headers or () if k == wire.POSITIONS_HEADER]
        return wire.split_positions(found[0])[1] if found else None

    assert [carried(r) for r in records[:6]] == [
        None,
        {"t.cmd.s": 5},
        None,
        {"t.cmd.s": 7},
        None,
        None,
    ]
    assert records[1].headers[: len(event)] == event  # its own headers are kept, in order
    assert records[6:] == [
        Record("t.events", 2, b"", wire.positions_value("w/1", {"t.cmd.s": 9}), POSITIONS)
    ]

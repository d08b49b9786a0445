"""The embedded run index (issue 21) and inspection through it (issue 19), on the memory store and
on RocksDB on disk: rows follow each append, filters and paging see every run once, a crash or a
store written before the index keeps it equal to what the histories say, and ``summary`` and
``list_open_suspensions`` answer without reading a history."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from rocksdict import AccessType, Options, Rdict

from flowstream.engine import FlowEngine
from flowstream.errors import FlowError, InvalidTransitionError
from flowstream.index import RunIndex, RunQuery
from flowstream.index.check import index_differences, list_all
from flowstream.index.rows import micros, open_items
from flowstream.index.table import BUILT_KEY
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import (
    RunCompleted,
    RunCreated,
    RunStarted,
    StepCompleted,
    StepCreated,
    StepStarted,
    WaitCompleted,
    WaitCreated,
)
from flowstream.model.snapshot import RunStatus
from flowstream.model.spec import RetryPolicy
from flowstream.replay.context import StepInvocation, WorkflowContext
from flowstream.replay.state import RunState
from flowstream.stores.base import EventStore
from flowstream.stores.memory import MemoryEventStore
from flowstream.stores.rocksdb import RocksDBEventStore
from tests.support import EPOCH, FakeClock, make_runtime, run, spec

ORDER = spec("order", signal_names=("approve",))
REFUND = spec("refund", signal_names=("approve",))
ROOT = Path(__file__).resolve().parents[2]


def order(ctx: WorkflowContext) -> RuntimeCommand:
    """Charge, then wait for ``approve``, a timer or a hook as the input says, then complete."""
    kind = (ctx.input or {}).get("wait", "signal") if isinstance(ctx.input, dict) else "signal"
    if not ctx.step_completed("charge"):
        failed = ctx.step_failed("charge")
        if failed is not None:
            return ctx.fail(f"charge failed: {failed}")
        retry = RetryPolicy(max_attempts=2, delay=timedelta(minutes=5))
        return ctx.schedule_step("charge", "charge", ctx.input, retry)
    if kind == "timer" and not ctx.wait_completed("cool"):
        return ctx.wait_for("cool", timedelta(hours=1))
    if kind == "hook" and not ctx.hook_received("h1"):
        return ctx.create_hook("h1", f"token-{ctx.run_id}")
    if kind == "signal" and not ctx.signal_received("approval"):
        return ctx.wait_for_signal("approval", "approve")
    return ctx.complete("done")


def charge(invocation: StepInvocation) -> str:
    if isinstance(invocation.input, dict) and invocation.input.get("bad"):
        raise RuntimeError("card declined")
    return "charged"


RUNTIME = make_runtime(order, {"charge": charge})


@pytest.fixture(params=["memory", "rocksdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> Iterator[EventStore]:
    opened: EventStore
    if request.param == "memory":
        opened = MemoryEventStore(clock=clock)
    else:
        opened = RocksDBEventStore(tmp_path / "db", clock=clock)
    yield opened
    opened.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def states(store: EventStore) -> list[RunState]:
    return [RunState.from_history(store.read(run_id)) for run_id in store.list_runs()]


def fill(engine: FlowEngine, runs: int) -> None:
    """``runs`` runs waiting for a signal, a timer or a hook in turn; r0 gets its signal."""
    for n in range(runs):
        run(engine.start(f"r{n}", ORDER, {"wait": ["signal", "timer", "hook"][n % 3]}))
    run(engine.signal("r0", "approve", id="s"))


def statuses(index: RunIndex, status: RunStatus) -> list[str]:
    return sorted(row.run_id for row in list_all(index, RunQuery(status=frozenset({status}))))


def test_a_run_shows_up_under_its_status_as_it_moves(store: EventStore, clock: FakeClock) -> None:
    engine = FlowEngine(store, RUNTIME, clock=clock)
    index = engine.run_index()
    clock.advance(seconds=1)
    run(engine.start("r1", ORDER))
    row = index.get("r1")
    assert row is not None and row.status is RunStatus.SUSPENDED
    assert row.waiting_for == "signal approve" and row.workflow == "order"
    assert statuses(index, RunStatus.SUSPENDED) == ["r1"]
    clock.advance(seconds=1)
    run(engine.start("t1", ORDER, {"wait": "timer"}))
    assert index.get("t1").waiting_for == "timer until 2026-01-01T01:00:02+00:00"  # type: ignore[union-attr]
    run(engine.start("h1", REFUND, {"wait": "hook"}))
    assert index.get("h1").waiting_for == "hook h1"  # type: ignore[union-attr]
    run(engine.start("bad", ORDER, {"bad": True}))
    bad = index.get("bad")
    assert bad is not None and bad.status is RunStatus.SUSPENDED
    assert bad.waiting_for == "retry of step charge at 2026-01-01T00:05:02+00:00"
    assert bad.last_error is not None and "card declined" in bad.last_error

    clock.advance(minutes=10)
    run(engine.signal("r1", "approve", id="s1"))
    run(engine.resume_due())
    engine.create("p1", ORDER, None)
    p1 = index.get("p1")
    assert p1 is not None and p1.status is RunStatus.PENDING and p1.waiting_for == "start"
    assert statuses(index, RunStatus.COMPLETED) == ["r1"]
    assert statuses(index, RunStatus.FAILED) == ["bad"]
    assert "card declined" in index.get("bad").last_error  # type: ignore[union-attr,operator]
    assert "r1" not in statuses(index, RunStatus.SUSPENDED)
    assert index.counts() == {
        **{status.value: 0 for status in RunStatus},
        "pending": 1,
        "suspended": 2,
        "completed": 1,
        "failed": 1,
    }
    refunds = list_all(index, RunQuery(workflow=frozenset({"refund"})))
    assert [r.run_id for r in refunds] == ["h1"]
    both = RunQuery(workflow=frozenset({"order"}), status=frozenset({RunStatus.SUSPENDED}))
    assert [r.run_id for r in list_all(index, both)] == ["t1"]
    assert index_differences(index, states(store)) == []


def test_paging_returns_every_run_once(store: EventStore, clock: FakeClock) -> None:
    engine = FlowEngine(store, RUNTIME, clock=clock)
    for n in range(230):
        if n % 50 == 0:
            clock.advance(minutes=1)  # many runs share an update time
        run(engine.start(f"r{n:03d}", ORDER if n % 3 else REFUND, {"wait": "signal"}))
    for n in range(0, 230, 4):
        run(engine.signal(f"r{n:03d}", "approve", id=f"s{n}"))
    index = engine.run_index()
    queries = [
        RunQuery(limit=17),
        RunQuery(limit=1, status=frozenset({RunStatus.COMPLETED})),
        RunQuery(limit=9, workflow=frozenset({"order", "refund"})),
        RunQuery(
            limit=7,
            workflow=frozenset({"order"}),
            status=frozenset({RunStatus.SUSPENDED, RunStatus.COMPLETED}),
        ),
    ]
    for query in queries:
        seen: list[str] = []
        cursor = None
        while True:
            page = index.query(query.model_copy(update={"cursor": cursor}))
            assert len(page.rows) <= query.limit
            seen.extend(row.run_id for row in page.rows)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        wanted = [
            s.run_id
            for s in states(store)
            if (query.status is None or s.public_status() in query.status)
            and (query.workflow is None or s.spec.name in query.workflow)
        ]
        assert len(seen) == len(set(seen)) and sorted(seen) == sorted(wanted), query
    after = EPOCH + timedelta(minutes=3)
    recent = list_all(index, RunQuery(updated_after=after))
    assert {r.run_id for r in recent} == {
        s.run_id for s in states(store) if s.updated_at is not None and s.updated_at >= after
    }
    older = list_all(index, RunQuery(updated_before=after))
    assert len(older) + len(recent) == 230 and not {r.run_id for r in older} & {
        r.run_id for r in recent
    }
    with pytest.raises(FlowError, match="invalid cursor"):
        index.query(RunQuery(cursor="nonsense"))


def test_summary_and_suspensions_read_the_index_not_the_histories(
    tmp_path: Path, clock: FakeClock
) -> None:
    path = tmp_path / "db"
    with RocksDBEventStore(path, clock=clock) as first:
        engine = FlowEngine(first, RUNTIME, clock=clock)
        for n, wait in enumerate(["signal", "timer", "hook", "signal", "none"]):
            run(engine.start(f"r{n}", ORDER, {"wait": wait}))
        run(engine.start("bad", ORDER, {"bad": True}))
        expected_items = {s.run_id: open_items(s) for s in states(first)}
    reopened = RocksDBEventStore(path, clock=clock)
    try:

        def no_history(run_id: str) -> None:
            raise AssertionError(f"read the history of {run_id}")

        reopened._load = no_history  # type: ignore[assignment,method-assign]
        engine = FlowEngine(reopened, RUNTIME, clock=clock)
        summary = engine.summary()
        assert summary.total_runs == 6
        assert summary.by_status == {RunStatus.SUSPENDED: 5, RunStatus.COMPLETED: 1}
        assert (summary.open_signal_waits, summary.open_waits, summary.active_hooks) == (2, 1, 1)
        assert summary.pending_retries == 1 and summary.open_children == 0
        found = engine.list_open_suspensions(clock.now + timedelta(hours=2))
        assert [(s.run_id, s.kind, s.subject_id) for s in found] == [
            (run_id, item.kind, item.subject_id)
            for run_id, items in sorted(expected_items.items())
            for item in items
        ]
        assert all(s.is_due for s in found if s.due is not None)
    finally:
        del reopened._load
        reopened.close()


def test_an_append_that_fails_half_way_leaves_the_index_on_what_the_store_holds(
    store: EventStore,
) -> None:
    # On RocksDB the second append joins the first's group commit: the run's index keys wait
    # for the group's write, from a state the failed batch advanced two events before failing.
    store.append_if_sequence("r1", 0, [RunCreated(spec=ORDER, input={}), RunStarted()])
    store.append_if_sequence("r1", 2, [WaitCreated(wait_id="w", resume_at=EPOCH)])
    with pytest.raises(InvalidTransitionError):
        store.append_if_sequence(
            "r1",
            3,
            [
                StepCreated(step_id="a", step_name="charge"),
                StepStarted(step_id="a", attempt=1),
                StepCompleted(step_id="unknown", output=1),
            ],
        )
    index = store.run_index()
    row = index.get("r1")
    assert row is not None and row.last_sequence == 3 and row.status is RunStatus.SUSPENDED
    assert row.waiting_for == "timer until 2026-01-01T00:00:00+00:00"
    assert index.counts()["suspended"] == 1
    assert index_differences(index, states(store)) == []
    # The run goes on from what the store holds, and the index with it.
    store.append_if_sequence("r1", 3, [WaitCompleted(wait_id="w"), RunCompleted(output=1)])
    assert index.get("r1").status is RunStatus.COMPLETED  # type: ignore[union-attr]
    assert index.counts()["suspended"] == 0 and index.counts()["completed"] == 1
    assert index_differences(index, states(store)) == []


def _drop_index(path: Path) -> None:
    db = Rdict(str(path), options=Options(raw_mode=True))
    try:
        db.delete_range(b"v", b"w")
        del db[BUILT_KEY]
    finally:
        db.close()


def test_a_store_written_before_the_index_is_indexed_on_open(
    tmp_path: Path, clock: FakeClock
) -> None:
    path = tmp_path / "db"
    with RocksDBEventStore(path, clock=clock) as first:
        fill(FlowEngine(first, RUNTIME, clock=clock), 20)
    _drop_index(path)
    # Read-only, the index is built in memory; read-write, on disk once.
    with RocksDBEventStore(path, read_only=True) as viewer:
        assert index_differences(viewer.run_index(), states(viewer)) == []
    with RocksDBEventStore(path, clock=clock) as second:
        assert second.run_index().counts()["suspended"] == 19
        assert index_differences(second.run_index(), states(second)) == []
    with RocksDBEventStore(path, clock=clock) as third:
        assert index_differences(third.run_index(), states(third)) == []


def test_a_store_whose_index_has_the_first_layout_is_indexed_again_on_open(
    tmp_path: Path, clock: FakeClock
) -> None:
    """The first layout had JSON objects for rows and counters and a key per run by update
    time, under the mark ``m/run_index``: such a store reads none of it and builds it anew."""
    path = tmp_path / "db"
    with RocksDBEventStore(path, clock=clock) as first:
        fill(FlowEngine(first, RUNTIME, clock=clock), 20)
    db = Rdict(str(path), options=Options(raw_mode=True))
    try:
        del db[BUILT_KEY]
        db[b"m/run_index"] = b"1"
        db[b"vc"] = b'{"suspended": 7}'
        db[b"vt" + bytes(8) + b"gone"] = b""
    finally:
        db.close()
    with RocksDBEventStore(path, clock=clock) as second:
        assert second.run_index().counts()["suspended"] == 19
        assert index_differences(second.run_index(), states(second)) == []
    db = Rdict(str(path), options=Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        assert db.get(b"m/run_index") is None and db.get(BUILT_KEY) is not None
        assert not [key for key in db.keys(from_key=b"vt") if bytes(key).startswith(b"vt")]
    finally:
        db.close()


def test_a_store_whose_index_has_the_second_layout_is_indexed_again_on_open(
    tmp_path: Path, clock: FakeClock
) -> None:
    """The second layout (mark ``m/run_index/2``) kept a key per run by status beside the one by
    workflow, no key per workflow, and the row in a key of its own (``vr<run>``) beside the run's
    last sequence: such a store is read as it is by a read-only open (the index built in memory)
    and built anew, its status keys deleted, by the next writer."""
    path = tmp_path / "db"
    with RocksDBEventStore(path, clock=clock) as first:
        fill(FlowEngine(first, RUNTIME, clock=clock), 20)
        clock.advance(seconds=1)
        run(FlowEngine(first, RUNTIME, clock=clock).start("x1", REFUND, {"wait": "timer"}))
        old = states(first)
    db = Rdict(str(path), options=Options(raw_mode=True))
    try:
        del db[BUILT_KEY]
        db[b"m/run_index/2"] = b"1"
        for key in [bytes(k) for k in db.keys(from_key=b"vn")]:
            if key.startswith(b"vn"):
                del db[key]
        for key, value in [(bytes(k), bytes(v)) for k, v in db.items(from_key=b"r")]:
            if key.startswith(b"r"):  # the run's last sequence alone, the row in a key of its own
                db[key] = value[:8]
                db[b"vr" + key[1:]] = value[8:]
        for state in [*old, RunState.from_history(old[0].history[:2])]:  # one run twice
            updated = state.updated_at or state.created_at
            newest = ((1 << 64) - 1 - micros(updated)).to_bytes(8, "big")
            status = state.public_status().value.encode()
            db[b"vs" + status + b"\0" + newest + state.run_id.encode()] = b""
    finally:
        db.close()
    with RocksDBEventStore(path, read_only=True) as viewer:
        assert index_differences(viewer.run_index(), states(viewer)) == []
    with RocksDBEventStore(path, clock=clock) as second:
        index = second.run_index()
        assert statuses(index, RunStatus.SUSPENDED) == sorted(
            s.run_id for s in old if s.public_status() is RunStatus.SUSPENDED
        )
        assert [r.run_id for r in index.query(RunQuery(limit=1)).rows] == ["x1"]
        assert index_differences(index, states(second)) == []
    db = Rdict(str(path), options=Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        assert db.get(b"m/run_index/2") is None and db.get(BUILT_KEY) is not None
        for old_prefix in (b"vs", b"vr"):
            assert not [k for k in db.keys(from_key=old_prefix) if bytes(k).startswith(old_prefix)]
        names = [bytes(k) for k in db.keys(from_key=b"vn") if bytes(k).startswith(b"vn")]
        assert names == [b"vnorder", b"vnrefund"]
    finally:
        db.close()


def test_an_append_writes_a_compact_row_and_moves_one_key(tmp_path: Path) -> None:
    """The index's keys are most of an append's write (and with ``sync="always"`` each costs
    an fsync): a row is an array of values, written after the run's last sequence in the key the
    store writes for every append (``r<run_id>``), and a run has one key by update time, by
    workflow and status (a listing without a workflow filter merges the workflows'); its
    workflow's key is written with the first run of the workflow only."""

    def kind(key: bytes) -> bytes:
        return key[:2] if key.startswith(b"v") else key[:1]

    store = RocksDBEventStore(tmp_path / "db", sync="always")
    written: list[list[tuple[bytes, bytes | None]]] = []
    table = store._run_table
    assert table is not None
    change = table.change

    def watched(before: Any, state: RunState) -> Any:
        found = change(before, state)
        written.append(found)
        return found

    table.change = watched  # type: ignore[method-assign]
    try:
        store.append_if_sequence("r1", 0, [RunCreated(spec=ORDER, input={}), RunStarted()])
        assert sorted(kind(key) for key, _ in written[-1]) == [b"r", b"vc", b"vn", b"vw"]
        store.append_if_sequence("r2", 0, [RunCreated(spec=ORDER, input={}), RunStarted()])
        assert sorted(kind(key) for key, _ in written[-1]) == [b"r", b"vc", b"vw"]
        store.append_if_sequence("r1", 2, [StepCreated(step_id="a", step_name="charge")])
        moved = written[-1]
        assert [key[:2] for key, value in moved if value is None] == [b"vw"]
        assert sorted(kind(key) for key, value in moved if value is not None) == [b"r", b"vw"]
        row = next(value for key, value in moved if key == b"r" + b"r1")
        assert row is not None and row[:8] == (3).to_bytes(8, "big") and len(row) < 128, row
        page = store.run_index().query(RunQuery())
        assert [r.run_id for r in page.rows] == ["r1", "r2"]
        assert page.rows[0] == store.run_index().get("r1")
        assert index_differences(store.run_index(), states(store)) == []
    finally:
        store.close()


def test_a_read_only_open_beside_the_writer_reads_its_index(
    tmp_path: Path, clock: FakeClock
) -> None:
    path = tmp_path / "db"
    with RocksDBEventStore(path, clock=clock) as writer:
        fill(FlowEngine(writer, RUNTIME, clock=clock), 5)
        with RocksDBEventStore(path, read_only=True) as viewer:
            index = viewer.run_index()
            assert index.counts()["suspended"] == 4 and index.counts()["completed"] == 1
            assert statuses(index, RunStatus.COMPLETED) == ["r0"]
            assert index_differences(index, states(writer)) == []


_CRASHING = textwrap.dedent(
    """
    import asyncio, os, sys
    from flowstream.engine import FlowEngine
    from flowstream.stores.rocksdb import RocksDBEventStore
    from tests.index.test_embedded_index import ORDER, RUNTIME

    async def main() -> None:
        store = RocksDBEventStore(sys.argv[1])
        engine = FlowEngine(store, RUNTIME)
        for n in range(40):
            await engine.start(f"r{n}", ORDER, {"wait": ["signal", "timer", "hook"][n % 3]})
        for n in range(0, 40, 3):
            await engine.signal(f"r{n}", "approve", id=f"s{n}")
        # Appends held for the next group commit, then the process dies without closing.
        for n in range(40, 45):
            engine.create(f"r{n}", ORDER, None)
        store._write_pending() if sys.argv[2] == "written" else None
        os._exit(0)

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("tail", ["written", "lost"])
def test_a_crash_keeps_the_index_equal_to_the_histories(tmp_path: Path, tail: str) -> None:
    path = tmp_path / "db"
    done = subprocess.run(
        [sys.executable, "-c", _CRASHING, str(path), tail],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    with RocksDBEventStore(path) as reopened:
        found = states(reopened)
        # Lost: none of the last creates had been written (they waited for a group commit).
        assert len(found) == (45 if tail == "written" else 40)
        assert index_differences(reopened.run_index(), found) == []
        assert reopened.run_index().counts()["completed"] == 14


def test_the_counters_are_written_only_when_an_append_moves_them(tmp_path: Path) -> None:
    """An append that moves no run to another status and opens or closes nothing leaves the
    counters' key alone (in a synced write of its own it was a quarter of the index's bytes);
    the counts stay right, in the store reopened too."""
    path = tmp_path / "db"
    store = RocksDBEventStore(path, sync="always")
    written: list[list[bytes]] = []
    table = store._run_table
    assert table is not None
    change = table.change

    def watched(before: Any, state: RunState) -> Any:
        found = change(before, state)
        written.append([key for key, _ in found])
        return found

    table.change = watched  # type: ignore[method-assign]
    store.append_if_sequence("r1", 0, [RunCreated(spec=ORDER, input={}), RunStarted()])
    store.append_if_sequence("r1", 2, [StepCreated(step_id="a", step_name="charge")])
    store.append_if_sequence("r1", 3, [StepStarted(step_id="a", attempt=1)])
    store.append_if_sequence("r1", 4, [WaitCreated(wait_id="w", resume_at=EPOCH)])
    store.append_if_sequence("r1", 5, [WaitCompleted(wait_id="w"), RunCompleted(output=1)])
    moved = [b"vc" in keys for keys in written]
    assert moved == [True, False, False, True, True], moved
    assert store.run_index().counts()["completed"] == 1
    store.close()
    again = RocksDBEventStore(path)
    try:
        totals = again.run_index().counts()
        assert totals == {**{s.value: 0 for s in RunStatus}, "completed": 1}, totals
        assert index_differences(again.run_index(), states(again)) == []
    finally:
        again.close()

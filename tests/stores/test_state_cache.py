"""Suspended runs cost disk, not memory (issue 19): a store keeps the projections of the runs it
is driving, a bounded number of them; a suspended run leaves memory and is read back from its
history on disk when its input arrives, and resumes exactly as if it had stayed.

Proven on RocksDB on disk (the embedded store, its cache capped low) and on the broker (the
Kafka store, whose partition stores let a run go once its suspension is committed), and on a
``PartitionStore`` with a sealed and an open batch: a run whose events are not written yet is
never evicted, whatever the bound.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from flowstream.engine import FlowEngine
from flowstream.model.commands import RuntimeCommand
from flowstream.model.events import RunCreated, RunStarted, WaitCreated
from flowstream.model.snapshot import RunStatus
from flowstream.replay.context import WorkflowContext
from flowstream.stores.base import EventStore
from flowstream.stores.kafka import KafkaEventStore
from flowstream.stores.partition import PartitionStore
from flowstream.stores.rocksdb import WRITE_BUFFERS_BYTES, RocksDBEventStore, rocksdb_memory
from tests.support import FakeClock, event_types, make_runtime, run, spec
from tests.support.stores import StoreFactory

SPEC = spec("parked", signal_names=("go",))
RUNS = [f"parked-{i:02d}" for i in range(24)]


def park(ctx: WorkflowContext) -> RuntimeCommand:
    """One step, then a signal, then complete with both."""
    if not ctx.step_completed("touch"):
        return ctx.schedule_step("touch", "touch", ctx.input)
    if not ctx.signal_received("w"):
        return ctx.wait_for_signal("w", "go")
    return ctx.complete({"step": ctx.step_output("touch"), "signal": ctx.signal_payload("w")})


def _cached(store: EventStore) -> set[str]:
    if isinstance(store, KafkaEventStore):
        return {r for partition in store._partitions for r in partition._states}
    return set(store._states)


@pytest.mark.parametrize("kind", ["rocksdb", pytest.param("kafka", marks=pytest.mark.kafka)])
def test_an_evicted_suspended_run_resumes_from_disk_on_its_signal(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The bound holds while runs are created; a run it let go resumes from its history on
    disk, and after a restart too (the Kafka store restores from its topic)."""
    if kind == "kafka":
        stores = StoreFactory(
            "kafka",
            tmp_path,
            bootstrap=request.getfixturevalue("kafka_bootstrap"),
            prefix=request.getfixturevalue("unique_prefix"),
        )
    else:
        stores = StoreFactory("rocksdb", tmp_path)
    clock = FakeClock()
    runtime = make_runtime(park, {"touch": lambda inv: inv.input})
    try:
        store = stores.open(clock=clock)
        bound = _bound(store, 5 if kind == "rocksdb" else 2)
        engine = FlowEngine(store, runtime, clock=clock)
        for index, run_id in enumerate(RUNS):
            assert run(engine.start(run_id, SPEC, {"i": index})).status is RunStatus.SUSPENDED
            assert len(_cached(store)) <= bound
        evicted = [r for r in RUNS if r not in _cached(store)]
        assert len(evicted) >= len(RUNS) - bound
        snapshot = run(engine.send_signal(evicted[0], "s-0", "go", {"by": "ann"}))
        assert snapshot.status is RunStatus.COMPLETED
        assert snapshot.output == {"step": {"i": RUNS.index(evicted[0])}, "signal": {"by": "ann"}}
        assert event_types(store.read(evicted[0]))[-3:] == [
            "signal_received",
            "signal_wait_completed",
            "run_completed",
        ]
        store = stores.reopen(store, clock=clock)
        engine = FlowEngine(store, runtime, clock=clock)
        snapshot = run(engine.send_signal(evicted[-1], "s-1", "go", "late"))
        assert snapshot.output == {"step": {"i": RUNS.index(evicted[-1])}, "signal": "late"}
        assert engine.snapshot(evicted[1]).status is RunStatus.SUSPENDED
    finally:
        stores.close_all()


def _bound(store: EventStore, runs: int) -> int:
    """Cap the store's cache at ``runs`` (a Kafka store: each partition's); the total bound."""
    if isinstance(store, KafkaEventStore):
        for partition in store._partitions:
            partition._cache_runs = runs
        return runs * len(store._partitions)
    assert isinstance(store, RocksDBEventStore)
    store._cache_runs = runs
    return runs


def _start(store: PartitionStore, run_id: str) -> None:
    store.append_if_sequence(run_id, 0, [RunCreated(spec=SPEC), RunStarted()])


def test_a_partition_lets_a_suspended_run_go_once_its_suspension_is_committed(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    store = PartitionStore(0, tmp_path / "p", lambda *_: None, clock=clock)
    _start(store, "timer")
    _start(store, "driven")  # waits on nothing: a decision is due, it is being driven
    store.append_if_sequence(
        "timer", 2, [WaitCreated(wait_id="w", resume_at=clock.now + timedelta(days=3))]
    )
    store.seal()
    assert {"timer", "driven"} <= set(store._states)  # sealed, not written: kept
    store.commit_sealed(1)
    assert "timer" not in store._states and "driven" in store._states
    state = store.state("timer")  # read back from disk, whole
    assert state.last_sequence == 3 and set(state.open_waits) == {"w"}
    store.close()


def test_the_partition_cache_is_bounded_and_keeps_the_runs_not_yet_written(
    tmp_path: Path,
) -> None:
    store = PartitionStore(0, tmp_path / "p", lambda *_: None, clock=FakeClock())
    store._cache_runs = 10
    for i in range(30):
        _start(store, f"w-{i:02d}")
        if i == 4:
            store.seal()  # w-00..w-04 are being committed, the rest is open
    # Over the bound, but no run with staged or sealed events is let go.
    assert set(store._states) == {f"w-{i:02d}" for i in range(30)}
    store.commit_sealed(1)
    store.commit_local(2)
    sizes = []
    for i in range(30, 60):
        _start(store, f"w-{i:02d}")
        store.commit_local(3 + i)
        sizes.append(len(store._states))
    # Back under the bound: a tenth of the surplus leaves with each run remembered.
    assert sizes[0] < 30 and max(sizes[-10:]) <= 10, sizes
    assert store.state("w-00").last_sequence == 2  # read back from disk
    store.close()


def test_the_stores_of_one_process_share_their_rocksdb_memory(tmp_path: Path) -> None:
    """The block cache and the write buffers are one per process, not one per store: the
    memtables of eight stores are counted by the one write-buffer manager."""
    stores = [RocksDBEventStore(tmp_path / f"s{i}") for i in range(8)]
    try:
        before = rocksdb_memory()["memtable_bytes"]
        blob = {"pad": "x" * 4000}
        for index, store in enumerate(stores):
            engine = FlowEngine(store, make_runtime(park, {"touch": lambda inv: inv.input}))
            for n in range(20):
                run(engine.start(f"r-{index}-{n}", SPEC, blob))
        used = rocksdb_memory()
        assert used["memtable_bytes"] - before > 8 * 20 * 4000, used
        assert used["memtable_bytes"] <= WRITE_BUFFERS_BYTES, used
    finally:
        for store in stores:
            store.close()

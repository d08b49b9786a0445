"""A ``PartitionStore`` counts its runs by status as events are appended (``stores.statuses``).

No Kafka: the counts must equal what reading every run says, on the live path (staged, sealed,
committed, aborted), after a restore however it is sliced, interrupted, resumed or discarded,
after a reopen, and for a store written before the counts existed (counted once when opened).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from flowstream.model.events import RunCompleted, RunCreated, RunStarted, WaitCreated
from flowstream.stores.partition import PartitionStore
from flowstream.stores.statuses import BUILT_KEY, StatusCounts
from tests.stores.test_partition_restore import live_records, new_store, restore
from tests.support import EPOCH, spec

SPEC = spec("statuses")

#: What the runs of ``live_records`` are when it ends.
LIVE = {"running": 2, "suspended": 3, "completed": 2, "pending": 1}


def read_every_run(store: PartitionStore) -> dict[str, int]:
    """The counts the slow way: every run's status."""
    found = Counter(store.state(run).public_status().value for run in store.list_runs())
    return dict(found)


@pytest.fixture
def records(tmp_path: Path) -> list[bytes]:
    found, _ = live_records(tmp_path)
    live = new_store(tmp_path / "live")
    assert live.status_counts() == read_every_run(live) == LIVE
    live.close()
    return found


def test_the_counts_move_with_commits_and_an_abort_drops_them(tmp_path: Path) -> None:
    store = new_store(tmp_path / "p")
    store.append_if_sequence("a", 0, [RunCreated(spec=SPEC), RunStarted()])
    assert store.status_counts() == {}  # staged only
    store.seal()
    store.append_if_sequence("b", 0, [RunCreated(spec=SPEC)])
    store.commit_sealed(None)
    assert store.status_counts() == {"running": 1}
    store.commit_local(None)
    assert store.status_counts() == {"running": 1, "pending": 1}
    store.append_if_sequence("a", 2, [WaitCreated(wait_id="w", resume_at=EPOCH)])
    store.seal()
    store.append_if_sequence("b", 1, [RunStarted(), RunCompleted()])
    store.discard()  # both transactions abort
    assert store.status_counts() == {"running": 1, "pending": 1}
    store.append_if_sequence("b", 1, [RunStarted(), RunCompleted()])
    store.commit_local(None)
    assert store.status_counts() == read_every_run(store) == {"running": 1, "completed": 1}
    store.close()
    reopened = new_store(tmp_path / "p")
    assert reopened.status_counts() == {"running": 1, "completed": 1}
    reopened.close()


@pytest.mark.parametrize("slice_size", [1, 4, 1000])
def test_a_restore_counts_what_the_live_path_counted(
    records: list[bytes], tmp_path: Path, slice_size: int
) -> None:
    store = new_store(tmp_path / "restored")
    restore(store, records, slice_size)
    # Before the end of the restore, the runs not finished count as running.
    assert store.status_counts() == {"running": 6, "completed": 2}
    assert store.finish_restore() == []
    assert store.status_counts() == read_every_run(store) == LIVE


@pytest.mark.parametrize("cut", [5, 17])
def test_an_interrupted_or_discarded_restore_counts_each_run_once(
    records: list[bytes], tmp_path: Path, cut: int
) -> None:
    first = new_store(tmp_path / "kept")
    restore(first, records[:cut], 4)
    first.restore_event(records[cut])  # staged, never committed
    first.close()
    second = new_store(tmp_path / "kept")
    for raw in records[cut : cut + 6]:
        second.restore_event(raw)
    second.discard()
    restore(second, records[cut:], 3, start=cut)
    assert second.finish_restore() == []
    assert second.status_counts() == LIVE
    # A tail restore into the finished store moves the runs it advances.
    tail = new_store(tmp_path / "tail")
    restore(tail, records[:cut], 5)
    assert tail.finish_restore() == []
    restore(tail, records[cut:], 5, start=cut)
    assert tail.finish_restore() == []
    assert tail.status_counts() == read_every_run(tail) == LIVE
    second.close()
    tail.close()


def test_a_store_written_before_the_counts_is_counted_once_when_opened(
    records: list[bytes], tmp_path: Path
) -> None:
    store = new_store(tmp_path / "old")
    restore(store, records, 1000)
    assert store.finish_restore() == []
    for key, _ in list(store._scan(b"m/status")):
        store._db.delete(key)
    assert store._db.get(BUILT_KEY) is None
    store.close()
    reopened = new_store(tmp_path / "old")
    assert reopened.status_counts() == LIVE
    assert reopened._db.get(BUILT_KEY) is not None
    reopened.close()


def test_moves_of_one_run_cancel_out_and_zero_counts_leave() -> None:
    counts = StatusCounts({"running": 1})
    counts.move(None, "pending")
    counts.move("pending", "running")
    counts.move("running", "completed")
    counts.move("completed", "completed")
    writes: dict[bytes, bytes] = {}

    class Batch:
        def put(self, key: bytes, value: bytes) -> None:
            writes[key] = value

    counts.commit_staged(Batch())
    assert counts.committed == {"running": 1, "completed": 1}
    assert set(writes) == {b"m/status/completed"}  # pending and running did not change
    counts.move("running", None)
    counts.commit_staged(Batch())
    assert counts.committed == {"completed": 1}
    assert int.from_bytes(writes[b"m/status/running"], "big", signed=True) == 0

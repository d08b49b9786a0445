"""RocksDB group commit: appends made before a ``wait_durable`` share one write and one fsync.

They are held in one batch until then, so every read that goes to the database (a run not in
the cache, the run list, the wakeup index, the hook index) must see them first, and a failed
group write must not leave cached projections ahead of the disk.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from flowstream.model.events import (
    HookCreated,
    RunCreated,
    RunStarted,
    StepCreated,
    WaitCreated,
)
from flowstream.model.spec import WorkflowSpec
from flowstream.stores.rocksdb import RocksDBEventStore
from tests.support import EPOCH

SPEC = WorkflowSpec(name="group")


def _started(store: RocksDBEventStore, run_id: str) -> None:
    store.append_if_sequence(run_id, 0, [RunCreated(spec=SPEC), RunStarted()])


def test_appends_awaiting_their_group_commit_are_seen_by_every_read(tmp_path: Path) -> None:
    store = RocksDBEventStore(tmp_path / "db", cache_runs=1)
    _started(store, "a")
    assert store.list_runs() == ["a"]
    due = EPOCH + timedelta(seconds=5)
    store.append_if_sequence("a", 2, [WaitCreated(wait_id="w", resume_at=due)])
    wakeup = store.next_wakeup()
    assert wakeup is not None and (wakeup.run_id, wakeup.subject_id) == ("a", "w")
    _started(store, "b")
    store.append_if_sequence("b", 2, [WaitCreated(wait_id="v", resume_at=due)])
    assert [w.run_id for w in store.due_wakeups(due)] == ["a", "b"]
    store.append_if_sequence("b", 3, [HookCreated(hook_id="h", token_digest="d" * 64)])
    assert store.find_hook("d" * 64) == ("b", "h")
    store.append_if_sequence("a", 3, [StepCreated(step_id="s", step_name="n")])
    _started(store, "c")  # the cache holds one run: "a" is read back from the database
    assert [e.sequence for e in store.read("a")] == [1, 2, 3, 4]
    _started(store, "d")
    _started(store, "e")  # "d" leaves the cache before anything of it was written
    assert store.exists("d")
    store.close()

    reopened = RocksDBEventStore(tmp_path / "db")
    assert [len(reopened.read(r)) for r in "abcde"] == [4, 4, 2, 2, 2]
    reopened.close()


class _FailingWrites:
    """The database, except that its next write fails as a full disk would."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self.failures = 1

    def write(self, batch: Any, options: Any) -> None:
        if self.failures:
            self.failures -= 1
            raise OSError("disk full")
        self._db.write(batch, options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def test_a_failed_group_write_drops_the_projections_it_had_advanced(tmp_path: Path) -> None:
    store = RocksDBEventStore(tmp_path / "db")
    _started(store, "r1")
    asyncio.run(store.wait_durable())
    store._db = _FailingWrites(store._db)  # type: ignore[assignment]
    store.append_if_sequence("r1", 2, [StepCreated(step_id="s", step_name="n")])
    assert len(store.read("r1")) == 3  # cached, not yet written
    with pytest.raises(OSError, match="disk full"):
        asyncio.run(store.wait_durable())
    assert len(store.read("r1")) == 2  # read again from the disk, without the lost append
    store.append_if_sequence("r1", 2, [StepCreated(step_id="t", step_name="n")])
    asyncio.run(store.wait_durable())
    store.close()
    reopened = RocksDBEventStore(tmp_path / "db")
    assert list(reopened.state("r1").steps) == ["t"]
    reopened.close()


def test_appends_from_threads_racing_group_commits_all_reach_the_disk(tmp_path: Path) -> None:
    store = RocksDBEventStore(tmp_path / "db")
    runs = [f"r{i}" for i in range(8)]
    done = threading.Event()

    def append(run_id: str) -> None:
        _started(store, run_id)
        for index in range(200):
            store.append_if_sequence(
                run_id, 2 + index, [StepCreated(step_id=f"s{index}", step_name="n")]
            )

    def commit() -> None:
        while not done.is_set():
            asyncio.run(store.wait_durable())

    committer = threading.Thread(target=commit)
    committer.start()
    writers = [threading.Thread(target=append, args=(run_id,)) for run_id in runs]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    done.set()
    committer.join()
    store.close()
    reopened = RocksDBEventStore(tmp_path / "db")
    assert [len(reopened.read(run_id)) for run_id in runs] == [202] * len(runs)
    reopened.close()

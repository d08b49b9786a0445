"""A ``PartitionStore`` with a sealed batch (the transaction being committed) and an open one.

The processor seals a partition's staged writes when it hands a transaction to the commit thread
and keeps staging decisions into a new batch. These tests prove, on RocksDB on disk, that the
sealed batch alone is written by ``commit_sealed``, that the overlays keep answering for both
generations and shrink once a batch is written, and that ``discard`` forgets both.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flowstream.model.events import RunCreated, RunStarted, StepCreated, StepStarted
from flowstream.stores.partition import PartitionStore
from tests.support import FakeClock, spec

SPEC = spec("seal")


def new_store(path: Path) -> PartitionStore:
    return PartitionStore(0, path, lambda *_: None, clock=FakeClock())


def start(store: PartitionStore, run_id: str) -> None:
    store.append_if_sequence(run_id, 0, [RunCreated(spec=SPEC), RunStarted()])


def test_only_the_sealed_batch_is_written_by_commit_sealed(tmp_path: Path) -> None:
    store = new_store(tmp_path / "p")
    start(store, "sealed-run")
    store.seal()
    start(store, "open-run")
    store.commit_sealed(7)
    store.close()

    reopened = new_store(tmp_path / "p")
    assert reopened.list_runs() == ["sealed-run"]
    assert reopened.events_offset == 7
    reopened.close()


def test_overlays_answer_for_both_generations_and_shrink_when_written(tmp_path: Path) -> None:
    store = new_store(tmp_path / "p")
    store.index_hook_token("d-sealed", "run-a", "hook-a")
    store.park("run-a", "cmd.signal:0:1", b"sealed")
    store.seal()
    store.index_hook_token("d-open", "run-b", "hook-b")
    store.park("run-b", "cmd.signal:0:2", b"open")

    assert store.hook_token_owner("d-sealed") == ("run-a", "hook-a")
    assert store.hook_token_owner("d-open") == ("run-b", "hook-b")
    assert {raw for _, _, raw in store.parked()} == {b"sealed", b"open"}

    store.commit_sealed(None)
    # The sealed entries now come from the database; the open ones are still staged only.
    assert store._staged_tokens == {b"td-open": ("run-b", "hook-b")}
    assert list(store._staged_inbox.values()) == [b"open"]
    assert store.hook_token_owner("d-sealed") == ("run-a", "hook-a")
    assert {raw for _, _, raw in store.parked()} == {b"sealed", b"open"}

    store.seal()
    store.commit_sealed(None)
    assert store._staged_tokens == {} and store._staged_inbox == {}
    assert store.hook_token_owner("d-open") == ("run-b", "hook-b")
    store.close()


def test_an_entry_staged_again_by_the_open_batch_survives_the_sealed_write(
    tmp_path: Path,
) -> None:
    store = new_store(tmp_path / "p")
    store.index_hook_token("d", "run-a", "hook-1")
    store.seal()
    store.index_hook_token("d", "run-a", "hook-2")
    store.commit_sealed(None)
    assert store.hook_token_owner("d") == ("run-a", "hook-2")
    store.discard()  # the open batch is aborted: the written value is what remains
    assert store.hook_token_owner("d") == ("run-a", "hook-1")
    store.close()


def test_discard_forgets_both_generations_and_their_cached_runs(tmp_path: Path) -> None:
    store = new_store(tmp_path / "p")
    start(store, "committed")
    store.commit_local(1)
    store.append_if_sequence(
        "committed",
        2,
        [StepCreated(step_id="s", step_name="n"), StepStarted(step_id="s", attempt=1)],
    )
    store.seal()
    start(store, "open-run")
    store.discard()

    assert store.state("committed").last_sequence == 2  # reloaded from disk, not the cache
    assert not store.exists("open-run")
    assert not store.has_sealed and not store.has_staged
    store.close()


def test_an_append_that_cannot_be_staged_produces_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The review's L5: records produced into the open transaction that the local state does
    not hold would commit as duplicate sequences later; staging comes first."""
    produced: list[str] = []
    store = PartitionStore(0, tmp_path / "p", lambda run_id, *_: produced.append(run_id))

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the batch cannot take it")

    monkeypatch.setattr(store, "_stage_write", broken)
    with pytest.raises(RuntimeError):
        start(store, "never")
    assert produced == []
    store.close()


def test_a_run_that_ended_leaves_the_state_cache_once_committed(tmp_path: Path) -> None:
    """A worker holds the state of the runs still going; a finished run is read from disk."""
    from flowstream.model.events import RunCompleted

    store = new_store(tmp_path / "p")
    start(store, "done-run")
    start(store, "going-run")
    store.append_if_sequence("done-run", 2, [RunCompleted(output={"ok": True})])
    store.seal()
    start(store, "staged-run")
    store.commit_sealed(3)
    assert "done-run" not in store._states
    assert "going-run" in store._states and "staged-run" in store._states
    state = store.state("done-run")  # read again from RocksDB
    assert state.is_terminal and state.last_sequence == 3
    store.close()

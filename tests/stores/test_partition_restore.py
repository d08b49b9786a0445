"""Restoring a ``PartitionStore`` from its event records gives the store the live path wrote.

No Kafka: a live store's sink collects the records it would produce, in order, and a fresh store
restores them (``restore_event`` per record, ``commit_local`` per slice, ``finish_restore``).
Every key and value must match the live store's (the events offset aside), however the restore
is sliced, interrupted or resumed from a kept directory.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from flowstream import codec
from flowstream.errors import FlowError, InvalidTransitionError, SerializationError
from flowstream.model.events import (
    FlowEvent,
    HookCreated,
    RunCompleted,
    RunCreated,
    RunStarted,
    StepCompleted,
    StepCreated,
    StepRetrying,
    StepStarted,
    WaitCompleted,
    WaitCreated,
)
from flowstream.model.spec import RetryPolicy
from flowstream.replay.decide import token_digest
from flowstream.stores import partition, restoring
from flowstream.stores.partition import PartitionStore
from tests.support import EPOCH, FakeClock, envelope, spec

SPEC = spec("restore")
DELAYED = RetryPolicy(delay_ms=1000)


def live_records(tmp_path: Path) -> tuple[list[bytes], dict[bytes, bytes]]:
    """Runs of every shape, interleaved; the records in topic order and the live content."""
    records: list[bytes] = []
    store = PartitionStore(
        0, tmp_path / "live", lambda run, envs, encoded: records.extend(encoded), clock=FakeClock()
    )
    due = EPOCH + timedelta(hours=1)
    shapes: dict[str, list[list[FlowEvent]]] = {
        "running": [
            [RunCreated(spec=SPEC, input={"n": 1}), RunStarted()],
            [StepCreated(step_id="s", step_name="n"), StepStarted(step_id="s", attempt=1)],
        ],
        "retrying": [
            [
                RunCreated(spec=SPEC),
                RunStarted(),
                StepCreated(step_id="s", step_name="n", retry=DELAYED),
            ],
            [StepStarted(step_id="s", attempt=1)],
            [StepRetrying(step_id="s", attempt=1, error="boom", retry_after=due)],
        ],
        "waiting": [
            [RunCreated(spec=SPEC), RunStarted()],
            [WaitCreated(wait_id="w", resume_at=due)],
        ],
        "woken": [
            [RunCreated(spec=SPEC), RunStarted(), WaitCreated(wait_id="w", resume_at=due)],
            [WaitCompleted(wait_id="w")],
        ],
        "hooked": [
            [RunCreated(spec=SPEC), RunStarted()],
            [HookCreated(hook_id="h", token_digest=token_digest("t1"))],
        ],
        "done": [
            [RunCreated(spec=SPEC), RunStarted(), StepCreated(step_id="s", step_name="n")],
            [StepStarted(step_id="s", attempt=1), WaitCreated(wait_id="w", resume_at=due)],
            [StepCompleted(step_id="s", output=3)],
            [RunCompleted(output="ok")],
        ],
        "done-hooked": [
            [RunCreated(spec=SPEC), RunStarted()],
            [HookCreated(hook_id="h", token_digest=token_digest("t2"))],
            [RunCompleted()],
        ],
        "created": [[RunCreated(spec=SPEC)]],
    }
    longest = max(len(batches) for batches in shapes.values())
    for round_ in range(longest):
        for run_id, batches in shapes.items():
            if round_ < len(batches):
                last = 0 if not store.exists(run_id) else store.state(run_id).last_sequence
                store.append_if_sequence(run_id, last, batches[round_])
                store.commit_local(None)
    content = dump(store)
    store.close()
    return records, content


def dump(store: PartitionStore) -> dict[bytes, bytes]:
    return {
        bytes(key): bytes(value)
        for key, value in store._db.items()
        if not bytes(key).startswith(b"m/")
    }


def restore(store: PartitionStore, records: list[bytes], slice_size: int, start: int = 0) -> None:
    for at in range(0, len(records), slice_size):
        for raw in records[at : at + slice_size]:
            store.restore_event(raw)
        store.commit_local(start + min(at + slice_size, len(records)))


@pytest.fixture
def live(tmp_path: Path) -> tuple[list[bytes], dict[bytes, bytes]]:
    return live_records(tmp_path)


def new_store(path: Path) -> PartitionStore:
    return PartitionStore(0, path, lambda *_: None, clock=FakeClock())


@pytest.mark.parametrize("slice_size", [1, 3, 7, 1000])
def test_a_restored_store_holds_what_the_live_path_wrote(
    live: tuple[list[bytes], dict[bytes, bytes]], tmp_path: Path, slice_size: int
) -> None:
    records, content = live
    store = new_store(tmp_path / "restored")
    restore(store, records, slice_size)
    assert store.finish_restore() == []
    assert dump(store) == content
    assert store.events_offset == len(records)
    assert sorted(store.running_runs()) == ["running"]
    # The runs that wait on nothing are driven after the restore, not marked in the store.
    assert sorted(store.to_drive) == ["created", "woken"]
    assert [w.run_id for w in store.due_wakeups(EPOCH + timedelta(days=1))] == [
        "retrying",
        "waiting",
    ]
    assert store.find_hook(token_digest("t1")) == ("hooked", "h")
    assert store.state("done").is_terminal
    # Restored records again (a rewound consumer) are already held.
    assert not any(store.restore_event(raw) for raw in records)


@pytest.mark.parametrize("slice_size", [1, 4])
def test_a_restore_lets_its_runs_go_and_reads_them_back_from_the_store(
    live: tuple[list[bytes], dict[bytes, bytes]],
    tmp_path: Path,
    slice_size: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With room for one run between slices and two per write of ``finish_restore``, a restore
    (interrupted, a slice discarded) keeps no more in memory and builds the same store."""
    monkeypatch.setattr(partition, "_RESTORED_KEPT", 1)
    monkeypatch.setattr(restoring, "_FINISH_CHUNK", 2)
    records, content = live
    first = new_store(tmp_path / "kept")
    restore(first, records[:13], slice_size)
    first.close()
    store = new_store(tmp_path / "kept")
    assert store._restored == {}  # nothing read up front: the u-marks stay on disk
    for raw in records[13:20]:
        store.restore_event(raw)
    store.discard()
    for at in range(13, len(records), slice_size):
        for raw in records[at : at + slice_size]:
            store.restore_event(raw)
        store.commit_local(min(at + slice_size, len(records)))
        assert len(store._restored) <= 1
    assert store.finish_restore() == []
    assert store._restored == {} and store._states == {}  # the runs are on disk alone
    assert dump(store) == content
    assert sorted(store.running_runs()) == ["running"]
    assert sorted(store.to_drive) == ["created", "woken"]
    assert not any(store.restore_event(raw) for raw in records)
    reference = new_store(tmp_path / "reference")
    restore(reference, records, 1000)
    assert reference.finish_restore() == []
    assert store.status_counts() == reference.status_counts()


def test_the_indexes_are_built_a_slice_at_a_time(
    live: tuple[list[bytes], dict[bytes, bytes]], tmp_path: Path
) -> None:
    """A processor builds a restore's indexes a slice per loop iteration: with its deadline
    passed, each slice builds one run, and the store ends as a whole ``finish_restore``
    builds it."""
    records, content = live
    store = new_store(tmp_path / "restored")
    restore(store, records, 1000)
    slices = 0
    while True:
        failures, done = store.finish_restore_slice(0.0)
        assert failures == []
        slices += 1
        if done:
            break
        assert store.finishing
    assert not store.finishing
    unfinished = ["created", "hooked", "retrying", "running", "waiting", "woken"]
    assert slices == len(unfinished)
    assert dump(store) == content
    assert sorted(store.running_runs()) == ["running"]
    assert sorted(store.to_drive) == ["created", "woken"]
    reference = new_store(tmp_path / "reference")
    restore(reference, records, 1000)
    assert reference.finish_restore() == []
    assert store.status_counts() == reference.status_counts()


@pytest.mark.parametrize("built", [1, 3, 5])
def test_a_finish_cut_short_keeps_the_runs_to_drive_it_found(
    live: tuple[list[bytes], dict[bytes, bytes]], tmp_path: Path, built: int
) -> None:
    """The partition goes (the store is closed) after some slices: the next owner's finish
    still drives the runs those slices found waiting on nothing, whose u-marks are gone."""
    records, content = live
    first = new_store(tmp_path / "kept")
    restore(first, records, 1000)
    for _ in range(built):
        assert first.finish_restore_slice(0.0) == ([], False)
    first.close()
    second = new_store(tmp_path / "kept")
    assert second.finish_restore() == []
    assert sorted(second.to_drive) == ["created", "woken"]
    assert sorted(second.running_runs()) == ["running"]
    assert dump(second) == content


@pytest.mark.parametrize("cut", [5, 11, 17, 23])
def test_an_interrupted_restore_resumes_from_the_kept_directory(
    live: tuple[list[bytes], dict[bytes, bytes]], tmp_path: Path, cut: int
) -> None:
    records, content = live
    first = new_store(tmp_path / "kept")
    restore(first, records[:cut], 4)
    first.restore_event(records[cut])  # staged, never committed
    first.close()
    second = new_store(tmp_path / "kept")
    assert second.events_offset == cut
    restore(second, records[cut:], 4, start=cut)
    assert second.finish_restore() == []
    assert dump(second) == content


@pytest.mark.parametrize("cut", [6, 14, 22])
def test_a_tail_restore_into_a_finished_store_advances_its_runs(
    live: tuple[list[bytes], dict[bytes, bytes]], tmp_path: Path, cut: int
) -> None:
    records, content = live
    store = new_store(tmp_path / "kept")
    restore(store, records[:cut], 5)
    assert store.finish_restore() == []
    restore(store, records[cut:], 5, start=cut)
    assert store.finish_restore() == []
    assert dump(store) == content


def test_a_discarded_slice_is_restored_again(
    live: tuple[list[bytes], dict[bytes, bytes]], tmp_path: Path
) -> None:
    records, content = live
    store = new_store(tmp_path / "restored")
    restore(store, records[:9], 9)
    for raw in records[9:20]:
        store.restore_event(raw)
    store.discard()  # the slice is thrown away; the consumer rewinds to offset 9
    restore(store, records[9:], 6, start=9)
    assert store.finish_restore() == []
    assert dump(store) == content


def test_records_that_are_no_legal_next_event_raise_and_change_nothing(tmp_path: Path) -> None:
    store = new_store(tmp_path / "restored")

    def record(run_id: str, sequence: int, event: Any) -> bytes:
        return codec.encode_event(envelope(run_id, sequence, event))

    store.restore_event(record("r1", 1, RunCreated(spec=SPEC)))
    store.restore_event(record("r1", 2, RunStarted()))
    store.restore_event(record("r1", 3, RunCompleted()))
    store.commit_local(3)
    before = dump(store)
    bad: list[tuple[bytes, type[FlowError]]] = [
        (b"not avro", SerializationError),
        (codec.encode_event(envelope("r1", 1, RunCreated(spec=SPEC)))[:20], SerializationError),
        (record("r2", 1, RunStarted()), InvalidTransitionError),
        (record("r2", 2, RunCreated(spec=SPEC)), InvalidTransitionError),
        (record("r1", 5, RunStarted()), InvalidTransitionError),
        (record("r1", 4, RunStarted()), InvalidTransitionError),
    ]
    for raw, error in bad:
        with pytest.raises(error):
            store.restore_event(raw)
    store.restore_event(record("r3", 1, RunCreated(spec=SPEC)))
    with pytest.raises(InvalidTransitionError):
        store.restore_event(record("r3", 2, RunCreated(spec=SPEC)))
    with pytest.raises(InvalidTransitionError):
        store.restore_event(record("r3", 3, RunStarted()))
    store.discard()
    store.commit_local(4)
    assert dump(store) == before
    assert store.finish_restore() == []


def test_a_live_run_whose_history_does_not_validate_is_reported(tmp_path: Path) -> None:
    store = new_store(tmp_path / "restored")
    created = codec.encode_event(envelope("r1", 1, RunCreated(spec=SPEC)))
    # Legal at a glance (contiguous, not after a terminal event), illegal in the state machine.
    ghost = codec.encode_event(envelope("r1", 2, StepCompleted(step_id="ghost")))
    store.restore_event(created)
    store.restore_event(ghost)
    store.commit_local(2)
    [(run_id, error)] = store.finish_restore()
    assert run_id == "r1" and isinstance(error, InvalidTransitionError)
    with pytest.raises(InvalidTransitionError):
        store.read("r1")
    assert store.finish_restore() == []  # reported once, not on every takeover

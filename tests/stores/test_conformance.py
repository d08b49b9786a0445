"""The event-store contract (the numbered rules of ``flowstream/stores/base.py``), proven against
every backend in ``STORE_KINDS``. A new backend passes this file before anything else."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

import pytest

from flowstream.errors import (
    CorruptHistoryError,
    EventConflictError,
    FlowError,
    HookTokenConflictError,
    InvalidIdentifierError,
    InvalidTransitionError,
    PayloadTooLargeError,
    RunNotFoundError,
    SerializationError,
    StoreLockedError,
)
from flowstream.model.events import (
    FlowEvent,
    HookCreated,
    HookReceived,
    RunCancelled,
    RunCompleted,
    RunCreated,
    RunStarted,
    SignalReceived,
    StepCompleted,
    StepCreated,
    StepRetrying,
    StepStarted,
    WaitCompleted,
    WaitCreated,
)
from flowstream.model.spec import RetryPolicy
from flowstream.replay.decide import token_digest
from flowstream.replay.state import Wakeup
from flowstream.stores.base import MAX_EVENT_BYTES, EventStore
from tests.support import EPOCH, FakeClock, envelope, event_types, spec
from tests.support.stores import StoreFactory

SPEC = spec("conformance", signal_names=("go",))
DIGEST_A = token_digest("token-a")
DIGEST_B = token_digest("token-b")


def started(store: EventStore, run_id: str, *extra: FlowEvent) -> int:
    """Create and start ``run_id`` (plus ``extra`` events); returns the last sequence."""
    events = [RunCreated(spec=SPEC, input={"n": 1}), RunStarted(), *extra]
    store.append_if_sequence(run_id, 0, events)
    return len(events)


def with_wait(store: EventStore, run_id: str, wait_id: str, due_in_s: float) -> int:
    return started(
        store, run_id, WaitCreated(wait_id=wait_id, resume_at=EPOCH + timedelta(seconds=due_in_s))
    )


# -- rule 1: optimistic concurrency --------------------------------------------------------


def test_new_run_is_appended_at_expected_sequence_zero(store: EventStore) -> None:
    envelopes = store.append_if_sequence("r1", 0, [RunCreated(spec=SPEC)])
    assert [e.sequence for e in envelopes] == [1]
    assert store.exists("r1")
    assert [e.sequence for e in store.read("r1")] == [1]


def test_stale_expected_sequence_conflicts_and_writes_nothing(store: EventStore) -> None:
    last = started(store, "r1")
    with pytest.raises(EventConflictError) as caught:
        store.append_if_sequence("r1", last - 1, [StepCreated(step_id="s", step_name="n")])
    assert caught.value.run_id == "r1"
    assert caught.value.expected_sequence == last - 1
    assert caught.value.actual_sequence == last
    assert len(store.read("r1")) == last
    assert "s" not in store.state("r1").steps


def test_expected_sequence_ahead_of_the_run_conflicts(store: EventStore) -> None:
    last = started(store, "r1")
    with pytest.raises(EventConflictError) as caught:
        store.append_if_sequence("r1", last + 3, [RunCompleted()])
    assert caught.value.actual_sequence == last
    assert event_types(store.read("r1")) == ["run_created", "run_started"]


def test_creating_an_existing_run_conflicts(store: EventStore) -> None:
    started(store, "r1")
    with pytest.raises(EventConflictError) as caught:
        store.append_if_sequence("r1", 0, [RunCreated(spec=SPEC)])
    assert caught.value.expected_sequence == 0
    assert caught.value.actual_sequence == 2


def test_only_one_of_two_writers_at_the_same_sequence_wins(store: EventStore) -> None:
    last = started(
        store, "r1", StepCreated(step_id="s", step_name="n"), StepStarted(step_id="s", attempt=1)
    )
    store.append_if_sequence("r1", last, [StepCompleted(step_id="s", output="first")])
    with pytest.raises(EventConflictError):
        store.append_if_sequence("r1", last, [StepCompleted(step_id="s", output="second")])
    assert store.state("r1").steps["s"].output == "first"
    assert len(store.read("r1")) == last + 1


# -- rule 2: contiguous, atomic batches -----------------------------------------------------


def test_batch_gets_contiguous_sequences_one_timestamp_and_fresh_ids(
    store: EventStore, clock: FakeClock
) -> None:
    clock.advance(seconds=5)
    first = store.append_if_sequence(
        "r1", 0, [RunCreated(spec=SPEC), RunStarted(), StepCreated(step_id="a", step_name="n")]
    )
    clock.advance(seconds=5)
    second = store.append_if_sequence(
        "r1", 3, [StepCreated(step_id="b", step_name="n"), StepStarted(step_id="a", attempt=1)]
    )
    assert [e.sequence for e in first] == [1, 2, 3]
    assert [e.sequence for e in second] == [4, 5]
    assert {e.timestamp for e in first} == {EPOCH + timedelta(seconds=5)}
    assert {e.timestamp for e in second} == {EPOCH + timedelta(seconds=10)}
    history = store.read("r1")
    assert [e.sequence for e in history] == [1, 2, 3, 4, 5]
    assert len({e.event_id for e in history}) == 5
    assert all(e.run_id == "r1" for e in history)
    assert [e.event_id for e in history] == [e.event_id for e in first + second]


def test_empty_append_writes_nothing(store: EventStore) -> None:
    last = started(store, "r1")
    assert store.append_if_sequence("r1", last, []) == []
    assert len(store.read("r1")) == last


def test_batch_with_one_invalid_event_writes_none_of_it(
    stores: StoreFactory, store: EventStore
) -> None:
    last = started(store, "r1")
    batch: list[FlowEvent] = [
        StepCreated(step_id="a", step_name="n"),
        StepStarted(step_id="a", attempt=1),
        StepCompleted(step_id="unknown", output=1),
    ]
    with pytest.raises(InvalidTransitionError):
        store.append_if_sequence("r1", last, batch)
    assert len(store.read("r1")) == last
    assert store.state("r1").steps == {}
    # The rejected batch did not leave a half-advanced cached projection behind.
    store.append_if_sequence("r1", last, [StepCreated(step_id="a", step_name="n")])
    assert [e.sequence for e in store.read("r1")] == [1, 2, 3]
    if stores.durable:
        reopened = stores.reopen(store)
        assert event_types(reopened.read("r1")) == ["run_created", "run_started", "step_created"]


def test_rejected_first_batch_creates_no_run(store: EventStore) -> None:
    with pytest.raises(InvalidTransitionError):
        store.append_if_sequence("r1", 0, [RunCreated(spec=SPEC), RunCompleted()])
    assert not store.exists("r1")
    assert store.list_runs() == []
    with pytest.raises(RunNotFoundError):
        store.read("r1")


# -- rule 3: the state machine guards every write -------------------------------------------


@pytest.mark.parametrize(
    ("events", "fragment"),
    [
        ([RunStarted()], "run_started"),
        ([RunCreated(spec=SPEC)], "run_created"),
        ([StepStarted(step_id="nope", attempt=1)], "unknown step"),
        ([StepCreated(step_id="a", step_name="n"), StepStarted(step_id="a", attempt=2)], "attempt"),
        ([WaitCompleted(wait_id="w")], "not waiting"),
        ([SignalReceived(signal_id="s", name="undeclared")], "not declared"),
        ([HookReceived(hook_id="h")], "not active"),
    ],
)
def test_illegal_transition_raises_and_writes_nothing(
    store: EventStore, events: list[FlowEvent], fragment: str
) -> None:
    last = started(store, "r1")
    with pytest.raises(InvalidTransitionError) as caught:
        store.append_if_sequence("r1", last, events)
    assert fragment in str(caught.value)
    assert caught.value.run_id == "r1"
    assert len(store.read("r1")) == last


def test_first_event_must_be_run_created(store: EventStore) -> None:
    with pytest.raises(InvalidTransitionError):
        store.append_if_sequence("r1", 0, [RunStarted()])
    assert not store.exists("r1")


def test_nothing_is_appended_after_a_terminal_event(store: EventStore) -> None:
    last = started(store, "r1", RunCompleted(output=1))
    with pytest.raises(InvalidTransitionError):
        store.append_if_sequence("r1", last, [RunCancelled()])
    assert len(store.read("r1")) == last


def test_invalid_run_id_is_rejected_before_anything_is_written(store: EventStore) -> None:
    for bad in ("", "has space", "slash/ed", "x" * 201, "dot.ted"):
        with pytest.raises(InvalidIdentifierError):
            store.append_if_sequence(bad, 0, [RunCreated(spec=SPEC)])
    assert store.list_runs() == []


# -- rule 4: payload limit ----------------------------------------------------------------------


def test_oversized_event_raises_and_writes_nothing(stores: StoreFactory, store: EventStore) -> None:
    big = "x" * (MAX_EVENT_BYTES + 1)
    with pytest.raises(PayloadTooLargeError) as caught:
        store.append_if_sequence("r1", 0, [RunCreated(spec=SPEC, input=big)])
    assert caught.value.limit == MAX_EVENT_BYTES
    assert caught.value.size > MAX_EVENT_BYTES
    assert big not in str(caught.value)
    assert not store.exists("r1")

    last = started(store, "r2")
    batch: list[FlowEvent] = [StepCreated(step_id="a", step_name="n"), RunCompleted(output=big)]
    with pytest.raises(PayloadTooLargeError):
        store.append_if_sequence("r2", last, batch)
    assert len(store.read("r2")) == last
    if stores.durable:
        reopened = stores.reopen(store)
        assert len(reopened.read("r2")) == last
        assert not reopened.exists("r1")


def test_event_just_under_the_limit_is_accepted(store: EventStore) -> None:
    store.append_if_sequence("r1", 0, [RunCreated(spec=SPEC, input="x" * (MAX_EVENT_BYTES - 2048))])
    assert len(store.read("r1")[0].event.input) == MAX_EVENT_BYTES - 2048  # type: ignore[union-attr,arg-type]


# -- rule 5: hook tokens ---------------------------------------------------------------------------


def test_active_hook_token_conflict_names_the_owner_and_writes_nothing(store: EventStore) -> None:
    started(store, "owner", HookCreated(hook_id="approve", token_digest=DIGEST_A))
    last = started(store, "thief")
    with pytest.raises(HookTokenConflictError) as caught:
        store.append_if_sequence("thief", last, [HookCreated(hook_id="h", token_digest=DIGEST_A)])
    err = caught.value
    assert err.owner_run_id == "owner"
    assert err.owner_hook_id == "approve"
    assert "owner" in str(err)
    assert DIGEST_A not in str(err) and "token-a" not in str(err)
    assert len(store.read("thief")) == last
    assert store.find_hook(DIGEST_A) == ("owner", "approve")


def test_same_token_for_another_hook_of_the_same_run_conflicts(store: EventStore) -> None:
    last = started(store, "r1", HookCreated(hook_id="h1", token_digest=DIGEST_A))
    with pytest.raises(HookTokenConflictError):
        store.append_if_sequence("r1", last, [HookCreated(hook_id="h2", token_digest=DIGEST_A)])
    assert len(store.read("r1")) == last


def test_token_of_a_settled_hook_or_finished_run_can_be_claimed_again(store: EventStore) -> None:
    last = started(store, "a", HookCreated(hook_id="h", token_digest=DIGEST_A))
    store.append_if_sequence("a", last, [HookReceived(hook_id="h", payload=1)])
    b_last = started(store, "b", HookCreated(hook_id="h", token_digest=DIGEST_A))
    assert store.find_hook(DIGEST_A) == ("b", "h")

    store.append_if_sequence("b", b_last, [RunCancelled(reason="stop")])
    started(store, "c", HookCreated(hook_id="k", token_digest=DIGEST_A))
    assert store.find_hook(DIGEST_A) == ("c", "k")


def test_distinct_tokens_do_not_conflict(store: EventStore) -> None:
    started(store, "a", HookCreated(hook_id="h", token_digest=DIGEST_A))
    started(store, "b", HookCreated(hook_id="h", token_digest=DIGEST_B))
    assert store.find_hook(DIGEST_A) == ("a", "h")
    assert store.find_hook(DIGEST_B) == ("b", "h")
    assert store.find_hook(token_digest("unknown")) is None


# -- rule 6: reads -------------------------------------------------------------------------------


def test_read_returns_the_complete_history_in_order(store: EventStore) -> None:
    store.append_if_sequence("r1", 0, [RunCreated(spec=SPEC)])
    for sequence in range(1, 30):
        event: FlowEvent = (
            RunStarted()
            if sequence == 1
            else StepCreated(step_id=f"s{sequence:02d}", step_name="n")
        )
        store.append_if_sequence("r1", sequence, [event])
    history = store.read("r1")
    assert [e.sequence for e in history] == list(range(1, 31))
    assert [e.event.step_id for e in history[2:]] == [f"s{i:02d}" for i in range(2, 30)]  # type: ignore[union-attr]


def test_read_returns_a_copy(store: EventStore) -> None:
    started(store, "r1")
    history = store.read("r1")
    history.clear()
    assert len(store.read("r1")) == 2


def test_unknown_run_is_run_not_found(store: EventStore) -> None:
    with pytest.raises(RunNotFoundError) as caught:
        store.read("missing")
    assert caught.value.run_id == "missing"
    with pytest.raises(RunNotFoundError):
        store.state("missing")
    assert not store.exists("missing")


def test_state_is_the_validated_projection(store: EventStore) -> None:
    started(store, "r1", StepCreated(step_id="a", step_name="n", retry=RetryPolicy.none()))
    state = store.state("r1")
    assert state.last_sequence == 3
    assert state.steps["a"].retry == RetryPolicy.none()
    assert state.input == {"n": 1}


def test_list_runs_is_sorted(store: EventStore) -> None:
    for run_id in ("b-2", "a_1", "C3", "a-0"):
        started(store, run_id)
    assert store.list_runs() == sorted(["b-2", "a_1", "C3", "a-0"])


def test_runs_are_independent(store: EventStore) -> None:
    started(store, "a")
    started(store, "b", StepCreated(step_id="x", step_name="n"))
    assert [e.sequence for e in store.read("a")] == [1, 2]
    assert [e.sequence for e in store.read("b")] == [1, 2, 3]
    assert {e.run_id for e in store.read("b")} == {"b"}


# -- rule 7: the wakeup index ------------------------------------------------------------------


def test_due_wakeups_are_exactly_the_due_ones_in_time_order(store: EventStore) -> None:
    with_wait(store, "late", "w", 30)
    with_wait(store, "early", "w", 10)
    with_wait(store, "middle", "w", 20)
    started(store, "none")
    at = EPOCH + timedelta(seconds=20)
    due = store.due_wakeups(at)
    assert [(w.run_id, w.kind, w.subject_id) for w in due] == [
        ("early", "wait", "w"),
        ("middle", "wait", "w"),
    ]
    assert due[1].due == at  # a deadline equal to now is due
    assert store.due_wakeups(EPOCH) == []
    assert store.next_wakeup() == Wakeup(EPOCH + timedelta(seconds=10), "early", "wait", "w")


def test_wakeups_leave_the_index_when_completed_or_terminal(store: EventStore) -> None:
    last = with_wait(store, "a", "w", 10)
    with_wait(store, "b", "w", 20)
    store.append_if_sequence("a", last, [WaitCompleted(wait_id="w")])
    assert [w.run_id for w in store.due_wakeups(EPOCH + timedelta(days=1))] == ["b"]
    store.append_if_sequence("b", 3, [RunCancelled()])
    assert store.due_wakeups(EPOCH + timedelta(days=1)) == []
    assert store.next_wakeup() is None


def test_delayed_retries_are_indexed_by_due_time(store: EventStore) -> None:
    retry = RetryPolicy.fixed(3, 1000)
    last = started(
        store,
        "r1",
        StepCreated(step_id="s", step_name="n", retry=retry),
        StepStarted(step_id="s", attempt=1),
    )
    due = EPOCH + timedelta(seconds=1)
    store.append_if_sequence(
        "r1", last, [StepRetrying(step_id="s", attempt=1, error="boom", retry_after=due)]
    )
    assert store.due_wakeups(due) == [Wakeup(due, "r1", "retry", "s")]
    assert store.next_wakeup() == Wakeup(due, "r1", "retry", "s")
    store.append_if_sequence("r1", last + 1, [StepStarted(step_id="s", attempt=2)])
    assert store.due_wakeups(due) == []


def test_due_wakeups_do_not_read_histories(
    stores: StoreFactory, store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for index in range(5):
        with_wait(store, f"r{index}", "w", index)
    if stores.durable:
        store = stores.reopen(store)  # a cold store: nothing cached
    loads: list[str] = []
    original = store._load
    monkeypatch.setattr(store, "_load", lambda run_id: loads.append(run_id) or original(run_id))
    due = store.due_wakeups(EPOCH + timedelta(seconds=2))
    assert [w.run_id for w in due] == ["r0", "r1", "r2"]
    assert store.next_wakeup() is not None
    assert loads == []


# -- rule 8: the open-runs index ------------------------------------------------------------------


def test_open_runs_are_the_live_runs_in_id_order_a_page_at_a_time(store: EventStore) -> None:
    for run_id in ("d", "b", "a", "c", "e"):
        started(store, run_id)
    store.append_if_sequence("c", 2, [RunCompleted()])
    assert store.open_runs(None, 10) == ["a", "b", "d", "e"]
    assert store.open_runs(None, 2) == ["a", "b"]
    assert store.open_runs("b", 2) == ["d", "e"]
    assert store.open_runs("bb", 10) == ["d", "e"]
    assert store.open_runs("e", 10) == []


def test_a_run_joins_the_open_runs_with_its_first_event_and_leaves_with_its_end(
    store: EventStore,
) -> None:
    store.append_if_sequence("pending", 0, [RunCreated(spec=SPEC)])
    store.append_if_sequence("done", 0, [RunCreated(spec=SPEC), RunStarted(), RunCompleted()])
    assert store.open_runs(None, 10) == ["pending"]
    store.append_if_sequence("pending", 1, [RunStarted(), RunCancelled()])
    assert store.open_runs(None, 10) == []


def test_a_rejected_append_leaves_the_open_runs_as_they_were(store: EventStore) -> None:
    started(store, "a")
    with pytest.raises(InvalidTransitionError):
        store.append_if_sequence("a", 2, [RunCompleted(), RunStarted()])
    with pytest.raises(InvalidTransitionError):
        store.append_if_sequence("b", 0, [RunStarted()])
    assert store.open_runs(None, 10) == ["a"]


def test_the_open_runs_survive_a_restart(stores: StoreFactory, store: EventStore) -> None:
    started(store, "a")
    started(store, "b")
    with_wait(store, "c", "w", 10)
    store.append_if_sequence("b", 2, [RunCompleted()])
    reopened = stores.reopen(store)
    assert reopened.open_runs(None, 10) == ["a", "c"]
    reopened.append_if_sequence("a", 2, [RunCompleted()])
    assert reopened.open_runs(None, 10) == ["c"]


# -- validation on read ----------------------------------------------------------------------------


def _bad_histories() -> dict[str, list]:  # type: ignore[type-arg]
    created = RunCreated(spec=SPEC)
    return {
        "gap": [envelope("bad", 1, created), envelope("bad", 3, RunStarted())],
        "duplicate": [
            envelope("bad", 1, created),
            envelope("bad", 2, RunStarted()),
            envelope("bad", 2, RunStarted()),
        ],
        "no-create": [envelope("bad", 1, RunStarted())],
        "foreign": [envelope("bad", 1, created), envelope("other", 2, RunStarted())],
        "illegal": [
            envelope("bad", 1, created),
            envelope("bad", 2, RunStarted()),
            envelope("bad", 3, StepCompleted(step_id="ghost")),
        ],
        "after-terminal": [
            envelope("bad", 1, created),
            envelope("bad", 2, RunStarted()),
            envelope("bad", 3, RunCompleted()),
            envelope("bad", 4, RunCancelled()),
        ],
    }


@pytest.mark.parametrize("case", sorted(_bad_histories()))
def test_corrupt_stored_history_is_reported_on_read(
    stores: StoreFactory, store: EventStore, case: str
) -> None:
    stores.write_raw_history(store, "bad", _bad_histories()[case])
    with pytest.raises(CorruptHistoryError) as caught:
        store.read("bad")
    if case != "foreign":  # see the test below
        assert caught.value.run_id == "bad"
    with pytest.raises(CorruptHistoryError):
        store.state("bad")
    with pytest.raises(CorruptHistoryError):
        store.append_if_sequence("bad", 2, [StepCreated(step_id="s", step_name="n")])


def test_corrupt_history_error_names_the_run_that_was_read(
    stores: StoreFactory, store: EventStore
) -> None:
    stores.write_raw_history(store, "bad", _bad_histories()["foreign"])
    with pytest.raises(CorruptHistoryError) as caught:
        store.read("bad")
    assert caught.value.run_id == "bad"


def test_undecodable_stored_bytes_are_a_serialization_error(
    stores: StoreFactory, store: EventStore
) -> None:
    stores.write_raw_bytes(store, "bad", [(1, b"{not json")])
    with pytest.raises(SerializationError):
        store.read("bad")


# -- durability (durable kinds) ------------------------------------------------------------------


def test_history_and_indexes_survive_a_restart(stores: StoreFactory, store: EventStore) -> None:
    started(store, "a", HookCreated(hook_id="h", token_digest=DIGEST_A))
    with_wait(store, "b", "w", 10)
    before = store.read("a")
    reopened = stores.reopen(store)
    assert reopened.read("a") == before
    assert reopened.list_runs() == ["a", "b"]
    assert reopened.find_hook(DIGEST_A) == ("a", "h")
    assert reopened.next_wakeup() == Wakeup(EPOCH + timedelta(seconds=10), "b", "wait", "w")
    with pytest.raises(EventConflictError):
        reopened.append_if_sequence("a", 2, [RunCompleted()])
    with pytest.raises(HookTokenConflictError):
        started(reopened, "c", HookCreated(hook_id="h", token_digest=DIGEST_A))
    reopened.append_if_sequence("a", 3, [RunCompleted()])
    assert reopened.next_wakeup() is not None


def test_a_second_opener_gets_a_clear_error(stores: StoreFactory, store: EventStore) -> None:
    if not stores.durable:
        pytest.skip("only durable stores hold a lock")
    started(store, "a")
    path = stores._paths[id(store)]
    with pytest.raises(StoreLockedError) as caught:
        stores.open(path=path)
    assert str(path) in str(caught.value)
    assert store.read("a")  # the first holder is unaffected


def test_racing_threads_at_one_sequence_produce_exactly_one_winner(store: EventStore) -> None:
    last = started(store, "r1")
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def writer(index: int) -> None:
        barrier.wait(timeout=30)
        try:
            store.append_if_sequence("r1", last, [StepCreated(step_id=f"s{index}", step_name="n")])
            outcomes.append("won")
        except EventConflictError:
            outcomes.append("conflict")

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["conflict"] * 7 + ["won"]
    history = store.read("r1")
    assert [e.sequence for e in history] == [1, 2, 3]
    assert len(store.state("r1").steps) == 1


def test_an_unknown_event_schema_version_is_not_read_as_v1(
    stores: StoreFactory, store: EventStore
) -> None:
    future = envelope("r1", 1, RunCreated(spec=SPEC)).model_copy(update={"schema_version": 99})
    stores.write_raw_history(store, "r1", [future])
    with pytest.raises(FlowError):
        store.read("r1")


# -- failures around a commit ----------------------------------------------------------------------


def test_a_failed_write_leaves_no_events_and_no_cached_state(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    last = started(store, "r1")

    def broken(*args: object) -> None:
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(store, "_persist", broken)
        with pytest.raises(OSError):
            store.append_if_sequence("r1", last, [StepCreated(step_id="s", step_name="n")])
    assert len(store.read("r1")) == last
    assert store.state("r1").steps == {}
    store.append_if_sequence("r1", last, [StepCreated(step_id="t", step_name="n")])
    assert list(store.state("r1").steps) == ["t"]


def test_listeners_see_each_committed_batch_once(store: EventStore) -> None:
    seen: list[list[int]] = []
    store.add_listener(lambda batch: seen.append([e.sequence for e in batch]))
    started(store, "r1")
    store.append_if_sequence("r1", 2, [StepCreated(step_id="s", step_name="n")])
    with pytest.raises(EventConflictError):
        store.append_if_sequence("r1", 2, [StepCreated(step_id="t", step_name="n")])
    assert seen == [[1, 2], [3]]


def test_a_failing_listener_does_not_fail_a_committed_append(store: EventStore) -> None:
    def broken(batch: object) -> None:
        raise RuntimeError("observer crashed")

    store.add_listener(broken)
    envelopes = store.append_if_sequence("r1", 0, [RunCreated(spec=SPEC)])
    assert [e.sequence for e in envelopes] == [1]


def test_a_store_written_before_the_open_runs_index_gets_it_when_opened(
    tmp_path: Path, clock: FakeClock
) -> None:
    # Only the embedded store outlives its format (the others restore from the topic).
    stores = StoreFactory("rocksdb", tmp_path)
    try:
        store = stores.open(clock=clock)
        started(store, "a")
        started(store, "b", RunCompleted())
        with_wait(store, "c", "w", 10)
        store._write_pending()  # type: ignore[attr-defined]
        db = store._db  # type: ignore[attr-defined]
        index = [bytes(k) for k, _ in db.items() if bytes(k).startswith((b"o", b"m/open_index"))]
        for key in index:
            del db[key]
        assert stores.reopen(store).open_runs(None, 10) == ["a", "c"]
    finally:
        stores.close_all()

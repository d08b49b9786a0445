"""What only the Kafka-backed store has to prove: the events topic is the durable log (a lost or
stale state directory is rebuilt from it), one transaction per append, fencing by transactional
id, and clear errors when the topic and the local state disagree. The contract itself is proven by
``test_conformance.py`` and the engine suites, which run on the ``kafka`` kind too."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from flowstream import codec, wire
from flowstream.engine import FlowEngine
from flowstream.errors import (
    CorruptHistoryError,
    EventConflictError,
    FlowError,
    HookTokenConflictError,
    PayloadTooLargeError,
    StoreLockedError,
)
from flowstream.kafka import clients
from flowstream.model.events import (
    FlowEvent,
    HookCreated,
    RunCompleted,
    RunCreated,
    RunStarted,
    StepCreated,
    StepStarted,
    WaitCreated,
)
from flowstream.model.snapshot import RunStatus
from flowstream.partitioning import partition_for
from flowstream.replay.decide import token_digest
from flowstream.stores.base import MAX_EVENT_BYTES
from flowstream.stores.kafka import KafkaEventStore
from flowstream.stores.partition import PartitionStore
from flowstream.topology import TopologyError, load_topology
from tests.support import EPOCH, FakeClock, envelope, make_runtime, run, spec
from tests.support.stores import StoreFactory, read_events_topic

pytestmark = pytest.mark.kafka

SPEC = spec("kafka-store")
PARTITIONS = load_topology().run_partitions
# Enough runs that every partition of the events topic holds some.
RUNS = [f"run-{i:02d}" for i in range(24)]

Opener = Callable[..., KafkaEventStore]


@pytest.fixture
def factory(kafka_bootstrap: str, unique_prefix: str, tmp_path: Path) -> Iterator[StoreFactory]:
    made = StoreFactory("kafka", tmp_path, bootstrap=kafka_bootstrap, prefix=unique_prefix)
    try:
        yield made
    finally:
        made.close_all()


@pytest.fixture
def open_store(
    kafka_bootstrap: str, unique_prefix: str, factory: StoreFactory, tmp_path: Path
) -> Iterator[Opener]:
    """``open_store(state, transactional_id="store")``: a store on this test's events topic."""
    prefix = factory._new_log(unique_prefix)
    opened: list[KafkaEventStore] = []

    def opener(
        state: str, *, transactional_id: str = "store", prefix: str = prefix, **options: Any
    ) -> KafkaEventStore:
        store = KafkaEventStore(
            kafka_bootstrap,
            prefix=prefix,
            state_dir=tmp_path / state,
            transactional_id=f"{unique_prefix}.{transactional_id}",
            **options,
        )
        opened.append(store)
        return store

    try:
        yield opener
    finally:
        for store in opened:
            store.close()


def fill(store: KafkaEventStore) -> None:
    """Runs of every shape on every partition: steps, waits, hooks, terminal ones."""
    for index, run_id in enumerate(RUNS):
        events: list[FlowEvent] = [RunCreated(spec=SPEC, input={"i": index}), RunStarted()]
        match index % 4:
            case 0:
                events.append(StepCreated(step_id="s", step_name="n"))
                events.append(StepStarted(step_id="s", attempt=1))
            case 1:
                due = EPOCH + timedelta(days=index)
                events.append(WaitCreated(wait_id="w", resume_at=due))
            case 2:
                digest = token_digest(f"token-{index}")
                events.append(HookCreated(hook_id="h", token_digest=digest))
            case _:
                events.append(RunCompleted(output=index))
        store.append_if_sequence(run_id, 0, events)


def view(store: KafkaEventStore) -> dict[str, Any]:
    """Everything a reader can see."""
    return {
        "runs": store.list_runs(),
        "histories": {run_id: store.read(run_id) for run_id in store.list_runs()},
        "due": store.due_wakeups(EPOCH + timedelta(days=len(RUNS))),
        "next": store.next_wakeup(),
        "hooks": [store.find_hook(token_digest(f"token-{i}")) for i in range(len(RUNS))],
    }


# -- the topic is the durable log --------------------------------------------------------------


def test_runs_cover_every_partition() -> None:
    assert {partition_for(run_id, PARTITIONS) for run_id in RUNS} == set(range(PARTITIONS))


def test_a_deleted_state_directory_is_rebuilt_from_the_topic(
    open_store: Opener, tmp_path: Path
) -> None:
    clock = FakeClock()
    store = open_store("state", clock=clock)
    fill(store)
    sleeper = make_runtime(
        lambda ctx: (
            ctx.complete("woke")
            if ctx.wait_completed("nap")
            else ctx.wait_until("nap", EPOCH + timedelta(minutes=5))
        )
    )
    run(FlowEngine(store, sleeper, clock=clock).start("sleeper", SPEC))
    before = view(store)
    store.close()
    shutil.rmtree(tmp_path / "state")

    rebuilt = open_store("state", clock=clock)
    assert view(rebuilt) == before
    assert len(before["runs"]) == len(RUNS) + 1
    # The rebuilt state is the sequence authority and enforces every index again.
    with pytest.raises(EventConflictError):
        rebuilt.append_if_sequence("run-00", 3, [RunCompleted()])
    with pytest.raises(HookTokenConflictError):
        rebuilt.append_if_sequence(
            "thief",
            0,
            [RunCreated(spec=SPEC), HookCreated(hook_id="h", token_digest=token_digest("token-2"))],
        )
    rebuilt.append_if_sequence("run-00", 4, [RunCompleted()])
    engine = FlowEngine(rebuilt, sleeper, clock=clock)
    later = clock.advance(minutes=5)
    assert run(engine.resume_due(later)).resumed == ["sleeper"]
    assert engine.snapshot("sleeper").status is RunStatus.COMPLETED


def test_a_kept_state_directory_reads_only_the_tail_of_the_topic(
    open_store: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = open_store("a")
    fill(first)
    first.close()
    # Another process (another state directory, the same transactional id) writes more.
    second = open_store("b")
    second.append_if_sequence("run-00", 4, [RunCompleted(output="late")])
    second.append_if_sequence("late", 0, [RunCreated(spec=SPEC), RunStarted()])
    expected = view(second)
    second.close()

    restored: list[bytes] = []
    original = PartitionStore.restore_event

    def counting(self: PartitionStore, raw: bytes) -> bool:
        restored.append(raw)
        return original(self, raw)

    monkeypatch.setattr(PartitionStore, "restore_event", counting)
    reopened = open_store("a")
    assert view(reopened) == expected
    read = sorted((e.run_id, e.sequence) for e in map(codec.decode_event, restored))
    assert read == [("late", 1), ("late", 2), ("run-00", 5)]


def test_a_state_directory_of_another_topic_is_refused(
    open_store: Opener, factory: StoreFactory, unique_prefix: str
) -> None:
    store = open_store("state")
    fill(store)
    store.close()
    other = factory._new_log(f"{unique_prefix}-other")
    with pytest.raises(FlowError) as caught:
        open_store("state", prefix=other, transactional_id="other")
    assert "delete the directory" in str(caught.value)


def test_events_are_keyed_by_run_on_the_run_partition_in_sequence_order(
    open_store: Opener,
) -> None:
    store = open_store("state")
    fill(store)
    records = read_events_topic(store)
    assert len(records) == sum(len(store.read(run_id)) for run_id in RUNS)
    for record in records:
        event = codec.decode_event(record.value)
        assert record.key == event.run_id.encode()
        assert record.partition == partition_for(event.run_id, PARTITIONS)
        assert record.headers[wire.RECORD_HEADER] == wire.RecordKind.EVENT.value.encode()
        assert record.headers[wire.WRITER_HEADER] == store.transactional_id.encode()
    for run_id in RUNS:
        on_topic = [codec.decode_event(r.value) for r in records if r.key == run_id.encode()]
        assert on_topic == store.read(run_id)


# -- transactions and fencing -----------------------------------------------------------------


class _FailingCommits:
    """Wraps a producer; ``commit_transaction`` fails with an abortable error."""

    def __init__(self, producer: Any) -> None:
        self._producer = producer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def commit_transaction(self, *args: Any) -> None:
        raise clients.KafkaException(
            clients.KafkaError(clients.KafkaError._INVALID_ARG, "injected", txn_requires_abort=True)
        )


def test_a_failed_commit_aborts_and_appends_nothing(open_store: Opener, tmp_path: Path) -> None:
    store = open_store("state")
    store.append_if_sequence("r1", 0, [RunCreated(spec=SPEC), RunStarted()])
    seen: list[int] = []
    store.add_listener(lambda batch: seen.extend(e.sequence for e in batch))
    real = store._producer
    store._producer = _FailingCommits(real)  # type: ignore[assignment]
    with pytest.raises(FlowError) as caught:
        store.append_if_sequence("r1", 2, [StepCreated(step_id="lost", step_name="n")])
    assert caught.value.run_id == "r1"
    assert "nothing was appended" in str(caught.value)
    assert len(store.read("r1")) == 2
    assert store.state("r1").steps == {}
    assert seen == []

    store._producer = real
    store.append_if_sequence("r1", 2, [StepCreated(step_id="kept", step_name="n")])
    assert seen == [3]
    store.close()
    shutil.rmtree(tmp_path / "state")
    rebuilt = open_store("state")
    assert list(rebuilt.state("r1").steps) == ["kept"]
    assert [e.sequence for e in rebuilt.read("r1")] == [1, 2, 3]


def test_a_second_store_with_the_same_transactional_id_fences_the_first(
    open_store: Opener,
) -> None:
    first = open_store("a")
    first.append_if_sequence("r1", 0, [RunCreated(spec=SPEC), RunStarted()])
    second = open_store("b")
    assert len(second.read("r1")) == 2

    for run_id, expected in (("r1", 2), ("r2", 0), ("r1", 2)):
        with pytest.raises(StoreLockedError) as caught:
            first.append_if_sequence(run_id, expected, [_next(expected)])
        message = str(caught.value)
        assert "fenced" in message and first.transactional_id in message
    assert len(first.read("r1")) == 2  # reads still answer from the local state
    assert not first.exists("r2")

    second.append_if_sequence("r1", 2, [StepCreated(step_id="s", step_name="n")])
    assert [codec.decode_event(r.value).sequence for r in read_events_topic(second)] == [1, 2, 3]


def _next(expected: int) -> FlowEvent:
    return RunCreated(spec=SPEC) if expected == 0 else StepCreated(step_id="z", step_name="n")


def test_a_second_opener_of_the_state_directory_fences_nobody(open_store: Opener) -> None:
    first = open_store("state")
    with pytest.raises(StoreLockedError):
        open_store("state")
    first.append_if_sequence("r1", 0, [RunCreated(spec=SPEC)])
    assert len(first.read("r1")) == 1


# -- the topic and the state disagree ---------------------------------------------------------


def test_a_missing_events_topic_is_a_topology_error(open_store: Opener, unique_prefix: str) -> None:
    with pytest.raises(TopologyError) as caught:
        open_store("state", prefix=f"{unique_prefix}-missing")
    assert "flowstream topics apply" in str(caught.value)
    assert open_store("state").list_runs() == []  # the failed open released the directory


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(lambda: codec.encode_event(envelope("bad", 1, RunStarted())), id="illegal"),
        pytest.param(lambda: b"not avro", id="undecodable"),
    ],
)
def test_a_record_the_store_cannot_apply_stops_the_open(
    open_store: Opener, kafka_bootstrap: str, raw: Callable[[], bytes]
) -> None:
    store = open_store("state")
    store.append_if_sequence("good", 0, [RunCreated(spec=SPEC)])
    topic = store.topic
    store.close()
    producer = clients.new_producer(kafka_bootstrap)
    producer.produce(topic, raw(), key=b"bad", partition=partition_for("bad", PARTITIONS))
    assert producer.flush(30) == 0
    with pytest.raises(CorruptHistoryError) as caught:
        open_store("fresh")
    assert f"{topic}[{partition_for('bad', PARTITIONS)}]@" in str(caught.value)
    assert "flowstream audit" in str(caught.value)


def test_commit_timestamps_come_from_the_store_clock(open_store: Opener) -> None:
    moment = datetime(2030, 5, 17, 12, tzinfo=EPOCH.tzinfo)
    store = open_store("state", clock=lambda: moment)
    [created] = store.append_if_sequence("r1", 0, [RunCreated(spec=SPEC)])
    assert created.timestamp == moment
    assert codec.decode_event(read_events_topic(store)[0].value).timestamp == moment


def test_a_closed_store_refuses_appends(open_store: Opener) -> None:
    store = open_store("state")
    store.close()
    with pytest.raises(FlowError) as caught:
        store.append_if_sequence("r1", 0, [RunCreated(spec=SPEC)])
    assert "closed" in str(caught.value)


def test_an_event_rule_4_accepts_fits_the_events_topic(open_store: Opener) -> None:
    store = open_store("state", clock=FakeClock())
    shape = envelope("r1", 1, RunCreated(spec=SPEC, input="")).model_copy(
        update={"event_id": "0" * 32}
    )
    size = MAX_EVENT_BYTES - 64 - len(codec.encode_event(shape))
    try:
        [created] = store.append_if_sequence("r1", 0, [RunCreated(spec=SPEC, input="x" * size)])
    except PayloadTooLargeError:  # not the expected failure: the event must be within rule 4
        pytest.fail("the test event exceeds MAX_EVENT_BYTES")
    assert MAX_EVENT_BYTES - 80 < len(codec.encode_event(created)) <= MAX_EVENT_BYTES

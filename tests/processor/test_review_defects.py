"""The defects the processor review found (issue 15), each reproduced against the real broker.

Each test asserts the behaviour after the fix; each failed against the processor before its
rebuild for the reason its docstring names (the closing note of issue 15 has the failures seen).

The records are read with plain readers that tolerate what the processor's own readers may not
(a duplicate sequence, a record no codec knows): the tests must see the damage, not trip on it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry  # type: ignore[attr-defined]

from flowstream import codec, wire
from flowstream.client import EventTail
from flowstream.kafka import clients
from flowstream.model.events import (
    EventEnvelope,
    RunStarted,
    SignalReceived,
    SignalWaitCompleted,
    WorkflowTaskFailed,
)
from flowstream.model.messages import DeadLetter, StartRun
from flowstream.partitioning import partition_for
from flowstream.settings import Settings
from flowstream.topology import (
    CMD_SIGNAL,
    CMD_START,
    DEADLETTER,
    EVENTS,
    load_topology,
)
from tests.processor.apps import SPEC
from tests.processor.defect_apps import MISSING_KEY, ONE_STEP, POISON_ENV, POISON_RUN
from tests.processor.harness import (
    Cluster,
    Worker,
    assert_no_duplicate_sequences,
    free_port,
    metric,
    raw_events,
    step_runs,
    wait_until,
)
from tests.support import envelope

pytestmark = [pytest.mark.kafka]

PARTITIONS = load_topology().run_partitions
POISONED_APP = "tests.processor.defect_apps:poisoned"


def _runs_on(partition: int, stem: str, count: int) -> list[str]:
    """``count`` run ids whose partition is ``partition``."""
    found = (f"{stem}-{i}" for i in range(100_000))
    return [r for r in found if partition_for(r, PARTITIONS) == partition][:count]


def _ready(cluster: Cluster, worker: Worker) -> None:
    """The worker owns every partition and has nothing in flight: a run of its came and went."""
    cluster.client.start("warm-up", SPEC, {})
    cluster.client.flush()
    try:
        cluster.client.wait("warm-up", timeout=60)
    except TimeoutError:
        pytest.fail(f"the worker never got ready:\n{worker.output()[-3000:]}")


def _finish(cluster: Cluster, worker: Worker, run_id: str, timeout: float) -> str:
    """The run's status once terminal, or why it did not get there: not in time, the worker
    exited first, or the reader refused its history (a duplicate sequence)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and worker.process.poll() is None:
        try:
            return cluster.client.wait(run_id, timeout=2).status.value
        except TimeoutError:
            continue
        except Exception as exc:
            return f"not terminal: {type(exc).__name__}: {exc}"
    return "not terminal in time" if worker.process.poll() is None else "the worker exited"


def _statuses(cluster: Cluster, worker: Worker, run_ids: list[str], timeout: float) -> list[str]:
    """The runs' statuses once all are terminal; empty if they were not in time, or the worker
    exited first (not worth waiting for then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and worker.process.poll() is None:
        try:
            done = cluster.client.wait_all(run_ids, timeout=2)
        except TimeoutError:
            continue
        except Exception as exc:  # a reader refusing a duplicate sequence says so here
            return [f"unreadable: {type(exc).__name__}: {exc}"]
        return [done[r].status.value for r in run_ids]
    return []


def _alive(worker: Worker) -> str | None:
    """None while the worker runs; else how it ended, with the end of its log."""
    code = worker.process.poll()
    if code is None:
        return None
    return f"{worker.name} exited with {code}:\n{worker.output()[-3000:]}"


def _records(bootstrap: str, topic: str, partitions: list[int]) -> list[Any]:
    """Every committed record of the partitions, undecoded."""
    tail = EventTail(Settings(bootstrap=bootstrap, group=f"{topic}-check"), partitions, topic=topic)
    try:
        return tail.read_records_to_end(timeout=30)
    finally:
        tail.close()


def _dead_letters(cluster: Cluster, partitions: list[int] | None = None) -> list[DeadLetter]:
    topic = f"{cluster.prefix}.{DEADLETTER}"
    wanted = list(range(PARTITIONS)) if partitions is None else partitions
    return [codec.decode_dead_letter(m.value()) for m in _records(cluster.bootstrap, topic, wanted)]


def _committed(cluster: Cluster, suffix: str, partition: int) -> int:
    """The group's committed position on ``<prefix>.<suffix>`` partition ``partition``."""
    consumer = clients.new_consumer(cluster.bootstrap, cluster.group)
    try:
        tp = clients.TopicPartition(f"{cluster.prefix}.{suffix}", partition)
        return int(consumer.committed([tp], timeout=10)[0].offset)
    finally:
        consumer.close()


def _produce(
    bootstrap: str, records: list[tuple[str, int, str, bytes]], headers: Any = None
) -> list[int]:
    """Produce (topic, partition, key, value) records in one batch, non-transactionally; their
    offsets."""
    producer = clients.new_producer(bootstrap, {"linger.ms": 50})
    offsets: dict[int, int] = {}

    def delivered(index: int) -> Callable[[Any, Any], None]:
        def report(err: Any, message: Any) -> None:
            assert err is None, err
            offsets[index] = message.offset()

        return report

    for index, (topic, partition, key, value) in enumerate(records):
        producer.produce(
            topic,
            value=value,
            key=key.encode(),
            partition=partition,
            headers=headers,
            on_delivery=delivered(index),
        )
    assert producer.flush(30) == 0
    return [offsets[i] for i in range(len(records))]


def _start_with_garbage(cluster: Cluster, run_id: str, garbage: bytes, *, first: bool) -> int:
    """In one batch: a start of ``run_id`` and ``garbage`` on ``cmd.signal`` of its partition,
    the garbage first or second; the garbage's offset."""
    partition = partition_for(run_id, PARTITIONS)
    start = codec.encode_message(StartRun(run_id=run_id, spec=SPEC, input={}))
    records = [
        (f"{cluster.prefix}.{CMD_SIGNAL}", partition, run_id, garbage),
        (f"{cluster.prefix}.{CMD_START}", partition, run_id, start),
    ]
    offsets = _produce(cluster.bootstrap, records if first else records[::-1])
    return offsets[0] if first else offsets[1]


# -- H1: a produce error inside the commit ----------------------------------------------------


@pytest.fixture
def small_deadletter_cluster(
    kafka_bootstrap: str, unique_prefix: str, tmp_path: Path
) -> Iterator[Cluster]:
    """Topics as declared, except the dead-letter topic: one partition instead of eight."""
    topology = load_topology()
    specs = tuple(
        t.model_copy(update={"partitions": 1}) if t.suffix == DEADLETTER else t
        for t in topology.topics
    )
    cluster = Cluster(
        kafka_bootstrap,
        unique_prefix,
        tmp_path,
        topology=topology.model_copy(update={"topics": specs}),
    )
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.mark.timeout(120)
def test_h1a_dead_letter_to_a_topic_with_fewer_partitions(
    small_deadletter_cluster: Cluster,
) -> None:
    cluster = small_deadletter_cluster
    worker = cluster.start("w1")
    _ready(cluster, worker)
    run_id, *more = _runs_on(5, "dl", 11)
    garbage_at = _start_with_garbage(cluster, run_id, b"garbage, not a command", first=False)
    # More decisions while the dead letter fails: each commit the loop throws away after
    # the fact makes those it held be decided again, with the same sequence numbers.
    for later in more:
        time.sleep(0.2)
        cluster.client.start(later, SPEC, {})
        cluster.client.flush()
    statuses = _statuses(cluster, worker, [run_id, *more], timeout=30)

    assert _alive(worker) is None, _alive(worker)
    assert_no_duplicate_sequences(raw_events(cluster.bootstrap, cluster.prefix, PARTITIONS))
    assert statuses == ["completed"] * len(statuses), worker.output()[-3000:]
    letters = _dead_letters(cluster, [0])
    signals = f"{cluster.prefix}.{CMD_SIGNAL}"
    found = [
        d for d in letters if (d.source_topic, d.partition, d.offset) == (signals, 5, garbage_at)
    ]
    tries = worker.output().count(f"[5]@{garbage_at}: not an Avro")
    assert found, f"no dead letter of cmd.signal[5]@{garbage_at} in {letters}; {tries} tries"


@pytest.mark.timeout(120)
def test_h1b_a_dead_letter_the_broker_refuses_is_given_up_after_bounded_tries(
    cluster: Cluster,
) -> None:
    worker = cluster.start("w1")
    _ready(cluster, worker)
    # The broker now refuses any dead letter above 2000 bytes: every try fails the same way.
    admin = clients.new_admin(cluster.bootstrap)
    topic = f"{cluster.prefix}.{DEADLETTER}"
    resource = clients.ConfigResource(
        clients.ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("max.message.bytes", "2000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    admin.incremental_alter_configs([resource])[resource].result(30)

    def refused() -> bool:
        found = admin.describe_configs([clients.ConfigResource(clients.ResourceType.TOPIC, topic)])
        return bool(next(iter(found.values())).result(10)["max.message.bytes"].value == "2000")

    wait_until(refused, 30, "the dead-letter topic's max.message.bytes did not change")
    (run_id,) = _runs_on(3, "after-big", 1)
    garbage_at = _start_with_garbage(cluster, run_id, b"\x00garbage" * 2600, first=True)  # 20.8 KB
    status = _finish(cluster, worker, run_id, timeout=30)

    assert _alive(worker) is None, _alive(worker)
    assert status == "completed", worker.output()[-3000:]
    # After a bounded number of tries the garbage is dead-lettered in a minimal form, or
    # skipped with a logged reason: either way its position is committed.
    deadline = time.monotonic() + 15
    while _committed(cluster, CMD_SIGNAL, 3) <= garbage_at and time.monotonic() < deadline:
        time.sleep(0.2)
    if _committed(cluster, CMD_SIGNAL, 3) <= garbage_at:
        log = worker.output()
        pytest.fail(
            f"cmd.signal[3]@{garbage_at} still not committed after 15 s; "
            f"{log.count('aborting transaction')} aborts, "
            f"{log.count(f'[3]@{garbage_at}: not an Avro')} tries to dead-letter it:\n{log[-2000:]}"
        )
    assert _alive(worker) is None, _alive(worker)


# -- H2: workflow code raising outside the command path ---------------------------------------


@pytest.mark.timeout(180)
def test_h2_workflow_code_raising_on_a_step_outcome_costs_neither_worker_nor_run(
    cluster: Cluster,
) -> None:
    # The task is retried every second, three times; after that a new owner retries it once.
    retries = {
        "FLOWSTREAM_TASK_RETRY_MAX_INTERVAL_MS": "1000",
        "FLOWSTREAM_TASK_RETRY_MAX_AUTOMATIC": "3",
    }
    bug = {POISON_ENV: "on", **retries}
    partition = partition_for(POISON_RUN, PARTITIONS)
    normal = _runs_on(partition, "normal", 20)
    worker = cluster.start("w1", extra_env=bug, app=POISONED_APP)
    cluster.client.start(POISON_RUN, ONE_STEP, {})
    for run_id in normal:
        cluster.client.start(run_id, ONE_STEP, {})
    cluster.client.flush()
    statuses = _statuses(cluster, worker, normal, timeout=40)
    assert _alive(worker) is None, _alive(worker)
    assert statuses == ["completed"] * len(normal), f"not all terminal in 40 s: {statuses}"

    def recorded() -> bool:  # in the run's own history, its automatic retries used up
        failures = [
            e.event
            for e in cluster.client.history(POISON_RUN)
            if isinstance(e.event, WorkflowTaskFailed)
        ]
        return any(
            f.error_type == "KeyError" and MISSING_KEY in f.message and f.retry_at is None
            for f in failures
        )

    wait_until(recorded, 30, f"no workflow_task_failed records run {POISON_RUN}'s KeyError")
    assert step_runs(cluster.step_log)[(POISON_RUN, "a")] == 1

    # Its heir, with the bug still in: it neither dies nor runs a again.
    worker.kill()
    heir = cluster.start("w2", extra_env=bug, app=POISONED_APP)
    (later,) = _runs_on(partition, "after-kill", 1)
    cluster.client.start(later, ONE_STEP, {})
    cluster.client.flush()
    status = _finish(cluster, heir, later, timeout=40)
    time.sleep(1)  # a step the restore re-dispatched would have run by now
    assert _alive(heir) is None, _alive(heir)
    assert status == "completed", heir.output()[-3000:]
    assert step_runs(cluster.step_log)[(POISON_RUN, "a")] == 1

    # The bug fixed: the run was left recoverable, and goes on from where it was (its new
    # owner retries the task whose automatic retries were used up).
    assert heir.stop() == 0, heir.output()[-3000:]
    fixed = cluster.start("w3", extra_env=retries, app=POISONED_APP)
    status = _finish(cluster, fixed, POISON_RUN, timeout=40)
    assert status == "completed", fixed.output()[-3000:]
    assert step_runs(cluster.step_log)[(POISON_RUN, "a")] == 1


# -- H3: the restore meets a record it cannot decode ------------------------------------------


def _flip_fingerprint(data: bytes) -> bytes:
    """The same record with another writer-schema fingerprint (bytes 2-10 of the single-object
    encoding): what a newer release's writer would look like to this one. Its own inverse."""
    return data[:2] + bytes(b ^ 0xFF for b in data[2:10]) + data[10:]


def _histories(cluster: Cluster, partition: int) -> dict[str, list[tuple[int, str, str]]]:
    """(sequence, type, writer) of every committed event of the partition, by run; a record
    with the flipped fingerprint is read as what it was before."""
    unknown = _flip_fingerprint(codec.encode_event(envelope("x", 1, RunStarted())))[2:10]
    found: dict[str, list[tuple[int, str, str]]] = {}
    topic = f"{cluster.prefix}.{EVENTS}"
    for message in _records(cluster.bootstrap, topic, [partition]):
        if wire.kind_of(message) is not wire.RecordKind.EVENT:
            continue
        value = message.value()
        if value[2:10] == unknown:
            value = _flip_fingerprint(value)
        event: EventEnvelope = codec.decode_event(value)
        entry = (event.sequence, event.event.type, wire.writer_of(message))
        found.setdefault(event.run_id, []).append(entry)
    return found


@pytest.mark.timeout(150)
def test_h3_a_run_whose_history_cannot_be_read_is_quarantined_not_advanced(
    cluster: Cluster,
) -> None:
    partition = partition_for("waiting", PARTITIONS)
    worker = cluster.start("w1")
    cluster.client.start("waiting", SPEC, {"signal": True})
    cluster.client.flush()

    def suspended() -> bool:
        history = _histories(cluster, partition).get("waiting", [])
        return bool(history) and history[-1][1] == "signal_wait_created"

    wait_until(suspended, 60, "run waiting never waited for its signal")
    assert worker.stop() == 0, worker.output()[-3000:]
    shutil.rmtree(cluster.root / "state" / "w1")
    n = len(_histories(cluster, partition)["waiting"])
    forged = envelope("waiting", n + 1, SignalReceived(signal_id="new", name="go", payload={}))
    follows = envelope("waiting", n + 2, SignalWaitCompleted(wait_id="go", signal_id="new"))
    topic = f"{cluster.prefix}.{EVENTS}"
    _produce(
        cluster.bootstrap,
        [
            (topic, partition, "waiting", _flip_fingerprint(codec.encode_event(forged))),
            (topic, partition, "waiting", codec.encode_event(follows)),
        ],
        headers=[(wire.RECORD_HEADER, b"event")],
    )

    heir = cluster.start("w2")
    cluster.client.signal("waiting", "go", {"after": "restore"}, id="go-1")
    (neighbour,) = _runs_on(partition, "neighbour", 1)
    cluster.client.start(neighbour, SPEC, {})
    cluster.client.flush()
    _, signal_end = _watermarks(cluster.bootstrap, f"{cluster.prefix}.{CMD_SIGNAL}", partition)

    def neighbour_done() -> bool:
        history = _histories(cluster, partition).get(neighbour, [])
        return bool(history) and history[-1][1] == "run_completed"

    wait_until(neighbour_done, 40, f"{neighbour} never completed:\n{heir.output()[-3000:]}")
    wait_until(
        lambda: _committed(cluster, CMD_SIGNAL, partition) >= signal_end,
        20,
        f"the signal was never consumed:\n{heir.output()[-3000:]}",
    )
    assert _alive(heir) is None, _alive(heir)
    history = _histories(cluster, partition)["waiting"]
    sequences = [s for s, _, _ in history]
    shown = " ".join(f"{s}:{t}:{w or 'injected'}" for s, t, w in history)
    assert len(sequences) == len(set(sequences)), f"duplicate sequences: {shown}"
    assert sequences == list(range(1, n + 3)), f"advanced: {shown}"  # nothing after the bad record


def _watermarks(bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    consumer = clients.new_consumer(bootstrap, f"{topic}-watermarks")
    try:
        low, high = consumer.get_watermark_offsets(
            clients.TopicPartition(topic, partition), timeout=10, cached=False
        )
        return int(low), int(high)
    finally:
        consumer.close()


# -- M5: state of another deployment ----------------------------------------------------------


@pytest.mark.timeout(120)
def test_m5_state_of_another_topic_prefix_is_not_taken_for_this_one(
    kafka_bootstrap: str, unique_prefix: str, tmp_path: Path
) -> None:
    group = f"{unique_prefix}-group"
    state = tmp_path / "state"
    step_log = tmp_path / "steps.jsonl"
    clusters = {}
    for name in ("a", "b"):
        clusters[name] = Cluster(kafka_bootstrap, f"{unique_prefix}-{name}", tmp_path / name)

    def worker(name: str) -> Worker:
        started = Worker(
            "w1",
            bootstrap=kafka_bootstrap,
            prefix=clusters[name].prefix,
            group=group,
            state_dir=state,
            step_log=step_log,
        )
        clusters[name].workers["w1"] = started  # stopped with its cluster
        return started

    try:
        first = worker("a")
        clusters["a"].client.start("r1", SPEC, {})
        clusters["a"].client.flush()
        assert clusters["a"].client.wait("r1", timeout=60).status.value == "completed"
        assert first.stop() == 0, first.output()[-3000:]

        second = worker("b")
        clusters["b"].client.start("r1", SPEC, {})
        clusters["b"].client.flush()
        status = _finish(clusters["b"], second, "r1", timeout=20)
        assert _alive(second) is None, _alive(second)
        assert status == "completed", f"r1 under the second prefix: {status}"
        history = clusters["b"].client.history("r1")
        assert (history[0].sequence, history[0].event.type) == (1, "run_created")
    finally:
        for cluster in clusters.values():
            cluster.close()


# -- point 8: a second worker with an instance id in use --------------------------------------


@pytest.mark.timeout(120)
def test_p8_a_second_worker_with_an_instance_id_in_use_refuses_to_start(
    cluster: Cluster,
) -> None:
    instance = "shared-id-17"
    port = free_port()
    first = cluster.start(instance, extra_env={"FLOWSTREAM_METRICS_PORT": str(port)})
    _ready(cluster, first)
    second = cluster.start("intruder", instance_id=instance)
    deadline = time.monotonic() + 30
    while second.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    cluster.client.start("after-intruder", SPEC, {})
    cluster.client.flush()
    status = _finish(cluster, first, "after-intruder", timeout=30)

    code = second.process.poll()
    output = second.output()
    running = first.process.poll() is None
    resets = metric(port, "flowstream_producer_resets_total") if running else float("nan")
    assert code not in (None, 0), (
        f"the second worker {'still runs after 30 s' if code is None else 'ended with 0'}; "
        f"the first replaced its producers {resets:.0f} times"
    )
    assert "Traceback" not in output, output[-3000:]
    assert instance in output.strip().splitlines()[-1], output[-3000:]
    assert _alive(first) is None, _alive(first)
    assert status == "completed", first.output()[-3000:]
    assert resets == 0, f"{resets:.0f} producer resets:\n{first.output()[-3000:]}"

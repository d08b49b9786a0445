"""Readers of the events topic survive a bad record: ``FlowClient.history``, ``wait`` and
``flowstream audit`` skip and report it, and only the run named by its key is affected.

Runs are written by a real worker; then two bad records go into their events partition with a
plain producer: one that is not Avro at all (no key, no header) and one copy of an event of the
``victim`` run whose writer-schema fingerprint is altered (header ``flowstream-record: event``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from flowstream import codec, wire
from flowstream.cli import main
from flowstream.client import FlowClient
from flowstream.errors import CorruptHistoryError
from flowstream.kafka import clients
from flowstream.partitioning import partition_for
from flowstream.settings import Settings
from tests.processor.apps import SPEC
from tests.processor.harness import Worker, apply_topics

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]


@dataclass(frozen=True)
class Poisoned:
    bootstrap: str
    prefix: str
    client: FlowClient
    worker: Worker
    partition: int
    #: Runs of the poisoned partition: written before the bad records, and one after them.
    before: list[str]
    after: str
    victim: str
    #: Offsets of the garbage record and of the victim's bad record.
    offsets: tuple[int, int]


def _runs_on(partition: int, partitions: int, stem: str, count: int) -> list[str]:
    found = []
    for i in range(10_000):
        run_id = f"{stem}-{i}"
        if partition_for(run_id, partitions) == partition:
            found.append(run_id)
            if len(found) == count:
                return found
    raise AssertionError(f"no {count} run ids on partition {partition}")


def _produce_bad_records(
    bootstrap: str, topic: str, partition: int, victim_event: bytes
) -> list[int]:
    offsets: list[int] = []

    def delivered(error: object, message: object) -> None:
        assert error is None, error
        offsets.append(int(message.offset()))  # type: ignore[attr-defined]

    producer = clients.new_producer(bootstrap)
    producer.produce(
        topic, value=b"not an event at all", partition=partition, on_delivery=delivered
    )
    altered = victim_event[:2] + bytes(b ^ 0xFF for b in victim_event[2:10]) + victim_event[10:]
    producer.produce(
        topic,
        value=altered,
        key=codec.decode_event(victim_event).run_id.encode(),
        headers=[(wire.RECORD_HEADER, wire.RecordKind.EVENT.value.encode())],
        partition=partition,
        on_delivery=delivered,
    )
    assert producer.flush(30) == 0
    return offsets


@pytest.fixture(scope="module")
def poisoned(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Poisoned]:
    prefix = f"t-readers-{uuid.uuid4().hex[:8]}"
    apply_topics(kafka_bootstrap, prefix)
    state: Path = tmp_path_factory.mktemp("readers")
    worker = Worker(
        "readers-w1",
        bootstrap=kafka_bootstrap,
        prefix=prefix,
        group=f"{prefix}-group",
        state_dir=state,
        step_log=state / "steps.jsonl",
    )
    client = FlowClient(
        Settings(bootstrap=kafka_bootstrap, topic_prefix=prefix, group=prefix), wait=False
    )
    try:
        partitions = client.partitions
        partition = partition_for("readers", partitions)
        good_a, victim, good_b, after = _runs_on(partition, partitions, "poisoned", 4)
        elsewhere = next(
            f"elsewhere-{i}"
            for i in range(1000)
            if partition_for(f"elsewhere-{i}", partitions) != partition
        )
        before = [good_a, victim, good_b, elsewhere]
        for run_id in before:
            client.start(run_id, SPEC, {"n": run_id})
        client.flush()
        client.wait_all(before, timeout=90)
        victim_event = codec.encode_event(client.history(victim)[-1])
        offsets = _produce_bad_records(kafka_bootstrap, f"{prefix}.events", partition, victim_event)
        yield Poisoned(
            kafka_bootstrap,
            prefix,
            client,
            worker,
            partition,
            [good_a, good_b, elsewhere],
            after,
            victim,
            (offsets[0], offsets[1]),
        )
    finally:
        client.close()
        assert worker.stop() == 0, worker.output()[-3000:]


def test_history_of_a_good_run_skips_and_reports_the_bad_records(
    poisoned: Poisoned, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    for run_id in poisoned.before:
        history = poisoned.client.history(run_id)
        assert [e.sequence for e in history] == list(range(1, len(history) + 1))
        assert history[-1].event.type == "run_completed"
    topic = f"{poisoned.prefix}.events"
    for offset in poisoned.offsets:
        assert any(f"{topic}[{poisoned.partition}]@{offset}" in m for m in caplog.messages), (
            caplog.messages
        )


def test_history_of_the_run_with_the_bad_record_raises_a_clear_error(poisoned: Poisoned) -> None:
    with pytest.raises(CorruptHistoryError) as caught:
        poisoned.client.history(poisoned.victim)
    assert caught.value.run_id == poisoned.victim
    message = str(caught.value)
    assert f"[{poisoned.partition}]@{poisoned.offsets[1]}" in message
    assert "flowstream audit" in message


def test_wait_reads_past_the_bad_records(poisoned: Poisoned) -> None:
    client = poisoned.client
    client.start(poisoned.after, SPEC, {"n": poisoned.after})
    client.flush()
    assert client.wait(poisoned.after, timeout=60).status.value == "completed"
    assert client.wait(poisoned.before[0], timeout=60).status.value == "completed"


def test_audit_reports_the_corrupt_run_and_audits_the_others(
    poisoned: Poisoned, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["audit", "--bootstrap", poisoned.bootstrap, "--prefix", poisoned.prefix]
    assert main([*common, "--app", "tests.processor.apps:runtime"]) == 1
    out = capsys.readouterr().out
    for run_id in poisoned.before:
        assert f"{run_id}: ok" in out, out
    assert f"{poisoned.victim}: CORRUPT" in out, out
    topic = f"{poisoned.prefix}.events"
    for offset in poisoned.offsets:
        assert f"{topic}[{poisoned.partition}]@{offset}" in out, out
    # One run of the partition audited alone: the victim's record is not its problem, but the
    # record without a key could be anyone's.
    assert (
        main([*common, "--app", "tests.processor.apps:runtime", "--run", poisoned.before[0]]) == 1
    )
    out = capsys.readouterr().out
    assert f"{poisoned.before[0]}: ok" in out and poisoned.victim not in out, out

"""Across partitions and on the wire: child workflows and continuations travel as commands, the
events topic is readable with plain confluent-kafka + fastavro, and metrics are served."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition

from flowstream import wire
from flowstream.client import FlowClient
from flowstream.errors import RunNotFoundError
from flowstream.partitioning import partition_for
from flowstream.replay.decide import derived_run_id
from flowstream.settings import Settings
from tests.codec.test_independent_reader import read_value
from tests.processor.apps import SPEC
from tests.processor.harness import Worker, apply_topics, free_port

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]

#: An event record's ``flowstream-record`` header, as the processor writes it.
EVENT_KIND = wire.RecordKind.EVENT.value.encode()


@pytest.fixture
def deployment(
    kafka_bootstrap: str, unique_prefix: str, tmp_path: Path
) -> Iterator[tuple[FlowClient, Worker, int]]:
    apply_topics(kafka_bootstrap, unique_prefix)
    port = free_port()
    worker = Worker(
        "w1",
        bootstrap=kafka_bootstrap,
        prefix=unique_prefix,
        group=f"{unique_prefix}-group",
        state_dir=tmp_path / "state",
        step_log=tmp_path / "steps.jsonl",
        extra_env={"FLOWSTREAM_METRICS_PORT": str(port)},
    )
    client = FlowClient(
        Settings(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, group=f"{unique_prefix}-c"),
        wait=False,
    )
    try:
        yield client, worker, port
    finally:
        client.close()
        assert worker.stop() == 0, worker.output()[-3000:]


@pytest.mark.parametrize(
    "hops",
    [0, pytest.param(2, id="the-child-continues-as-new")],
)
def test_a_child_on_another_partition_reports_to_its_parent(
    deployment: tuple[FlowClient, Worker, int], hops: int
) -> None:
    """With ``hops`` the child continues as new: its chain's last run reports the outcome."""
    client, worker, _ = deployment
    parents = [f"parent-{i}" for i in range(6)]
    for run_id in parents:
        client.start(run_id, SPEC, {"child": True, "child_hops": hops})
    client.flush()
    results = client.wait_all(parents, timeout=90)
    assert {r.status.value for r in results.values()} == {"completed"}, worker.output()[-2000:]
    for run_id, result in results.items():
        assert result.output["kid"] == "done"  # type: ignore[index]
        child = result.children["kid"]
        assert child.outcome is not None and child.outcome.type == "completed"
        kid = client.snapshot(child.run_id)
        assert kid.parent is not None and kid.parent.run_id == run_id
        assert kid.status.value == ("continued_as_new" if hops else "completed")
    crossing = [
        r
        for r in results.values()
        if partition_for(r.children["kid"].run_id, client.partitions)
        != partition_for(r.run_id, client.partitions)
    ]
    assert crossing, "no child landed on another partition; the test proves nothing"


def test_a_forced_cancel_ends_the_last_run_of_a_child_that_continued_as_new(
    deployment: tuple[FlowClient, Worker, int],
) -> None:
    client, worker, _ = deployment
    client.start("impatient", SPEC, {"child": True, "child_hops": 1, "child_timer_ms": 600_000})
    client.flush()
    root = client.wait(derived_run_id("impatient", "child", "kid"), timeout=60)
    assert root.outcome is not None and root.outcome.successor_run_id is not None
    leaf_id = root.outcome.successor_run_id
    deadline = time.monotonic() + 60
    while True:  # the leaf exists and waits on its timer
        try:
            if client.snapshot(leaf_id).status.value == "suspended":
                break
        except RunNotFoundError:
            pass
        assert time.monotonic() < deadline, worker.output()[-2000:]
        time.sleep(0.2)
    client.cancel("impatient", "now", force=True)
    client.flush()
    parent = client.wait("impatient", timeout=60)
    assert parent.status.value == "cancelled", worker.output()[-2000:]
    kid = parent.children["kid"].outcome
    assert kid is not None and kid.type == "cancelled"
    assert client.wait(leaf_id, timeout=60).status.value == "cancelled", worker.output()[-2000:]


def test_continue_as_new_starts_the_successor_with_the_same_spec(
    deployment: tuple[FlowClient, Worker, int],
) -> None:
    client, worker, _ = deployment
    client.start("looping", SPEC, {"continue_hops": 2})
    client.flush()
    first = client.wait("looping", timeout=60)
    assert first.status.value == "continued_as_new"
    assert first.outcome is not None and first.outcome.successor_run_id is not None
    second = client.wait(first.outcome.successor_run_id, timeout=60)
    assert second.status.value == "continued_as_new" and second.spec == first.spec
    assert second.input == {"continue_hops": 1}
    assert second.outcome is not None and second.outcome.successor_run_id is not None
    last = client.wait(second.outcome.successor_run_id, timeout=60)
    assert last.status.value == "completed", worker.output()[-2000:]
    assert last.parent is not None and last.parent.continued


def test_the_events_topic_decodes_with_plain_confluent_kafka_and_fastavro(
    deployment: tuple[FlowClient, Worker, int], kafka_bootstrap: str, unique_prefix: str
) -> None:
    client, _, _ = deployment
    client.start("plain", SPEC, {"for": "an independent reader"})
    client.flush()
    client.wait("plain", timeout=60)
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": f"{unique_prefix}-independent",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    partition = partition_for("plain", client.partitions)
    consumer.assign([TopicPartition(f"{unique_prefix}.events", partition, 0)])
    decoded = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not decoded or decoded[-1][1] != "run_completed"):
        for message in consumer.consume(100, 0.5):
            headers = dict(message.headers() or ())
            if message.error() is not None or headers.get(wire.RECORD_HEADER) != EVENT_KIND:
                continue
            name, datum = read_value(message.value())
            assert name == "flowstream.EventEnvelope"
            event_name, event = datum["event"]
            decoded.append((datum["sequence"], event_name.rsplit(".", 1)[-1], datum, event))
    consumer.close()
    assert [d[0] for d in decoded] == list(range(1, len(decoded) + 1))
    created = decoded[0][3]
    assert decoded[0][1] == "RunCreated"
    assert orjson.loads(created["input"]) == {"for": "an independent reader"}
    assert decoded[-1][1] == "RunCompleted"


def test_metrics_are_served_over_http(deployment: tuple[FlowClient, Worker, int]) -> None:
    client, _, port = deployment
    runs = [f"metered-{i}" for i in range(5)]
    for run_id in runs:
        client.start(run_id, SPEC, {})
    client.flush()
    client.wait_all(runs, timeout=60)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert values['flowstream_step_attempts_total{outcome="completed"}'] >= 15
    assert values["flowstream_events_appended_total"] >= 5 * 12
    assert values["flowstream_owned_partitions"] == 8
    assert values["flowstream_restore_seconds_count"] == 8
    assert values["flowstream_transaction_seconds_count"] >= 1
    applied = [
        v
        for k, v in values.items()
        if k.startswith("flowstream_commands_total") and 'outcome="applied"' in k
    ]
    assert sum(applied) >= 5


def test_a_processor_refuses_to_start_when_a_topic_is_missing(
    kafka_bootstrap: str, unique_prefix: str, tmp_path: Path
) -> None:
    from flowstream.kafka import clients

    admin = clients.new_admin(kafka_bootstrap)
    futures = admin.create_topics([clients.NewTopic(f"{unique_prefix}.events", 8, 1)])
    for future in futures.values():
        future.result(30)
    worker = Worker(
        "lonely",
        bootstrap=kafka_bootstrap,
        prefix=unique_prefix,
        group=f"{unique_prefix}-group",
        state_dir=tmp_path / "state",
        step_log=tmp_path / "steps.jsonl",
    )
    worker.process.wait(60)
    output = worker.output()
    worker.stop()
    assert worker.process.returncode == 2, output
    assert f"topic {unique_prefix}.cmd.start is missing" in output
    assert "flowstream topics apply" in output
    assert "Traceback" not in output


def test_audit_rereads_the_events_topic_and_replays_every_run(
    deployment: tuple[FlowClient, Worker, int],
    kafka_bootstrap: str,
    unique_prefix: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from flowstream.cli import main

    client, _, _ = deployment
    runs = [f"audited-{i}" for i in range(4)]
    for run_id in runs:
        client.start(run_id, SPEC, {"n": run_id})
    client.flush()
    client.wait_all(runs, timeout=60)
    common = ["audit", "--bootstrap", kafka_bootstrap, "--prefix", unique_prefix]
    assert main([*common, "--app", "tests.processor.apps:runtime"]) == 0
    out = capsys.readouterr().out
    assert all(f"{run_id}: ok" in out for run_id in runs)
    assert "audited 4 run(s): 4 ok, 0 with problems" in out
    # Code that decides differently today is reported per run, with a nonzero exit.
    assert main([*common, "--app", "tests.processor.apps:drifted", "--run", runs[0]]) == 1
    out = capsys.readouterr().out
    assert f"{runs[0]}: NONDETERMINISTIC" in out and "history=" in out

"""The processor against the real broker: runs complete, commands apply once, bad input is
dead-lettered, signals before start wait in the inbox, timers fire."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowstream import codec
from flowstream.client import EventTail, FlowClient
from flowstream.errors import FlowError
from flowstream.kafka import clients
from flowstream.partitioning import partition_for
from flowstream.replay.decide import token_digest
from flowstream.settings import Settings
from tests.processor.apps import SPEC
from tests.processor.harness import Worker, apply_topics, assert_contiguous, step_runs

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]


@pytest.fixture(params=["strict", "eager"])
def deployment(
    request: pytest.FixtureRequest, kafka_bootstrap: str, unique_prefix: str, tmp_path: Path
) -> Iterator[tuple[FlowClient, Worker, Path]]:
    """One worker; every test runs with both step starts (after the start committed, or eager)."""
    apply_topics(kafka_bootstrap, unique_prefix)
    step_log = tmp_path / "steps.jsonl"
    worker = Worker(
        "w1",
        bootstrap=kafka_bootstrap,
        prefix=unique_prefix,
        group=f"{unique_prefix}-group",
        state_dir=tmp_path / "state",
        step_log=step_log,
        extra_env={"FLOWSTREAM_EAGER_STEPS": str(request.param == "eager").lower()},
    )
    settings = Settings(
        bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, group=f"{unique_prefix}-client"
    )
    client = FlowClient(settings, wait=False)
    try:
        yield client, worker, step_log
    finally:
        client.close()
        code = worker.stop()
        assert code == 0, worker.output()[-3000:]


def test_runs_complete_with_contiguous_histories(
    deployment: tuple[FlowClient, Worker, Path],
) -> None:
    client, worker, step_log = deployment
    run_ids = [f"run-{i:03d}" for i in range(20)]
    for run_id in run_ids:
        client.start(run_id, SPEC, {"n": run_id})
    client.start(run_ids[0], SPEC, {"n": run_ids[0]})  # a duplicate start is a no-op
    client.flush()
    results = client.wait_all(run_ids, timeout=90)
    assert {r.status.value for r in results.values()} == {"completed"}, worker.output()[-2000:]
    for run_id in run_ids:
        history = client.history(run_id)
        assert_contiguous(history)
        assert sum(e.event.type == "run_created" for e in history) == 1
        assert [e.event.type for e in history].count("step_completed") == 3
    counts = step_runs(step_log)
    assert all(counts[(r, s)] == 1 for r in run_ids for s in ("validate", "reserve", "charge"))


def test_signal_before_start_is_kept_and_applied(
    deployment: tuple[FlowClient, Worker, Path],
) -> None:
    client, worker, _ = deployment
    client.signal("early", "go", {"from": "before start"}, id="sig-1")
    client.flush()
    client.start("early", SPEC, {"signal": True})
    client.flush()
    result = client.wait("early", timeout=60)
    assert result.status.value == "completed", worker.output()[-2000:]
    assert result.output["go"] == {"from": "before start"}  # type: ignore[index]


def test_timer_and_delayed_retry_fire(deployment: tuple[FlowClient, Worker, Path]) -> None:
    client, worker, step_log = deployment
    client.start("timed", SPEC, {"timer_ms": 300, "flaky": "reserve"})
    client.flush()
    result = client.wait("timed", timeout=60)
    assert result.status.value == "completed", worker.output()[-2000:]
    types = [e.event.type for e in client.history("timed")]
    assert types.count("wait_completed") == 1
    assert types.count("step_retrying") == 1
    assert step_runs(step_log)[("timed", "reserve")] == 2


def test_poison_messages_are_dead_lettered_and_good_ones_processed(
    deployment: tuple[FlowClient, Worker, Path], kafka_bootstrap: str, unique_prefix: str
) -> None:
    client, _worker, _ = deployment
    producer = clients.new_producer(kafka_bootstrap)
    partitions = client.partitions
    poison = {
        "cmd.start": b"not avro at all",
        "cmd.signal": b"\xc3\x01" + b"\x00" * 12,
        "cmd.hook": b"",
        "cmd.cancel": b"\xff\xfe",
        "cmd.timer": b"garbage",
    }
    for suffix, value in poison.items():
        run_id = f"poison-{suffix}"
        producer.produce(
            f"{unique_prefix}.{suffix}",
            value=value,
            key=run_id.encode(),
            partition=partition_for(run_id, partitions),
        )
    # A cancel for a run that does not exist is dead-lettered with a clear reason.
    client.cancel("no-such-run", "test")
    producer.flush(10)
    client.start("good-after-poison", SPEC, {})
    client.flush()
    assert client.wait("good-after-poison", timeout=60).status.value == "completed"

    tail = EventTail(
        Settings(bootstrap=kafka_bootstrap, group=f"{unique_prefix}-dl"),
        list(range(8)),
        topic=f"{unique_prefix}.deadletter",
    )
    consumer = tail._consumer
    letters = []
    deadline = time.monotonic() + 30
    while len(letters) < 6 and time.monotonic() < deadline:
        for message in consumer.consume(100, 0.2):
            if message.error() is None:
                letters.append(codec.decode_dead_letter(message.value()))
    tail.close()
    assert len(letters) == 6, [(letter.source_topic, letter.reason) for letter in letters]
    by_topic = {letter.source_topic.removeprefix(unique_prefix + "."): letter for letter in letters}
    assert set(by_topic) == {"cmd.start", "cmd.signal", "cmd.hook", "cmd.cancel", "cmd.timer"}
    assert any("no-such-run" in letter.reason for letter in letters)


def test_a_hook_is_resumed_by_its_token_alone(
    deployment: tuple[FlowClient, Worker, Path],
) -> None:
    client, worker, _ = deployment
    token = "tok-" + "x" * 40
    runs = [f"hooked-{i}" for i in range(4)]
    for run_id in runs:
        client.start(run_id, SPEC, {"hook_digest": token_digest(f"{token}-{run_id}")})
    client.flush()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(_hook_open(client, r) for r in runs):
        time.sleep(0.2)
    client.resume_hook_by_token("not-a-registered-token", {"by": "mallory"})
    for run_id in runs:
        client.resume_hook_by_token(f"{token}-{run_id}", {"by": run_id})
    client.flush()
    results = client.wait_all(runs, timeout=60)
    for run_id, result in results.items():
        assert result.status.value == "completed", worker.output()[-2000:]
        assert result.output["approval"] == {"by": run_id}  # type: ignore[index]
    assert token not in worker.output()


def _hook_open(client: FlowClient, run_id: str) -> bool:
    try:
        return "approval" in client.snapshot(run_id, timeout=5).hooks
    except FlowError:
        return False


def test_a_signal_and_a_hook_resume_sent_before_start_both_apply(
    deployment: tuple[FlowClient, Worker, Path],
) -> None:
    """The hook does not exist until the signal moved the run on: the parked resume must be
    retried once that happened, not only when another command arrives."""
    client, worker, _ = deployment
    token = "early-hook-token-" + "y" * 30
    client.signal("both-early", "go", {"first": True}, id="sig-early")
    client.resume_hook("both-early", "approval", {"approved": True})
    client.flush()
    client.start("both-early", SPEC, {"signal": True, "hook_digest": token_digest(token)})
    client.flush()
    result = client.wait("both-early", timeout=60)
    assert result.status.value == "completed", worker.output()[-2000:]
    assert result.output["go"] == {"first": True}  # type: ignore[index]
    assert result.output["approval"] == {"approved": True}  # type: ignore[index]


def test_a_slow_step_does_not_stall_other_runs_of_its_partition(
    deployment: tuple[FlowClient, Worker, Path],
) -> None:
    client, worker, step_log = deployment
    partition = partition_for("slow-0", client.partitions)
    neighbours = [
        run_id
        for run_id in (f"quick-{i}" for i in range(200))
        if partition_for(run_id, client.partitions) == partition
    ][:5]
    # The slow run's steps are held until the file exists: as slow as the test needs, no slower.
    release = step_log.parent / "release-slow"
    client.start("slow-0", SPEC, {"hold_file": str(release)})
    client.flush()
    deadline = time.monotonic() + 30
    while ("slow-0", "validate") not in step_runs(step_log):
        assert time.monotonic() < deadline, worker.output()[-2000:]
        time.sleep(0.05)
    for run_id in neighbours:
        client.start(run_id, SPEC, {})
    client.flush()
    done = client.wait_all(neighbours, timeout=60)
    assert {r.status.value for r in done.values()} == {"completed"}, worker.output()[-2000:]
    # Every neighbour finished while the slow run is still inside its first step.
    slow = client.snapshot("slow-0")
    assert slow.status.value == "running" and slow.steps["validate"].status.value == "running"
    release.touch()
    assert client.wait("slow-0", timeout=60).status.value == "completed"

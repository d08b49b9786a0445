"""With three brokers (RF 3, min ISR 2), one broker is SIGKILLed during load: processing goes
on, every run completes, and the committed histories have no gap and no duplicate."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from flowstream.client import FlowClient
from flowstream.devkafka import Cluster
from flowstream.kafka.clients import new_admin, probe_brokers
from flowstream.partitioning import partition_for
from flowstream.settings import Settings
from tests.processor.apps import SPEC
from tests.processor.harness import (
    Load,
    Worker,
    apply_topics,
    assert_no_duplicate_sequences,
    raw_events,
    wait_until,
)

pytestmark = [pytest.mark.kafka3, pytest.mark.timeout(420)]


def test_losing_one_of_three_brokers_loses_nothing(
    kafka3_cluster: Cluster, unique_prefix: str, tmp_path: Path
) -> None:
    bootstrap = kafka3_cluster.bootstrap
    deadline = time.monotonic() + 90
    while len(probe_brokers(bootstrap, 5) or ()) < 3:  # every node registered with the quorum
        assert time.monotonic() < deadline, "the three brokers did not all register"
        time.sleep(0.5)
    apply_topics(bootstrap, unique_prefix, replication_factor=3)
    workers = [
        Worker(
            name,
            bootstrap=bootstrap,
            prefix=unique_prefix,
            group=f"{unique_prefix}-group",
            state_dir=tmp_path / "state",
            step_log=tmp_path / "steps.jsonl",
            # Leader elections take seconds: keep transactions open long enough to ride them out.
            extra_env={
                "FLOWSTREAM_TRANSACTION_TIMEOUT_MS": "30000",
                "FLOWSTREAM_SESSION_TIMEOUT_MS": "10000",
            },
        )
        for name in ("b1", "b2")
    ]
    client = FlowClient(
        Settings(bootstrap=bootstrap, topic_prefix=unique_prefix, group=f"{unique_prefix}-c"),
        wait=False,
    )
    victim = 0
    try:
        load = Load(client, SPEC, "broker", rate=20, options={"step_sleep_ms": 50})
        # The processors are up and committing before the broker dies.
        assert client.wait("broker-0000", timeout=120).status.value == "completed"
        time.sleep(2)
        # The node that coordinates the processors' group dies: every transaction sends its
        # positions there, and librdkafka may never return from that call once it is gone.
        victim = _group_coordinator(bootstrap, f"{unique_prefix}-group")
        before_kill = len(load.run_ids)
        kafka3_cluster.kill_node(victim)
        # Starts to partitions the dead node led wait until it is fenced and a new leader is
        # elected (broker.session.timeout.ms, 3 s), and the load thread waits for each start.
        wait_until(
            lambda: len(load.run_ids) > before_kill + 40,
            90,
            "no run was started while a broker was down",
        )
        run_ids = load.stop()
        assert before_kill > 10
        try:
            results = client.wait_all(run_ids, timeout=240)
        except TimeoutError as exc:
            pytest.fail(f"{exc}\n{_diagnosis(client, run_ids, workers)}")
        assert {r.status.value for r in results.values()} == {"completed"}, _diagnosis(
            client, run_ids, workers
        )
        records = raw_events(bootstrap, unique_prefix, client.partitions)
        assert_no_duplicate_sequences(records)
        assert {r for r, _, t, _ in records if t == "run_completed"} >= set(run_ids)
    finally:
        client.close()
        for worker in workers:
            worker.stop()
        if victim:
            kafka3_cluster.start_node(victim)


def _group_coordinator(bootstrap: str, group: str) -> int:
    admin = new_admin(bootstrap)
    (future,) = admin.describe_consumer_groups([group], request_timeout=10).values()
    return int(future.result().coordinator.id)


def _diagnosis(client: FlowClient, run_ids: list[str], workers: list[Worker]) -> str:
    """Which partitions hold unfinished runs, and what each worker logged and waits on."""
    records = raw_events(client.settings.bootstrap, client.settings.topic_prefix, client.partitions)
    completed = {r for r, _, t, _ in records if t == "run_completed"}
    unfinished: dict[int, int] = {}
    for run_id in run_ids:
        if run_id not in completed:
            partition = partition_for(run_id, client.partitions)
            unfinished[partition] = unfinished.get(partition, 0) + 1
    parts = [f"unfinished runs by partition: {sorted(unfinished.items())}"]
    for worker in workers:
        stacks = worker.stacks()
        parts.append(f"--- {worker.name}\n{worker.output()[-12000:]}\n{stacks[-6000:]}")
    return "\n".join(parts)

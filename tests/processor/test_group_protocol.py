"""The processor's group protocol against the real broker: by default (``auto``) the consumer
protocol (KIP-848) where the brokers allow the session, with the group's session set at the
coordinator; the classic one when asked for. Runs complete either way, and a second worker takes
its share of the partitions while runs are under way (the consumer protocol hands assignments out
as changes: the partitions the first keeps go on)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from flowstream.client import FlowClient
from flowstream.kafka import clients
from flowstream.settings import Settings
from tests.processor.apps import SPEC
from tests.processor.harness import Worker, apply_topics, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]


def _group(bootstrap: str, group: str) -> tuple[str, dict[str, set[int]]]:
    """The group's protocol type and the command partitions of each member's client id."""
    admin = clients.new_admin(bootstrap)
    found = admin.describe_consumer_groups([group], request_timeout=10)[group].result(15)
    owned: dict[str, set[int]] = {}
    for member in found.members:
        partitions = member.assignment.topic_partitions if member.assignment else []
        owned[member.client_id] = {tp.partition for tp in partitions}
    return found.type.name, owned


def _group_session(bootstrap: str, group: str) -> str | None:
    admin = clients.new_admin(bootstrap)
    resource = clients.ConfigResource(clients.ResourceType.GROUP, group)
    found = admin.describe_configs([resource], request_timeout=10)[resource].result(15)
    entry = found.get("consumer.session.timeout.ms")
    return None if entry is None else str(entry.value)


@pytest.mark.parametrize(("asked", "expected"), [(None, "CONSUMER"), ("classic", "CLASSIC")])
def test_the_group_protocol_follows_the_setting_and_the_brokers(
    kafka_bootstrap: str, unique_prefix: str, tmp_path: Path, asked: str | None, expected: str
) -> None:
    apply_topics(kafka_bootstrap, unique_prefix)
    group = f"{unique_prefix}-group"
    env = {"FLOWSTREAM_GROUP_PROTOCOL": asked} if asked else {}

    def start_worker(name: str) -> Worker:
        return Worker(
            name,
            bootstrap=kafka_bootstrap,
            prefix=unique_prefix,
            group=group,
            state_dir=tmp_path / "state",
            step_log=tmp_path / "steps.jsonl",
            extra_env=env,
        )

    workers = [start_worker("w1")]
    client = FlowClient(
        Settings(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, group=f"{group}-client"),
        wait=False,
    )
    try:
        # Runs whose steps take a while are under way on the first worker when the second
        # joins: the partitions the first keeps go on (their steps started after the commit
        # the revocation makes), the ones it gives up are taken over.
        run_ids = [f"run-{i:02d}" for i in range(16)]
        for run_id in run_ids:
            client.start(run_id, SPEC, {"n": run_id, "step_sleep_ms": 1500})
        client.flush()
        steps = tmp_path / "steps.jsonl"
        wait_until(lambda: steps.exists() and steps.stat().st_size > 0, 60, "no step ran")
        workers.append(start_worker("w2"))
        results = client.wait_all(run_ids, timeout=90)
        assert {r.status.value for r in results.values()} == {"completed"}

        def shared() -> bool:
            kind, owned = _group(kafka_bootstrap, group)
            return kind == expected and len(owned) == 2 and all(owned.values())

        wait_until(shared, 60, f"both workers own partitions of a {expected} group")
        owned = _group(kafka_bootstrap, group)[1]
        first, second = owned.values()
        assert not first & second  # co-partitioned and disjoint
        assert first | second == set(range(len(first | second)))
        if expected == "CONSUMER":
            assert _group_session(kafka_bootstrap, group) == "1500"
        # The second worker leaves; the first takes every partition and runs go on.
        assert workers[1].stop() == 0, workers[1].output()[-3000:]
        time.sleep(0.5)
        more = [f"after-{i:02d}" for i in range(8)]
        for run_id in more:
            client.start(run_id, SPEC, {"n": run_id})
        results = client.wait_all(more, timeout=90)
        assert {r.status.value for r in results.values()} == {"completed"}
        wait_until(
            lambda: len(_group(kafka_bootstrap, group)[1]) == 1,
            30,
            "the second worker left the group",
        )
    finally:
        client.close()
        for worker in workers:
            if worker.process.poll() is None:
                assert worker.stop() == 0, worker.output()[-3000:]

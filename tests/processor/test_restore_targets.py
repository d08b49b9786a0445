"""A restore's target (an events partition's high watermark) is asked for every partition on
its own: a broker SIGKILLed holds back only the partitions it led.

Before, the targets were asked with one consumer's ``get_watermark_offsets``, whose queries
wait behind each other: after a broker kill, partitions led by live brokers were answered
only when the dead leader's query timed out (5 s, then 10 s and 15 s for the next ones), so
a failover after a broker kill restored even the partitions it did not lead 5-16 s late."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from flowstream.devkafka import Cluster
from flowstream.kafka import clients
from flowstream.processor.restore import Targets
from flowstream.topology import EVENTS
from tests.processor.harness import three_brokers_topic

pytestmark = [pytest.mark.kafka3, pytest.mark.timeout(240)]

PARTITIONS = 8
RECORDS = 20


def test_a_dead_leader_holds_back_only_the_targets_of_its_partitions(
    kafka3_cluster: Cluster, unique_prefix: str
) -> None:
    bootstrap = kafka3_cluster.bootstrap
    topic = f"{unique_prefix}.events"
    three_brokers_topic(bootstrap, topic, PARTITIONS)
    admin = clients.new_admin(bootstrap)
    producer = clients.new_producer(bootstrap)
    for partition in range(PARTITIONS):
        for n in range(RECORDS):
            producer.produce(topic, b"x", key=f"{partition}-{n}".encode(), partition=partition)
    assert producer.flush(30) == 0

    def watermarks() -> Any:
        return clients.new_consumer(
            bootstrap, f"{unique_prefix}-wm", {"isolation.level": "read_uncommitted"}
        )

    # The processor's TaskManager, as far as the targets see it.
    tasks: Any = SimpleNamespace(
        ctx=SimpleNamespace(topics={EVENTS: topic}),
        watermarks=watermarks(),
        new_watermarks=watermarks,
    )
    targets = Targets(tasks)
    targets.admin = clients.new_admin(bootstrap)
    targets.new_admin = lambda: clients.new_admin(bootstrap)
    # Every client knows every leader before the kill, as a running processor's do.
    assert set(_answers(targets, 30).values()) == {(0, RECORDS)}

    leaders = {
        p: meta.leader
        for p, meta in admin.list_topics(topic, timeout=10).topics[topic].partitions.items()
    }
    victim = leaders[0]
    led = {p for p, leader in leaders.items() if leader == victim}
    kafka3_cluster.kill_node(victim)
    try:
        found = _answers(targets, 30, timings=True)
    finally:
        kafka3_cluster.start_node(victim)
    # Every answer is the partition's true end: a request to the dead leader that timed out
    # is answered -1001 without an error, which once emptied a store as "beyond the end".
    assert {answer for answer, _ in found.values()} == {(0, RECORDS)}, (led, found)
    took = {p: seconds for p, (_, seconds) in found.items()}
    others = {p: t for p, t in took.items() if p not in led}
    assert others and max(others.values()) < 2.0, (led, took)
    assert max(took.values()) < 15.0, (led, took)


def _answers(targets: Targets, timeout: float, *, timings: bool = False) -> dict[int, Any]:
    """Ask for every partition's target as the restore does (again after a failure) until all
    are answered: the answers, with ``timings`` each with the seconds it took."""
    began = time.monotonic()
    pending = {p: SimpleNamespace(partition=p) for p in range(PARTITIONS)}
    found: dict[int, Any] = {}
    while pending:
        assert time.monotonic() - began < timeout, f"no answer for {sorted(pending)}: {found}"
        targets.ask(list(pending.values()))  # type: ignore[arg-type]
        for p, task in list(pending.items()):
            try:
                answer = targets.answer(task)  # type: ignore[arg-type]
            except clients.KafkaException:
                continue
            if answer is not None:
                found[p] = (answer, round(time.monotonic() - began, 2)) if timings else answer
                del pending[p]
        time.sleep(0.01)
    return found

"""The command positions travel in the transactions, as ``positions`` records of the events
partitions; the group's offsets follow them outside the transactions. Against the real broker:
a new owner whose group offsets lag (here: rewound to the start while the group was empty) goes
on from the positions the transactions recorded, read from its store or restored from the topic,
and applies no command twice."""

from __future__ import annotations

import shutil

import pytest

from flowstream import wire
from flowstream.kafka import clients
from flowstream.topology import CMD_CANCEL, CMD_HOOK, CMD_SIGNAL, CMD_START, CMD_TIMER
from tests.processor.apps import SPEC
from tests.processor.harness import Cluster, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

COMMAND_TOPICS = (CMD_START, CMD_SIGNAL, CMD_HOOK, CMD_CANCEL, CMD_TIMER)


def _rewind_the_group(cluster: Cluster) -> None:
    """Commit offset 0 for every command partition, as a client outside the (empty) group."""
    rewinder = clients.new_consumer(cluster.bootstrap, cluster.group)
    try:
        rewinder.commit(
            offsets=[
                clients.TopicPartition(f"{cluster.prefix}.{name}", p, 0)
                for name in COMMAND_TOPICS
                for p in range(cluster.client.partitions)
            ],
            asynchronous=False,
        )
    finally:
        rewinder.close()


def _positions_records(cluster: Cluster) -> int:
    consumer = clients.new_consumer(
        cluster.bootstrap, f"{cluster.prefix}-positions-reader", {"enable.partition.eof": True}
    )
    topic = f"{cluster.prefix}.events"
    partitions = cluster.client.partitions
    consumer.assign([clients.TopicPartition(topic, p, 0) for p in range(partitions)])
    found, ends = 0, set()
    try:
        while len(ends) < partitions:
            for message in consumer.consume(500, 1.0):
                if message.error() is not None:
                    ends.add(message.partition())
                elif (recorded := wire.positions_of(message, wire.kind_of(message))) is not None:
                    assert set(recorded) <= {f"{cluster.prefix}.{name}" for name in COMMAND_TOPICS}
                    found += 1
    finally:
        consumer.close()
    return found


@pytest.mark.parametrize("store", ["kept", "lost"])
def test_a_new_owner_goes_on_from_the_recorded_positions_when_the_groups_lag(
    cluster: Cluster, store: str
) -> None:
    first = cluster.start("r1")
    commands = {f"rec-{i:02d}": f"cmd-rec-{i:02d}" for i in range(12)}
    for run_id, command_id in commands.items():
        cluster.client.start(run_id, SPEC, {}, command_id=command_id)
    cluster.client.flush()
    results = cluster.client.wait_all(list(commands), timeout=120)
    assert {r.status.value for r in results.values()} == {"completed"}, first.output()[-3000:]
    assert _positions_records(cluster) > 0
    assert first.stop() == 0, first.output()[-3000:]
    _rewind_the_group(cluster)
    if store == "lost":
        shutil.rmtree(cluster.root / "state")
    heir = cluster.start("r2")
    cluster.client.start("rec-after", SPEC, {}, command_id="cmd-rec-after")
    cluster.client.flush()
    after = cluster.client.wait_all(["rec-after"], timeout=120)
    assert after["rec-after"].status.value == "completed", heir.output()[-3000:]
    wait_until(
        lambda: heir.output().count("restored in") >= cluster.client.partitions,
        30,
        "the heir did not restore every partition\n" + heir.output()[-3000:],
    )
    for run_id, command_id in commands.items():
        outcomes = cluster.client.outcomes(command_id, run_id)
        assert len(outcomes) == 1, (run_id, outcomes, heir.output()[-3000:])
    assert "applied up to" in heir.output(), heir.output()[-3000:]

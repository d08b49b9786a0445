"""topics apply/verify against the real broker, through the library and the CLI."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from flowstream.cli import main
from flowstream.kafka import topics
from flowstream.topology import REQUIRED_SUFFIXES, TopologyError, load_topology

pytestmark = pytest.mark.kafka


def test_apply_creates_then_verifies(kafka_bootstrap: str, unique_prefix: str) -> None:
    topology = load_topology()
    created = topics.apply(kafka_bootstrap, topology, prefix=unique_prefix, replication_factor=1)
    # In the topology file's order, and every required topic among them.
    assert [s.suffix for s in created] == [t.suffix for t in topology.topics]
    assert {s.suffix for s in created} == set(REQUIRED_SUFFIXES)
    assert all(s.created and s.partitions == 8 for s in created)
    assert created[0].name == f"{unique_prefix}.events"

    again = topics.apply(kafka_bootstrap, topology, prefix=unique_prefix, replication_factor=1)
    assert not any(s.created for s in again)
    assert [s.name for s in topics.verify(kafka_bootstrap, topology, prefix=unique_prefix)] == [
        s.name for s in created
    ]

    events = f"{unique_prefix}.events"
    configs = topics.topic_configs(kafka_bootstrap, [events])[events]
    assert configs["cleanup.policy"] == "delete"
    assert configs["retention.ms"] == "-1"
    assert configs["min.insync.replicas"] == "1"


def test_wrong_partition_count_names_the_topic(
    kafka_bootstrap: str, unique_prefix: str, make_topic: Callable[..., str]
) -> None:
    make_topic("cmd.signal", partitions=4)
    with pytest.raises(TopologyError) as raised:
        topics.apply(kafka_bootstrap, load_topology(), prefix=unique_prefix, replication_factor=1)
    message = str(raised.value)
    assert f"topic {unique_prefix}.cmd.signal has 4 partitions" in message
    assert "declares 8" in message


def test_wrong_cleanup_policy_names_the_topic(
    kafka_bootstrap: str, unique_prefix: str, make_topic: Callable[..., str]
) -> None:
    name = make_topic("events", partitions=8, **{"cleanup.policy": "compact"})
    with pytest.raises(TopologyError, match=f"topic {name} has cleanup.policy=compact"):
        topics.apply(kafka_bootstrap, load_topology(), prefix=unique_prefix, replication_factor=1)


def test_verify_reports_missing_topics(kafka_bootstrap: str, unique_prefix: str) -> None:
    with pytest.raises(TopologyError, match=f"topics missing: {unique_prefix}.events"):
        topics.verify(kafka_bootstrap, load_topology(), prefix=unique_prefix)


def test_replication_beyond_the_cluster_is_refused(
    kafka_bootstrap: str, unique_prefix: str
) -> None:
    with pytest.raises(TopologyError, match="needs replication factor 99"):
        topics.apply(kafka_bootstrap, load_topology(), prefix=unique_prefix, replication_factor=99)


def test_cli_apply_and_verify(
    kafka_bootstrap: str, unique_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--bootstrap", kafka_bootstrap, "--prefix", unique_prefix]
    assert main(["topics", "verify", *common]) == 1
    assert "topics missing" in capsys.readouterr().err
    assert main(["topics", "apply", *common, "--replication-factor", "1"]) == 0
    out = capsys.readouterr().out
    assert f"created  {unique_prefix}.events (8 partitions)" in out
    assert main(["topics", "verify", *common]) == 0
    assert f"ok       {unique_prefix}.deadletter (8 partitions)" in capsys.readouterr().out

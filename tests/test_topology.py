"""The topology file: what it declares and what a broken one is told."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from flowstream.topology import (
    EVENTS,
    REQUIRED_SUFFIXES,
    TopologyError,
    default_topology_path,
    load_topology,
)


def test_declared_topics_are_co_partitioned() -> None:
    topology = load_topology()
    assert topology.prefix == "flowstream"
    assert {t.suffix for t in topology.topics} == set(REQUIRED_SUFFIXES)
    run_keyed = [t for t in topology.topics if t.run_keyed]
    assert {t.partitions for t in run_keyed} == {topology.run_partitions}
    assert {t.suffix for t in run_keyed} == set(REQUIRED_SUFFIXES) - {"deadletter"}
    assert topology.topic("deadletter").key == "original_key"
    events = topology.topic(EVENTS)
    assert events.cleanup_policy == "delete"
    assert events.retention_ms == -1
    assert events.configs(1)["min.insync.replicas"] == "1"
    assert events.configs()["min.insync.replicas"] == "2"


def test_names_use_the_prefix() -> None:
    topology = load_topology()
    assert topology.name("cmd.start") == "flowstream.cmd.start"
    assert topology.names("t-x")["events"] == "t-x.events"
    with pytest.raises(TopologyError, match="prefix"):
        topology.name("events", "bad prefix")
    with pytest.raises(TopologyError, match="no topic 'nope'"):
        topology.topic("nope")


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    lines = [f"prefix = {json.dumps(data['prefix'])}"]
    for topic in data["topics"]:
        lines.append("[[topics]]")
        for key, value in topic.items():
            lines.append(f"{key} = {json.dumps(value)}")
    path = tmp_path / "topics.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _declared() -> dict[str, Any]:
    with default_topology_path().open("rb") as handle:
        return tomllib.load(handle)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["topics"][1].update(partitions=4), "one partition count"),
        (lambda d: d["topics"][0].update(cleanup_policy="compact"), "events topic"),
        (lambda d: d["topics"].append(dict(d["topics"][2])), "declared twice: cmd.signal"),
        (lambda d: d["topics"].pop(), "not declared: deadletter"),
        (lambda d: d["topics"][3].update(min_insync_replicas=5), "exceeds replication_factor"),
        (lambda d: d["topics"][3].update(colour="red"), "colour"),
    ],
)
def test_invalid_topologies_are_refused(tmp_path: Path, change: Any, message: str) -> None:
    data = _declared()
    change(data)
    path = _write(tmp_path, data)
    with pytest.raises(TopologyError, match=message) as raised:
        load_topology(path)
    assert str(path) in str(raised.value)


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="not found"):
        load_topology(tmp_path / "absent.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("prefix = \n")
    with pytest.raises(TopologyError, match="not valid TOML"):
        load_topology(broken)

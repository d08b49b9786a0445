"""``KafkaRunIndex`` on the real broker (issue 21): it follows the events topic ``read_committed``,
holds the rows the histories say, picks up where it stopped, rebuilds to the same rows, and
serves ``flowstream kafka list`` and ``kafka describe``.

The runs are written by a ``KafkaEventStore`` (the embedded engine over the events topic: every
append one transaction), set up once for the module.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from flowstream.cli import main
from flowstream.engine import FlowEngine
from flowstream.index import KafkaRunIndex, RunQuery
from flowstream.index.check import index_differences, list_all
from flowstream.model.snapshot import RunStatus
from flowstream.replay.state import RunState
from flowstream.settings import Settings
from flowstream.stores.kafka import KafkaEventStore
from flowstream.topology import EVENTS, load_topology
from tests.conftest import create_topic
from tests.index.test_embedded_index import ORDER, REFUND, RUNTIME
from tests.support import run

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]


@dataclass
class Deployment:
    bootstrap: str
    prefix: str
    store: KafkaEventStore
    engine: FlowEngine

    @property
    def settings(self) -> Settings:
        return Settings(bootstrap=self.bootstrap, topic_prefix=self.prefix)

    def states(self) -> list[RunState]:
        return [RunState.from_history(self.store.read(r)) for r in self.store.list_runs()]


def _events_topic(bootstrap: str, prefix: str) -> None:
    topic = load_topology().topic(EVENTS)
    create_topic(
        bootstrap, topic.name(prefix), partitions=topic.partitions, config=topic.configs(1)
    )


@pytest.fixture(scope="module")
def deployment(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    prefix = f"t-index-{uuid.uuid4().hex[:8]}"
    _events_topic(kafka_bootstrap, prefix)
    store = KafkaEventStore(
        kafka_bootstrap,
        prefix=prefix,
        state_dir=tmp_path_factory.mktemp("writer"),
        transactional_id=f"{prefix}.writer",
    )
    engine = FlowEngine(store, RUNTIME)
    for n in range(8):
        wait = ["signal", "timer", "hook", "none"][n % 4]
        run(engine.start(f"r{n:02d}", ORDER if n % 2 else REFUND, {"wait": wait}))
    run(engine.start("bad", ORDER, {"bad": True}))
    run(engine.signal("r00", "approve", id="s0"))
    try:
        yield Deployment(kafka_bootstrap, prefix, store, engine)
    finally:
        store.close()


def test_the_index_follows_the_topic_and_resumes_from_its_offsets(
    deployment: Deployment, tmp_path: Path
) -> None:
    with KafkaRunIndex(deployment.settings, tmp_path / "index", refresh=None) as index:
        assert index.catch_up() > 0
        assert index_differences(index, deployment.states()) == []
        suspended = list_all(index, RunQuery(status=frozenset({RunStatus.SUSPENDED})))
        assert "r04" in {row.run_id for row in suspended}
        assert index.get("r04") is not None and index.get("r04").waiting_for == "signal approve"  # type: ignore[union-attr]

        run(deployment.engine.signal("r04", "approve", id="s4"))
        assert index.catch_up() > 0  # the signal and what the run did with it
        assert index.get("r04").status is RunStatus.COMPLETED  # type: ignore[union-attr]
        completed = list_all(index, RunQuery(status=frozenset({RunStatus.COMPLETED})))
        assert "r04" in {row.run_id for row in completed}
        assert index_differences(index, deployment.states()) == []
    # Reopened, it goes on from the offsets it wrote with the events: nothing to read again.
    with KafkaRunIndex(deployment.settings, tmp_path / "index", refresh=None) as index:
        assert index.catch_up() == 0
        assert index_differences(index, deployment.states()) == []


def test_a_rebuild_from_the_topic_gives_the_same_rows(
    deployment: Deployment, tmp_path: Path
) -> None:
    directory = tmp_path / "index"
    with KafkaRunIndex(deployment.settings, directory) as index:
        before = list_all(index)  # a query catches up first
        assert len(before) == len(deployment.store.list_runs())
        assert index.rebuild() > 0
        assert list_all(index) == before
    shutil.rmtree(directory)
    with KafkaRunIndex(deployment.settings, directory) as index:
        assert list_all(index) == before
    # The directory of another deployment's topic is rebuilt for this one, and back.
    other = f"t-index-other-{uuid.uuid4().hex[:8]}"
    _events_topic(deployment.bootstrap, other)
    settings = Settings(bootstrap=deployment.bootstrap, topic_prefix=other)
    with KafkaRunIndex(settings, directory) as index:
        assert list_all(index) == [] and sum(index.counts().values()) == 0
    with KafkaRunIndex(deployment.settings, directory) as index:
        assert list_all(index) == before


def cli(capsys: pytest.CaptureFixture[str], deployment: Deployment, *args: str) -> str:
    where = ["--bootstrap", deployment.bootstrap, "--prefix", deployment.prefix]
    assert main(["kafka", *args, *where]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_kafka_list_and_describe(
    deployment: Deployment, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = ["--index-dir", str(tmp_path / "index")]
    page = orjson.loads(
        cli(capsys, deployment, "list", "--status", "suspended", "--json", *directory)
    )
    expected = sorted(
        s.run_id for s in deployment.states() if s.public_status() is RunStatus.SUSPENDED
    )
    assert sorted(row["run_id"] for row in page["rows"]) == expected
    assert {row["status"] for row in page["rows"]} == {"suspended"}
    assert page["next_cursor"] is None

    first = orjson.loads(cli(capsys, deployment, "list", "--limit", "5", "--json", *directory))
    assert len(first["rows"]) == 5 and first["next_cursor"]
    rest = orjson.loads(
        cli(
            capsys,
            deployment,
            "list",
            "--limit",
            "1000",
            "--cursor",
            first["next_cursor"],
            "--json",
            *directory,
        )
    )
    listed = [row["run_id"] for row in first["rows"] + rest["rows"]]
    assert sorted(listed) == sorted(deployment.store.list_runs())

    lines = cli(capsys, deployment, "describe", "r02", *directory).splitlines()
    assert lines[0] == "r02: waiting for hook h1"
    assert lines[-1] == "  hook h1"
    described = orjson.loads(cli(capsys, deployment, "describe", "bad", "--json", *directory))
    assert described["status"] == "suspended" and "card declined" in described["last_error"]
    assert [p["kind"] for p in described["pending"]] == ["retry"]

    where = ["--bootstrap", deployment.bootstrap, "--prefix", deployment.prefix]
    assert main(["kafka", "describe", "nope", *where, *directory]) == 1
    assert capsys.readouterr().err == "error: run nope does not exist\n"

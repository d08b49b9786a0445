"""A real worker on the broker, scraped as Prometheus and a load balancer would: ``/healthz``
follows its start (producers, then the restore), and ``/metrics`` follows its runs (by status,
step durations by name) and its consumer lag (up while its loop is held, down after).

One worker goes through every stage (``gated_app`` holds each stage while a file exists), so the
broker-side setup (topics, group, the worker's start) is paid once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from flowstream.topology import load_topology
from tests.processor.apps import SPEC
from tests.processor.harness import Cluster, free_port
from tests.processor.test_health import get

pytestmark = pytest.mark.kafka


def wait_for(what: Callable[[], Any], timeout: float, why: Callable[[], str]) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = what()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(why())
        time.sleep(0.1)


class Scrape:
    """One worker's ``/metrics`` and ``/healthz``."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def health(self) -> tuple[int, dict[str, Any]]:
        try:
            status, body = get(self.base + "/healthz")
        except OSError:  # not serving yet
            return 0, {}
        return status, json.loads(body)

    def page(self) -> str:
        status, body = get(self.base + "/metrics")
        assert status == 200, status
        return body

    def samples(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        """Every sample called ``name``, by its sorted labels."""
        found = {}
        for family in text_string_to_metric_families(self.page()):
            for sample in family.samples:
                if sample.name == name:
                    found[tuple(sorted(sample.labels.items()))] = sample.value
        return found

    def runs(self) -> dict[str, float]:
        return {dict(k)["status"]: v for k, v in self.samples("flowstream_runs").items()}

    def lag(self) -> float:
        return sum(self.samples("flowstream_consumer_lag").values())


def test_a_worker_reports_its_health_runs_steps_and_lag(
    kafka_bootstrap: str, unique_prefix: str, tmp_path: Path
) -> None:
    cluster = Cluster(kafka_bootstrap, unique_prefix, tmp_path)
    gates = tmp_path / "gates"
    gates.mkdir()
    for gate in ("producer", "restore"):
        (gates / gate).touch()
    port = free_port()
    scrape = Scrape(port)
    partitions = list(range(load_topology().run_partitions))
    env = {"FLOWSTREAM_METRICS_PORT": str(port), "FLOWSTREAM_TEST_GATES": str(gates)}
    try:
        cluster.start("w", extra_env=env, app="tests.processor.gated_app:runtime")
        logs = cluster.logs

        # Connecting: no producer yet, so unhealthy, and said so without the (busy) loop.
        status, report = wait_for(
            lambda: (found := scrape.health())[1].get("status") == "starting" and found, 60, logs
        )
        assert status == 503, report
        assert report["problems"] == ["connecting: 0 of 2 transactional producers are made"]
        page = scrape.page()
        assert "_created" not in page
        (info,) = scrape.samples("flowstream_build_info")
        assert ("version", "0.1.0") in info and ("builds", "unpinned") in info

        # Connected, a member, but the partitions restore: still unhealthy.
        (gates / "producer").unlink()
        status, report = wait_for(
            lambda: (found := scrape.health())[1].get("restoring_partitions") and found, 60, logs
        )
        assert status == 503 and report["producers"] == ["ready", "ready"], report
        assert "still restoring" in report["problems"][0]
        assert set(scrape.runs().values()) == {0.0}  # no partition restored: none counted

        # Restored: healthy, owning every partition.
        (gates / "restore").unlink()
        wait_for(lambda: scrape.health()[0] == 200, 60, lambda: f"{scrape.health()}\n{logs()}")
        assert scrape.health()[1]["owned_partitions"] == partitions
        assert set(scrape.runs().values()) == {0.0}
        wait_for(
            lambda: len(scrape.samples("flowstream_consumer_lag")) == 5 * len(partitions),
            30,
            lambda: f"{scrape.samples('flowstream_consumer_lag')}",
        )

        # Runs move through the by-status gauge as their events commit.
        for n in range(6):
            cluster.client.start(f"plain-{n}", SPEC, {})
        # A parent's child start goes out in the worker's transaction: a commit marker follows
        # it on the command partition, and the lag still drains to 0.
        cluster.client.start("parent", SPEC, {"child": True})
        cluster.client.start("waits", SPEC, {"signal": True})
        wait_for(
            lambda: scrape.runs().get("completed") == 8 and scrape.runs().get("suspended") == 1,
            60,
            lambda: f"{scrape.runs()}\n{logs()}",
        )
        cluster.client.signal("waits", "go", id="g1")
        wait_for(lambda: scrape.runs().get("completed") == 9, 60, lambda: f"{scrape.runs()}")
        assert scrape.runs()["suspended"] == 0 and scrape.runs()["running"] == 0
        durations = scrape.samples("flowstream_step_duration_seconds_count")
        assert {dict(k)["step"]: v for k, v in durations.items()} == {
            "validate": 9,
            "reserve": 9,
            "charge": 9,
        }
        wait_for(
            lambda: scrape.lag() == 0, 30, lambda: f"{scrape.samples('flowstream_consumer_lag')}"
        )

        # Lag: a decision holds the loop; the commands sent meanwhile are fetched, not applied.
        (gates / "loop").touch()
        cluster.client.start("holder", SPEC, {"hold_loop": True})
        status, report = wait_for(
            lambda: (found := scrape.health())[0] == 503 and found, 30, lambda: f"{logs()}"
        )
        assert "did not answer" in report["problems"][0], report
        for n in range(20):
            cluster.client.start(f"queued-{n}", SPEC, {})
        wait_for(lambda: scrape.lag() >= 20, 30, lambda: f"lag {scrape.lag()}\n{logs()}")
        (gates / "loop").unlink()
        wait_for(lambda: scrape.lag() == 0, 60, lambda: f"lag {scrape.lag()}")
        wait_for(lambda: scrape.runs().get("completed") == 30, 60, lambda: f"{scrape.runs()}")
        assert scrape.health()[0] == 200
    finally:
        cluster.close()

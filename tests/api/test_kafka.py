"""The same plain-code apps on Kafka: ``flowstream worker --app module:app`` serves them
unchanged, and ``KafkaClient`` handles speak the embedded handles' vocabulary."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

import flowstream
from flowstream.examples import shop
from flowstream.testing import Replayer
from tests.api import hosted
from tests.processor.conftest import cluster
from tests.processor.harness import Cluster

__all__ = ["cluster"]  # the processor tests' fixture: topics, a client, worker processes

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]


def test_a_plain_code_workflow_runs_on_a_kafka_worker_through_a_handle(cluster: Cluster) -> None:
    worker = cluster.start("api-1", app="tests.api.hosted:app")
    client = flowstream.KafkaClient(flow_client=cluster.client)

    async def scenario() -> tuple[str, flowstream.WorkflowRunSnapshot]:
        handle = await client.start(hosted.errand, "k", id="errand-kafka-1")
        await handle.signal("go", "now", id="errand-kafka-1-go")
        result = await handle.result(timeout=90)
        return result, await handle.snapshot()

    try:
        result, snapshot = asyncio.run(scenario())
    except Exception:
        print(cluster.logs())
        raise
    # A retry after its delay, a timer, a signal and a gathered batch, all on the worker.
    assert result == "k@2+now+k-a@2+k-b@2"
    assert [s.attempt for s in snapshot.steps.values()] == [2, 2, 2, 1]
    assert snapshot.waits["sleep"].status.value == "completed"
    assert worker.process.poll() is None
    # Exported from the events topic, the history replays against the app.
    command = ["kafka", "history", "errand-kafka-1", "--json", "--bootstrap", cluster.bootstrap]
    exported = subprocess.run(
        [sys.executable, "-m", "flowstream", *command, "--prefix", cluster.prefix],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    report = asyncio.run(Replayer(hosted.app).replay_export(exported))
    assert report.ok and report.runs[0].decisions_checked >= 6


def test_a_kafka_handle_follows_its_run_through_continue_as_new(cluster: Cluster) -> None:
    cluster.start("api-chain", app="tests.api.hosted:app")
    client = flowstream.KafkaClient(flow_client=cluster.client)

    async def scenario() -> int:
        handle = await client.start(hosted.counter, 0, id="counter-kafka-1")
        return await handle.result(timeout=90)

    try:
        assert asyncio.run(scenario()) == 3  # three continuations, then the last run's output
    except Exception:
        print(cluster.logs())
        raise


def test_the_readme_workflow_runs_on_a_kafka_worker_up_to_its_hour(cluster: Cluster) -> None:
    cluster.start("api-shop", app="flowstream.examples.shop:app")
    client = flowstream.KafkaClient(flow_client=cluster.client)

    async def scenario() -> flowstream.WorkflowRunSnapshot:
        order = shop.Order(order_id="k1", cents=4599)
        handle = await client.start(shop.order, order, id="shop-kafka-1")
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                snapshot = await handle.snapshot()
            except flowstream.RunNotFoundError:
                await asyncio.sleep(0.2)
                continue
            if "sleep" in snapshot.waits:
                return snapshot
            await asyncio.sleep(0.2)
        raise AssertionError(f"the run did not reach its timer in time\n{cluster.logs()}")

    snapshot = asyncio.run(scenario())
    assert [s.status.value for s in snapshot.steps.values()] == ["completed", "completed"]
    assert snapshot.steps["charge_card"].output == 4599
    wait = snapshot.waits["sleep"]
    assert wait.status.value == "waiting"
    assert 3599 <= (wait.resume_at - snapshot.updated_at).total_seconds() <= 3601

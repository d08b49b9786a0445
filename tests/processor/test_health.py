"""A processor's metrics server: the address it binds, and ``/healthz``.

The server and ``HealthCheck``'s own logic are tried on stand-ins; a real worker on the broker
shows ``/healthz`` following group membership and partition ownership.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from flowstream.cli import build_parser
from flowstream.cli.worker import worker_settings
from flowstream.kafka.clients import KafkaError
from flowstream.processor.health import HealthCheck
from flowstream.processor.metrics import ProcessorMetrics
from flowstream.topology import load_topology
from tests.processor.harness import Cluster, free_port


def wait_until(predicate: Callable[[], bool], timeout: float, why: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(why())
        time.sleep(0.2)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_the_metrics_host_comes_from_the_flag_or_the_environment_and_is_loopback_by_default() -> (
    None
):
    parser = build_parser()
    plain = parser.parse_args(["worker"])
    flagged = parser.parse_args(["worker", "--metrics-host", "0.0.0.0"])
    assert worker_settings(plain, {}).metrics_host == "127.0.0.1"
    assert worker_settings(plain, {"FLOWSTREAM_METRICS_HOST": "::"}).metrics_host == "::"
    assert worker_settings(flagged, {"FLOWSTREAM_METRICS_HOST": "::"}).metrics_host == "0.0.0.0"


def test_the_server_binds_the_host_given_and_answers_healthz_from_the_check() -> None:
    metrics = ProcessorMetrics()
    metrics.owned_partitions.set(3)
    verdict: list[tuple[bool, dict[str, Any]]] = [(False, {"problems": ["restoring"]})]
    port = free_port()
    server = metrics.serve(port, "127.0.0.1", health=lambda: verdict[0])
    try:
        assert server.server_address[0] == "127.0.0.1"
        status, body = get(f"http://127.0.0.1:{port}/healthz")
        assert (status, json.loads(body)) == (503, {"problems": ["restoring"]})
        verdict[0] = (True, {"status": "ok"})
        assert get(f"http://127.0.0.1:{port}/healthz") == (200, '{"status": "ok"}')
        status, page = get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and "flowstream_owned_partitions 3.0" in page
    finally:
        server.shutdown()
        server.server_close()
    # Without a check, /healthz is any other path: the metrics page.
    port = free_port()
    server = metrics.serve(port)
    try:
        assert "flowstream_owned_partitions" in get(f"http://127.0.0.1:{port}/healthz")[1]
    finally:
        server.shutdown()
        server.server_close()


def stand_in(member: str | None = "m-1", owned: int = 2, restoring: int = 0) -> Any:
    """Just the attributes HealthCheck reads."""
    tasks = [SimpleNamespace(partition=p) for p in range(owned + restoring)]
    return SimpleNamespace(
        settings=SimpleNamespace(instance_id="p-1"),
        consumer=SimpleNamespace(memberid=lambda: member),
        tasks=SimpleNamespace(active=lambda: tasks[:owned], restoring=lambda: tasks[owned:]),
        pipeline=SimpleNamespace(
            slots=[SimpleNamespace(index=i, producer=object(), error=None) for i in (0, 1)],
            stuck=lambda: False,
        ),
    )


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def test_the_check_is_asked_on_the_loop_and_names_what_is_wrong(
    loop: asyncio.AbstractEventLoop,
) -> None:
    processor = stand_in()
    check = HealthCheck(processor, timeout_s=1)
    ok, report = check()
    assert not ok and report["problems"] == ["the processor is not running"]
    check.attach(loop)
    ok, report = check()
    assert ok and report["owned_partitions"] == [0, 1] and report["member_id"] == "m-1"
    ok, report = HealthCheck(stand_in(owned=0), timeout_s=1).report()
    assert ok and report["owned_partitions"] == []  # an idle member is healthy
    ok, report = HealthCheck(stand_in(member=None, owned=1, restoring=2)).report()
    assert not ok and report["problems"] == [
        "not a member of the consumer group (yet)",
        "partitions [1, 2] are still restoring",
    ]
    processor.pipeline.slots[1].producer = None  # given up with its partitions: made on demand
    assert check()[0]
    processor.pipeline.slots[1].error = KafkaError(KafkaError._FENCED, "fenced", fatal=True)
    assert check()[1]["problems"] == ["transactional producer [1] has a fatal error (fenced)"]
    processor.pipeline.slots[1].error = KafkaError(KafkaError._MSG_TIMED_OUT, "late")
    assert check()[0]
    processor.pipeline.stuck = lambda: True
    assert "hangs" in check()[1]["problems"][0]


def test_a_loop_that_does_not_turn_is_unhealthy(loop: asyncio.AbstractEventLoop) -> None:
    check = HealthCheck(stand_in(), timeout_s=0.3)
    check.attach(loop)
    loop.call_soon_threadsafe(time.sleep, 1.0)  # blocks the loop
    started = time.monotonic()
    ok, report = check()
    assert not ok and report["problems"] == ["the processor's loop did not answer within 0.3 s"]
    assert time.monotonic() - started < 0.9
    time.sleep(1.0)
    assert check()[0]


@pytest.mark.kafka
def test_healthz_of_real_workers_follows_membership_and_ownership(
    kafka_bootstrap: str, unique_prefix: str, tmp_path: Path
) -> None:
    cluster = Cluster(kafka_bootstrap, unique_prefix, tmp_path)
    partitions = list(range(load_topology().run_partitions))
    ports = {"a": free_port(), "b": free_port()}

    def health(name: str) -> tuple[int, dict[str, Any]]:
        try:
            status, body = get(f"http://127.0.0.1:{ports[name]}/healthz")
        except OSError:
            return 0, {}
        return status, json.loads(body)

    def start(name: str) -> None:
        env = {"FLOWSTREAM_METRICS_PORT": str(ports[name]), "FLOWSTREAM_METRICS_HOST": "127.0.0.1"}
        cluster.start(name, extra_env=env)

    try:
        start("a")
        wait_until(
            lambda: health("a")[1].get("owned_partitions") == partitions,
            60,
            lambda: f"a never owned every partition: {health('a')}\n{cluster.logs()}",
        )
        assert health("a")[0] == 200
        start("b")

        def split() -> bool:
            (status_a, a), (status_b, b) = health("a"), health("b")
            return (
                (status_a, status_b) == (200, 200)
                and sorted(a["owned_partitions"] + b["owned_partitions"]) == partitions
                and bool(b["owned_partitions"])
            )

        wait_until(split, 60, lambda: f"no split: {health('a')} {health('b')}\n{cluster.logs()}")
        assert health("a")[1]["member_id"] != health("b")[1]["member_id"]
        cluster.workers["b"].stop()
        wait_until(
            lambda: health("a")[1].get("owned_partitions") == partitions,
            60,
            lambda: f"a never took b's partitions back: {health('a')}\n{cluster.logs()}",
        )
        assert health("b") == (0, {})
    finally:
        cluster.close()

"""Shared test wiring: the real Kafka broker, unique names, and the "no Kafka test skipped" rule.

* ``kafka_bootstrap`` (session): ``$FLOWSTREAM_TEST_KAFKA`` when set, else a single broker started
  with :mod:`flowstream.devkafka` under ``~/.cache/flowstream/test-broker`` on port 19092, stopped
  at the end of the session only if this session started it.
* ``kafka3_cluster`` (session, lazy): a three-node cluster of this session alone (ports 29092-29094,
  or the next free group; ``$FLOWSTREAM_TEST_KAFKA3_PORT`` moves the first), for tests marked
  ``kafka3`` that kill and restart brokers.
* ``unique_prefix`` / ``unique_name`` / ``make_topic``: per-test topic and group names.
* With ``FLOWSTREAM_REQUIRE_KAFKA=1``, a session in which any test marked ``kafka`` or ``kafka3``
  was skipped or deselected exits non-zero and says which.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from typing import NoReturn

import pytest

from flowstream.devkafka import DEFAULT_PORT_3, Cluster, DevKafkaError
from flowstream.devkafka.jars import default_cache_root, ensure_jars
from flowstream.devkafka.process import port_is_free
from flowstream.kafka import clients

KAFKA_ENV = "FLOWSTREAM_TEST_KAFKA"
KAFKA3_PORT_ENV = "FLOWSTREAM_TEST_KAFKA3_PORT"
REQUIRE_ENV = "FLOWSTREAM_REQUIRE_KAFKA"
KAFKA_MARKERS = ("kafka", "kafka3")
TEST_BROKER_PORT = 19092

_missed_kafka_tests: list[str] = []


def _requires_kafka() -> bool:
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def _is_kafka_test(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) for name in KAFKA_MARKERS)


def _unavailable(message: str) -> NoReturn:
    if _requires_kafka():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


# -- brokers ------------------------------------------------------------------------------


def pytest_collection_finish(session: pytest.Session) -> None:
    """Fetch the Kafka jars before any test runs, so a first download eats no test's timeout."""
    if any(_is_kafka_test(item) for item in session.items):
        try:
            ensure_jars()
        except DevKafkaError:
            pass  # the fixtures report it, once per test that needs Kafka


@contextlib.contextmanager
def _running(cluster: Cluster, hint: str) -> Iterator[Cluster]:
    """The cluster started (fresh) unless it already runs; stopped after only if started here."""
    started_here = not cluster.is_running()
    problem = None
    try:
        cluster.start(fresh=started_here)
    except DevKafkaError as error:
        problem = f"{error} {hint}".strip()
    if problem is not None:
        _unavailable(f"no Kafka: {problem}")
    try:
        yield cluster
    finally:
        if started_here:
            cluster.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap address of a real single-node Kafka broker."""
    configured = os.environ.get(KAFKA_ENV)
    if configured:
        yield configured
        return
    cluster = Cluster(default_cache_root() / "test-broker", port=TEST_BROKER_PORT)
    with _running(cluster, f"(or set {KAFKA_ENV}=host:port)"):
        yield cluster.bootstrap


@pytest.fixture(scope="session")
def kafka3_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A three-node cluster (RF 3, min ISR 2) whose nodes tests may kill and restart.

    Never shared with another pytest session: one session's kill or stop must not land in
    another's test.
    """
    home = tmp_path_factory.mktemp("kafka3")
    base = _free_cluster_base(int(os.environ.get(KAFKA3_PORT_ENV, DEFAULT_PORT_3)))
    with _running(Cluster(home, brokers=3, port=base), "") as cluster:
        yield cluster


def _free_cluster_base(first: int = DEFAULT_PORT_3) -> int:
    """The first base port from ``first`` whose three client and controller ports are free."""
    for base in range(first, first + 2000, 10):
        ports = [base + i for i in range(3)] + [base + 100 + i for i in range(3)]
        if all(port_is_free(port) for port in ports):
            return base
    _unavailable(f"no free ports for a three-broker cluster from {first}")


# -- names --------------------------------------------------------------------------------


@pytest.fixture
def unique_prefix(request: pytest.FixtureRequest) -> str:
    """A topic/group name prefix no other test (or earlier run) uses."""
    stem = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name).strip("-")[:40]
    return f"t-{stem}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def unique_name(unique_prefix: str) -> Callable[[str], str]:
    """``unique_name("orders")`` -> ``<unique prefix>.orders``."""
    return lambda suffix: f"{unique_prefix}.{suffix}"


@pytest.fixture
def make_topic(kafka_bootstrap: str, unique_name: Callable[[str], str]) -> Callable[..., str]:
    """Create ``<unique prefix>.<suffix>`` (replication 1) and wait for its leaders."""

    def make(suffix: str, partitions: int = 1, **config: str) -> str:
        name = unique_name(suffix)
        create_topic(kafka_bootstrap, name, partitions=partitions, config=config)
        return name

    return make


def create_topic(
    bootstrap: str,
    name: str,
    *,
    partitions: int,
    replication_factor: int = 1,
    config: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> None:
    """Create a topic and wait until every partition has a leader."""
    admin = clients.new_admin(bootstrap)
    new = clients.NewTopic(
        name,
        num_partitions=partitions,
        replication_factor=replication_factor,
        config=config or {},
    )
    admin.create_topics([new], operation_timeout=timeout)[name].result()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        topic = admin.list_topics(topic=name, timeout=timeout).topics.get(name)
        if (
            topic is not None
            and topic.error is None
            and len(topic.partitions) == partitions
            and all(p.leader >= 0 for p in topic.partitions.values())
        ):
            return
        time.sleep(0.1)
    raise AssertionError(f"topic {name} has no leader for every partition after {timeout} s")


# -- the "no Kafka test may be skipped" rule --------------------------------------------------


def pytest_deselected(items: list[pytest.Item]) -> None:
    _missed_kafka_tests.extend(f"{i.nodeid} (deselected)" for i in items if _is_kafka_test(i))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if (
        report.skipped
        and not hasattr(report, "wasxfail")
        and any(name in report.keywords for name in KAFKA_MARKERS)
    ):
        _missed_kafka_tests.append(f"{report.nodeid} (skipped)")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _requires_kafka() and _missed_kafka_tests and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _requires_kafka() and _missed_kafka_tests:
        terminalreporter.section(f"{REQUIRE_ENV}=1", sep="!", red=True)
        terminalreporter.line(
            f"{len(_missed_kafka_tests)} Kafka test(s) did not run; with {REQUIRE_ENV}=1 "
            "every test marked kafka/kafka3 must run:",
            red=True,
        )
        for entry in _missed_kafka_tests:
            terminalreporter.line(f"  {entry}")

"""A command's outcome is written in the transaction of its effect, on the real broker.

The worker aborts every third commit after its records reached the log (``outcome_abort_app``),
so some starts are applied twice: once in a transaction that aborts, once in one that commits.
``read_uncommitted`` shows both outcome records (on the events topic, beside the events) and both
``run_created`` events of such a start;
``read_committed`` shows exactly one of each for every start. An outcome written outside the
transaction (or in another one) would outlive the abort of its events, and be seen twice.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from flowstream import codec, wire
from flowstream.client import FlowClient
from flowstream.examples.order import SPEC as ORDER
from flowstream.kafka import clients
from flowstream.model.messages import OutcomeStatus
from flowstream.topology import load_topology
from tests.processor.harness import Cluster, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]

PARTITIONS = load_topology().run_partitions
RUNS = 24


def _records(bootstrap: str, topic: str, isolation: str) -> list[Any]:
    """Every record of every partition of ``topic`` visible at ``isolation``, to each end."""
    consumer = clients.new_consumer(
        bootstrap,
        f"atomicity-{uuid.uuid4().hex[:8]}",
        {"enable.partition.eof": True, "isolation.level": isolation},
    )
    try:
        consumer.assign([clients.TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        found: list[Any] = []
        ended: set[int] = set()
        deadline = time.monotonic() + 60
        while len(ended) < PARTITIONS:
            assert time.monotonic() < deadline, f"{topic} not read to its end ({isolation})"
            for message in consumer.consume(500, 1.0):
                error = message.error()
                if error is None:
                    found.append(message)
                elif error.code() == clients.KafkaError._PARTITION_EOF:
                    ended.add(message.partition())
        return found
    finally:
        consumer.close()


def _outcomes(records: list[Any]) -> Counter[tuple[str, OutcomeStatus]]:
    """(key, status) of each outcome record."""
    counts: Counter[tuple[str, OutcomeStatus]] = Counter()
    for message in records:
        if wire.kind_of(message) is not wire.RecordKind.OUTCOME:
            continue
        _, _, raw = message.value().partition(b"\0")
        outcome = codec.decode_outcome(raw)
        counts[(outcome.key, outcome.status)] += 1
    return counts


def _created(records: list[Any]) -> Counter[str]:
    """Run ids of the ``run_created`` events among ``records``."""
    return Counter(
        envelope.run_id
        for envelope in wire.decode_events(records)
        if envelope.event.type == "run_created"
    )


def test_an_outcome_commits_and_aborts_with_the_events_of_its_command(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    prefix = f"t-atomic-{uuid.uuid4().hex[:8]}"
    cluster = Cluster(kafka_bootstrap, prefix, tmp_path)
    try:
        cluster.start("w1", app="tests.kafka.outcome_abort_app:runtime")
        # Once the worker answers a first start, the others are applied one by one as they come.
        ready = FlowClient(cluster.client.settings, timeout=90)
        try:
            ready.start(
                "warm-up", ORDER, {"order_id": "w", "sku": "s", "quantity": 1, "amount_cents": 1}
            )
        finally:
            ready.close()
        client = cluster.client  # sends without waiting
        run_ids = [f"atomic-{i:02d}" for i in range(RUNS)]
        for run_id in run_ids:
            data = {"order_id": run_id, "sku": "s", "quantity": 1, "amount_cents": 1}
            client.start(run_id, ORDER, data, command_id=f"{run_id}-start")
            client.flush()
            time.sleep(0.15)  # spread over many transactions, some of which abort

        def committed() -> Counter[tuple[str, OutcomeStatus]]:
            return _outcomes(_records(kafka_bootstrap, f"{prefix}.events", "read_committed"))

        wait_until(
            lambda: {key for key, _ in committed()} >= set(run_ids),
            120,
            f"not every start answered: {committed()}\n{cluster.logs()}",
        )
        assert "injected abort after writing" in cluster.workers["w1"].output()

        seen = committed()
        seen.pop(("warm-up", OutcomeStatus.APPLIED))
        assert seen == Counter({(r, OutcomeStatus.APPLIED): 1 for r in run_ids}), seen
        events = f"{prefix}.events"
        created = _created(_records(kafka_bootstrap, events, "read_committed"))
        assert created == Counter(dict.fromkeys([*run_ids, "warm-up"], 1)), created

        written = _outcomes(_records(kafka_bootstrap, f"{prefix}.events", "read_uncommitted"))
        all_created = _created(_records(kafka_bootstrap, events, "read_uncommitted"))
        # Each application wrote one outcome and one run_created, aborted or committed together.
        assert {r: written[(r, OutcomeStatus.APPLIED)] for r in run_ids} == {
            r: all_created[r] for r in run_ids
        }
        assert set(written) == {*seen, ("warm-up", OutcomeStatus.APPLIED)}  # and no other
        twice = [r for r in run_ids if written[(r, OutcomeStatus.APPLIED)] > 1]
        assert twice, f"no start was applied in a transaction that aborted: {written}"
    finally:
        cluster.close()

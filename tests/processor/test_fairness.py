"""A backlog of new commands does not starve the runs already under way, against the real
broker and a real worker: each loop iteration records the steps' outcomes before it takes new
commands, so a run whose step finished moves on while thousands of starts wait their turn."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import pytest

from flowstream.client import FlowClient
from flowstream.kafka import clients
from tests.processor.apps import SPEC
from tests.processor.harness import Cluster, committed_events, step_log, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

FLOOD = 6000
# One decision or so per iteration: the flood outlasts many iterations. On a quiet machine the
# first run's two steps left take about the time of 1,500-2,400 decisions: 6,000 keep them well
# inside the flood (869 and 1,004 of 6,000 were created before it completed).
TINY_BUDGET = {"FLOWSTREAM_DECISION_BUDGET_MS": "1"}


def test_runs_under_way_finish_while_a_backlog_of_starts_waits(
    cluster: Cluster, tmp_path: Path
) -> None:
    hold = tmp_path / "release-steps"
    cluster.start("w0", TINY_BUDGET)
    cluster.client.start("first", SPEC, {"hold_file": str(hold)}, wait=False)
    wait_until(
        lambda: any(e["run"] == "first" for e in step_log(cluster.step_log)),
        60,
        "the first run's step never started",
    )
    # Runs that wait for a signal: one decision each, so the flood is pure command backlog. It
    # is produced in one transaction: the worker (read_committed) sees all of it at once, so a
    # backlog exists however fast the worker is next to this client.
    flood = [f"flood-{i}" for i in range(FLOOD)]
    flooder = FlowClient(cluster.client.settings, wait=False)
    flooder._producer = clients.new_transactional_producer(
        cluster.bootstrap, f"{cluster.prefix}-flood"
    )
    flooder._producer.init_transactions(30)
    flooder._producer.begin_transaction()
    for run_id in flood:
        flooder.start(run_id, SPEC, {"signal": True}, wait=False)
    flooder._producer.commit_transaction(60)
    flooder.close()
    time.sleep(0.3)  # the worker is into the flood
    hold.touch()  # the first run's held step finishes: its outcome arrives behind the flood
    assert cluster.client.wait("first", timeout=180).status.value == "completed"
    created: dict[str, datetime] = {}
    wait_until(
        lambda: len(created_at(cluster, created)) == FLOOD + 1, 180, "the flood was not consumed"
    )
    # One worker wrote every event, so their times order them across partitions: how much of
    # the flood was created before the first run completed. Starved, all of it was: its two
    # steps left waited for an iteration that ended within its budget, after the whole flood.
    completed = next(
        envelope.timestamp
        for envelope, _ in committed_events(
            cluster.bootstrap, cluster.prefix, cluster.client.partitions
        )
        if envelope.run_id == "first" and envelope.event.type == "run_completed"
    )
    before = sum(1 for run_id in flood if created[run_id] < completed)
    assert before < FLOOD / 2, (before, FLOOD)


def created_at(cluster: Cluster, into: dict[str, datetime]) -> dict[str, datetime]:
    """When each run was created (its ``run_created`` event's time), read from the topic."""
    into.clear()
    for envelope, _ in committed_events(
        cluster.bootstrap, cluster.prefix, cluster.client.partitions
    ):
        if envelope.event.type == "run_created":
            into[envelope.run_id] = envelope.timestamp
    return into

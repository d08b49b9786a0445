"""A backlog of new commands does not starve the runs already under way, against the real
broker and a real worker: each loop iteration records the steps' outcomes before it takes new
commands, so a run whose step finished moves on while thousands of starts wait their turn."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from flowstream.partitioning import partition_for
from tests.processor.apps import SPEC
from tests.processor.harness import Cluster, raw_events, step_log, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

FLOOD = 2400
# One decision or so per iteration: the flood outlasts many iterations.
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
    # Runs that wait for a signal: one decision each, so the flood is pure command backlog.
    flood = [f"flood-{i}" for i in range(FLOOD)]
    for run_id in flood:
        cluster.client.start(run_id, SPEC, {"signal": True}, wait=False)
    cluster.client.flush()
    time.sleep(0.5)  # the worker is into the flood
    hold.touch()  # the first run's held step finishes: its outcome arrives behind the flood
    assert cluster.client.wait("first", timeout=180).status.value == "completed"
    wait_until(
        lambda: (
            sum(
                1
                for r in raw_events(cluster.bootstrap, cluster.prefix, cluster.client.partitions)
                if r[2] == "run_created"
            )
            == FLOOD + 1
        ),
        180,
        "the flood was not consumed",
    )
    # On the first run's partition (the order of its commits), how much of the flood was
    # created before the first run completed. Starved, it all was.
    partitions = cluster.client.partitions
    mine = partition_for("first", partitions)
    order = [
        (run_id, kind)
        for run_id, _, kind, _ in raw_events(cluster.bootstrap, cluster.prefix, partitions)
        if partition_for(run_id, partitions) == mine
    ]
    done_at = order.index(("first", "run_completed"))
    before = sum(
        1 for run_id, kind in order[:done_at] if kind == "run_created" and run_id != "first"
    )
    on_partition = sum(1 for run_id in flood if partition_for(run_id, partitions) == mine)
    assert on_partition > 100
    assert before < on_partition / 2, (before, on_partition)

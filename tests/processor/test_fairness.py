"""A backlog of new commands does not starve the runs already under way, against the real
broker and a real worker: each loop iteration records the steps' outcomes before it takes new
commands, and lets a step's thread in between decisions, so a run whose step finished moves on
while thousands of starts wait their turn."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from flowstream.client import FlowClient
from flowstream.kafka import clients
from tests.processor.apps import SPEC
from tests.processor.harness import Cluster, committed_events, step_log, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

FLOOD = 6000
# One decision or so per iteration: the flood outlasts many iterations.
TINY_BUDGET = {"FLOWSTREAM_DECISION_BUDGET_MS": "1"}
# What is measured is how many starts are decided while a finished step's outcome waits to be
# recorded, next to how many were left when the first step finished. Starved, about every start
# left waits (5,765 of 5,913 with the outcomes taken after the commands). Fair, a few: 3 in all
# on a quiet machine; on a loaded one the step's thread, and the asyncio loop's hand-off of its
# result, can take a second, and the starts decided meanwhile count (511 of 4,998 left in one
# CI run). A share of what is left does not depend on how fast the machine decides next to how
# fast steps run and commit, as long as starts are left when the first step finishes: the guard
# below says so.
WAITING_AT_MOST_SHARE = 0.25
LEFT_AT_LEAST = 1000
# Each held step makes this many short system calls once released, as a step that talks to a
# service does: its thread needs the interpreter lock back after each. With the loop taking
# decisions beside it and never letting a waiting thread in, such a step took 0.66 s and 1.07 s
# in two of three runs (1,627 and 2,560 starts decided meanwhile: both failed); letting it in
# between decisions once a step has run 50 ms (``StepRunner.make_way``), 2-69 ms and at most 272
# starts for the three steps in five runs.
STEP_IO = 1000


def test_runs_under_way_finish_while_a_backlog_of_starts_waits(
    cluster: Cluster, tmp_path: Path
) -> None:
    hold = tmp_path / "release-steps"
    cluster.start("w0", TINY_BUDGET)
    cluster.client.start("first", SPEC, {"hold_file": str(hold), "step_io": STEP_IO}, wait=False)
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
    released = datetime.now(UTC)
    hold.touch()  # the first run's held steps finish: their outcomes arrive inside the flood
    assert cluster.client.wait("first", timeout=180).status.value == "completed"
    created: dict[str, datetime] = {}
    wait_until(
        lambda: len(created_at(cluster, created)) == FLOOD + 1, 180, "the flood was not consumed"
    )
    # One worker wrote every event and every step ran in its process, so times order them: for
    # each of the first run's steps, the starts decided between the step finishing (released,
    # or started: the later steps do not wait) and its completion being recorded.
    completions = {
        envelope.event.step_id: envelope.timestamp
        for envelope, _ in committed_events(
            cluster.bootstrap, cluster.prefix, cluster.client.partitions
        )
        if envelope.run_id == "first" and envelope.event.type == "step_completed"
    }
    finished = {
        str(entry["step"]): max(released, datetime.fromtimestamp(float(entry["started"]), UTC))
        for entry in step_log(cluster.step_log)
        if entry["run"] == "first"
    }
    assert sorted(completions) == sorted(finished), (completions, finished)
    first = min(completions.values())
    left = sum(1 for run_id in flood if created[run_id] > first)
    assert left >= LEFT_AT_LEAST, f"only {left} starts were left when the first step finished"
    waited = {
        step: sum(1 for run_id in flood if finished[step] <= created[run_id] < completions[step])
        for step in completions
    }
    assert sum(waited.values()) <= WAITING_AT_MOST_SHARE * left, (waited, left)


def created_at(cluster: Cluster, into: dict[str, datetime]) -> dict[str, datetime]:
    """When each run was created (its ``run_created`` event's time), read from the topic."""
    into.clear()
    for envelope, _ in committed_events(
        cluster.bootstrap, cluster.prefix, cluster.client.partitions
    ):
        if envelope.event.type == "run_created":
            into[envelope.run_id] = envelope.timestamp
    return into

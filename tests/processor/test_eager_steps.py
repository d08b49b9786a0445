"""Steps started before or after their ``step_started`` commits (``eager_steps``), and commits
that fail and abort, against the real broker and real worker processes."""

from __future__ import annotations

import time

import pytest

from tests.processor.apps import SPEC
from tests.processor.fault_reasons import ABORT_REASON
from tests.processor.harness import (
    Cluster,
    Load,
    assert_no_duplicate_sequences,
    committed_events,
    event_offsets,
    raw_events,
    record_offsets,
    step_log,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]

EAGER = {"FLOWSTREAM_EAGER_STEPS": "true"}
STRICT = {"FLOWSTREAM_EAGER_STEPS": "false"}
# Long enough that no short run's transaction is sealed for its age alone.
PATIENT = {"FLOWSTREAM_COMMIT_LINGER_MS": "300", "FLOWSTREAM_COMMIT_INTERVAL_MS": "1000"}


def _transactions(
    run_id: str,
    offsets: dict[str, list[tuple[int, int]]],
    records: set[tuple[int, int]],
    ends: dict[int, int],
) -> int:
    """How many transactions wrote the records of ``run_id``, a run that ran alone: each wrote
    one commit marker on the run's partition, at an offset no committed record holds. A
    transaction's marker lands after its records, but not always before the next transaction's
    records (the next step's outcome may be written by the other producer before the coordinator
    has written the marker of the commit that started that step), so the markers are counted
    from the run's first record up to the next run's first record on the partition, or its end
    (a run is over for its client only once every marker before its last event is written)."""
    partition, first = offsets[run_id][0]
    later = [
        o
        for other, at in offsets.items()
        if other != run_id
        for p, o in at
        if p == partition and o > first
    ]
    end = min(later, default=ends[partition])
    return sum(1 for o in range(first, end) if (partition, o) not in records)


@pytest.mark.parametrize(("env", "expected"), [(EAGER, 1), (STRICT, 4)], ids=["eager", "strict"])
def test_a_short_run_commits_in_one_transaction_only_with_eager_steps(
    cluster: Cluster, env: dict[str, str], expected: int
) -> None:
    # Three fast steps one after another. Eager: each starts as it is decided and its outcome
    # and the next decision join the same open transaction, so the run's twelve events commit
    # together. Strict: each step waits for its step_started to commit, so the run takes four
    # transactions (start + first step, then one per outcome).
    cluster.start("w0", {**env, **PATIENT})
    run_ids = [f"seq-{i}" for i in range(4)]
    for run_id in run_ids:
        cluster.client.start(run_id, SPEC, {})
        assert cluster.client.wait(run_id, timeout=90).status.value == "completed"
    offsets = event_offsets(cluster.bootstrap, cluster.prefix, cluster.client.partitions)
    records, ends = record_offsets(cluster.bootstrap, cluster.prefix, cluster.client.partitions)
    for run_id in run_ids:
        assert len(offsets[run_id]) == 12, offsets[run_id]
        assert _transactions(run_id, offsets, records, ends) == expected, (run_id, offsets[run_id])
    # Either way each step ran once, after its run started, with the run's idempotency key.
    executions = [e for e in step_log(cluster.step_log) if e["run"] in run_ids]
    assert sorted((e["run"], e["step"], e["attempt"]) for e in executions) == sorted(
        (r, s, 1) for r in run_ids for s in ("validate", "reserve", "charge")
    )
    assert {e["key"] for e in executions} == {
        f"flow:{r}:{s}" for r in run_ids for s in ("validate", "reserve", "charge")
    }


@pytest.mark.parametrize("env", [EAGER, STRICT], ids=["eager", "strict"])
def test_runs_finish_through_commits_that_fail_and_abort(
    cluster: Cluster, env: dict[str, str]
) -> None:
    # Every seventh commit fails without fencing the producer. The abort throws away the
    # decisions of both transactions, outcomes of steps included: the commands are read again,
    # and the runs whose outcomes were lost are driven again, so their steps run again (same
    # attempt, same key) instead of waiting for another owner of the partition.
    worker = cluster.start("w0", env, app="tests.processor.abort_app:runtime")
    load = Load(cluster.client, SPEC, "abort", rate=20, options={"step_sleep_ms": 5})
    cluster.client.wait("abort-0000", timeout=90)
    time.sleep(4)
    run_ids = load.stop()
    results = cluster.client.wait_all(run_ids, timeout=120)
    output = worker.output()
    assert {r.status.value for r in results.values()} == {"completed"}, output[-4000:]
    aborts = output.count(ABORT_REASON)
    assert aborts >= 3, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    records = raw_events(cluster.bootstrap, cluster.prefix, cluster.client.partitions)
    assert_no_duplicate_sequences(records)
    # Every committed outcome is the only one of its step, and no step ran again after its
    # outcome was committed.
    completed: dict[tuple[str, str], float] = {}
    for event, _ in committed_events(cluster.bootstrap, cluster.prefix, cluster.client.partitions):
        if event.event.type == "step_completed":
            key = (event.run_id, event.event.step_id)
            assert key not in completed, key
            completed[key] = event.timestamp.timestamp()
    executions = [e for e in step_log(cluster.step_log) if e["run"] in set(run_ids)]
    for entry in executions:
        done = completed[(str(entry["run"]), str(entry["step"]))]
        assert float(str(entry["started"])) <= done, entry
        assert entry["attempt"] == 1 and entry["key"] == f"flow:{entry['run']}:{entry['step']}"
    # Some steps did run again: their outcome (or, eager, their start) was thrown away.
    runs_of: dict[tuple[object, object], int] = {}
    for entry in executions:
        step = (entry["run"], entry["step"])
        runs_of[step] = runs_of.get(step, 0) + 1
    assert max(runs_of.values()) >= 2, f"{aborts} aborts re-ran no step"

"""Workflow-task failures on Kafka (issue 16): workflow code that raises on a step outcome gets a
``workflow_task_failed`` record in the run's history (not a dead letter), is retried by the
timer path, shows in ``status``, and completes once the code stops raising; the step never runs
again."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from flowstream.model.events import WorkflowTaskFailed
from flowstream.model.snapshot import RunStatus
from tests.processor.defect_apps import MISSING_KEY, ONE_STEP, POISON_FLAG_ENV, POISON_RUN
from tests.processor.harness import Cluster, assert_contiguous, step_runs, wait_until

pytestmark = [pytest.mark.kafka]

APP = "tests.processor.defect_apps:poisoned"


def _failures(cluster: Cluster, run_id: str) -> list[WorkflowTaskFailed]:
    history = cluster.client.history(run_id)
    return [e.event for e in history if isinstance(e.event, WorkflowTaskFailed)]


def test_a_raising_workflow_is_recorded_retried_by_the_timer_and_completes_once_fixed(
    cluster: Cluster, tmp_path: Path
) -> None:
    flag = tmp_path / "bug-is-in"
    flag.touch()
    env = {POISON_FLAG_ENV: str(flag), "FLOWSTREAM_TASK_RETRY_INITIAL_MS": "300"}
    worker = cluster.start("w1", extra_env=env, app=APP)
    cluster.client.start(POISON_RUN, ONE_STEP, {})
    cluster.client.flush()

    def retried() -> bool:
        try:
            return len(_failures(cluster, POISON_RUN)) >= 3
        except Exception:
            return False

    wait_until(retried, 60, f"the failing task was not retried:\n{worker.output()[-3000:]}")
    failures = _failures(cluster, POISON_RUN)
    assert [f.attempt for f in failures[:3]] == [1, 2, 3]
    assert all(f.error_type == "KeyError" and MISSING_KEY in f.message for f in failures)
    assert all(f.retry_at is not None for f in failures[:3])
    snapshot = cluster.client.snapshot(POISON_RUN)
    assert snapshot.status is RunStatus.RUNNING
    assert snapshot.task_failure is not None and snapshot.task_failure.error_type == "KeyError"

    flag.unlink()  # the bug fixed, in the running worker: the next timer retry completes it
    done = cluster.client.wait(POISON_RUN, timeout=60)
    assert done.status is RunStatus.COMPLETED, worker.output()[-3000:]
    assert done.task_failure is None
    history = cluster.client.history(POISON_RUN)
    assert_contiguous(history)
    assert [e.event.type for e in history][-2:] == ["workflow_task_failed", "run_completed"]
    assert step_runs(cluster.step_log)[(POISON_RUN, "a")] == 1
    assert worker.process.poll() is None


def test_a_task_whose_automatic_retries_are_used_up_completes_on_kafka_retry(
    cluster: Cluster, tmp_path: Path
) -> None:
    flag = tmp_path / "bug-is-in"
    flag.touch()
    env = {
        POISON_FLAG_ENV: str(flag),
        "FLOWSTREAM_TASK_RETRY_INITIAL_MS": "200",
        "FLOWSTREAM_TASK_RETRY_MAX_AUTOMATIC": "2",
    }
    worker = cluster.start("w1", extra_env=env, app=APP)
    cluster.client.start(POISON_RUN, ONE_STEP, {})
    cluster.client.flush()

    def exhausted() -> bool:
        try:
            failures = _failures(cluster, POISON_RUN)
        except Exception:
            return False
        return bool(failures) and failures[-1].retry_at is None

    wait_until(exhausted, 60, f"the retries were not used up:\n{worker.output()[-3000:]}")
    time.sleep(1)  # nothing retries it by itself any more
    assert [f.attempt for f in _failures(cluster, POISON_RUN)] == [1, 2]

    flag.unlink()
    cluster.client.retry(POISON_RUN)  # the operator's retry, once the bug is fixed
    cluster.client.flush()
    done = cluster.client.wait(POISON_RUN, timeout=60)
    assert done.status is RunStatus.COMPLETED, worker.output()[-3000:]
    assert step_runs(cluster.step_log)[(POISON_RUN, "a")] == 1

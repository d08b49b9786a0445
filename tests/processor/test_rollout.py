"""Rolling deployment with build pinning, against the real broker: build 1 → builds 1+2 → build
2. Runs pinned to build 1 finish while it is served; a processor that cannot serve a run's build
appends nothing for it and parks its commands durably until an owner that serves it arrives."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from flowstream.cli import main
from flowstream.client import FlowClient
from flowstream.settings import Settings
from tests.processor.apps import SPEC_V1, SPEC_V2
from tests.processor.harness import (
    Worker,
    apply_topics,
    assert_no_duplicate_sequences,
    raw_events,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

V1 = "build-1=tests.processor.apps:runtime_v1"
V2 = "build-2=tests.processor.apps:runtime_v2"


def test_roll_from_build_1_to_build_2(
    kafka_bootstrap: str,
    unique_prefix: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    apply_topics(kafka_bootstrap, unique_prefix)
    client = FlowClient(
        Settings(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix, group=f"{unique_prefix}-c"),
        wait=False,
    )
    workers: list[Worker] = []

    def worker(name: str, *builds: str) -> Worker:
        started = Worker(
            name,
            bootstrap=kafka_bootstrap,
            prefix=unique_prefix,
            group=f"{unique_prefix}-group",
            state_dir=tmp_path / "state",
            step_log=tmp_path / "steps.jsonl",
            app=None,
            builds=builds,
        )
        workers.append(started)
        return started

    try:
        old = worker("only-v1", V1)
        v1_done = [f"v1-done-{i}" for i in range(6)]
        v1_waiting = [f"v1-wait-{i}" for i in range(6)]
        for run_id in v1_done:
            client.start(run_id, SPEC_V1, {})
        for run_id in v1_waiting:
            client.start(run_id, SPEC_V1, {"signal": True})
        client.flush()
        assert {s.status.value for s in client.wait_all(v1_done, timeout=120).values()} == {
            "completed"
        }

        both = worker("v1-and-v2", V1, V2)
        time.sleep(1)
        assert old.stop() == 0
        v2_runs = [f"v2-{i}" for i in range(6)]
        for run_id in v2_runs:
            client.start(run_id, SPEC_V2, {})
        for run_id in v1_waiting[:3]:  # build 1 is still served: these finish now
            client.signal(run_id, "go", {"while": "both builds"}, id=f"{run_id}-go")
        client.flush()
        finished = client.wait_all([*v2_runs, *v1_waiting[:3]], timeout=180)
        assert {s.status.value for s in finished.values()} == {"completed"}

        new = worker("only-v2", V2)
        time.sleep(1)
        assert both.stop() == 0
        for run_id in v1_waiting[3:]:  # nobody serves build 1 now: parked, not lost
            client.signal(run_id, "go", {"while": "build 2 only"}, id=f"{run_id}-go")
        late_v2 = [f"v2-late-{i}" for i in range(4)]
        for run_id in late_v2:
            client.start(run_id, SPEC_V2, {})
        client.flush()
        assert {s.status.value for s in client.wait_all(late_v2, timeout=180).values()} == {
            "completed"
        }
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all(client.parked(r) for r in v1_waiting[3:]):
                break
            time.sleep(0.5)
        for run_id in v1_waiting[3:]:
            reasons = client.parked(run_id)
            assert reasons and "build-1" in reasons[0], (run_id, reasons)
            assert client.snapshot(run_id).status.value == "suspended"
        shown = ["kafka", "status", v1_waiting[3], "--bootstrap", kafka_bootstrap]
        assert main([*shown, "--prefix", unique_prefix]) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["status"] == "suspended"
        assert "build-1" in status["waiting_commands"][0]

        # An owner that serves build 1 takes the partitions: the parked signals apply.
        assert new.stop() == 0
        worker("v1-again", V1, V2)
        resumed = client.wait_all(v1_waiting[3:], timeout=180)
        assert {s.status.value for s in resumed.values()} == {"completed"}
        assert all(r.output["go"] == {"while": "build 2 only"} for r in resumed.values())  # type: ignore[index]

        records = raw_events(kafka_bootstrap, unique_prefix, client.partitions)
        assert_no_duplicate_sequences(records)
        v1_runs = set(v1_done) | set(v1_waiting)
        writers_of_v1 = {writer for run, _, _, writer in records if run in v1_runs}
        assert "only-v2" not in writers_of_v1
        assert writers_of_v1 <= {"only-v1", "v1-and-v2", "v1-again"}
        writers_of_v2 = {
            writer for run, _, _, writer in records if run in set(v2_runs) | set(late_v2)
        }
        assert "only-v1" not in writers_of_v2
    finally:
        client.close()
        for started in workers:
            started.stop()

"""The embedded CLI's operator commands: ``status`` says in one line why a run is not moving,
``drive`` moves a stalled run on, ``tick`` repairs stalled runs beside the due deadlines."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from flowstream.cli import main
from flowstream.engine import FlowEngine
from flowstream.model.events import SignalReceived
from flowstream.stores.rocksdb import RocksDBEventStore
from tests.cli.stall_app import SPEC, runtime

APP = "tests.cli.stall_app:runtime"


def stalled_run(data: Path, run_id: str = "r1") -> None:
    """A run whose signal was committed by a process that stopped before the next decision."""
    with RocksDBEventStore(data) as store:
        asyncio.run(FlowEngine(store, runtime).start(run_id, SPEC))
        event = SignalReceived(signal_id="s1", name="go", payload="shipped")
        store.append_if_sequence(run_id, store.state(run_id).last_sequence, [event])
        asyncio.run(store.wait_durable())


def cli(capsys: pytest.CaptureFixture[str], data: Path, *args: str) -> list[str]:
    assert main([*args, "--data", str(data), "--app", APP]) == 0
    return capsys.readouterr().out.splitlines()


def test_status_leads_with_the_reason_a_run_is_not_moving(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stalled_run(tmp_path)
    lines = cli(capsys, tmp_path, "status", "r1")
    assert lines[0] == (
        "r1: stalled: a received signal is not yet paired with its wait; run `flowstream drive r1`"
    )
    assert orjson.loads("\n".join(lines[1:]))["run_id"] == "r1"
    only_json = cli(capsys, tmp_path, "status", "r1", "--json")
    assert orjson.loads("\n".join(only_json))["status"] == "suspended"


def test_drive_moves_a_stalled_run_on_and_says_where_it_stands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stalled_run(tmp_path)
    assert cli(capsys, tmp_path, "drive", "r1") == ["r1: completed"]
    assert cli(capsys, tmp_path, "status", "r1")[0] == "r1: completed"


def test_a_waiting_run_says_what_it_waits_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with RocksDBEventStore(tmp_path) as store:
        asyncio.run(FlowEngine(store, runtime).start("r1", SPEC))
    assert cli(capsys, tmp_path, "drive", "r1") == ["r1: waiting for signal 'go' (wait w1)"]


def test_tick_repairs_the_stalled_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stalled_run(tmp_path, "a")
    stalled_run(tmp_path, "b")
    assert cli(capsys, tmp_path, "tick") == ["resumed 0 run(s), repaired 2 stalled run(s)"]
    assert cli(capsys, tmp_path, "status", "b")[0] == "b: completed"


def test_audit_reports_the_runs_that_violate_the_liveness_invariant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stalled_run(tmp_path, "stuck")
    with RocksDBEventStore(tmp_path) as store:
        asyncio.run(FlowEngine(store, runtime).start("waiting", SPEC))
    assert main(["audit", "--data", str(tmp_path), "--app", APP]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "stuck: STALLED" in out
    assert any(line.startswith("waiting: ok") for line in out)
    assert out[-1] == (
        "audited 2 run(s): 1 ok, 1 with problems (1 stalled: nothing will move them)"
    )

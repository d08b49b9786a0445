"""The embedded CLI writes nothing it cannot follow through (issue 16, item 3): its ``--app``
defaults to the example runtime, which declares the one workflow it serves, so ``cancel``,
``signal`` and ``hook`` on a run of another workflow fail before appending anything, and a start
of the example with an input it cannot read is refused."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from flowstream.cli import main
from flowstream.engine import FlowEngine
from flowstream.model.spec import WorkflowSpec
from flowstream.stores.rocksdb import RocksDBEventStore
from tests.processor.apps import SPEC as OTHER
from tests.processor.apps import runtime as other_runtime

pytestmark = pytest.mark.timeout(60)


def history(data: Path, run_id: str) -> list[str]:
    store = RocksDBEventStore(data)
    try:
        return [envelope.event.type for envelope in store.read(run_id)]
    finally:
        store.close()


def start(data: Path, run_id: str, spec: WorkflowSpec, input: object) -> None:
    store = RocksDBEventStore(data)
    try:
        asyncio.run(FlowEngine(store, other_runtime).start(run_id, spec, input))  # type: ignore[arg-type]
    finally:
        store.close()


def test_commands_on_a_run_of_another_workflow_append_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    start(data, "other-1", OTHER, {"hook_digest": "d" * 64})
    before = history(data, "other-1")
    assert before[-1] == "hook_created"
    capsys.readouterr()
    for argv in (
        ["cancel", "other-1"],
        ["signal", "other-1", "go", "--id", "g1"],
        ["hook", "--run", "other-1", "--hook", "approval"],
    ):
        assert main([*argv, "--data", str(data)]) == 1, argv
        err = capsys.readouterr().err
        assert "workflow three-steps" in err and "serves order" in err, err
        assert err.count("\n") == 1, err
    assert history(data, "other-1") == before
    # With the runtime that serves it, the same command goes through.
    served = ["--data", str(data), "--app", "tests.processor.apps:runtime"]
    assert main(["signal", "other-1", "go", "--id", "g1", *served]) == 0
    assert history(data, "other-1")[len(before)] == "signal_received"


def test_audit_skips_the_runs_of_workflows_its_runtime_does_not_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Replaying another workflow's history with the example's code would report decisions
    that differ; the audit says which code it lacked instead."""
    data = tmp_path / "data"
    start(data, "other-1", OTHER, {})
    capsys.readouterr()
    assert main(["audit", "--data", str(data)]) == 0
    out = capsys.readouterr().out
    assert "other-1: skipped (no runtime given serves workflow three-steps" in out, out
    assert main(["audit", "--data", str(data), "--app", "tests.processor.apps:runtime"]) == 0
    assert "other-1: ok" in capsys.readouterr().out

"""The embedded CLI an operator expects: ``--version``, ``start``, ``list [--status]
[--workflow] [--json]``, ``describe RUN``, ``--json`` on the read and write commands, and JSON
options from ``@FILE`` or standard input (a payload larger than a command line can hold)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import orjson
import pytest

from flowstream.cli import main

APP = "tests.cli.stall_app:runtime"
SPEC = "tests.cli.stall_app:SPEC"


def run(capsys: pytest.CaptureFixture[str], data: Path, *args: str, code: int = 0) -> str:
    assert main([*args, "--data", str(data), "--app", APP]) == code
    captured = capsys.readouterr()
    return captured.out if code == 0 else captured.err


def test_version_names_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("flowstream 0.1.0 (python 3.")


def test_start_list_and_describe_on_the_embedded_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run(capsys, tmp_path, "start", "r1", "--workflow", SPEC)
    assert out.startswith("r1: ") and "go" in out, out
    # Starting again with the same input is a no-op; with another input it is refused.
    run(capsys, tmp_path, "start", "r1", "--workflow", SPEC)
    err = run(capsys, tmp_path, "start", "r1", "--workflow", SPEC, "--input", "1", code=1)
    assert err == "error: run r1: workflow input differs\n"
    payload = tmp_path / "payload.json"
    payload.write_bytes(orjson.dumps({"carrier": "DHL"}))
    run(capsys, tmp_path, "start", "r2", "--workflow", SPEC, "--input", f"@{payload}")
    run(capsys, tmp_path, "signal", "r2", "go", "--id", "s1", "--payload", f"@{payload}")

    page = orjson.loads(run(capsys, tmp_path, "list", "--json"))
    rows = page["rows"]  # the most recently updated first
    assert [(r["run_id"], r["status"], r["workflow"]) for r in rows] == [
        ("r2", "completed", "stall"),
        ("r1", "suspended", "stall"),
    ]
    assert page["next_cursor"] is None
    assert rows[0]["waiting_for"] is None and rows[1]["waiting_for"] == "signal go"
    first = orjson.loads(run(capsys, tmp_path, "list", "--json", "--limit", "1"))
    assert [r["run_id"] for r in first["rows"]] == ["r2"] and first["next_cursor"]
    more = run(capsys, tmp_path, "list", "--limit", "1", "--cursor", first["next_cursor"])
    assert more.startswith("r1 ") and len(more.splitlines()) == 1
    suspended = run(capsys, tmp_path, "list", "--status", "suspended").splitlines()
    assert len(suspended) == 1 and suspended[0].startswith("r1 ")
    assert run(capsys, tmp_path, "list", "--workflow", "other") == ""
    assert len(run(capsys, tmp_path, "list", "--workflow", "stall").splitlines()) == 2

    lines = run(capsys, tmp_path, "describe", "r1").splitlines()
    described = orjson.loads(run(capsys, tmp_path, "describe", "r1", "--json"))
    assert lines[0] == f"r1: {described['condition']}"
    assert "signal 'go'" in described["condition"]
    assert lines[2:] == ["  signal w1"]
    assert described["pending"] == [{"kind": "signal", "id": "w1"}]
    assert described["waiting_for"] == "signal go" and described["status"] == "suspended"
    assert run(capsys, tmp_path, "describe", "r2").splitlines()[-1] == "  no pending work"
    err = run(capsys, tmp_path, "describe", "nope", code=1)
    assert err == "error: run nope does not exist\n"


def test_a_payload_over_128_kb_goes_in_on_standard_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run(capsys, tmp_path, "start", "r1", "--workflow", SPEC)
    big = {"items": ["x" * 1000] * 200}  # about 200 KB, over what one argument may hold
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(orjson.dumps(big))))
    signal = run(capsys, tmp_path, "signal", "r1", "go", "--id", "s1", "--payload", "-", "--json")
    assert orjson.loads(signal)["status"] == "completed"
    assert orjson.loads(run(capsys, tmp_path, "status", "r1", "--json"))["output"] == big


def test_json_on_tick_history_and_audit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, tmp_path, "start", "r1", "--workflow", SPEC)
    tick = orjson.loads(run(capsys, tmp_path, "tick", "--json"))
    assert tick == {"resumed": [], "repaired": [], "failed": {}}
    history = orjson.loads(run(capsys, tmp_path, "history", "r1", "--json"))
    assert [e["event"]["type"] for e in history][:2] == ["run_created", "run_started"]
    audit = orjson.loads(run(capsys, tmp_path, "audit", "--json"))
    assert audit["runs"][0]["run_id"] == "r1" and audit["runs"][0]["verdict"] == "OK"
    assert audit["unreadable_records"] == []


def test_a_json_option_that_is_not_json_is_bad_usage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = run(capsys, tmp_path, "start", "r1", "--workflow", SPEC, "--input", "{oops", code=2)
    assert err.startswith("error: --input is not JSON: ")
    err = run(capsys, tmp_path, "start", "r1", "--workflow", SPEC, "--input", "@nofile", code=2)
    assert err == "error: --input: cannot read nofile: No such file or directory\n"
    assert not tmp_path.joinpath("CURRENT").exists()


def test_history_of_several_runs_names_each_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for run_id in ("r1", "r2"):
        run(capsys, tmp_path, "start", run_id, "--workflow", SPEC)
    lines = run(capsys, tmp_path, "history").splitlines()
    assert [line for line in lines if not line.startswith(" ")] == ["r1:", "r2:"]
    assert "r1:" not in run(capsys, tmp_path, "history", "r1")


def test_describe_says_a_run_whose_workflow_code_raises_is_failing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run(capsys, tmp_path, "start", "r1", "--workflow", SPEC)
    argv = ["signal", "r1", "go", "--id", "s1", "--data", str(tmp_path)]
    assert main([*argv, "--app", "tests.cli.raising_app:runtime"]) == 0
    assert capsys.readouterr().out == "r1: running\n"
    assert main(["describe", "r1", "--data", str(tmp_path), "--app", APP]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("r1: ") and "bug in my workflow code" in first, first

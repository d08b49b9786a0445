"""``flowstream list`` and ``describe`` read the embedded store's run index: filters and pages,
beside the app that has the store open, and one ``error:`` line for a bad option."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from flowstream.cli import main
from flowstream.engine import FlowEngine
from flowstream.stores.rocksdb import RocksDBEventStore
from tests.index.test_embedded_index import ORDER, REFUND, RUNTIME
from tests.support import run

APP = "tests.index.test_embedded_index:RUNTIME"


@pytest.fixture
def data(tmp_path: Path) -> Path:
    with RocksDBEventStore(tmp_path / "db") as store:
        engine = FlowEngine(store, RUNTIME)
        for n in range(12):
            run(engine.start(f"r{n:02d}", ORDER if n % 2 else REFUND, {"wait": "signal"}))
        for n in range(0, 12, 3):
            run(engine.signal(f"r{n:02d}", "approve", id=f"s{n}"))
    return tmp_path / "db"


def cli(capsys: pytest.CaptureFixture[str], data: Path, *args: str, code: int = 0) -> str:
    assert main([*args, "--data", str(data), "--app", APP]) == code
    captured = capsys.readouterr()
    return captured.out if code == 0 else captured.err


def test_list_pages_through_the_filtered_runs_beside_the_running_app(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with RocksDBEventStore(data):  # the app holds the store
        seen: list[str] = []
        cursor: list[str] = []
        while True:
            page = orjson.loads(
                cli(
                    capsys, data, "list", "--status", "suspended", "--limit", "3", "--json", *cursor
                )
            )
            assert {row["status"] for row in page["rows"]} <= {"suspended"}
            seen += [row["run_id"] for row in page["rows"]]
            if page["next_cursor"] is None:
                break
            cursor = ["--cursor", page["next_cursor"]]
        assert sorted(seen) == [f"r{n:02d}" for n in range(12) if n % 3]
        lines = cli(
            capsys, data, "list", "--workflow", "refund", "--status", "completed"
        ).splitlines()
        assert sorted(line.split()[0] for line in lines) == ["r00", "r06"]
        described = orjson.loads(cli(capsys, data, "describe", "r01", "--json"))
        assert described["waiting_for"] == "signal approve"
        assert described["pending"] == [{"kind": "signal", "id": "approval"}]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--limit", "0"], 2, "error: --limit must be from 1 to 1000\n"),
        (["--limit", "1001"], 2, "error: --limit must be from 1 to 1000\n"),
        (
            ["--updated-after", "yesterday"],
            2,
            "error: --updated-after 'yesterday' is not an ISO 8601 time\n",
        ),
        (["--cursor", "x"], 1, "error: invalid cursor 'x': pass a page's next_cursor unchanged\n"),
    ],
)
def test_a_bad_list_option_is_one_error_line(
    data: Path, capsys: pytest.CaptureFixture[str], args: list[str], code: int, message: str
) -> None:
    assert cli(capsys, data, "list", *args, code=code) == message

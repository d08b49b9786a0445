"""Every error path of the CLI ends in one ``error:`` line and an exit code, never a traceback
(``--debug`` shows it); read commands never create a store; a corrupt store is named corrupt.

Each case runs ``python -m flowstream`` in a subprocess, as a user would."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from flowstream.engine import FlowEngine
from flowstream.stores.rocksdb import RocksDBEventStore
from tests.cli.stall_app import SPEC, runtime

APP = "tests.cli.stall_app:runtime"


def flowstream(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("FLOWSTREAM_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "flowstream", *args],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
        cwd=cwd or root,
    )


def one_error(done: subprocess.CompletedProcess[str], code: int, wanted: str) -> None:
    """One ``error:`` line on stderr holding ``wanted``, exit ``code``, no traceback."""
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines() == [done.stderr.strip()], done.stderr
    assert done.stderr.startswith("error: "), done.stderr
    assert wanted in done.stderr, done.stderr
    assert done.returncode == code, (done.returncode, done.stderr)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A store holding one run (r1), closed."""
    data = tmp_path / "data"
    with RocksDBEventStore(data) as opened:
        asyncio.run(FlowEngine(opened, runtime).start("r1", SPEC))
    return data


def test_an_app_module_not_on_the_path_is_one_line(store: Path, tmp_path: Path) -> None:
    done = flowstream("status", "r1", "--data", str(store), "--app", "mywf:runtime")
    one_error(
        done, 2, "--app mywf:runtime: no module named 'mywf' (is its directory on PYTHONPATH?"
    )


def test_a_missing_attribute_is_one_line(store: Path) -> None:
    done = flowstream("status", "r1", "--data", str(store), "--app", "tests.cli.stall_app:nosuch")
    one_error(done, 2, "module tests.cli.stall_app has no attribute 'nosuch'")


def test_a_bad_log_level_is_one_line() -> None:
    done = flowstream("worker", "--app", APP, "--bootstrap", "127.0.0.1:1", "--log-level", "loud")
    one_error(done, 2, "--log-level 'loud' is not one of DEBUG, INFO, WARNING, ERROR, CRITICAL")


def test_a_metrics_port_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = flowstream(
            "worker", "--app", APP, "--bootstrap", "127.0.0.1:1", "--metrics-port", port
        )
    one_error(done, 2, f"cannot serve metrics on 127.0.0.1:{port}: Address already in use")


def test_data_naming_a_file_is_one_line(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a store")
    for command in (["status", "r1"], ["signal", "r1", "go", "--id", "s"], ["demo"]):
        done = flowstream(*command, "--data", str(afile), "--app", APP)
        one_error(done, 1, f"{afile} is a file, not a store directory")
    assert afile.read_text() == "not a store"


def test_read_and_write_commands_never_create_a_store(tmp_path: Path) -> None:
    missing = tmp_path / "mistyped"
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "notes.txt").write_text("hello")
    for data in (missing, garbage):
        for command in (
            ["status", "r1"],
            ["history"],
            ["list"],
            ["describe", "r1"],
            ["signal", "r1", "go", "--id", "s1"],
            ["tick"],
            ["audit"],
        ):
            app = [] if command == ["audit"] else ["--app", APP]
            done = flowstream(*command, "--data", str(data), *app)
            one_error(done, 1, f"no store at {data} (check --data")
    assert not missing.exists()
    assert sorted(p.name for p in garbage.iterdir()) == ["notes.txt"]


def _damage(path: Path, offset: int | None = None) -> None:
    raw = bytearray(path.read_bytes())
    at = len(raw) // 2 if offset is None else offset
    raw[at : at + 32] = bytes(range(32))
    path.write_bytes(bytes(raw))


def test_a_garbage_current_file_is_reported_corrupt_naming_it(store: Path) -> None:
    (store / "CURRENT").write_bytes(b"\x00garbage")
    one_error(
        flowstream("status", "r1", "--data", str(store), "--app", APP),
        1,
        f"the store at {store} is corrupt: CURRENT file does not end with newline",
    )


def test_a_corrupt_manifest_is_reported_corrupt_naming_it(store: Path) -> None:
    manifest = next(store.glob("MANIFEST-*"))
    _damage(manifest, 20)
    done = flowstream("history", "--data", str(store), "--app", APP)
    one_error(done, 1, f"the store at {store} is corrupt: ")
    assert manifest.name in done.stderr


def test_a_corrupt_sst_is_reported_corrupt_not_locked(store: Path, tmp_path: Path) -> None:
    # Flush the run from the write-ahead log into an SST.
    with RocksDBEventStore(store) as opened:
        opened._db.flush()
    ssts = list(store.glob("*.sst"))
    assert ssts
    for sst in ssts:
        # In the first data block, which holds the run's events: the middle of the file may be
        # its properties block, which RocksDB reports when it opens the store as "properties
        # unsorted", naming the MANIFEST (it did so in one CI run).
        _damage(sst, 16)
    done = flowstream("status", "r1", "--data", str(store), "--app", APP)
    one_error(done, 1, f"the store at {store} is corrupt: block checksum mismatch")
    assert "another process" not in done.stderr
    assert any(sst.name in done.stderr for sst in ssts)


def test_a_locked_store_is_reported_locked_by_every_command(store: Path) -> None:
    with RocksDBEventStore(store):
        for command in (["signal", "r1", "go", "--id", "s1"], ["drive", "r1"]):
            done = flowstream(*command, "--data", str(store), "--app", APP)
            one_error(done, 1, f"the store at {store} is open in another process")


def test_read_commands_work_beside_a_running_app(store: Path) -> None:
    with RocksDBEventStore(store):
        for command in (["status", "r1", "--json"], ["history"], ["list"], ["describe", "r1"]):
            done = flowstream(*command, "--data", str(store), "--app", APP)
            assert done.returncode == 0, done.stderr
            assert ("flow.run.created" if command == ["history"] else "r1") in done.stdout
        done = flowstream("audit", "--data", str(store), "--app", APP)
        assert "audited 1 run(s)" in done.stdout, done.stdout + done.stderr


def test_audit_with_no_broker_is_one_line() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    done = flowstream("audit", "--bootstrap", f"127.0.0.1:{port}", "--timeout", "2")
    one_error(done, 1, f"no Kafka broker answered at 127.0.0.1:{port} within 2 s")


def test_debug_shows_the_traceback(store: Path) -> None:
    for debug in (["--debug", "status"], ["status", "--debug"]):
        done = flowstream(*debug, "r1", "--data", str(store), "--app", "mywf")
        assert done.returncode == 1
        assert "Traceback" in done.stderr and "UsageError" in done.stderr
    from flowstream.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["kafka", "status", "r", "--debug"]).debug is True
    assert parser.parse_args(["kafka", "status", "r"]).debug is False


def test_copying_a_store_keeps_it_readable(store: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(store, copy)
    assert flowstream("status", "r1", "--data", str(copy), "--app", APP).returncode == 0

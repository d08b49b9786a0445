"""A normal install works: the wheel built from this tree, installed into a fresh virtual
environment, carries the topology, applies the topics and drives an order run on the broker
with nothing from the source tree (no checkout on the path, no FLOWSTREAM_TOPOLOGY)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
import zipfile
from pathlib import Path

import orjson
import pytest

from flowstream.replay.decide import token_digest

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]


def _run(*command: str | Path, cwd: Path, env: dict[str, str], stdin: str | None = None) -> str:
    done = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"{command}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done.stdout


def test_the_wheel_installs_and_runs_kafka_commands(kafka_bootstrap: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLOWSTREAM_", "PYTHON"))}
    dist = tmp_path / "dist"
    _run(
        sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dist, ROOT, cwd=ROOT, env=env
    )
    (wheel,) = dist.glob("flowstream-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert "flowstream/topics.toml" in archive.namelist()
        # the web console the gateway serves, as package data
        assert {"index.html", "app.js", "console.css"} <= {
            name.rsplit("/", 1)[-1]
            for name in archive.namelist()
            if name.startswith("flowstream/gateway/console/")
        }
        shipped = archive.read("flowstream/topics.toml")
    assert shipped == (ROOT / "topology" / "topics.toml").read_bytes()

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path, env=env)
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run(*pip, wheel, cwd=tmp_path, env=env)
    flowstream = venv / "bin" / "flowstream"
    where = _run(
        venv / "bin" / "python",
        "-c",
        "import flowstream; print(flowstream.__file__)",
        cwd=tmp_path,
        env=env,
    )
    assert where.startswith(str(venv)), where

    prefix = f"t-wheel-{uuid.uuid4().hex[:8]}"
    connect = ["--bootstrap", kafka_bootstrap, "--prefix", prefix]
    _run(
        flowstream, "topics", "apply", *connect, "--replication-factor", "1", cwd=tmp_path, env=env
    )
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        [
            flowstream,
            "worker",
            *connect,
            "--group",
            f"{prefix}-group",
            "--state-dir",
            tmp_path / "state",
            "--app",
            "flowstream.examples.order",
        ],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        run_id = f"wheel-{uuid.uuid4().hex[:8]}"
        token = f"approval-{uuid.uuid4().hex}"
        order = {
            "order_id": run_id,
            "sku": "sku-1",
            "quantity": 1,
            "amount_cents": 100,
            "approval_token_digest": token_digest(token),
        }
        kafka = [flowstream, "kafka"]
        started = _run(
            *kafka,
            "start",
            run_id,
            *connect,
            "--workflow",
            "flowstream.examples.order",
            "--input",
            "-",
            "--timeout",
            "120",
            cwd=tmp_path,
            env=env,
            stdin=orjson.dumps(order).decode(),
        )
        assert started.endswith(": applied\n"), started
        _until_status(kafka, run_id, connect, tmp_path, env, "approval")
        _run(
            *kafka,
            "hook",
            *connect,
            "--token-stdin",
            "--payload",
            '{"manager": "dana"}',
            cwd=tmp_path,
            env=env,
            stdin=f"{token}\n",
        )
        shipped = tmp_path / "shipped.json"
        shipped.write_text('{"parcel": "p-1"}')
        signal = ["signal", run_id, "shipped", "--id", "ship-1", "--payload", f"@{shipped}"]
        _run(
            *kafka,
            *signal,
            *connect,
            "--timeout",
            "120",
            cwd=tmp_path,
            env=env,
        )
        output = _run(*kafka, "wait", run_id, *connect, "--timeout", "120", cwd=tmp_path, env=env)
        assert orjson.loads(output)["shipment"] == {"parcel": "p-1"}
    finally:
        worker.terminate()
        code = worker.wait(30)
        log.close()
    assert code == 0, (tmp_path / "worker.log").read_text()[-3000:]


def _until_status(
    kafka: list[Path | str],
    run_id: str,
    connect: list[str],
    cwd: Path,
    env: dict[str, str],
    hook: str,
) -> None:
    """Until the run's hook is active (the order has reserved stock and charged)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        done = subprocess.run(
            [str(p) for p in [*kafka, "status", run_id, *connect]],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode == 0:
            hooks = orjson.loads(done.stdout)["hooks"]
            if hooks.get(hook, {}).get("status") == "active":
                return
        time.sleep(0.5)
    raise AssertionError(f"hook {hook} of {run_id} never became active")

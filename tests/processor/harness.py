"""Real ``flowstream worker`` processes and topics for the processor tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson

from flowstream.kafka import topics
from flowstream.model.events import EventEnvelope
from flowstream.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]


def apply_topics(bootstrap: str, prefix: str, replication_factor: int = 1) -> None:
    topics.apply(bootstrap, load_topology(), prefix=prefix, replication_factor=replication_factor)


class Worker:
    """One processor process; stdout/stderr go to ``<state>/<name>.log``."""

    def __init__(
        self,
        name: str,
        *,
        bootstrap: str,
        prefix: str,
        group: str,
        state_dir: Path,
        step_log: Path,
        app: str | None = "tests.processor.apps:runtime",
        builds: tuple[str, ...] = (),
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.log_path = state_dir / f"{name}.log"
        state_dir.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "flowstream",
            "worker",
            "--bootstrap",
            bootstrap,
            "--prefix",
            prefix,
            "--group",
            group,
            "--state-dir",
            str(state_dir / name),
            "--instance-id",
            name,
        ]
        if app:
            command += ["--app", app]
        for build in builds:
            command += ["--build", build]
        env = dict(os.environ)
        env["FLOWSTREAM_TEST_STEP_LOG"] = str(step_log)
        env["FLOWSTREAM_SESSION_TIMEOUT_MS"] = "6000"
        env["FLOWSTREAM_TRANSACTION_TIMEOUT_MS"] = "6000"
        env.update(extra_env or {})
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal(self, signum: int) -> None:
        os.kill(self.process.pid, signum)

    def stop(self, timeout: float = 20) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._log.close()
        return self.process.returncode

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)
        self._log.close()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


def step_runs(step_log: Path) -> Counter[tuple[str, str]]:
    """How many times each (run, step) really executed."""
    counts: Counter[tuple[str, str]] = Counter()
    if step_log.exists():
        for line in step_log.read_bytes().splitlines():
            entry = orjson.loads(line)
            counts[(entry["run"], entry["step"])] += 1
    return counts


def assert_contiguous(history: list[EventEnvelope]) -> None:
    sequences = [e.sequence for e in history]
    assert sequences == list(range(1, len(history) + 1)), sequences


def wait_until(predicate: object, timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(message)

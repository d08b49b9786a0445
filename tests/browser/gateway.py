"""A real ``flowstream gateway`` process for the console tests, and its API called from Python."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson

from tests.processor.harness import free_port

ROOT = Path(__file__).resolve().parents[2]


class GatewayServer:
    """``python -m flowstream <options>`` (``gateway …`` or ``kafka gateway …``) on a free
    loopback port, with a new token; its output goes to ``<log_dir>/gateway.log``."""

    def __init__(self, options: list[str], log_dir: Path) -> None:
        self.token = secrets.token_urlsafe(24)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / "gateway.log"
        self._log = self.log_path.open("ab")
        env = dict(os.environ, FLOWSTREAM_GATEWAY_TOKEN=self.token)
        command = [sys.executable, "-m", "flowstream", *options]
        command += ["--host", "127.0.0.1", "--port", str(self.port)]
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the gateway exited: {self.output()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        raise AssertionError(f"the gateway did not answer in {timeout} s: {self.output()[-3000:]}")

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def call(self, method: str, path: str, body: Any = None, *, bearer: bool = True) -> Any:
        """The JSON answer of one request; an HTTP error raises ``AssertionError``."""
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = orjson.dumps(body)
            headers["Content-Type"] = "application/json"
        if bearer:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(
            f"{self.url}{path}", data=data, headers=headers, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return orjson.loads(answer.read() or b"null")
        except urllib.error.HTTPError as error:
            raise AssertionError(f"{method} {path}: {error.code} {error.read()!r}") from error

    def run(self, run_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self.call("GET", f"/api/runs/{run_id}")
        return found

    def wait_for(self, run_id: str, status: str, timeout: float = 60) -> dict[str, Any]:
        """The run's detail once its status is ``status``."""
        deadline = time.monotonic() + timeout
        seen = None
        while time.monotonic() < deadline:
            try:
                detail = self.run(run_id)
            except AssertionError as error:  # not started yet (Kafka: 404 until it is)
                seen = str(error)
            else:
                seen = detail["run"]["status"]
                if seen == status:
                    return detail
            time.sleep(0.1)
        raise AssertionError(f"run {run_id} is {seen}, not {status}, after {timeout} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._log.close()

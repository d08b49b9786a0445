"""``flowstream gateway``: it does not start without a credential, and when it serves, its output
holds no secret and its access log redacts webhook paths."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx
import pytest

from flowstream.cli import main
from tests.gateway.support import AUTH, TOKEN, new_token

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.gateway.flows:app"


def _one_error(capsys: pytest.CaptureFixture[str], code: int, expected: int, wanted: str) -> None:
    err = capsys.readouterr().err
    assert code == expected, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and wanted in lines[0], err


def test_no_token_no_gateway(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLOWSTREAM_GATEWAY_TOKEN", raising=False)
    data = tmp_path / "data"
    code = main(["gateway", "--data", str(data), "--app", APP])
    _one_error(capsys, code, 2, "needs a bearer token")
    code = main(["gateway", "--data", str(data), "--app", APP, "--no-auth", "--host", "0.0.0.0"])
    _one_error(capsys, code, 2, "loopback")
    code = main(["gateway", "--data", str(data), "--token-file", str(tmp_path / "nope")])
    _one_error(capsys, code, 2, "--token-file: cannot read")
    (tmp_path / "empty").write_text("\n")
    code = main(["gateway", "--data", str(data), "--token-file", str(tmp_path / "empty")])
    _one_error(capsys, code, 2, "token is empty")
    assert not data.exists()  # nothing was opened


def test_the_kafka_verb_is_registered(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["kafka", "gateway", "--help"])
    assert exit.value.code == 0
    assert "--bootstrap" in capsys.readouterr().out


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_served_gateway_logs_no_secret(tmp_path: Path) -> None:
    port = _free_port()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FLOWSTREAM_GATEWAY_TOKEN", None)
    command = [
        sys.executable, "-m", "flowstream", "gateway", "--data", str(tmp_path / "data"),
        "--app", APP, "--port", str(port), "--token-file", str(token_file),
    ]  # fmt: skip
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    hook, digest = new_token()
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, log.read_text()
            try:
                if httpx.get(f"{base}/api/counts", headers=AUTH).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        start = {
            "workflow": "approval",
            "run_id": "cli-1",
            "input": {"subject": "s", "token_digest": digest},
        }
        assert httpx.post(f"{base}/api/runs", json=start, headers=AUTH).status_code == 201
        assert httpx.post(f"{base}/hooks/{hook}", json={"ok": True}).status_code == 200
        assert httpx.get(f"{base}/api/runs").status_code == 401
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(20) == 0, log.read_text()
    output = log.read_text()
    assert '"POST /hooks/<redacted>" 200' in output, output
    assert '"POST /api/runs" 201' in output
    for secret in (hook, digest, TOKEN):
        assert secret not in output

"""Secrets stay out of the logs: the access log redacts webhook paths, uvicorn's is off, and no
line of any logger (nor the server's output) holds a hook token or the bearer token."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import uvicorn
from starlette.testclient import TestClient

from flowstream.engine import FlowEngine
from flowstream.gateway import EmbeddedBackend, GatewaySettings, create_app
from flowstream.gateway.guards import BearerCheck, redact_path
from flowstream.gateway.server import server_config
from flowstream.stores.rocksdb import RocksDBEventStore
from tests.gateway.flows import app as flows
from tests.gateway.support import AUTH, TOKEN, new_token

pytestmark = pytest.mark.timeout(60)


def test_redact_path() -> None:
    assert redact_path("/hooks/abc-DEF_123") == "/hooks/<redacted>"
    assert redact_path("/hooks/") == "/hooks/<redacted>"
    assert redact_path("/x/../hooks/secret/more") == "/x/../hooks/<redacted>"
    assert redact_path("/api/runs/r-1") == "/api/runs/r-1"
    assert redact_path("/hooksmith") == "/hooksmith"


def test_the_bearer_check_compares_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return a == b

    monkeypatch.setattr("flowstream.gateway.guards.hmac.compare_digest", spy)
    check = BearerCheck(GatewaySettings(token=TOKEN).token)
    assert check.admits(f"Bearer {TOKEN}")
    assert not check.admits("Bearer nope")
    assert not check.admits(None)
    assert not check.admits(f"Basic {TOKEN}")  # compared all the same
    assert len(compared) == 4 and all(b == TOKEN.encode() for _, b in compared)


def test_settings_never_show_the_token() -> None:
    settings = GatewaySettings(token=TOKEN)
    assert TOKEN not in repr(settings) and TOKEN not in settings.model_dump_json()
    assert TOKEN not in str(settings)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[FlowEngine]:
    store = RocksDBEventStore(tmp_path / "data")
    try:
        yield FlowEngine(store, flows)
    finally:
        store.close()


def _traffic(request: Any, token: str, digest: str) -> None:
    """A start, a wrong and a right webhook, reads: everything that could log a secret."""
    body = {
        "workflow": "approval",
        "run_id": "log-1",
        "input": {"subject": "s", "token_digest": digest},
    }
    assert request("POST", "/api/runs", json=body, headers=AUTH).status_code == 201
    assert request("POST", f"/hooks/{token}-wrong", json=1).status_code == 404
    assert request("POST", f"/hooks/{token}", json={"ok": True}).status_code == 200
    assert request("POST", f"/hooks/{token}", json={"ok": False}).status_code == 409
    assert request("GET", f"/hooks/{token}").status_code in (404, 405)
    assert request("POST", f"/hooks/{token}", content=b"x" * 5000).status_code == 413
    assert request("GET", "/api/runs/log-1", headers=AUTH).status_code == 200
    assert (
        request("GET", "/api/runs", headers={"Authorization": f"Bearer {token}"}).status_code == 401
    )


#: The test's own HTTP client logs the URLs it calls: the server's lines are the others.
_CLIENT_LOGGERS = ("httpx", "httpcore")


def _no_secrets(records: list[logging.LogRecord], *secrets: str) -> None:
    server = [r for r in records if not r.name.startswith(_CLIENT_LOGGERS)]
    assert any(r.name == "flowstream.gateway.access" for r in server)
    for record in server:
        line = record.getMessage() + str(record.exc_info or "")
        for secret in secrets:
            assert secret not in line, (record.name, line)


def test_the_access_log_redacts_webhook_paths(
    engine: FlowEngine, caplog: pytest.LogCaptureFixture
) -> None:
    token, digest = new_token()
    app = create_app(
        EmbeddedBackend(engine, {"approval": flows.spec("approval")}),
        GatewaySettings(token=TOKEN, max_body_bytes=4096),
    )
    caplog.set_level(logging.DEBUG)
    with TestClient(app) as client:
        _traffic(client.request, token, digest)
    access = [r.getMessage() for r in caplog.records if r.name == "flowstream.gateway.access"]
    assert len(access) == 8, access
    assert sum('"POST /hooks/<redacted>"' in line for line in access) == 4
    assert any('"POST /api/runs" 201' in line for line in access)
    assert any('"POST /hooks/<redacted>" 413' in line for line in access)
    _no_secrets(caplog.records, token, digest, TOKEN)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_under_uvicorn_no_line_holds_a_secret(
    engine: FlowEngine, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    token, digest = new_token()
    settings = GatewaySettings(token=TOKEN, port=_free_port(), max_body_bytes=4096)
    app = create_app(EmbeddedBackend(engine, {"approval": flows.spec("approval")}), settings)
    caplog.set_level(logging.DEBUG)
    server = uvicorn.Server(server_config(app, settings))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.02)
        with httpx.Client(base_url=f"http://127.0.0.1:{settings.port}") as client:
            _traffic(client.request, token, digest)
    finally:
        server.should_exit = True
        thread.join(10)
    assert not any(r.name == "uvicorn.access" for r in caplog.records)
    access = [r.getMessage() for r in caplog.records if r.name == "flowstream.gateway.access"]
    assert sum("/hooks/<redacted>" in line for line in access) == 5, access
    assert any(r.name.startswith("uvicorn") for r in caplog.records)  # its own lines still go
    _no_secrets(caplog.records, token, digest, TOKEN)
    printed = capfd.readouterr()
    for secret in (token, digest, TOKEN):
        assert secret not in printed.out + printed.err

"""What the embedded and the Kafka gateway tests share: the endpoints behind the credential,
the token, and polling a run over HTTP."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

import pytest
from starlette.testclient import TestClient

from flowstream.replay.decide import token_digest

#: The gateway's bearer token in these tests.
TOKEN = "gateway-test-token-" + "x" * 24
AUTH = {"Authorization": f"Bearer {TOKEN}"}

#: Every endpoint that needs the credential: (method, path, JSON body).
GUARDED: list[tuple[str, str, Any]] = [
    ("GET", "/api/runs", None),
    ("GET", "/api/runs?status=suspended", None),
    ("GET", "/api/counts", None),
    ("GET", "/api/runs/any-run", None),
    ("GET", "/api/runs/any-run/history", None),
    ("POST", "/api/runs", {"workflow": "waiter", "run_id": "never-started"}),
    ("POST", "/api/runs/any-run/signals/go", {"payload": 1, "signal_id": "s-1"}),
    ("POST", "/api/runs/any-run/cancel", {}),
    ("POST", "/api/runs/any-run/retry", None),
    ("GET", "/openapi.json", None),
]

#: What a request without the credential, or with a wrong one, carries.
WRONG_CREDENTIALS: list[dict[str, str] | None] = [
    None,
    {"Authorization": "Bearer wrong-token"},
    {"Authorization": f"Bearer {TOKEN}x"},
    {"Authorization": f"Basic {TOKEN}"},
    {"Authorization": TOKEN},
    {"Authorization": "Bearer "},
]


def new_token() -> tuple[str, str]:
    """A hook token and its digest."""
    token = secrets.token_urlsafe(24)
    return token, token_digest(token)


def assert_refused(client: TestClient, method: str, path: str, body: Any) -> None:
    """Every wrong credential gets the same 401, and nothing of the request is done."""
    for headers in WRONG_CREDENTIALS:
        response = client.request(method, path, json=body, headers=headers)
        assert response.status_code == 401, (headers, response.text)
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json()["error"]["kind"] == "Unauthorized"


def until(
    client: TestClient, run_id: str, ready: Callable[[dict[str, Any]], bool], timeout: float = 60
) -> dict[str, Any]:
    """``GET /api/runs/{run_id}`` until ``ready(body)``."""
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        response = client.get(f"/api/runs/{run_id}", headers=AUTH)
        if response.status_code == 200:
            body = response.json()
            if ready(body):
                return body
        else:
            assert response.status_code == 404, response.text
        time.sleep(0.1)
    pytest.fail(f"run {run_id} never got ready; last: {body}")


def status_is(*statuses: str) -> Callable[[dict[str, Any]], bool]:
    return lambda body: body["run"]["status"] in statuses

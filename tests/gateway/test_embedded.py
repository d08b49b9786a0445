"""The gateway over an embedded engine on a RocksDB store on disk, through its ASGI app."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from flowstream.engine import FlowEngine
from flowstream.gateway import EmbeddedBackend, GatewaySettings, create_app
from flowstream.stores.rocksdb import RocksDBEventStore
from tests.gateway.flows import app as flows
from tests.gateway.support import (
    AUTH,
    GUARDED,
    TOKEN,
    assert_refused,
    new_token,
    status_is,
    until,
)

pytestmark = pytest.mark.timeout(60)

WORKFLOWS = {name: d.spec for name, d in flows.workflows.items()}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RocksDBEventStore]:
    store = RocksDBEventStore(tmp_path / "data")
    try:
        yield store
    finally:
        store.close()


def gateway(store: RocksDBEventStore, **settings: Any) -> TestClient:
    settings.setdefault("token", TOKEN)
    backend = EmbeddedBackend(FlowEngine(store, flows), WORKFLOWS)
    return TestClient(create_app(backend, GatewaySettings(**settings)))


@pytest.fixture
def client(store: RocksDBEventStore) -> Iterator[TestClient]:
    with gateway(store) as client:
        yield client


def approval(client: TestClient, run_id: str, digest: str, *, note: bool = False) -> None:
    body = {"subject": run_id, "token_digest": digest, "note": note}
    response = client.post(
        "/api/runs", json={"workflow": "approval", "run_id": run_id, "input": body}, headers=AUTH
    )
    assert response.status_code == 201, response.text
    assert response.json() == {"run_id": run_id, "outcome": "applied"}
    assert response.headers["location"] == f"/api/runs/{run_id}"


# -- the door -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body"), GUARDED, ids=[f"{m} {p}" for m, p, _ in GUARDED]
)
def test_every_endpoint_refuses_no_and_a_wrong_credential(
    client: TestClient, store: RocksDBEventStore, method: str, path: str, body: Any
) -> None:
    assert_refused(client, method, path, body)
    assert store.list_runs() == []  # the refused start started nothing


def test_the_credential_opens_every_endpoint(client: TestClient) -> None:
    for method, path, body in GUARDED:
        response = client.request(method, path, json=body, headers=AUTH)
        assert response.status_code != 401, (method, path, response.text)


def test_no_auth_is_explicit_and_on_loopback_only(store: RocksDBEventStore) -> None:
    with pytest.raises(ValueError, match="needs a bearer token"):
        GatewaySettings()
    with pytest.raises(ValueError, match="loopback"):
        GatewaySettings(no_auth=True, host="0.0.0.0")
    with pytest.raises(ValueError, match="not both"):
        GatewaySettings(no_auth=True, token=TOKEN)
    with gateway(store, token=None, no_auth=True) as open_client:
        assert open_client.get("/api/counts").status_code == 200


# -- commands and reads ---------------------------------------------------------------------


def test_start_list_show_history_and_counts(client: TestClient) -> None:
    _, digest = new_token()
    approval(client, "a-1", digest)
    again = client.post(
        "/api/runs",
        json={
            "workflow": "approval",
            "run_id": "a-1",
            "input": {"subject": "a-1", "token_digest": digest, "note": False},
        },
        headers=AUTH,
    )
    assert again.status_code == 200 and again.json()["outcome"] == "noop"
    started = client.post("/api/runs", json={"workflow": "waiter"}, headers=AUTH)
    assert started.status_code == 201
    waiter = started.json()["run_id"]
    assert waiter.startswith("waiter-")

    listed = client.get("/api/runs", headers=AUTH).json()
    assert [row["run_id"] for row in listed["runs"]] == [waiter, "a-1"]  # newest update first
    assert listed["next_cursor"] is None
    only = client.get("/api/runs?workflow=approval&status=suspended", headers=AUTH).json()
    assert [row["run_id"] for row in only["runs"]] == ["a-1"]
    none = client.get("/api/runs?status=completed", headers=AUTH).json()
    assert none == {"runs": [], "next_cursor": None}
    first = client.get("/api/runs?limit=1", headers=AUTH).json()
    assert len(first["runs"]) == 1 and first["next_cursor"] is not None
    rest = client.get(f"/api/runs?limit=1&cursor={first['next_cursor']}", headers=AUTH).json()
    assert [r["run_id"] for r in first["runs"] + rest["runs"]] == [waiter, "a-1"]

    shown = client.get("/api/runs/a-1", headers=AUTH).json()
    assert shown["run"]["status"] == "suspended"
    assert shown["pending"] == [{"kind": "hook", "id": "decision"}]
    assert shown["snapshot"]["hooks"]["decision"]["status"] == "active"
    assert digest not in str(shown["snapshot"]["hooks"]) + str(shown["pending"])
    events = client.get("/api/runs/a-1/history", headers=AUTH).json()["events"]
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["type"] == "run_created" and events[0]["key"] == "flow.run.created"
    assert "hook_created" in [e["type"] for e in events]
    (created,) = [e for e in events if e["type"] == "hook_created"]
    assert "token_digest" not in created and digest not in str(created)  # left out too

    counts = client.get("/api/counts", headers=AUTH).json()
    assert counts["counts"]["suspended"] == 2 and counts["total"] == 2


def test_errors_carry_the_python_api_kinds(client: TestClient) -> None:
    _, digest = new_token()
    approval(client, "e-1", digest)

    def error(response: Any, status: int) -> str:
        assert response.status_code == status, response.text
        return str(response.json()["error"]["kind"])

    other = {"subject": "other", "token_digest": digest}
    conflict = client.post(
        "/api/runs", json={"workflow": "approval", "run_id": "e-1", "input": other}, headers=AUTH
    )
    assert error(conflict, 409) == "RunConflictError"
    invalid = client.post(
        "/api/runs", json={"workflow": "approval", "run_id": "e-2", "input": {"x": 1}}, headers=AUTH
    )
    assert error(invalid, 422) == "InvalidInputError"
    unknown = client.post("/api/runs", json={"workflow": "nope"}, headers=AUTH)
    assert error(unknown, 422) == "WorkflowNotServedError"
    bad_id = client.post("/api/runs", json={"workflow": "waiter", "run_id": "a b"}, headers=AUTH)
    assert error(bad_id, 422) == "InvalidIdentifierError"
    extra = client.post("/api/runs", json={"workflow": "waiter", "nope": 1}, headers=AUTH)
    assert error(extra, 422) == "InvalidInputError"
    not_json = client.post(
        "/api/runs", content=b"{", headers={**AUTH, "content-type": "application/json"}
    )
    assert error(not_json, 422) == "InvalidInputError"
    assert error(client.get("/api/runs/nope", headers=AUTH), 404) == "RunNotFoundError"
    assert error(client.get("/api/runs/nope/history", headers=AUTH), 404) == "RunNotFoundError"
    signal = client.post("/api/runs/nope/signals/go", json={"signal_id": "s"}, headers=AUTH)
    assert error(signal, 404) == "RunNotFoundError"
    assert error(client.post("/api/runs/nope/cancel", headers=AUTH), 404) == "RunNotFoundError"
    assert error(client.post("/api/runs/nope/retry", headers=AUTH), 404) == "RunNotFoundError"
    undeclared = client.post("/api/runs/e-1/signals/go", json={"signal_id": "s"}, headers=AUTH)
    assert error(undeclared, 409) == "InvalidTransitionError"
    assert error(client.get("/api/runs?status=sleeping", headers=AUTH), 422) == "InvalidInputError"
    assert error(client.get("/api/nothing-here", headers=AUTH), 404) == "NotFound"
    assert error(client.delete("/api/runs", headers=AUTH), 405) == "MethodNotAllowed"


def test_signal_cancel_and_retry(client: TestClient) -> None:
    assert (
        client.post(
            "/api/runs", json={"workflow": "waiter", "run_id": "w-1"}, headers=AUTH
        ).status_code
        == 201
    )
    signal = {"payload": {"go": True}, "signal_id": "go-1"}
    sent = client.post("/api/runs/w-1/signals/go", json=signal, headers=AUTH)
    assert sent.status_code == 200 and sent.json() == {"run_id": "w-1", "outcome": "applied"}
    done = until(client, "w-1", status_is("completed"))
    assert done["snapshot"]["output"] == {"go": True}
    again = client.post("/api/runs/w-1/signals/go", json=signal, headers=AUTH)
    assert again.status_code == 200  # the same signal id: applied once
    changed = client.post(
        "/api/runs/w-1/signals/go", json={"payload": 2, "signal_id": "go-1"}, headers=AUTH
    )
    assert changed.status_code == 409 and changed.json()["error"]["kind"] == "RunConflictError"

    assert (
        client.post(
            "/api/runs", json={"workflow": "sleeper", "run_id": "s-1"}, headers=AUTH
        ).status_code
        == 201
    )
    shown = until(client, "s-1", status_is("suspended"))
    assert shown["pending"][0]["kind"] == "wait"
    retried = client.post("/api/runs/s-1/retry", headers=AUTH)
    assert retried.status_code == 200 and retried.json()["outcome"] == "applied"
    cancelled = client.post("/api/runs/s-1/cancel", json={"reason": "not needed"}, headers=AUTH)
    assert cancelled.status_code == 200
    ended = until(client, "s-1", status_is("cancelled"))
    assert ended["snapshot"]["cancellation"]["reason"] == "not needed"
    assert (
        client.post(
            "/api/runs", json={"workflow": "sleeper", "run_id": "s-2"}, headers=AUTH
        ).status_code
        == 201
    )
    forced = client.post("/api/runs/s-2/cancel", json={"force": True}, headers=AUTH)
    assert forced.status_code == 200
    until(client, "s-2", status_is("cancelled"))


# -- webhooks -------------------------------------------------------------------------------


def test_a_webhook_resumes_exactly_its_hook(client: TestClient) -> None:
    token_1, digest_1 = new_token()
    _, digest_2 = new_token()
    approval(client, "h-1", digest_1)
    approval(client, "h-2", digest_2)

    resumed = client.post(f"/hooks/{token_1}", json={"approved": True})  # no credential
    assert resumed.status_code == 200 and resumed.json() == {"outcome": "applied"}
    done = until(client, "h-1", status_is("completed"))
    assert done["snapshot"]["output"]["decision"] == {"recorded": {"approved": True}}
    other = client.get("/api/runs/h-2", headers=AUTH).json()
    assert other["run"]["status"] == "suspended"
    assert other["snapshot"]["hooks"]["decision"]["status"] == "active"

    # The same payload again changes nothing; another one conflicts.
    assert client.post(f"/hooks/{token_1}", json={"approved": True}).status_code == 200
    again = client.post(f"/hooks/{token_1}", json={"approved": False})
    assert again.status_code == 409 and again.json()["error"]["kind"] == "RunConflictError"
    assert "h-1" not in again.text


def test_a_wrong_token_is_404_and_says_nothing_more(client: TestClient) -> None:
    token, digest = new_token()
    approval(client, "n-1", digest)
    wrong = client.post(f"/hooks/{new_token()[0]}", json={"approved": True})
    assert wrong.status_code == 404
    answer = wrong.json()
    assert answer == {
        "error": {"kind": "InvalidTransitionError", "message": "no hook waits at this URL"}
    }
    # A token whose hook was resumed and whose run ended answers the same.
    assert client.post(f"/hooks/{token}", json=1).status_code == 200
    until(client, "n-1", status_is("completed"))
    cancelled, cancelled_digest = new_token()
    approval(client, "n-2", cancelled_digest)
    client.post("/api/runs/n-2/cancel", json={"force": True}, headers=AUTH)
    assert client.post(f"/hooks/{cancelled}", json=1).json() == answer
    # The URL opens nothing else: not the API, not another verb.
    assert client.get("/api/runs", headers={"Authorization": f"Bearer {token}"}).status_code == 401
    assert client.get(f"/hooks/{token}").status_code in (404, 405)
    assert client.post(f"/hooks/{token}/cancel").status_code in (404, 405)  # the console's files
    assert client.post(f"/hooks/{token}", content=b"{not json").status_code == 422


# -- limits ---------------------------------------------------------------------------------


def test_bodies_over_the_limit_are_refused(store: RocksDBEventStore) -> None:
    big = b'{"payload": "' + b"x" * 2000 + b'"}'
    with gateway(store, max_body_bytes=1000) as client:
        for path, headers in (("/api/runs", AUTH), ("/hooks/some-token", {})):
            declared = client.post(path, content=big, headers=headers)
            assert declared.status_code == 413, declared.text
            assert declared.json()["error"]["kind"] == "PayloadTooLargeError"

            def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
                for start in range(0, len(big), 100):
                    yield big[start : start + 100]

            streamed = client.post(path, content=chunks(), headers=headers)
            assert streamed.status_code == 413, streamed.text
        small = client.post(
            "/api/runs", json={"workflow": "waiter", "run_id": "small"}, headers=AUTH
        )
        assert small.status_code == 201
    assert store.list_runs() == ["small"]


def test_the_openapi_description_is_served(client: TestClient) -> None:
    described = client.get("/openapi.json", headers=AUTH)
    assert described.status_code == 200
    document = described.json()
    assert document["openapi"].startswith("3.")
    paths = document["paths"]
    for path in (
        "/api/runs",
        "/api/runs/{run_id}",
        "/api/runs/{run_id}/history",
        "/api/runs/{run_id}/signals/{name}",
        "/api/runs/{run_id}/cancel",
        "/api/runs/{run_id}/retry",
        "/api/counts",
        "/hooks/{token}",
    ):
        assert path in paths, path
    schemes = document["components"]["securitySchemes"]
    assert [s["scheme"] for s in schemes.values()] == ["bearer"]
    assert "security" not in paths["/hooks/{token}"]["post"]  # a webhook needs no credential
    assert paths["/api/runs"]["get"]["security"]
    assert client.get("/docs", headers=AUTH).status_code == 404  # no assets from the internet

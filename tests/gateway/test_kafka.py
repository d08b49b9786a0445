"""The gateway over a Kafka deployment on the real broker: one ``flowstream worker`` runs the
runs, the gateway sends commands through ``FlowClient`` and reads the run index."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from flowstream.client import FlowClient
from flowstream.gateway import GatewaySettings, KafkaBackend, create_app
from flowstream.index import KafkaRunIndex
from flowstream.settings import Settings
from flowstream.topology import load_topology
from tests.gateway.flows import app as flows
from tests.gateway.support import AUTH, GUARDED, TOKEN, assert_refused, new_token, status_is, until
from tests.processor.harness import Worker, apply_topics

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]

WORKFLOWS = {name: d.spec for name, d in flows.workflows.items()}


@pytest.fixture(scope="module")
def client(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """The topics under a fresh prefix, a worker serving the test flows, and the gateway."""
    prefix = f"t-gw-{uuid.uuid4().hex[:8]}"
    apply_topics(kafka_bootstrap, prefix)
    state = tmp_path_factory.mktemp("gateway-kafka")
    worker = Worker(
        "gw-w1",
        bootstrap=kafka_bootstrap,
        prefix=prefix,
        group=f"{prefix}-group",
        state_dir=state,
        step_log=state / "steps.jsonl",
        app="tests.gateway.flows:app",
    )
    settings = Settings(bootstrap=kafka_bootstrap, topic_prefix=prefix, group=f"{prefix}-gw")
    topology = load_topology()
    index = KafkaRunIndex(settings, state / "index", topology=topology, refresh=0)
    backend = KafkaBackend(
        lambda: FlowClient(settings, topology=topology), WORKFLOWS, index, command_timeout=30
    )
    try:
        with TestClient(create_app(backend, GatewaySettings(token=TOKEN))) as client:
            yield client
    finally:
        code = worker.stop()
        assert code == 0, worker.output()[-3000:]


def start(client: TestClient, workflow: str, run_id: str, input: Any = None) -> Any:
    body = {"workflow": workflow, "run_id": run_id, "input": input}
    return client.post("/api/runs", json=body, headers=AUTH)


def test_every_endpoint_refuses_no_and_a_wrong_credential(client: TestClient) -> None:
    for method, path, body in GUARDED:
        assert_refused(client, method, path, body)
    # The refused start sent nothing: the run does not exist.
    assert client.get("/api/runs/never-started", headers=AUTH).status_code == 404


def test_commands_reads_and_errors(client: TestClient) -> None:
    run = f"k-{uuid.uuid4().hex[:6]}"
    started = start(client, "waiter", run)
    assert started.status_code == 201, started.text
    assert started.json() == {"run_id": run, "outcome": "applied"}
    again = start(client, "waiter", run)
    assert again.status_code == 200 and again.json()["outcome"] == "noop"
    conflict = start(client, "waiter", run, {"other": 1})
    assert conflict.status_code == 409 and conflict.json()["error"]["kind"] == "RunConflictError"
    invalid = start(client, "approval", f"{run}-bad", {"x": 1})
    assert invalid.status_code == 422 and invalid.json()["error"]["kind"] == "InvalidInputError"
    unknown = start(client, "nope", f"{run}-nope")
    assert unknown.status_code == 422
    assert unknown.json()["error"]["kind"] == "WorkflowNotServedError"

    shown = until(client, run, status_is("suspended"))
    assert shown["pending"] == [{"kind": "signal", "id": shown["pending"][0]["id"]}]
    listed = client.get("/api/runs?workflow=waiter&status=suspended", headers=AUTH).json()
    assert run in [row["run_id"] for row in listed["runs"]]
    counts = client.get("/api/counts", headers=AUTH).json()
    assert counts["counts"]["suspended"] >= 1

    signal = {"payload": {"go": 1}, "signal_id": f"{run}-go"}
    sent = client.post(f"/api/runs/{run}/signals/go", json=signal, headers=AUTH)
    assert sent.status_code == 200 and sent.json()["outcome"] == "applied", sent.text
    assert (
        client.post(f"/api/runs/{run}/signals/go", json=signal, headers=AUTH).json()["outcome"]
        == "noop"
    )
    done = until(client, run, status_is("completed"))
    assert done["snapshot"]["output"] == {"go": 1}
    events = client.get(f"/api/runs/{run}/history", headers=AUTH).json()["events"]
    assert events[0]["type"] == "run_created" and events[-1]["type"] == "run_completed"
    late = client.post(f"/api/runs/{run}/signals/go", json={"signal_id": "late"}, headers=AUTH)
    assert late.status_code == 409 and late.json()["error"]["kind"] == "InvalidTransitionError"

    missing = client.get("/api/runs/nope-run", headers=AUTH)
    assert missing.status_code == 404 and missing.json()["error"]["kind"] == "RunNotFoundError"
    parked = client.post("/api/runs/nope-run/signals/go", json={"signal_id": "p"}, headers=AUTH)
    assert parked.status_code == 202 and parked.json()["outcome"] == "parked", parked.text
    gone = client.post("/api/runs/nope-run/cancel", headers=AUTH)
    assert gone.status_code == 404 and gone.json()["error"]["kind"] == "RunNotFoundError"


def test_cancel_and_retry(client: TestClient) -> None:
    run = f"s-{uuid.uuid4().hex[:6]}"
    assert start(client, "sleeper", run).status_code == 201
    until(client, run, status_is("suspended"))
    retried = client.post(f"/api/runs/{run}/retry", headers=AUTH)
    assert retried.status_code == 200 and retried.json()["outcome"] in ("applied", "noop")
    cancelled = client.post(f"/api/runs/{run}/cancel", json={"reason": "no"}, headers=AUTH)
    assert cancelled.status_code == 200, cancelled.text
    until(client, run, status_is("cancelled"))


def test_a_webhook_resumes_exactly_its_hook(client: TestClient) -> None:
    token_1, digest_1 = new_token()
    _, digest_2 = new_token()
    run_1, run_2 = (f"h-{uuid.uuid4().hex[:6]}" for _ in range(2))
    for run, digest in ((run_1, digest_1), (run_2, digest_2)):
        assert (
            start(client, "approval", run, {"subject": run, "token_digest": digest}).status_code
            == 201
        )
        until(client, run, lambda body: body["pending"] == [{"kind": "hook", "id": "decision"}])

    wrong = client.post(f"/hooks/{new_token()[0]}", json=1)
    assert wrong.status_code == 404
    assert wrong.json() == {
        "error": {"kind": "InvalidTransitionError", "message": "no hook waits at this URL"}
    }
    resumed = client.post(f"/hooks/{token_1}", json={"approved": True})
    assert resumed.status_code == 200 and resumed.json() == {"outcome": "applied"}, resumed.text
    done = until(client, run_1, status_is("completed"))
    assert done["snapshot"]["output"]["decision"] == {"recorded": {"approved": True}}
    other = client.get(f"/api/runs/{run_2}", headers=AUTH).json()
    assert other["run"]["status"] == "suspended"
    assert other["snapshot"]["hooks"]["decision"]["status"] == "active"
    conflict = client.post(f"/hooks/{token_1}", json={"approved": False})
    assert conflict.status_code in (404, 409), conflict.text  # resumed, its run has ended
    assert run_1 not in conflict.text

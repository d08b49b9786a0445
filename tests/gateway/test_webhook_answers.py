"""What a webhook answers for each error of a resumption: fixed words, never the error's own
message (which may name the token's digest, a run or a hook)."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from flowstream.errors import (
    CommandParkedError,
    InvalidTransitionError,
    PayloadTooLargeError,
    RunConflictError,
    RunNotFoundError,
    RuntimeBuildUnavailableError,
)
from flowstream.gateway import Answer, Backend, GatewaySettings, create_app
from flowstream.index import RunPage, RunQuery
from flowstream.model.base import JSON
from flowstream.model.spec import WorkflowSpec
from tests.gateway.support import TOKEN

pytestmark = pytest.mark.timeout(30)

#: What an error's message could hold that a webhook caller must not learn.
SECRET = "0123456789abcdef" * 4


class Raising(Backend):
    """A backend whose hook resumption raises ``error``."""

    def __init__(self, error: Exception) -> None:
        super().__init__({})
        self.error = error

    async def resume_hook_by_token(self, token: str, payload: JSON) -> Answer:
        raise self.error

    async def start(self, run_id: str, spec: WorkflowSpec, input: JSON) -> Answer:
        raise NotImplementedError

    async def signal(self, run_id: str, name: str, payload: JSON, signal_id: str) -> Answer:
        raise NotImplementedError

    async def cancel(self, run_id: str, reason: str | None, force: bool) -> Answer:
        raise NotImplementedError

    async def retry(self, run_id: str) -> Answer:
        raise NotImplementedError

    async def run(self, run_id: str) -> dict[str, Any]:
        raise NotImplementedError

    async def history(self, run_id: str) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def runs(self, query: RunQuery) -> RunPage:
        raise NotImplementedError

    async def counts(self) -> dict[str, int]:
        raise NotImplementedError


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (TimeoutError(f"no outcome of command c for {SECRET} in time"), 504, "Timeout"),
        (CommandParkedError(f"run {SECRET}: parked"), 202, None),
        (RunConflictError(f"run {SECRET}: hook h was already resumed"), 409, "RunConflictError"),
        (InvalidTransitionError(f"hook {SECRET} is disposed"), 404, "InvalidTransitionError"),
        (RunNotFoundError(SECRET), 404, "InvalidTransitionError"),
        (PayloadTooLargeError(SECRET, 10, 5), 413, "PayloadTooLargeError"),
        (RuntimeBuildUnavailableError(SECRET, "b1", "b2"), 503, "RuntimeBuildUnavailableError"),
    ],
)
def test_a_webhook_answers_in_fixed_words(error: Exception, status: int, kind: str | None) -> None:
    app = create_app(Raising(error), GatewaySettings(token=TOKEN))
    with TestClient(app) as client:
        answer = client.post("/hooks/some-token", json={"ok": True})
    assert answer.status_code == status, answer.text
    assert SECRET not in answer.text
    if kind is not None:
        assert answer.json()["error"]["kind"] == kind

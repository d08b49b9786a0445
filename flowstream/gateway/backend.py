"""``Backend``: what the gateway's endpoints call, embedded (``EmbeddedBackend``) or over Kafka
(``KafkaBackend``).

Every method is a coroutine and raises the ``flowstream.errors`` class the Python API raises
for the same request; ``flowstream.gateway.problems`` turns it into an HTTP answer. A command
answers with an ``Answer``: what became of it (``applied``, ``noop`` for one that changed
nothing, ``accepted`` for one recorded whose drive goes on, ``parked`` for a Kafka command that
waits for its run to start or its build to be served) and the run it went to.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flowstream.errors import WorkflowNotServedError
from flowstream.index import RunPage, RunQuery
from flowstream.model.base import JSON
from flowstream.model.spec import WorkflowSpec

__all__ = ["Answer", "Backend"]


@dataclass(frozen=True, slots=True)
class Answer:
    """What became of one command."""

    run_id: str
    outcome: str
    reason: str | None = None

    def json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"run_id": self.run_id, "outcome": self.outcome}
        if self.reason is not None:
            shown["reason"] = self.reason
        return shown


class Backend(ABC):
    """Runs to start, steer and read, for the gateway."""

    def __init__(self, workflows: Mapping[str, WorkflowSpec]) -> None:
        #: The workflows ``POST /api/runs`` may start, by name (no request picks code to load).
        self.workflows = dict(workflows)

    def spec(self, name: str, run_id: str) -> WorkflowSpec:
        """The spec of workflow ``name``, or ``WorkflowNotServedError`` naming those served."""
        found = self.workflows.get(name)
        if found is None:
            raise WorkflowNotServedError(run_id, name, sorted(self.workflows))
        return found

    async def open(self) -> None:
        """Called once the server starts (the embedded engine's deadlines fire from then on)."""

    async def close(self) -> None:
        """Called as the server stops."""

    # -- commands -------------------------------------------------------------------------

    @abstractmethod
    async def start(self, run_id: str, spec: WorkflowSpec, input: JSON) -> Answer:
        """Start ``run_id`` (idempotent for the same spec and input: ``noop``)."""

    @abstractmethod
    async def signal(self, run_id: str, name: str, payload: JSON, signal_id: str) -> Answer:
        """Send signal ``name`` once per ``signal_id``."""

    @abstractmethod
    async def cancel(self, run_id: str, reason: str | None, force: bool) -> Answer:
        """Request cancellation (or force it)."""

    @abstractmethod
    async def retry(self, run_id: str) -> Answer:
        """Drive the run again now (an operator's retry, after a fix)."""

    @abstractmethod
    async def resume_hook_by_token(self, token: str, payload: JSON) -> Answer:
        """Resume the one hook that owns ``token`` (a secret: it never goes into a message)."""

    # -- reads ----------------------------------------------------------------------------

    @abstractmethod
    async def run(self, run_id: str) -> dict[str, Any]:
        """``{"run": row, "condition", "snapshot", "pending"}`` (``views.run_json``)."""

    @abstractmethod
    async def history(self, run_id: str) -> list[dict[str, Any]]:
        """The run's committed events (``views.event_json``)."""

    @abstractmethod
    async def runs(self, query: RunQuery) -> RunPage:
        """One page of the run index: rows, and the cursor of the next (``None``: the last)."""

    @abstractmethod
    async def counts(self) -> dict[str, int]:
        """How many runs there are in each status."""

"""``EmbeddedBackend``: the gateway drives a ``FlowEngine`` in its own process.

The engine is the one the embedded CLI opens (``--app``, ``--data``), held open while the
gateway runs, and the gateway is its host: from ``open`` on, ``engine.serve()`` fires its timers
and retries and repairs stalled runs, while requests start, signal, resume and cancel runs on
the same engine, each on the event loop (the engine's appends are checked against the run's
sequence, so they interleave safely).

A command appends its event and drives the run as the Python API does, so its answer carries
the same error; a drive still going after ``command_timeout`` (a long step) goes on in the
background and the command answers ``accepted``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Mapping
from datetime import UTC, datetime
from typing import Any

from flowstream.engine import FlowEngine
from flowstream.gateway.backend import Answer, Backend
from flowstream.gateway.views import event_json, run_json
from flowstream.index import RunPage, RunQuery
from flowstream.model.base import JSON
from flowstream.model.snapshot import WorkflowRunSnapshot
from flowstream.model.spec import WorkflowSpec

__all__ = ["EmbeddedBackend"]

LOG = logging.getLogger("flowstream.gateway")


class EmbeddedBackend(Backend):
    """The gateway over ``engine``, whose store it hosts while it serves."""

    def __init__(
        self,
        engine: FlowEngine,
        workflows: Mapping[str, WorkflowSpec],
        *,
        command_timeout: float = 30.0,
    ) -> None:
        super().__init__(workflows)
        self.engine = engine
        self.command_timeout = command_timeout
        self._host: asyncio.Task[Any] | None = None
        self._drives: set[asyncio.Task[Any]] = set()

    async def open(self) -> None:
        self._host = asyncio.create_task(self.engine.serve(), name="flowstream-engine-host")

    async def close(self) -> None:
        tasks = [t for t in (self._host, *self._drives) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._host = None

    async def _bounded(self, run_id: str, call: Awaitable[WorkflowRunSnapshot]) -> Answer:
        """``call``'s answer, or ``accepted`` if it still drives the run after the timeout
        (its error, if any, then goes to the log)."""
        task = asyncio.ensure_future(call)
        done, _ = await asyncio.wait({task}, timeout=self.command_timeout)
        if task in done:
            task.result()
            return Answer(run_id, "applied")
        self._drives.add(task)
        task.add_done_callback(self._drove)
        return Answer(run_id, "accepted", "recorded; the run is still being driven")

    def _drove(self, task: asyncio.Task[Any]) -> None:
        self._drives.discard(task)
        if not task.cancelled() and task.exception() is not None:
            LOG.warning("a drive the gateway accepted failed: %s", task.exception())

    # -- commands -------------------------------------------------------------------------

    async def start(self, run_id: str, spec: WorkflowSpec, input: JSON) -> Answer:
        existed = self.engine.store.exists(run_id)
        answer = await self._bounded(run_id, self.engine.start(run_id, spec, input))
        return Answer(run_id, "noop") if existed and answer.outcome == "applied" else answer

    async def signal(self, run_id: str, name: str, payload: JSON, signal_id: str) -> Answer:
        return await self._bounded(run_id, self.engine.signal(run_id, name, payload, id=signal_id))

    async def cancel(self, run_id: str, reason: str | None, force: bool) -> Answer:
        return await self._bounded(run_id, self.engine.cancel(run_id, reason, force=force))

    async def retry(self, run_id: str) -> Answer:
        self.engine.store.state(run_id)  # RunNotFoundError before anything is driven
        return await self._bounded(run_id, self.engine.drive(run_id, retry_task=True))

    async def resume_hook_by_token(self, token: str, payload: JSON) -> Answer:
        # The engine finds the hook by the token's digest and compares digests in constant
        # time (``RunInputs._hook_for_token``).
        return await self._bounded("", self.engine.resume_hook_by_token(token, payload))

    # -- reads ----------------------------------------------------------------------------

    async def run(self, run_id: str) -> dict[str, Any]:
        now = datetime.now(UTC)
        state = self.engine.store.state(run_id)
        return run_json(state, self.engine.condition(run_id, now=now), now)

    async def history(self, run_id: str) -> list[dict[str, Any]]:
        return [event_json(envelope) for envelope in self.engine.history(run_id)]

    async def runs(self, query: RunQuery) -> RunPage:
        return self.engine.run_index().query(query)

    async def counts(self) -> dict[str, int]:
        return self.engine.run_index().counts()

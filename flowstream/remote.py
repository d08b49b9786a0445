"""``KafkaClient``: the handle vocabulary (``flowstream.handles``) for runs on Kafka workers.

It wraps a ``FlowClient``, whose calls block, and runs each in a thread so a handle's verbs are
awaitable like the embedded ones. A start, a signal or a cancellation is a command produced to
the deployment's command topics (flushed before the call returns); ``result()`` tails the
events topic until the run has ended.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from flowstream.client import FlowClient
from flowstream.handles import Client
from flowstream.model.base import JSON
from flowstream.model.events import EventEnvelope, RunContinuedAsNew
from flowstream.model.snapshot import RunStatus, WorkflowRunSnapshot
from flowstream.model.spec import WorkflowSpec
from flowstream.settings import Settings

__all__ = ["KafkaClient"]

#: How long ``result()`` waits when no timeout is given (``FlowClient.wait`` needs one).
_DEFAULT_WAIT = 3600.0


class KafkaClient(Client):
    """Handles over a deployment's topics, through ``flow_client`` (or a new one for
    ``settings``)."""

    def __init__(
        self, settings: Settings | None = None, *, flow_client: FlowClient | None = None
    ) -> None:
        if flow_client is None:
            if settings is None:
                raise TypeError("KafkaClient needs settings or a flow_client")
            flow_client = FlowClient(settings)
        self.flow_client = flow_client

    def close(self) -> None:
        """Flush what is still queued and release the producer."""
        self.flow_client.close()

    async def _call(self, send: Callable[[], object]) -> None:
        """Run one send (which may wait for the command's outcome) and flush, off the loop."""

        def sent() -> None:
            send()
            self.flow_client.flush()

        await asyncio.to_thread(sent)

    async def _start(self, run_id: str, spec: WorkflowSpec, input: JSON) -> None:
        await self._call(lambda: self.flow_client.start(run_id, spec, input))

    async def _wait(self, run_id: str, timeout: float | None) -> WorkflowRunSnapshot:
        """The end of ``run_id``'s chain: a run that continued as new is followed to its
        successor (named by its last event), as the embedded handle does."""
        deadline = time.monotonic() + (timeout if timeout is not None else _DEFAULT_WAIT)
        while True:
            left = max(0.1, deadline - time.monotonic())
            snapshot = await asyncio.to_thread(self.flow_client.wait, run_id, timeout=left)
            if snapshot.status is not RunStatus.CONTINUED_AS_NEW:
                return snapshot
            history = await self._history(run_id)
            last = history[-1].event if history else None
            if not isinstance(last, RunContinuedAsNew):
                return snapshot
            run_id = last.successor_run_id

    async def _signal(self, run_id: str, name: str, payload: JSON, signal_id: str) -> None:
        await self._call(lambda: self.flow_client.signal(run_id, name, payload, id=signal_id))

    async def _resume_hook(self, run_id: str, hook_id: str, payload: JSON) -> None:
        await self._call(lambda: self.flow_client.resume_hook(run_id, hook_id, payload))

    async def _cancel(self, run_id: str, reason: str | None, force: bool) -> None:
        await self._call(lambda: self.flow_client.cancel(run_id, reason, force=force))

    async def _snapshot(self, run_id: str) -> WorkflowRunSnapshot:
        return await asyncio.to_thread(self.flow_client.snapshot, run_id)

    async def _history(self, run_id: str) -> list[EventEnvelope]:
        return await asyncio.to_thread(self.flow_client.history, run_id)

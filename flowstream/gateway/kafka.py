"""``KafkaBackend``: the gateway as a client of a Kafka deployment.

Commands go out through ``FlowClient``, which waits for each one's outcome on the outcomes
topic and raises the class the processor named for a rejection (the Python API's, so the answer
is the embedded one's); a parked command (its run does not exist yet, its build is not served)
answers ``parked`` with the reason, 202. A ``FlowClient`` waits for one outcome at a time, so
the backend keeps a few and lends one to each command, in a thread, off the event loop.

Reads come from the deployment's run index (``flowstream.index.KafkaRunIndex``, a local
directory kept from the events topic, ``read_committed``): lists and counts from its rows, a
run and its history from the histories it holds, caught up first, so a command the gateway
answered (its outcome commits with its events) shows in the next read.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from flowstream.client import FlowClient
from flowstream.errors import CommandParkedError
from flowstream.gateway.backend import Answer, Backend
from flowstream.gateway.views import event_json, run_json
from flowstream.index import KafkaRunIndex, RunPage, RunQuery
from flowstream.model.base import JSON
from flowstream.model.messages import CommandOutcome
from flowstream.model.spec import WorkflowSpec
from flowstream.replay.liveness import condition
from flowstream.replay.state import RunState

__all__ = ["KafkaBackend"]

T = TypeVar("T")

#: Commands in flight at once (each holds one ``FlowClient`` while it waits for its outcome).
DEFAULT_CLIENTS = 4


class KafkaBackend(Backend):
    """The gateway over a deployment's topics: clients made by ``new_client``, reads from
    ``index`` (which the gateway closes when it stops)."""

    def __init__(
        self,
        new_client: Callable[[], FlowClient],
        workflows: Mapping[str, WorkflowSpec],
        index: KafkaRunIndex,
        *,
        command_timeout: float = 30.0,
        clients: int = DEFAULT_CLIENTS,
    ) -> None:
        super().__init__(workflows)
        self.index = index
        self.command_timeout = command_timeout
        self._new_client = new_client
        self._made: list[FlowClient] = []
        self._idle: queue.Queue[FlowClient] = queue.Queue()
        self._slots = asyncio.Semaphore(clients)

    async def close(self) -> None:
        made, self._made = self._made, []
        for client in made:
            await asyncio.to_thread(client.close)
        await asyncio.to_thread(self.index.close)

    def _lend(self) -> FlowClient:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            client = self._new_client()
            self._made.append(client)
            return client

    async def _with_client(self, work: Callable[[FlowClient], T]) -> T:
        async with self._slots:

            def lent() -> T:
                client = self._lend()
                try:
                    return work(client)
                finally:
                    self._idle.put(client)

            return await asyncio.to_thread(lent)

    async def _command(
        self, run_id: str, send: Callable[[FlowClient], CommandOutcome | None]
    ) -> Answer:
        try:
            outcome = await self._with_client(send)
        except CommandParkedError as exc:
            return Answer(run_id, "parked", str(exc))
        assert outcome is not None  # sent with wait=True
        return Answer(outcome.forwarded_to or run_id, outcome.status.value, outcome.reason)

    # -- commands -------------------------------------------------------------------------

    async def start(self, run_id: str, spec: WorkflowSpec, input: JSON) -> Answer:
        timeout = self.command_timeout
        return await self._command(
            run_id, lambda c: c.start(run_id, spec, input, wait=True, timeout=timeout)
        )

    async def signal(self, run_id: str, name: str, payload: JSON, signal_id: str) -> Answer:
        timeout = self.command_timeout
        return await self._command(
            run_id,
            lambda c: c.signal(run_id, name, payload, id=signal_id, wait=True, timeout=timeout),
        )

    async def cancel(self, run_id: str, reason: str | None, force: bool) -> Answer:
        timeout = self.command_timeout
        return await self._command(
            run_id, lambda c: c.cancel(run_id, reason, force=force, wait=True, timeout=timeout)
        )

    async def retry(self, run_id: str) -> Answer:
        timeout = self.command_timeout
        return await self._command(run_id, lambda c: c.retry(run_id, wait=True, timeout=timeout))

    async def resume_hook_by_token(self, token: str, payload: JSON) -> Answer:
        # Routed by the token's digest; the owning processor finds the hook by the digest and
        # compares digests in constant time. No outcome or error names the token.
        timeout = self.command_timeout
        return await self._command(
            "",
            lambda c: c.resume_hook_by_token(token, payload, wait=True, timeout=timeout),
        )

    # -- reads ----------------------------------------------------------------------------

    async def _state(self, run_id: str) -> RunState:
        def read() -> RunState:
            self.index.catch_up()  # what committed until now: a command answered is in it
            return self.index.state(run_id)

        return await asyncio.to_thread(read)

    async def run(self, run_id: str) -> dict[str, Any]:
        state = await self._state(run_id)
        now = datetime.now(UTC)
        return run_json(state, condition(state, now), now)

    async def history(self, run_id: str) -> list[dict[str, Any]]:
        state = await self._state(run_id)
        return [event_json(envelope) for envelope in state.history]

    async def runs(self, query: RunQuery) -> RunPage:
        return await asyncio.to_thread(self.index.query, query)

    async def counts(self) -> dict[str, int]:
        return await asyncio.to_thread(self.index.counts)

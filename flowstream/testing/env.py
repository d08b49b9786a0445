"""``WorkflowEnvironment``: an engine on the memory store and a virtual clock, for tests.

::

    env = WorkflowEnvironment(app)                      # always_replay=True: see below
    handle = await env.client.start(order, Order(...), id="order-1")
    await handle.signal("shipped", "DHL-1")
    receipt = await handle.result()                     # a 1-hour timer passes at once

Time skipping: the engine's host waits on the environment's ``VirtualClock``, so whenever the
run is otherwise idle (no step to run, no input to process) it jumps to the next deadline (a
timer, a delayed retry) instead of sleeping; ``env.skip(timedelta(...))`` moves it by hand.

Always-replay mode (``always_replay=True``): after every committed batch of events, the run's
whole history is replayed from scratch against the code (``replay.audit``, the check
``flowstream audit`` runs), and a decision that comes out differently is a
``ReplayDivergedError``, raised by the call of ``env.client`` (or of the handle) that committed
it, and by ``env.check()``. That catches workflow code that
reads the clock, randomness or anything else history does not hold, on the first cycle that
replays it, instead of in production after a worker restart.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from flowstream.engine import FlowEngine
from flowstream.handles import EmbeddedClient
from flowstream.model.base import JSON
from flowstream.model.events import EventEnvelope
from flowstream.model.snapshot import WorkflowRunSnapshot
from flowstream.model.spec import WorkflowSpec
from flowstream.replay.audit import RunAudit, audit_history
from flowstream.runtime import FlowRuntime
from flowstream.stores.memory import MemoryEventStore
from flowstream.testing.clock import EPOCH, VirtualClock

__all__ = ["ReplayDivergedError", "WorkflowEnvironment", "replay_now"]


class ReplayDivergedError(AssertionError):
    """A replay from scratch decided differently from the history it replayed."""

    def __init__(self, run_id: str, problems: Sequence[str]) -> None:
        super().__init__(
            f"run {run_id} replays differently from its history (workflow code read something "
            f"history does not hold?): {'; '.join(problems)}"
        )
        self.run_id = run_id
        self.problems = tuple(problems)


def replay_now(history: Sequence[EventEnvelope], runtime: FlowRuntime) -> RunAudit:
    """Audit ``history`` against ``runtime`` at once (the runtime's ``run_workflow`` must not
    suspend on anything but its own result, which holds for ``App`` and sync runtimes)."""
    coroutine = audit_history(history, lambda spec: runtime)
    try:
        coroutine.send(None)
    except StopIteration as done:
        report: RunAudit = done.value
        return report
    coroutine.close()
    raise RuntimeError("always-replay needs a run_workflow that does not await I/O")


def _divergence(report: RunAudit) -> list[str]:
    """The audit's problems that are about replay (not the liveness of a history caught
    between two appends of one cycle)."""
    stalled = report.condition.describe() if report.stalled and report.condition else None
    return [p for p in report.problems if p != stalled]


class _CheckedClient(EmbeddedClient):
    """An ``EmbeddedClient`` that raises what the always-replay mode found after each call."""

    def __init__(self, env: WorkflowEnvironment) -> None:
        super().__init__(env.engine)
        self._env = env

    async def _start(self, run_id: str, spec: WorkflowSpec, input: JSON) -> None:
        try:
            await super()._start(run_id, spec, input)
        finally:
            self._env.check()

    async def _wait(self, run_id: str, timeout: float | None) -> WorkflowRunSnapshot:
        try:
            return await self.engine.wait(run_id, timeout=timeout, idle=self._env.idle_timeout)
        finally:
            self._env.check()

    async def _signal(self, run_id: str, name: str, payload: JSON, signal_id: str) -> None:
        try:
            await super()._signal(run_id, name, payload, signal_id)
        finally:
            self._env.check()

    async def _resume_hook(self, run_id: str, hook_id: str, payload: JSON) -> None:
        try:
            await super()._resume_hook(run_id, hook_id, payload)
        finally:
            self._env.check()

    async def _cancel(self, run_id: str, reason: str | None, force: bool) -> None:
        try:
            await super()._cancel(run_id, reason, force)
        finally:
            self._env.check()


class WorkflowEnvironment:
    """An engine, its memory store, a virtual clock and an ``EmbeddedClient``, for one test."""

    def __init__(
        self,
        runtime: FlowRuntime,
        *,
        start: datetime = EPOCH,
        always_replay: bool = False,
        idle_timeout: float | None = 2.0,
        **engine_options: Any,
    ) -> None:
        self.runtime = runtime
        #: How long ``handle.result()`` waits, in real seconds, for outside input to a run
        #: with no deadline left before it raises ``TimeoutError`` naming what the run waits
        #: for (``None``: for ever).
        self.idle_timeout = idle_timeout
        self.clock = VirtualClock(start)
        self.store = MemoryEventStore(clock=self.clock)
        self.engine = FlowEngine(self.store, runtime, clock=self.clock, **engine_options)
        self.always_replay = always_replay
        #: Starts runs and hands out their handles (``flowstream.handles``).
        self.client: EmbeddedClient = _CheckedClient(self)
        #: Every replay that diverged so far (also raised where it happened).
        self.divergences: list[ReplayDivergedError] = []
        #: How many replays from scratch the always-replay mode ran.
        self.replays = 0
        if always_replay:
            self.store.add_listener(self._replay)

    def _replay(self, batch: list[EventEnvelope]) -> None:
        run_id = batch[0].run_id
        report = replay_now(self.store.read(run_id), self.runtime)
        self.replays += 1
        problems = _divergence(report)
        if problems:  # the store logs what a listener raises: the client's calls raise it
            self.divergences.append(ReplayDivergedError(run_id, problems))

    async def run_until_idle(self) -> None:
        """Fire every deadline (skipping time to each) until none is left."""
        try:
            await self.engine.run_until_idle()
        finally:
            self.check()

    async def skip(self, delta: timedelta | float) -> None:
        """Move the clock by ``delta`` and fire what came due."""
        self.clock.advance(delta)
        try:
            await self.engine.resume_due()
        finally:
            self.check()

    def check(self) -> None:
        """Raise the first divergence the always-replay mode saw (the client's calls and the
        fixtures' teardown call it)."""
        if self.divergences:
            raise self.divergences[0]

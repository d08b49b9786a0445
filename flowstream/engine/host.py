"""``Host``: the embedded engine as a long-running host that fires its own deadlines.

``resume_due`` is one scheduler tick; a host calls it whenever a deadline (a timer, a delayed
step retry, a failed workflow task's retry) comes due. Here that loop is the engine's own:

* ``run_until_idle()`` fires deadlines, waiting for each next one, until none is left: every
  open run then waits for outside input (a signal, a hook) or there is no open run;
* ``wait(run_id)`` does the same until one run (the last of its continuation chain) has ended;
* ``serve()`` runs the ticks for ever, for a process that embeds the engine behind its own
  entry points (which start runs and send signals on the same engine).

Waiting follows the engine's clock: a clock with a ``skip_to`` method (the virtual clock of
``flowstream.testing``) is moved straight to the next deadline once the other tasks of the loop
have had their turn, so an hour's timer passes at once; any other clock is slept on, at most
``poll_interval`` at a time so that inputs from other tasks are noticed.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import NoReturn, Protocol, runtime_checkable

from flowstream.engine.continuation import Continuation
from flowstream.engine.inputs import RunInputs, SchedulerTick
from flowstream.engine.inspection import Inspection
from flowstream.errors import FlowError
from flowstream.model.snapshot import WorkflowRunSnapshot

__all__ = ["Host", "SkippingClock"]

#: Turns of the event loop other tasks get before a virtual clock skips ahead.
_YIELDS = 3


@runtime_checkable
class SkippingClock(Protocol):
    """A clock a host may move forward instead of sleeping (a test's virtual clock)."""

    def __call__(self) -> datetime: ...

    def skip_to(self, moment: datetime) -> None: ...


class Host(RunInputs, Inspection, Continuation):
    """Fires timers and delayed retries itself: ``run_until_idle``, ``wait`` and ``serve``."""

    #: Longest real sleep between two looks at the store (new inputs, new deadlines).
    poll_interval: float = 0.5
    #: Whether ``serve`` runs (then it alone fires deadlines).
    _serving: bool = False

    async def run_until_idle(self, *, timeout: float | None = None) -> SchedulerTick:
        """Fire every deadline as it comes due until none is left; what the ticks did.

        Raises ``TimeoutError`` after ``timeout`` seconds of real time, and the first error a
        due run raised when its deadline stays due (it would only raise again).
        """
        total = SchedulerTick()
        give_up = None if timeout is None else time.monotonic() + timeout
        while True:
            tick = await self.resume_due()
            total.resumed.extend(tick.resumed)
            total.repaired.extend(tick.repaired)
            total.failed.update(tick.failed)
            wakeup = self.next_wakeup()
            if wakeup is None:
                return total
            if tick.failed and wakeup.due <= self._clock():
                raise next(iter(tick.failed.values()))
            await self._wait_until(wakeup.due, give_up)

    async def wait(
        self, run_id: str, *, timeout: float | None = None, idle: float | None = None
    ) -> WorkflowRunSnapshot:
        """Fire deadlines until ``run_id`` (the last run of its continuation chain) has ended;
        its snapshot. ``TimeoutError`` after ``timeout`` seconds of real time, or once no
        deadline at all has been left for ``idle`` seconds (only outside input could move the
        run: a test that forgot a signal); the error names what the run waits for."""
        give_up = None if timeout is None else time.monotonic() + timeout
        idle_since: float | None = None
        while True:
            snapshot = self.snapshot(self.continuation_chain(run_id)[-1])
            if snapshot.is_terminal:
                return snapshot
            if self._serving:  # serve() fires the deadlines: only watch
                await self._pause(None, give_up, run_id)
                continue
            tick = await self.resume_due()
            snapshot = self.snapshot(self.continuation_chain(run_id)[-1])
            if snapshot.is_terminal:
                return snapshot
            wakeup = self.next_wakeup()
            if wakeup is not None and wakeup.due <= self._clock():
                if tick.failed:
                    raise next(iter(tick.failed.values()))
                continue
            if wakeup is None:
                idle_since = idle_since or time.monotonic()
                if idle is not None and time.monotonic() - idle_since > idle:
                    raise TimeoutError(self._stuck(run_id))
            else:
                idle_since = None
            if wakeup is None or not isinstance(self._clock, SkippingClock):
                # Nothing is due: only another task's input (or a later deadline) moves it.
                await self._pause(wakeup.due if wakeup is not None else None, give_up, run_id)
                continue
            await self._wait_until(wakeup.due, give_up)

    async def serve(self) -> NoReturn:
        """Fire deadlines as they come due, for ever (cancel the task to stop); meanwhile
        ``wait`` only watches, so one loop fires each deadline."""
        self._serving = True
        try:
            while True:
                await self.resume_due()
                wakeup = self.next_wakeup()
                await self._pause(wakeup.due if wakeup is not None else None, None, None)
        finally:
            self._serving = False

    async def _wait_until(self, moment: datetime, give_up: float | None) -> None:
        clock = self._clock
        if isinstance(clock, SkippingClock):
            for _ in range(_YIELDS):
                await asyncio.sleep(0)
            if clock() < moment:
                clock.skip_to(moment)
            return
        await self._pause(moment, give_up, None)

    async def _pause(
        self, moment: datetime | None, give_up: float | None, run_id: str | None
    ) -> None:
        """Sleep until ``moment`` (or a while, when ``None``), at most ``poll_interval``."""
        delay = self.poll_interval
        if moment is not None:
            delay = min(delay, max(0.0, (moment - self._clock()).total_seconds()))
        if isinstance(self._clock, SkippingClock):
            delay = min(delay, 0.01)
        if give_up is not None:
            left = give_up - time.monotonic()
            if left <= 0:
                raise TimeoutError(self._stuck(run_id))
            delay = min(delay, left)
        await asyncio.sleep(delay)

    def _stuck(self, run_id: str | None) -> str:
        if run_id is None:
            return "deadlines were still due when the timeout passed"
        try:
            leaf = self.continuation_chain(run_id)[-1]
            described = self.condition(leaf).describe()
        except FlowError as exc:
            described = str(exc)
        return f"run {run_id} has not ended in time: {described}"

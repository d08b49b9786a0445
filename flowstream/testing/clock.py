"""``VirtualClock``: a clock tests move by hand, or that a host skips to the next deadline."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from flowstream.model.base import utc

__all__ = ["VirtualClock"]

#: Where a virtual clock starts unless told otherwise (any fixed moment: tests repeat exactly).
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


class VirtualClock:
    """A clock that stands still until it is moved; it never goes back.

    Pass it to the store and the engine (``WorkflowEnvironment`` does): its ``skip_to`` makes
    the engine's host (``run_until_idle``, ``wait``, ``handle.result()``) jump to the next
    deadline instead of sleeping, once nothing else is runnable.
    """

    def __init__(self, start: datetime = EPOCH) -> None:
        self._now = utc(start)

    def __call__(self) -> datetime:
        return self._now

    def __repr__(self) -> str:
        return f"VirtualClock({self._now.isoformat()})"

    def skip_to(self, moment: datetime) -> None:
        """Move to ``moment``; a moment in the past leaves the clock where it is."""
        self._now = max(self._now, utc(moment))

    def advance(self, delta: timedelta | float) -> datetime:
        """Move forward by ``delta`` (a ``timedelta`` or seconds); the new time."""
        step = delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        if step < timedelta(0):
            raise ValueError("a virtual clock only moves forward")
        self._now += step
        return self._now

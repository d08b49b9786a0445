"""One daemon thread that runs the processor's blocking transactional calls in order.

``ThreadPoolExecutor`` would do, but for one case: a librdkafka call that never returns. Some do
not honour their timeout (``send_offsets_to_transaction``, which the processor no longer calls,
did so while the group coordinator's broker was gone: librdkafka issues 5456 and 5511). The
processor then gives the lane up with its producer, and a daemon thread left blocked does not
hold up the process's exit, where an executor's thread would be joined forever.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from flowstream.kafka import clients

LOG = logging.getLogger("flowstream.processor")

_STOP = object()
#: A call that ran longer than this is logged (with its outcome): what a broker's failover
#: costs a transaction, seen without giving any call up.
SLOW_CALL_S = 2.0


class LaneGivenUp(RuntimeError):
    """A call queued on a lane that was given up (``Lane.abandon``): it never ran."""


class Lane:
    """Runs submitted calls one after another on its own daemon thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._busy_since: float | None = None
        #: When the lane was given up, and when the call it was stuck in began.
        self._abandoned: tuple[float, float] | None = None
        self._given_up = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(
        self,
        call: Callable[..., Any],
        *args: Any,
        after: Future[Any] | None = None,
        patience: float = 30.0,
    ) -> Future[Any]:
        """Run ``call(*args)`` once the calls submitted before it ran and ``after`` (a call of
        another lane, say) is done; a ``TimeoutError`` if ``after`` is not done in ``patience``
        seconds. The call's result or exception is the future's."""
        future: Future[Any] = Future()
        self._queue.put((future, call, args, after, patience))
        return future

    @staticmethod
    def wait(future: Future[Any], timeout: float) -> bool:
        """Wait up to ``timeout`` for a call of a lane; whether it is done."""
        with contextlib.suppress(TimeoutError):
            future.exception(timeout=timeout)
        return future.done()

    def busy_for(self) -> float:
        """How long the call running now has run (0 when idle)."""
        since = self._busy_since
        return 0.0 if since is None else time.monotonic() - since

    def renewed(self) -> Lane:
        """A new lane of the same name (this one is given up with the call it is stuck in)."""
        return Lane(self.name)

    def close(self) -> None:
        """Stop after the calls already submitted; a blocked call is left where it is."""
        self._queue.put(_STOP)

    def abandon(self) -> Lane:
        """Give this lane up with the call it is stuck in, and return a new one of the same
        name. When the call left behind returns, a log line says after how long. The calls
        queued behind it never run (each fails with ``LaneGivenUp``): they belong to
        transactions that were ended, and run late they would find the slot's new producer."""
        since = self._busy_since
        if since is not None:
            self._abandoned = (time.monotonic(), since)
        self._given_up = True
        self.close()
        return self.renewed()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            future, call, args, after, patience = item
            if not future.set_running_or_notify_cancel():
                continue
            if self._given_up:
                future.set_exception(LaneGivenUp(f"lane {self.name} was given up"))
                continue
            called = self._busy_since = time.monotonic()
            try:
                if after is not None:
                    after.exception(timeout=patience)
                    if self._given_up:  # given up while this call waited for ``after``
                        raise LaneGivenUp(f"lane {self.name} was given up")
                called = time.monotonic()
                result = call(*args)
            except BaseException as exc:  # handed to whoever waits on the future
                future.set_exception(exc)
            except:  # noqa: E722 - not an exception class: see ``clients.as_exception``
                future.set_exception(clients.as_exception(sys.exc_info()[1]))
            else:
                future.set_result(result)
            finally:
                self._busy_since = None
                self._note_return(call, future, called)

    def _note_return(self, call: Callable[..., Any], future: Future[Any], called: float) -> None:
        """Log a call given up when it returns, and any other call that ran over
        ``SLOW_CALL_S`` (from when it was called, after any wait for ``after``)."""
        abandoned = self._abandoned
        if abandoned is None:
            took = time.monotonic() - called
            if took > SLOW_CALL_S:
                LOG.info(
                    "lane %s: the call %s took %.2f s (%s)",
                    self.name,
                    getattr(call, "__name__", type(call).__name__),
                    took,
                    _outcome(future),
                )
            return
        self._abandoned = None
        gave_up, began = abandoned
        now = time.monotonic()
        LOG.info(
            "lane %s: the call %s given up after %.2f s returned %.2f s after it began (%s)",
            self.name,
            getattr(call, "__name__", type(call).__name__),
            gave_up - began,
            now - began,
            _outcome(future),
        )


def _outcome(future: Future[Any]) -> str:
    error = future.exception() if future.done() else None
    return "ok" if error is None else f"{type(error).__name__}: {error}"

"""One daemon thread that runs the processor's blocking transactional calls in order.

``ThreadPoolExecutor`` would do, but for one case: a librdkafka call that never returns. Some do
not honour their timeout (``send_offsets_to_transaction`` while the group coordinator's broker is
gone: librdkafka issues 5456 and 5511). The processor then gives the lane up with its producer,
and a daemon thread left blocked does not hold up the process's exit, where an executor's thread
would be joined forever.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from flowstream.kafka import clients

_STOP = object()


class Lane:
    """Runs submitted calls one after another on its own daemon thread."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._busy_since: float | None = None
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, call: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._queue.put((future, call, args))
        return future

    def busy_for(self) -> float:
        """How long the call running now has run (0 when idle)."""
        since = self._busy_since
        return 0.0 if since is None else time.monotonic() - since

    def close(self) -> None:
        """Stop after the calls already submitted; a blocked call is left where it is."""
        self._queue.put(_STOP)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            future, call, args = item
            if not future.set_running_or_notify_cancel():
                continue
            self._busy_since = time.monotonic()
            try:
                result = call(*args)
            except BaseException as exc:  # handed to whoever waits on the future
                future.set_exception(exc)
            except:  # noqa: E722 - not an exception class: see ``clients.as_exception``
                future.set_exception(clients.as_exception(sys.exc_info()[1]))
            else:
                future.set_result(result)
            finally:
                self._busy_since = None

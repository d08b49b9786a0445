"""How the pipeline classifies Kafka errors, and the calls it repeats while they pass."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from flowstream.kafka import clients

__all__ = ["Abort", "InDoubt", "is_fatal", "patiently", "retrying"]

LOG = logging.getLogger("flowstream.processor")


class Abort(Exception):
    """The open transaction cannot commit and must be aborted."""


class InDoubt(Exception):
    """A transaction may have committed though something after the commit failed: what it
    holds is known only to the events topic, so the partitions are restored from there."""


def is_fatal(error: Any) -> bool:
    """A producer error after which no transactional call can succeed (fenced, say)."""
    fatal = getattr(error, "fatal", None)
    return bool(fatal()) if callable(fatal) else False


def patiently(operation: Callable[[], Any], *, attempts: int = 6) -> Any:
    """Call a metadata query again while it times out (a broker may be failing over)."""
    for attempt in range(attempts):
        try:
            return operation()
        except clients.KafkaException as exc:
            if exc.args[0].fatal() or attempt == attempts - 1:
                raise
            LOG.warning("retrying after %s", exc)
            time.sleep(0.5)
    raise AssertionError("unreachable")


def retrying(operation: Callable[[], object], *, attempts: int = 10) -> None:
    """Call a transactional producer operation again while it fails with a retriable error
    (librdkafka's contract: retry the same call; abortable and fatal errors propagate)."""
    for attempt in range(attempts):
        try:
            operation()
            return
        except clients.KafkaException as exc:
            error = exc.args[0]
            if not error.retriable() or attempt == attempts - 1:
                raise
            time.sleep(min(0.05 * 2**attempt, 1.0))

"""``/healthz`` of a processor: asked on its event loop, so a loop that no longer turns is
reported as such, and the state it reads is never read while the loop changes it.

Healthy means: the loop answers within the timeout, the consumer is a member of the group, no
assigned partition is still restoring, no transactional producer holds a fatal error (fenced) and
no transactional call hangs. A producer given up with its partitions is made again when the next
transaction needs it, so a member without one is healthy, as is a member that owns no partitions
(more members than partitions).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import TYPE_CHECKING, Any

from flowstream.processor.txn.errors import is_fatal

if TYPE_CHECKING:
    from flowstream.processor.worker import Processor

__all__ = ["HealthCheck"]


class HealthCheck:
    """Callable from any thread (the metrics server's): ``(healthy, report)``."""

    def __init__(self, processor: Processor, *, timeout_s: float = 2.0) -> None:
        self.processor = processor
        self.timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the processor runs on (from inside it, before ``Processor.run``)."""
        self._loop = loop

    def __call__(self) -> tuple[bool, dict[str, Any]]:
        loop = self._loop
        if loop is None or loop.is_closed():
            return False, {"status": "unavailable", "problems": ["the processor is not running"]}
        answer: concurrent.futures.Future[tuple[bool, dict[str, Any]]] = concurrent.futures.Future()

        def probe() -> None:
            try:
                answer.set_result(self.report())
            except Exception as exc:
                answer.set_exception(exc)

        try:
            loop.call_soon_threadsafe(probe)
            return answer.result(self.timeout_s)
        except TimeoutError:
            problem = f"the processor's loop did not answer within {self.timeout_s} s"
        except RuntimeError as exc:  # the loop closed meanwhile
            problem = f"the processor is not running: {exc}"
        except Exception as exc:
            problem = f"the health check failed: {exc!r}"
        return False, {"status": "unavailable", "problems": [problem]}

    def report(self) -> tuple[bool, dict[str, Any]]:
        """The processor's health, read on its loop."""
        processor = self.processor
        problems = []
        member = _member_id(processor.consumer)
        if not member:
            problems.append("not a member of the consumer group (yet)")
        owned = sorted(task.partition for task in processor.tasks.active())
        restoring = sorted(task.partition for task in processor.tasks.restoring())
        if restoring:
            problems.append(f"partitions {restoring} are still restoring")
        fenced = [s.index for s in processor.pipeline.slots if s.error and is_fatal(s.error)]
        if fenced:
            problems.append(f"transactional producer {fenced} has a fatal error (fenced)")
        if processor.pipeline.stuck():
            problems.append("a transactional call hangs (the producer is being given up)")
        report = {
            "status": "unavailable" if problems else "ok",
            "instance_id": processor.settings.instance_id,
            "member_id": member,
            "owned_partitions": owned,
            "restoring_partitions": restoring,
            "problems": problems,
        }
        return not problems, report


def _member_id(consumer: Any) -> str | None:
    if consumer is None:
        return None
    try:
        member = consumer.memberid()
    except RuntimeError:  # closed
        return None
    return str(member) if member else None

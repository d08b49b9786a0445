"""``/healthz`` of a processor: asked on its event loop, so a loop that no longer turns is
reported as such, and the state it reads is never read while the loop changes it.

Healthy means: the processor is connected (its transactional producers are made and its
consumer subscribed), the loop answers within the timeout, the consumer is a member of the group,
no assigned partition is still restoring, every transactional producer is usable (none holds a
fatal error, as a fenced one does; none failed to be made) and no transactional call hangs. A
producer given up with its partitions is made again when the next transaction needs it (ahead of
need, on a lane), so a member without one is healthy, as is a member that owns no partitions
(more members than partitions).

While the processor connects, its loop is busy with the blocking calls that connect it, so that
phase is answered from the calling thread without asking the loop.
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
        if self.processor.consumer is None:
            return False, self._connecting()
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
        producers = [_producer_state(slot) for slot in processor.pipeline.slots]
        fenced = [i for i, state in enumerate(producers) if state == "fenced"]
        if fenced:
            problems.append(f"transactional producer {fenced} has a fatal error (fenced)")
        failed = [i for i, state in enumerate(producers) if state.startswith("failed")]
        if failed:
            problems.append(f"transactional producer {failed} could not be made")
        if processor.pipeline.stuck():
            problems.append("a transactional call hangs (the producer is being given up)")
        report = {
            "status": "unavailable" if problems else "ok",
            "instance_id": processor.settings.instance_id,
            "member_id": member,
            "owned_partitions": owned,
            "restoring_partitions": restoring,
            "producers": producers,
            "problems": problems,
        }
        return not problems, report

    def _connecting(self) -> dict[str, Any]:
        """The report while the processor connects (read without its loop)."""
        producers = [_producer_state(slot) for slot in self.processor.pipeline.slots]
        made = sum(state == "ready" for state in producers)
        if made < len(producers):
            problem = f"connecting: {made} of {len(producers)} transactional producers are made"
        else:
            problem = "connecting: the consumer has not subscribed yet"
        return {
            "status": "starting",
            "instance_id": self.processor.settings.instance_id,
            "member_id": None,
            "owned_partitions": [],
            "restoring_partitions": [],
            "producers": producers,
            "problems": [problem],
        }


def _producer_state(slot: Any) -> str:
    """``ready``, ``fenced``, ``being made``, ``made when needed`` or ``failed: <why>``."""
    if slot.error is not None and is_fatal(slot.error):
        return "fenced"
    if slot.producer is not None:
        return "ready"
    prepared = getattr(slot, "prepared", None)
    if prepared is None:
        return "made when needed"
    future = prepared[1]
    if not future.done():
        return "being made"
    error = future.exception()
    return "made when needed" if error is None else f"failed: {error}"


def _member_id(consumer: Any) -> str | None:
    if consumer is None:
        return None
    try:
        member = consumer.memberid()
    except RuntimeError:  # closed
        return None
    return str(member) if member else None

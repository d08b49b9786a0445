"""``Inbox``: commands parked until they can apply (their run does not exist yet, their build is
not served here), kept in the partition's store and on the events topic (``inbox`` records)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from flowstream import codec, wire
from flowstream.errors import FlowError
from flowstream.model.messages import CommandMessage
from flowstream.processor.boundary import FailureBoundary, describe
from flowstream.processor.context import Context
from flowstream.processor.deadletters import DeadLetters
from flowstream.topology import EVENTS

__all__ = ["Inbox", "Park"]

LOG = logging.getLogger("flowstream.processor")


class Park(Exception):
    """The command cannot be applied yet; keep it in the partition's inbox."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Inbox:
    """Parks commands and retries them."""

    def __init__(
        self,
        ctx: Context,
        dead_letters: DeadLetters,
        boundary: FailureBoundary,
        apply: Callable[[Any, CommandMessage], Awaitable[None]],
    ) -> None:
        self.ctx = ctx
        self.dead_letters = dead_letters
        self.boundary = boundary
        self._apply = apply

    def park(self, task: Any, run_id: str, inbox_id: str, raw: bytes, reason: str) -> None:
        task.store.park(run_id, inbox_id, raw)
        headers = [
            (wire.RECORD_HEADER, wire.RecordKind.INBOX.value.encode()),
            (wire.REASON_HEADER, reason.encode()),
        ]
        self.ctx.produce(
            self.ctx.topics[EVENTS],
            task.partition,
            run_id,
            wire.inbox_value(run_id, inbox_id, raw),
            headers,
        )

    async def drain(self, task: Any, run_id: str) -> None:
        """Retry the parked commands of ``run_id`` until none applies; each applies once, then
        leaves the inbox. Applying one may unblock another (a signal makes the run create the
        hook a parked resume waits for), so passes repeat while something applied."""
        if not task.store.has_parked():
            return
        progress = True
        while progress:
            progress = False
            for parked_run, inbox_id, raw in list(task.store.parked(run_id)):
                if await self.retry(task, parked_run, inbox_id, raw):
                    progress = True

    @staticmethod
    def is_parked(task: Any, run_id: str, inbox_id: str) -> bool:
        return any(parked[1] == inbox_id for parked in task.store.parked(run_id))

    async def retry(self, task: Any, parked_run: str, inbox_id: str, raw: bytes) -> bool:
        """Apply one parked command; False if it still has to wait."""
        reason = None
        before = self.boundary.last_sequence(task, parked_run)
        try:
            await self._apply(task, codec.decode_command(raw))
        except Park:
            return False
        except FlowError as exc:
            reason = str(exc)
            self.boundary.moved_then_failed(task, parked_run, before)
        except Exception as exc:  # workflow code raised: the command is given up, the run kept
            self.boundary.failed(task, parked_run, exc)
            reason = f"runtime code raised {describe(exc)}"
        task.store.unpark(parked_run, inbox_id)
        self.ctx.produce(
            self.ctx.topics[EVENTS],
            task.partition,
            parked_run,
            wire.inbox_done_value(parked_run, inbox_id),
            [(wire.RECORD_HEADER, wire.RecordKind.INBOX_DONE.value.encode())],
        )
        if reason is not None:
            self.dead_letters.for_source(
                task.partition,
                parked_run.encode(),
                raw,
                f"parked command failed: {reason}",
                source=inbox_id,
            )
        return True

"""``Inbox``: commands parked until they can apply (their run does not exist yet, their build or
workflow is not served here), kept in the partition's store and on the events topic (``inbox``
records), for a time-to-live at most.

A parked command is stored with the time it was parked (the ``inbox`` record's timestamp, when
restored from the topic). Past ``Settings.parked_ttl_ms`` it is retried once more and, if it
still has to wait, dead-lettered with the reason and removed from the inbox: a signal for a run
that never started is not kept, and retried at every activation, for ever.

A command with a command id gets a ``parked`` outcome when it is parked (``CommandHandler``) and,
when it leaves the inbox, a second one, written here with what became of it: applied (or a no-op),
rejected with the reason it failed, or rejected with the reason it waited when its time-to-live
ran out (its kind the parked one's: ``RunNotFoundError`` for a run that never started). Retries
in between write nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from flowstream import codec, wire
from flowstream.errors import FlowError, InvalidTransitionError
from flowstream.model.messages import CommandMessage, OutcomeStatus, StartRun
from flowstream.processor.boundary import FailureBoundary, describe
from flowstream.processor.context import Context
from flowstream.processor.deadletters import DeadLetters
from flowstream.processor.outcomes import Before, Outcomes, error_kind
from flowstream.processor.redact import redacted
from flowstream.topology import EVENTS

__all__ = ["Inbox", "Park", "parked_value"]

LOG = logging.getLogger("flowstream.processor")

#: Parked commands dead-lettered per expiry scan; the rest at the next one, soon after.
EXPIRE_BUDGET = 200
#: A stored parked value: this byte, the time it was parked (ms since the epoch, 8 bytes big
#: endian), the command's bytes. A command's bytes start with the Avro marker, never with it.
_STAMPED = b"P"


def parked_value(parked_at_ms: int, raw: bytes) -> bytes:
    """What the partition store keeps for a command parked at ``parked_at_ms``."""
    return _STAMPED + max(0, parked_at_ms).to_bytes(8, "big") + raw


def _parts(value: bytes) -> tuple[int | None, bytes]:
    """(parked at in ms, or ``None`` for a value stored before parked times were, command)."""
    if value[:1] == _STAMPED:
        return int.from_bytes(value[1:9], "big"), value[9:]
    return None, value


def _age(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"


class Park(Exception):
    """The command cannot be applied yet; keep it in the partition's inbox. ``kind`` names the
    ``flowstream.errors`` class a client raises meanwhile (``RunNotFoundError``, say)."""

    def __init__(self, reason: str, *, kind: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


class Inbox:
    """Parks commands, retries them, and gives up those parked past their time-to-live."""

    def __init__(
        self,
        ctx: Context,
        dead_letters: DeadLetters,
        boundary: FailureBoundary,
        outcomes: Outcomes,
        apply: Callable[[Any, CommandMessage], Awaitable[str | None]],
    ) -> None:
        self.ctx = ctx
        self.dead_letters = dead_letters
        self.boundary = boundary
        self.outcomes = outcomes
        self._apply = apply
        self._ttl_ms = ctx.settings.parked_ttl_ms
        # Scanned for expired commands this often: a tenth of the time-to-live, within 1-60 s.
        self._scan_every_s = min(60.0, max(1.0, self._ttl_ms / 10_000))
        self._next_scan = 0.0
        # When this process first saw a parked value stored without its time.
        self._first_seen: dict[str, int] = {}

    def _now_ms(self) -> int:
        return int(self.ctx.clock().timestamp() * 1000)

    def park(self, task: Any, run_id: str, inbox_id: str, raw: bytes, reason: str) -> None:
        """Keep a command until it can apply, without the hook token it may hold (``redact``)."""
        safe = redacted(raw, may_hold_token=False)
        if safe is None:
            raise InvalidTransitionError("no hook is registered for the presented token")
        raw = safe
        task.store.park(run_id, inbox_id, parked_value(self._now_ms(), raw))
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
            for parked_run, inbox_id, value in list(task.store.parked(run_id)):
                if await self.retry(task, parked_run, inbox_id, value):
                    progress = True

    @staticmethod
    def is_parked(task: Any, run_id: str, inbox_id: str) -> bool:
        return any(parked[1] == inbox_id for parked in task.store.parked(run_id))

    @staticmethod
    def start_parked(task: Any, run_id: str) -> bool:
        """Whether ``run_id``'s start waits in the inbox (its build is not served here)."""
        start = codec.message_schema_name(StartRun)
        names = codec.default_codec().schema_name
        return any(names(_parts(value)[1]) == start for *_, value in task.store.parked(run_id))

    async def expire(self, tasks: Iterable[Any]) -> None:
        """Every so often, retry the commands parked past their time-to-live (each is applied,
        or dead-lettered with its reason), a budget of them per scan."""
        wall = time.monotonic()
        if wall < self._next_scan:
            return
        self._next_scan = wall + self._scan_every_s
        budget = EXPIRE_BUDGET
        for task in tasks:
            if not task.store.has_parked():
                continue
            for parked_run, inbox_id, value in list(task.store.parked(None)):
                if not self._expired(inbox_id, value):
                    continue
                if budget == 0:
                    self._next_scan = wall  # more are due: the next iteration goes on
                    return
                budget -= 1
                self.ctx.pipeline.begin()
                if await self.retry(task, parked_run, inbox_id, value):
                    await self.boundary.guard(task, parked_run, self.drain(task, parked_run))

    def _expired(self, inbox_id: str, value: bytes) -> float | None:
        """How long the command has been parked, in seconds, once that is past its TTL."""
        parked_at, _ = _parts(value)
        now = self._now_ms()
        if parked_at is None:
            parked_at = self._first_seen.setdefault(inbox_id, now)
        waited = now - parked_at
        return waited / 1000 if waited >= self._ttl_ms else None

    async def retry(self, task: Any, parked_run: str, inbox_id: str, value: bytes) -> bool:
        """Apply one parked command; False if it still has to wait (and is within its TTL)."""
        _, raw = _parts(value)
        reason = None
        kind: str | None = None
        command: CommandMessage | None = None
        before = Before(False, self.boundary.last_sequence(task, parked_run), False)
        try:
            command = codec.decode_command(raw)
            before = Before.of(task, command)
            forwarded_to = await self._apply(task, command)
        except Park as park:
            waited = self._expired(inbox_id, value)
            if waited is None:
                return False
            self.ctx.metrics.parked_expired.inc()
            reason = f"parked for {_age(waited)} without applying: {park.reason}"
            kind = park.kind
            LOG.warning("run %s: %s", parked_run, reason)
        except FlowError as exc:
            reason = f"parked command failed: {exc}"
            kind = error_kind(exc)
            self.boundary.moved_then_failed(task, parked_run, before.last_sequence)
        except Exception as exc:  # workflow code raised: the command is given up, the run kept
            self.boundary.failed(task, parked_run, exc)
            reason = f"parked command failed: runtime code raised {describe(exc)}"
        else:
            self.outcomes.settled(task, command, before, inbox_id, forwarded_to)
        task.store.unpark(parked_run, inbox_id)
        self._first_seen.pop(inbox_id, None)
        self.ctx.produce(
            self.ctx.topics[EVENTS],
            task.partition,
            parked_run,
            wire.inbox_done_value(parked_run, inbox_id),
            [(wire.RECORD_HEADER, wire.RecordKind.INBOX_DONE.value.encode())],
        )
        if reason is not None:
            self.dead_letters.for_source(
                task.partition, parked_run.encode(), raw, reason, source=inbox_id
            )
            self.outcomes.write(
                task.partition,
                command,
                OutcomeStatus.REJECTED,
                reason=reason,
                kind=kind,
                source=inbox_id,
            )
        return True

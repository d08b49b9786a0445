"""``Outcomes``: what became of each command a client sent, written as ``outcome`` records of the
events topic in the transaction of the command's effect.

A command with a ``command_id`` gets one outcome record per thing that happened to it, on the
events partition of its key (:mod:`flowstream.wire`): ``applied``; ``noop`` (a duplicate, or
nothing to do); ``rejected`` (with the reason and the ``flowstream.errors`` class a client
raises); ``parked``, and later, when the inbox retries it, what became of it then (applied,
noop, or rejected, also when it was given up after its time-to-live); ``forwarded``, and the rest
on the partition of the run it went on to. A command without an id (sent before command ids, or
by a processor) gets none.

What a command did is judged from the run before and after it (:class:`Before`): a start of a
run that existed is a duplicate (a conflicting one raised), any other command that appended
nothing changed nothing, unless it went on to the successor of a run that continued as new.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flowstream import codec, wire
from flowstream.errors import FlowError
from flowstream.model.messages import (
    CancelRun,
    CommandMessage,
    DisposeHook,
    OutcomeStatus,
    ResumeHook,
    RetryRun,
    SendSignal,
    StartRun,
)
from flowstream.model.snapshot import HookStatus
from flowstream.processor.context import Context, routing_key
from flowstream.replay.state import RunState
from flowstream.topology import EVENTS

__all__ = ["Before", "Outcomes", "error_kind"]

_REASON_CHARS = 1000


def _field(command: CommandMessage, name: str) -> Any:
    """A field of ``command``, ``None`` if its type has none. (``getattr`` with a default costs a
    caught ``AttributeError`` inside pydantic for the types without it, on every command.)"""
    return command.__dict__.get(name)


def error_kind(exc: BaseException) -> str | None:
    """The ``flowstream.errors`` class a client raises for ``exc``; ``None`` for anything else
    (code that raised: the client raises ``FlowError`` with the reason)."""
    return type(exc).__name__ if isinstance(exc, FlowError) else None


@dataclass(frozen=True, slots=True)
class Before:
    """A command's run as it was before the command applied: whether it existed, its last
    sequence, and whether the command repeats what the run already holds."""

    exists: bool
    last_sequence: int
    duplicate: bool

    @classmethod
    def of(cls, task: Any, command: CommandMessage) -> Before:
        run_id = _field(command, "run_id")
        store = task.store
        if run_id is None or not store.exists(run_id):
            return cls(False, 0, False)
        state = store.state(run_id)
        return cls(True, state.last_sequence, _repeats(state, command))


def _repeats(state: RunState, command: CommandMessage) -> bool:
    """``command`` asks for what ``state`` already holds (it changes nothing)."""
    match command:
        case StartRun():
            return True  # the same spec and input, or the start raises a conflict
        case SendSignal():
            return command.signal_id in state.signals
        case ResumeHook() if command.hook_id is not None:
            hook = state.hooks.get(command.hook_id)
            return hook is not None and (hook.received or hook.status is HookStatus.RECEIVED)
        case DisposeHook():
            hook = state.hooks.get(command.hook_id)
            return hook is not None and hook.status is HookStatus.DISPOSED
        case CancelRun():
            return state.is_terminal or (not command.force and state.cancellation is not None)
    return False


class Outcomes:
    """Writes command outcomes into the open transaction."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def write(
        self,
        partition: int,
        command: CommandMessage | None,
        status: OutcomeStatus,
        *,
        reason: str | None = None,
        kind: str | None = None,
        forwarded_to: str | None = None,
        source: str = "",
    ) -> None:
        """The outcome of ``command`` (nothing for one without a command id)."""
        command_id = None if command is None else _field(command, "command_id")
        if command is None or command_id is None:
            return
        key = routing_key(command)
        # The fields of a ``CommandOutcome``, from a command already validated: encoded without
        # building and validating the model again (one per command).
        value = codec.default_codec().encode_outcome(
            command_id=command_id,
            key=key,
            command=command.type,
            status=status,
            reason=None if reason is None else reason[:_REASON_CHARS],
            error_kind=kind,
            forwarded_to=forwarded_to,
            source=source,
        )
        self.ctx.produce(
            self.ctx.topics[EVENTS],
            partition,
            key,
            wire.outcome_value(command_id, value),
            wire.OUTCOME_HEADERS,
        )
        metrics = self.ctx.metrics
        metrics.child(metrics.outcomes, status.value).inc()

    def rejected(
        self, partition: int, command: CommandMessage | None, exc: BaseException, source: str
    ) -> None:
        self.write(
            partition,
            command,
            OutcomeStatus.REJECTED,
            reason=str(exc) or type(exc).__name__,
            kind=error_kind(exc),
            source=source,
        )

    def settled(
        self,
        task: Any,
        command: CommandMessage,
        before: Before,
        source: str,
        forwarded_to: str | None = None,
    ) -> None:
        """``command`` applied without raising: applied, a no-op, or forwarded (to the run
        ``forwarded_to``)."""
        if _field(command, "command_id") is None:
            return  # a processor's own command (a timer, a child's report): no one waits
        status, reason = judge(task, command, before)
        if forwarded_to is not None:
            status, reason = OutcomeStatus.FORWARDED, f"sent on to run {forwarded_to}"
        self.write(
            task.partition, command, status, reason=reason, forwarded_to=forwarded_to, source=source
        )


def judge(task: Any, command: CommandMessage, before: Before) -> tuple[OutcomeStatus, str | None]:
    """(status, reason) of a command that applied without raising and went nowhere else."""
    run_id = _field(command, "run_id")
    store = task.store
    if run_id is None or not store.exists(run_id):
        return OutcomeStatus.APPLIED, None
    state = store.state(run_id)
    if isinstance(command, StartRun):
        if before.exists:
            return OutcomeStatus.NOOP, f"run {run_id} exists with the same spec and input"
        return OutcomeStatus.APPLIED, None
    successor = state.outcome.successor_run_id if state.outcome is not None else None
    if successor is not None:
        return OutcomeStatus.APPLIED, f"run {run_id} continued as new: sent on to {successor}"
    if isinstance(command, RetryRun):
        if state.is_terminal:
            return OutcomeStatus.NOOP, f"run {run_id} is {state.status.value}: nothing to retry"
        return OutcomeStatus.APPLIED, f"run {run_id} is driven again"
    if before.duplicate or state.last_sequence == before.last_sequence:
        if state.is_terminal and not before.duplicate:
            return OutcomeStatus.NOOP, f"run {run_id} is {state.status.value}: nothing changed"
        return OutcomeStatus.NOOP, "a duplicate: the run holds it already"
    return OutcomeStatus.APPLIED, None

"""``CommandHandler``: one consumed command, from its bytes to its effect on a partition's runs.

Decode (undecodable or oversized → dead letter), check the key's partition, then dispatch by
type. A command that has to wait is parked (``Inbox``), among them one for a run whose build or
workflow no runtime here serves; one the engine refuses (a start whose input does not validate
against its workflow's input model, say) is dead-lettered with the reason, and nothing of it is
appended; workflow code that raises while the command is applied is that run's failure
(``FailureBoundary``), and the command is dead-lettered with it. Nothing a command holds can
stop the processor.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from flowstream import codec
from flowstream.errors import (
    FlowError,
    InvalidInputError,
    InvalidTransitionError,
    NonDeterministicError,
    RunNotFoundError,
    RuntimeBuildUnavailableError,
    SerializationError,
    WorkflowNotServedError,
)
from flowstream.kafka import clients
from flowstream.model.events import ChildWorkflowResolved, TerminalOutcome
from flowstream.model.messages import (
    CancelRun,
    CommandMessage,
    DisposeHook,
    FireTimer,
    HookTokenRejected,
    OutcomeStatus,
    RegisterHookToken,
    ReleaseHookToken,
    ResolveChild,
    ResumeHook,
    RetryRun,
    SendSignal,
    StartRun,
)
from flowstream.partitioning import partition_for
from flowstream.processor.boundary import FailureBoundary, describe
from flowstream.processor.context import Context, routing_key
from flowstream.processor.deadletters import DeadLetters
from flowstream.processor.hooktokens import HookTokens
from flowstream.processor.inbox import Inbox, Park
from flowstream.processor.outcomes import Before, Outcomes, error_kind
from flowstream.processor.tasks import PartitionTask, TaskManager

__all__ = ["CommandHandler"]

LOG = logging.getLogger("flowstream.processor")

#: The error a client raises for a command parked for a run, or a hook, that does not exist yet
#: (the embedded engine's for a run, or a hook, that does not exist).
_NOT_FOUND = RunNotFoundError.__name__
_NO_HOOK = InvalidTransitionError.__name__


class CommandHandler:
    """Applies consumed commands to the partitions that own them."""

    def __init__(
        self,
        ctx: Context,
        tasks: TaskManager,
        dead_letters: DeadLetters,
        boundary: FailureBoundary,
    ) -> None:
        self.ctx = ctx
        self.tasks = tasks
        self.dead_letters = dead_letters
        self.boundary = boundary
        self.outcomes = Outcomes(ctx)
        self.inbox = Inbox(ctx, dead_letters, boundary, self.outcomes, self.apply)
        self.hook_tokens = HookTokens(ctx)

    async def handle(self, message: Any) -> None:
        """Apply one consumed record of a command topic inside the open transaction, and write
        its outcome there (a command that does not decode has no id to write one under)."""
        if message.error() is not None:
            if message.error().fatal():
                raise clients.KafkaException(message.error())
            return
        partition = message.partition()
        task = self.tasks.get(partition)
        if task is None or task.restoring:
            return
        topic = message.topic()
        began = time.perf_counter()
        # Moved before the transaction begins: a transaction this command opens sends the
        # moved position with its first fence, not again once the fence went through.
        task.positions[topic] = message.offset() + 1
        self.ctx.pipeline.begin().commands += 1
        source = f"{topic}[{partition}]@{message.offset()}"
        command: CommandMessage | None = None
        outcome = "applied"
        try:
            command = self._decode(message)
            outcome = await self._handle(task, message, command, source)
        except NonDeterministicError as exc:
            self.ctx.metrics.nondeterminism.inc()
            outcome = "deadletter"
            self.dead_letters.for_message(message, str(exc))
            self.outcomes.rejected(partition, command, exc, source)
        except (FlowError, ValueError) as exc:
            outcome = "deadletter"
            self.dead_letters.for_message(message, str(exc))
            self.outcomes.rejected(partition, command, exc, source)
        except Exception as exc:  # workflow or step code raised: the run's failure
            outcome = "deadletter"
            run_id = (message.key() or b"").decode(errors="replace")
            self.boundary.failed(task, run_id, exc, report=False)
            reason = f"runtime code raised {describe(exc)}"
            self.dead_letters.for_message(message, reason)
            self.outcomes.rejected(partition, command, Exception(reason), source)
        metrics = self.ctx.metrics
        metrics.child(metrics.commands, topic, outcome.split(":")[0]).inc()
        metrics.decision_seconds.observe(time.perf_counter() - began)

    def _decode(self, message: Any) -> CommandMessage:
        """The command a record holds (within the size limit)."""
        raw = message.value() or b""
        limit = self.ctx.settings.max_message_bytes
        if len(raw) > limit:
            raise SerializationError(f"message of {len(raw)} bytes exceeds {limit}")
        return codec.decode_command(raw)

    def _check(self, task: PartitionTask, command: CommandMessage) -> None:
        """``command`` is this partition's to apply, to a run that is not quarantined."""
        run_id = routing_key(command)
        owner = partition_for(run_id, self.ctx.partitions)
        if owner != task.partition:
            raise InvalidTransitionError(
                f"key {run_id} belongs to partition {owner}, not {task.partition}"
            )
        quarantined = task.store.quarantined(run_id)
        if quarantined is not None:
            raise InvalidTransitionError(f"run {run_id} is quarantined: {quarantined}")

    async def _handle(
        self, task: PartitionTask, message: Any, command: CommandMessage, source: str
    ) -> str:
        self._check(task, command)
        run_id = routing_key(command)
        before = Before.of(task, command)
        try:
            forwarded_to = await self.apply(task, command)
        except Park as park:
            inbox_id = f"{message.topic()}:{task.partition}:{message.offset()}"
            self.inbox.park(task, run_id, inbox_id, message.value() or b"", park.reason)
            self.outcomes.write(
                task.partition,
                command,
                OutcomeStatus.PARKED,
                reason=park.reason,
                kind=park.kind,
                source=source,
            )
            return f"parked: {park.reason}"
        except Exception:
            self.boundary.moved_then_failed(task, run_id, before.last_sequence)
            raise
        self.outcomes.settled(task, command, before, source, forwarded_to)
        # The run moved on (it may have created the hook a parked resume waits for): a failure
        # there is that parked command's, not this one's.
        await self.boundary.guard(task, run_id, self.inbox.drain(task, run_id))
        return "applied"

    async def apply(self, task: PartitionTask, command: CommandMessage) -> str | None:
        """Apply one decoded command; raises ``Park`` when it has to wait. Returns the run it
        was sent on to: a token-only hook resumption's, or the successor of a run that
        continued as new (a signal, a cancellation, a retry)."""
        engine = task.engine
        store = task.store
        try:
            match command:
                case StartRun():
                    try:
                        engine.create(
                            command.run_id,
                            command.spec,
                            command.input,
                            parent=command.parent,
                            depth=command.depth,
                        )
                    except InvalidInputError as exc:
                        self._refuse_child(command, str(exc))
                        raise
                    await engine.advance(command.run_id)
                case SendSignal() | CancelRun() | RetryRun() if (
                    successor := engine.forward(command)
                ) is not None:
                    return successor  # it continued as new: the successor's partition answers
                case CancelRun() | RetryRun() if not store.exists(
                    command.run_id
                ) and self.inbox.start_parked(task, command.run_id):
                    raise Park("its start waits in the inbox", kind=_NOT_FOUND)
                case SendSignal():
                    if not store.exists(command.run_id):
                        raise Park("run does not exist yet", kind=_NOT_FOUND)
                    await engine.send_signal(
                        command.run_id, command.signal_id, command.name, command.payload
                    )
                case ResumeHook() if command.run_id is None:
                    return self.hook_tokens.forward(task, command)
                case ResumeHook():
                    await self.hook_tokens.resume(task, command)
                case RegisterHookToken():
                    self.hook_tokens.claim(task, command)
                case ReleaseHookToken():
                    self.hook_tokens.release(task, command)
                case HookTokenRejected():
                    await self.hook_tokens.rejected(task, command)
                case DisposeHook():
                    if not store.exists(command.run_id):
                        raise Park("run does not exist yet", kind=_NOT_FOUND)
                    await engine.dispose_hook(command.run_id, command.hook_id)
                case RetryRun():
                    self._retry(task, command)
                case CancelRun():
                    if command.force:
                        await engine.force_cancel(command.run_id, command.reason)
                    else:
                        await engine.request_cancellation(command.run_id, command.reason)
                case FireTimer():
                    task.fired.pop((command.run_id, command.kind, command.subject_id), None)
                    if not store.exists(command.run_id):
                        return None
                    now = max(self.ctx.clock(), command.due)
                    if command.kind == "wait":
                        await engine.resume_wait(command.run_id, command.subject_id, now=now)
                    else:
                        await engine.advance(command.run_id, now=now)
                case ResolveChild():
                    await self._resolve_child(task, command)
        except (RuntimeBuildUnavailableError, WorkflowNotServedError) as exc:
            if isinstance(command, FireTimer):
                # Not parked: the wakeup stays indexed and fires again, here every
                # ``timer_refire_ms`` (so parking would pile up copies) and at once for an owner
                # that serves the run.
                return None
            # Another member (or the next deployment) may serve it: wait, with the reason.
            self.ctx.metrics.parked_for_build.inc()
            raise Park(str(exc), kind=error_kind(exc)) from exc
        return None

    def _refuse_child(self, command: StartRun, reason: str) -> None:
        """A child's start refused for its input: the child is never created and ends failed
        for its parent, which would otherwise wait for it for ever (as the embedded engine)."""
        link = command.parent
        if link is None or link.child_id is None or link.continued:
            return
        outcome = TerminalOutcome(type="failed", error=reason)
        self.ctx.emit(
            ResolveChild(
                run_id=link.run_id,
                child_id=link.child_id,
                child_run_id=command.run_id,
                outcome=outcome,
            )
        )

    def _retry(self, task: PartitionTask, command: RetryRun) -> None:
        """An operator's retry: the run is driven like one a restore left to drive (through
        the ``FailureBoundary``, its running steps dispatched again if it is suspended)."""
        if not task.store.exists(command.run_id):
            raise RunNotFoundError(command.run_id)
        state = task.store.state(command.run_id)
        if task.engine.forward_retry(state.run_id):
            LOG.info("run %s continued as new: the retry goes on to its successor", state.run_id)
            return
        if state.is_terminal:
            LOG.info("run %s: retry asked, but it is %s", state.run_id, state.status.value)
            return
        LOG.info("run %s: driven again at an operator's request", state.run_id)
        task.to_drive.append(state.run_id)

    async def _resolve_child(self, task: PartitionTask, command: ResolveChild) -> None:
        if not task.store.exists(command.run_id):
            raise RunNotFoundError(command.run_id)
        state = task.store.state(command.run_id)
        child = state.children.get(command.child_id)
        if child is None or child.run_id != command.child_run_id:
            raise InvalidTransitionError(
                f"run {command.run_id} has no child {command.child_id} with run "
                f"{command.child_run_id}"
            )
        if child.outcome is None and not state.is_terminal:
            task.store.append_if_sequence(
                state.run_id,
                state.last_sequence,
                [ChildWorkflowResolved(child_id=command.child_id, outcome=command.outcome)],
            )
        await task.engine.advance(command.run_id)

"""``HookTokens``: a hook token is claimed once, cluster-wide, and no processor writes it down.

A token's owner partition is ``partition_for(sha256(token))``: the token index lives there, so
every claim of one token meets every other claim of it in one partition's order, whichever
partitions the claiming runs live on.

* The run's partition appends ``hook_created`` (it holds the digest only) and, in the same
  transaction, sends ``RegisterHookToken`` (digest, run, hook, the event's sequence) to the
  digest's partition. There the first active claim wins: a claim of a digest no other hook
  holds is recorded (``hook-claim`` on the events topic, ``c<digest>`` in RocksDB), a repeated
  claim of the holder is a no-op, and any other is answered by ``HookTokenRejected`` to the
  claimant's partition, where the run records ``HookTokenConflictError`` as a failed workflow
  task that undoes the hook's creation (``workflow_task_failed.undone_hook``); the retried task
  creates the hook, and claims the token, again. Its retry backs off with the number of claims
  of that hook that lost (the task policy's delays), and the digest's partition remembers the
  claimant (``hook-waiter``) to wake it (``RetryRun``) as soon as the token is released.
* When a hook is resumed or disposed, its run asks for cancellation (which cancels its hooks)
  or its run ends, the run's partition sends ``ReleaseHookToken``; the digest's partition drops
  the claim if it is still that hook's (``hook-release``) and wakes the waiting claimants. A
  late resume by the token still goes to that hook's run until another hook claims it, which
  answers it as the embedded engine does (an identical redelivery is a no-op).
* A token-only ``ResumeHook`` is routed by the digest; its partition forwards it to the
  claiming run's partition with ``token_digest`` in place of the token, where the digest is
  compared with the hook's in constant time.

Every message and record of it is written in the transaction that consumes its cause, so a
crash between a claim and its answer leaves the claim on ``cmd.hook`` (it is applied once, by
the partition's next owner) and the answer with it. Applying any of them twice is harmless:
a claim by the holder is a no-op, a release of a claim that is not the hook's changes nothing,
and an answer for a hook that is no longer the active hook created at its sequence is dropped.

Tokens at rest: see ``redact``.
"""

from __future__ import annotations

import hmac
import logging
from datetime import timedelta

from flowstream import wire
from flowstream.errors import (
    HookTokenConflictError,
    InvalidTransitionError,
    RunNotFoundError,
)
from flowstream.model.events import (
    EventEnvelope,
    HookCreated,
    HookDisposed,
    HookReceived,
    RunCancellationRequested,
    WorkflowTaskFailed,
)
from flowstream.model.messages import (
    HookTokenRejected,
    RegisterHookToken,
    ReleaseHookToken,
    ResumeHook,
    RetryRun,
)
from flowstream.model.snapshot import HookStatus
from flowstream.processor.context import Context
from flowstream.processor.inbox import Park
from flowstream.processor.redact import presented_digest
from flowstream.processor.tasks import PartitionTask
from flowstream.replay.task_failures import task_failed_events
from flowstream.stores.partition import PartitionStore
from flowstream.stores.rocksdb import TERMINAL_EVENTS
from flowstream.topology import EVENTS

__all__ = ["RECORD_KINDS", "HookTokens", "restore_record"]

LOG = logging.getLogger("flowstream.processor")

#: The events-topic records of the token index (restored by ``restore_record``).
RECORD_KINDS = frozenset(
    {
        wire.RecordKind.HOOK_TOKEN,
        wire.RecordKind.HOOK_CLAIM,
        wire.RecordKind.HOOK_RELEASE,
        wire.RecordKind.HOOK_WAITER,
    }
)
#: Hook states whose token the run still holds when it ends or asks for cancellation.
_HELD = (HookStatus.ACTIVE, HookStatus.CANCELLED)
#: The event types an append claims or releases a token for (any other is passed over).
_TOKEN_EVENTS = frozenset(
    {"hook_created", "hook_received", "hook_disposed", "run_cancellation_requested"}
    | TERMINAL_EVENTS
)


def restore_record(store: PartitionStore, kind: wire.RecordKind, value: bytes) -> None:
    """Apply one token-index record of the events topic to ``store``."""
    digest, run_id, hook_id = wire.split_hook_token(value)
    if kind is wire.RecordKind.HOOK_CLAIM:
        store.claim_hook_token(digest, run_id, hook_id)
    elif kind is wire.RecordKind.HOOK_RELEASE:
        store.release_hook_token(digest, run_id, hook_id)
        store.take_token_waiters(digest)  # woken when the release was applied
    elif kind is wire.RecordKind.HOOK_WAITER:
        store.add_token_waiter(digest, run_id, hook_id)
    else:
        store.index_hook_token(digest, run_id, hook_id)


class HookTokens:
    """The token paths of one processor: claims and releases on the digest's partition, their
    causes and answers on the run's."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    # -- the run's partition: what an append sends -------------------------------------------

    def appended(self, store: PartitionStore, run_id: str, envelopes: list[EventEnvelope]) -> None:
        """Claims and releases for one staged append of ``run_id`` (from the store's sink)."""
        for envelope in envelopes:
            if envelope.event.type in _TOKEN_EVENTS:
                break
        else:
            return  # most appends: no hook or terminal event
        state = store.cached_state(run_id)
        for envelope in envelopes:
            event = envelope.event
            if event.type not in _TOKEN_EVENTS:
                continue
            if isinstance(event, HookCreated):
                self.ctx.emit(
                    RegisterHookToken(
                        token_digest=event.token_digest,
                        run_id=run_id,
                        hook_id=event.hook_id,
                        sequence=envelope.sequence,
                    )
                )
            elif state is None:
                continue
            elif isinstance(event, HookReceived | HookDisposed):
                hook = state.hooks.get(event.hook_id)
                if hook is not None:
                    self._release(hook.token_digest, run_id, hook.hook_id)
            elif isinstance(event, RunCancellationRequested) or event.type in TERMINAL_EVENTS:
                for hook in state.hooks.values():
                    if hook.status in _HELD:
                        self._release(hook.token_digest, run_id, hook.hook_id)

    def _release(self, digest: str, run_id: str, hook_id: str) -> None:
        self.ctx.emit(ReleaseHookToken(token_digest=digest, run_id=run_id, hook_id=hook_id))

    # -- the digest's partition --------------------------------------------------------------

    def claim(self, task: PartitionTask, command: RegisterHookToken) -> None:
        """The first active claim of a digest wins; a later one is answered with a rejection."""
        digest = command.token_digest
        holder = task.store.hook_token_claim(digest)
        if holder == (command.run_id, command.hook_id):
            return  # the same claim again
        if holder is None:
            task.store.claim_hook_token(digest, command.run_id, command.hook_id)
            self._record(task, wire.RecordKind.HOOK_CLAIM, digest, command.run_id, command.hook_id)
            return
        LOG.info(
            "run %s: the token of hook %s is held by hook %s of run %s: claim rejected",
            command.run_id,
            command.hook_id,
            holder[1],
            holder[0],
        )
        task.store.add_token_waiter(digest, command.run_id, command.hook_id)
        self._record(task, wire.RecordKind.HOOK_WAITER, digest, command.run_id, command.hook_id)
        self.ctx.emit(
            HookTokenRejected(
                run_id=command.run_id,
                hook_id=command.hook_id,
                sequence=command.sequence,
                owner_run_id=holder[0],
                owner_hook_id=holder[1],
            )
        )

    def release(self, task: PartitionTask, command: ReleaseHookToken) -> None:
        digest = command.token_digest
        if task.store.release_hook_token(digest, command.run_id, command.hook_id):
            self._record(
                task, wire.RecordKind.HOOK_RELEASE, digest, command.run_id, command.hook_id
            )
            for waiting in task.store.take_token_waiters(digest):
                self.ctx.emit(RetryRun(run_id=waiting))  # claim again now

    def forward(self, task: PartitionTask, command: ResumeHook) -> str:
        """A token-only resume: on to the claiming hook's run, with the digest, not the token,
        and its command id (that run's partition writes its next outcome); returns the run."""
        digest = presented_digest(command)
        owner = None if digest is None else task.store.hook_token_owner(digest)
        if owner is None:
            raise InvalidTransitionError("no hook is registered for the presented token")
        run_id, hook_id = owner
        self.ctx.emit(
            ResumeHook(
                run_id=run_id,
                hook_id=hook_id,
                token_digest=digest,
                payload=command.payload,
                command_id=command.command_id,
            )
        )
        return run_id

    def _record(
        self, task: PartitionTask, kind: wire.RecordKind, digest: str, run_id: str, hook_id: str
    ) -> None:
        self.ctx.produce(
            self.ctx.topics[EVENTS],
            task.partition,
            digest,
            wire.hook_token_value(digest, run_id, hook_id),
            [(wire.RECORD_HEADER, kind.value.encode())],
        )

    # -- the run's partition: resumes and answers --------------------------------------------

    async def resume(self, task: PartitionTask, command: ResumeHook) -> None:
        """A resume by run and hook id, with or without the token (or its forwarded digest)."""
        assert command.run_id is not None and command.hook_id is not None
        if not task.store.exists(command.run_id):
            raise Park("run does not exist yet", kind=RunNotFoundError.__name__)
        state = task.store.state(command.run_id)
        hook = state.hooks.get(command.hook_id)
        if hook is None and not state.is_terminal:
            raise Park(
                f"hook {command.hook_id} does not exist yet", kind=InvalidTransitionError.__name__
            )
        presented = presented_digest(command)
        if (
            hook is not None
            and presented is not None
            and not hmac.compare_digest(hook.token_digest, presented)
        ):
            raise InvalidTransitionError(
                f"the presented token does not match hook {command.hook_id}",
                run_id=command.run_id,
            )
        await task.engine.resume_hook(command.run_id, command.hook_id, command.payload)

    async def rejected(self, task: PartitionTask, command: HookTokenRejected) -> None:
        """The claim of a hook lost: record the conflict in its run, undoing the creation."""
        run_id, hook_id = command.run_id, command.hook_id
        if not task.store.exists(run_id):
            return
        state = task.store.state(run_id)
        hook = state.hooks.get(hook_id)
        if (
            state.is_terminal
            or hook is None
            or hook.status is not HookStatus.ACTIVE
            or (command.sequence and hook.sequence != command.sequence)
        ):
            return  # that claim's hook is settled, or was created again since
        error = HookTokenConflictError(run_id, command.owner_run_id, command.owner_hook_id)
        engine = task.engine
        engine._admit(run_id, state.spec)  # a build not served here: parked, nothing written
        now = self.ctx.clock()
        events = task_failed_events(
            state, type(error).__name__, str(error), now, engine.task_retry, undone_hook=hook_id
        )
        # The re-created hook clears the failure, so its attempt restarts at 1: the retry backs
        # off with the claims of this hook that lost instead (and the release wakes it sooner).
        lost = 1 + sum(
            isinstance(e.event, WorkflowTaskFailed) and e.event.undone_hook == hook_id
            for e in state.history
        )
        first = events[0]
        if len(events) == 1 and isinstance(first, WorkflowTaskFailed):
            policy = engine.task_retry
            retry_at = None
            if lost < policy.max_automatic:
                retry_at = now + timedelta(milliseconds=policy.delay_ms(lost))
            events = [first.model_copy(update={"retry_at": retry_at})]
        task.store.append_if_sequence(run_id, state.last_sequence, events)
        if engine.on_task_failure is not None:
            engine.on_task_failure(run_id, type(error).__name__, str(error))
        await engine.advance(run_id)

"""``PartitionEngine``: the embedded engine's replay cycle, hosted by a Kafka processor.

It differs from ``FlowEngine`` only where a run touches the world outside its partition:

* steps are not awaited: they are handed to the processor, which starts them after the
  transaction holding their ``step_started`` commits and feeds their outcomes back later;
* child runs and continuation successors may live on other partitions, so they are started by
  producing ``StartRun`` messages, and a finished child reports to its parent with
  ``ResolveChild``; nothing here reads or writes another partition's state;
* a child's start (and, once its parent is asked to cancel, its ``CancelRun``) is produced once,
  in the transaction that records the request, so a committed request is a sent start; an
  operator's retry of the parent sends them again (the recovery path for a start that was lost);
* so a signal, a cancellation or an operator's retry for a run that continued as new is
  forwarded to its successor, and a forced cancellation reaches a child elsewhere by a forced
  ``CancelRun``; every command sent to a run whose start this partition sent goes on
  ``cmd.start`` behind that start (``Emit``'s ``behind_start``), so it never overtakes it;
* several runtime builds may be served at once, one ``FlowRuntime`` per build id.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Protocol

from flowstream.engine import FlowEngine
from flowstream.engine.continuation import reported_child, same_link, successor_link
from flowstream.errors import CorruptHistoryError, RuntimeBuildUnavailableError
from flowstream.model.base import JSON
from flowstream.model.events import ChildCancellationPolicy, ParentLink, TerminalOutcome
from flowstream.model.messages import (
    CancelRun,
    CommandMessage,
    ResolveChild,
    RetryRun,
    SendSignal,
    StartRun,
)
from flowstream.model.snapshot import WorkflowRunSnapshot
from flowstream.model.spec import WorkflowSpec
from flowstream.replay.decide import derived_run_id
from flowstream.replay.state import RunState
from flowstream.replay.task_failures import TaskRetryPolicy
from flowstream.runtime import FlowRuntime, check_served
from flowstream.stores.base import Clock, EventStore, utc_now
from flowstream.stores.partition import PartitionStore

__all__ = ["PartitionEngine"]

#: Hands decided steps to the processor: (run id, [(step id, attempt)]).
Dispatch = Callable[[str, list[tuple[str, int]]], None]
#: Send marks kept before they are all dropped (one per run the open transaction touched).
_SENT_KEPT = 10_000


class Emit(Protocol):
    """Produces a command for another run inside the open transaction (on ``cmd.start``, behind
    the run's start, with ``behind_start``)."""

    def __call__(self, command: CommandMessage, *, behind_start: bool = False) -> None: ...


class PartitionEngine(FlowEngine):
    """The replay cycle for the runs of one owned partition."""

    #: Steps run outside the cycle and children report by command: a run's condition is what
    #: its state shows (the restore and the sweeper re-dispatch the steps an owner lost).
    hosts_work = False

    def __init__(
        self,
        store: EventStore,
        runtimes: Mapping[str | None, FlowRuntime],
        *,
        dispatch: Dispatch,
        emit: Emit,
        clock: Clock = utc_now,
        on_conflict: Callable[[], None] | None = None,
        max_continuations: int = 1_000,
        task_retry: TaskRetryPolicy | None = None,
        on_task_failure: Callable[[str, str, str], None] | None = None,
    ) -> None:
        if not runtimes:
            raise ValueError("a processor needs at least one runtime")
        super().__init__(
            store,
            next(iter(runtimes.values())),
            clock=clock,
            on_conflict=on_conflict,
            max_continuations=max_continuations,
            task_retry=task_retry,
            on_task_failure=on_task_failure,
        )
        self.runtimes = dict(runtimes)
        self._dispatch = dispatch
        self._emit = emit
        #: Run id -> (sequence, event id) of the last event whose commands the open
        #: transaction has sent (``_unsent_from``).
        self._sent: dict[str, tuple[int, str]] = {}

    def _admit(self, run_id: str, spec: WorkflowSpec) -> None:
        if spec.runtime_build_id not in self.runtimes:
            served = ",".join(sorted(b or "<unpinned>" for b in self.runtimes))
            raise RuntimeBuildUnavailableError(run_id, spec.runtime_build_id, served)
        check_served(self.runtimes[spec.runtime_build_id], run_id, spec)

    def _runtime_for(self, spec: WorkflowSpec) -> FlowRuntime:
        return self.runtimes[spec.runtime_build_id]

    async def _run_steps(self, run_id: str, step_ids: list[str], now: datetime | None) -> bool:
        state = self.store.state(run_id)
        self._dispatch(run_id, [(s, state.steps[s].attempt) for s in step_ids])
        return False

    async def _leaf(self, run_id: str) -> RunState:
        return self.store.state(run_id)

    def _unsent_from(self, state: RunState) -> int:
        """The first sequence of ``state`` whose commands to other runs (its children's starts,
        a cancellation passed on to them, its successor's start) are not sent yet.

        Those commands go out in the transaction that appends the events asking for them: the
        events before the open transaction's first are committed, so theirs were sent, and so
        were those of the events up to the mark a send in the open transaction left (unless an
        abort threw those events away: their sequence then holds another event, or none).
        A store without transactions counts only the marks.
        """
        first = 0
        if isinstance(self.store, PartitionStore):
            since = self.store.open_since(state.run_id)
            first = state.last_sequence + 1 if since is None else since + 1
        mark = self._sent.get(state.run_id)
        if mark is None:
            return first
        sequence, event_id = mark
        if (
            first <= sequence <= state.last_sequence
            and state.history[sequence - 1].event_id == event_id
        ):
            return sequence + 1
        del self._sent[state.run_id]  # committed since, or thrown away by an abort
        return first

    def _mark_sent(self, state: RunState) -> None:
        """The commands ``state``'s events ask for are sent, up to its last event."""
        if len(self._sent) >= _SENT_KEPT:
            self._sent.clear()  # at worst a start goes out twice in one transaction
        self._sent[state.run_id] = (state.last_sequence, state.history[-1].event_id)

    async def _drive_chain(
        self, run_id: str, now: datetime | None, *, notify_parent: bool
    ) -> RunState:
        return await self._drive_one(run_id, now, notify_parent=notify_parent)

    def create(
        self,
        run_id: str,
        spec: WorkflowSpec,
        input: JSON = None,
        *,
        parent: ParentLink | None = None,
        depth: int = 0,
    ) -> None:
        """``FlowEngine.create``, refusing a continuation's start for a run that exists with
        another link: the chain would lead back into itself (each hop in a cycle would send the
        next start for ever), so it is not followed."""
        if parent is not None and parent.continued and self.store.exists(run_id):
            found = self.store.state(run_id).parent
            if not same_link(found, parent):
                raise CorruptHistoryError(
                    f"run {run_id} exists but is not hop {parent.hop} of the continuation chain "
                    f"after run {parent.run_id}: its link differs, so the chain is not followed",
                    run_id=run_id,
                )
        super().create(run_id, spec, input, parent=parent, depth=depth)

    def _ensure_successor(self, state: RunState) -> None:
        """The successor's start goes out with the continuation, in its transaction (an
        operator's retry sends it again: ``forward_retry``)."""
        if state.last_sequence >= self._unsent_from(state):
            self._emit(_successor_start(state))
            self._mark_sent(state)

    # -- a command for a run that continued as new goes on to its successor ---------------------

    def _successor_for_commands(self, run_id: str) -> str | None:
        """The successor that commands addressed to ``run_id`` go on to, if it continued as new.

        The successor may live on another partition, so the command is forwarded, not applied
        here. Only a link whose successor id was derived from this run and the link's sequence
        is followed: no chain of such links leads back into itself, so a forwarded command never
        comes around again.
        """
        if not self.store.exists(run_id):
            return None
        state = self.store.state(run_id)
        if state.outcome is None or state.outcome.successor_run_id is None:
            return None
        successor = state.outcome.successor_run_id
        link = state.history[-1]
        if successor != derived_run_id(run_id, "continue", str(link.sequence - 1)):
            raise CorruptHistoryError(
                f"run {run_id} continued into {successor}, an id the engine did not derive from "
                "its link, so commands are not forwarded along the chain",
                run_id=run_id,
            )
        return successor

    def forward(self, command: SendSignal | CancelRun | RetryRun) -> str | None:
        """Send ``command`` on to its run's successor if the run continued as new, keeping its
        ids (signal id, command id), on ``cmd.start`` behind the successor's start (which an
        operator's retry sends again first: the recovery path for a start that was lost).
        Returns the successor, or ``None`` when the command applies here."""
        successor = self._successor_for_commands(command.run_id)
        if successor is None:
            return None
        if isinstance(command, RetryRun):
            self._emit(_successor_start(self.store.state(command.run_id)))
        self._emit(command.model_copy(update={"run_id": successor}), behind_start=True)
        return successor

    def forward_retry(self, run_id: str) -> bool:
        """An operator's retry of a run that continued as new goes on to its successor; True
        when it did."""
        return self.forward(RetryRun(run_id=run_id)) is not None

    async def send_signal(
        self, run_id: str, signal_id: str, name: str, payload: JSON = None
    ) -> WorkflowRunSnapshot:
        command = SendSignal(run_id=run_id, signal_id=signal_id, name=name, payload=payload)
        if self.forward(command) is None:
            return await super().send_signal(run_id, signal_id, name, payload)
        return self.snapshot(run_id)

    async def request_cancellation(
        self, run_id: str, reason: str | None = None
    ) -> WorkflowRunSnapshot:
        if self.forward(CancelRun(run_id=run_id, reason=reason)) is None:
            return await super().request_cancellation(run_id, reason)
        return self.snapshot(run_id)

    async def force_cancel(self, run_id: str, reason: str | None = None) -> WorkflowRunSnapshot:
        if self.forward(CancelRun(run_id=run_id, reason=reason, force=True)) is None:
            return await super().force_cancel(run_id, reason)
        return self.snapshot(run_id)

    async def _force_cancel_child(self, run_id: str, reason: str | None) -> TerminalOutcome:
        """A child here that has not continued is cancelled at once; one on another partition,
        or one that continued into a successor, is sent a forced cancel, and the parent records
        it cancelled without waiting for it."""
        target = self._successor_for_commands(run_id)
        if target is None and self.store.exists(run_id):
            return await super()._force_cancel_child(run_id, reason)
        self._emit(CancelRun(run_id=target or run_id, reason=reason, force=True), behind_start=True)
        return TerminalOutcome(type="cancelled", error=reason)

    def _restore_abandoned(self, state: RunState, child_id: str) -> None:
        """An abandoned child runs on without its parent, where it lives: one on another
        partition is sent its start again (a no-op if it exists), never created here."""
        child = state.children[child_id]
        if self.store.exists(child.run_id):
            return
        self._emit(self._child_start(state, child_id))

    def _child_start(self, state: RunState, child_id: str) -> StartRun:
        child = state.children[child_id]
        return StartRun(
            run_id=child.run_id,
            spec=child.spec,
            input=child.input,
            parent=ParentLink(run_id=state.run_id, child_id=child_id),
            depth=state.depth + 1,
        )

    async def _reconcile_children(self, state: RunState, now: datetime | None) -> bool:
        """Send each open child's start, and pass a cancellation on, once: in the transaction
        that records the request (or the cancellation), or again on an operator's retry."""
        unsent = self._unsent_from(state)
        sent_now = self._sent.get(state.run_id) == (state.last_sequence, state.history[-1].event_id)
        if state.run_id in self._retry_now and not sent_now:
            unsent = 0  # an operator's retry sends them all again, once per drive
        cancellation = state.cancellation
        for child_id in sorted(state.open_children, key=state._child_order):
            child = state.children[child_id]
            if child.requested_sequence >= unsent:
                self._emit(self._child_start(state, child_id))
            if (
                cancellation is not None
                and cancellation.sequence >= unsent
                and child.cancellation_policy is ChildCancellationPolicy.REQUEST_CANCELLATION
                and child.requested_sequence < cancellation.sequence
            ):
                self._emit(
                    CancelRun(run_id=child.run_id, reason=cancellation.reason), behind_start=True
                )
        self._mark_sent(state)
        return False

    async def _after_terminal(
        self, state: RunState, now: datetime | None, *, notify_parent: bool
    ) -> None:
        if state.outcome is None:
            return
        if state.outcome.successor_run_id is not None:
            self._ensure_successor(state)
            return
        # The chain's last run resolves the child: a continuation's link names the parent and
        # the child, whose run (the chain's root) has the id the parent derived for it.
        reported = reported_child(state)
        if reported is not None:
            parent_id, child_id = reported
            assert state.parent is not None
            root = state.run_id
            if state.parent.continued:
                root = derived_run_id(parent_id, "child", child_id)
            self._emit(
                ResolveChild(
                    run_id=parent_id, child_id=child_id, child_run_id=root, outcome=state.outcome
                )
            )


def _successor_start(state: RunState) -> StartRun:
    """The start of the successor a continued ``state`` names."""
    assert state.outcome is not None and state.outcome.successor_run_id is not None
    return StartRun(
        run_id=state.outcome.successor_run_id,
        spec=state.spec,
        input=state.continuation_input,
        parent=successor_link(state),
        depth=state.depth,
    )

"""``RunInputs``: what wakes a suspended run from outside: due timers, signals and hooks.

An input delivered again with the same content appends nothing, but it drives the run when
the run is stalled: a crash between the input's event and the next decision leaves a run that
waits on nothing, and a retried delivery is what its sender has to move it on. ``resume_due``
is the embedded scheduler's tick: it fires the due deadlines, then repairs stalled runs (every
open run on the engine's first tick, a budget of them from a cursor on each later one).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from datetime import datetime

from flowstream.engine.liveness import REPAIR_BUDGET, Liveness
from flowstream.errors import (
    EventConflictError,
    FlowError,
    InvalidTransitionError,
    RunConflictError,
)
from flowstream.model.base import JSON, json_equal
from flowstream.model.events import HookDisposed, HookReceived, SignalReceived, WaitCompleted
from flowstream.model.payloads import to_json
from flowstream.model.snapshot import HookStatus, WaitStatus, WorkflowRunSnapshot
from flowstream.replay.decide import token_digest
from flowstream.replay.state import RunState, Wakeup

__all__ = ["RunInputs", "SchedulerTick"]


@dataclass(slots=True)
class SchedulerTick:
    """What ``resume_due`` did: runs resumed, stalled runs repaired, and runs whose resumption
    or repair raised."""

    resumed: list[str] = field(default_factory=list)
    failed: dict[str, Exception] = field(default_factory=dict)
    repaired: list[str] = field(default_factory=list)


class RunInputs(Liveness):
    """Delivers timers, delayed retries, signals and hook payloads once each, and drives the run."""

    #: Where the next tick's repair pass starts; ``None`` before the first (which scans all).
    _repair_cursor: str | None = None
    _repaired_once = False

    # -- timers and retries -----------------------------------------------------------------

    def next_wakeup(self) -> Wakeup | None:
        """The earliest durable deadline (timer or delayed retry) in the store."""
        return self.store.next_wakeup()

    async def resume_wait(
        self, run_id: str, wait_id: str, *, now: datetime | None = None
    ) -> WorkflowRunSnapshot:
        """Complete a due timer once and drive the run; repeats are no-ops."""
        moment = now or self._clock()
        while True:
            state = self.store.state(run_id)
            wait = state.waits.get(wait_id)
            if wait is None:
                raise InvalidTransitionError(f"wait {wait_id} does not exist", run_id=run_id)
            if state.is_terminal or wait.status is not WaitStatus.WAITING:
                return await self._redelivered(state, moment)
            if moment < wait.resume_at:
                raise InvalidTransitionError(
                    f"wait {wait_id} is due at {wait.resume_at.isoformat()}, not yet",
                    run_id=run_id,
                )
            self._admit(run_id, state.spec)
            try:
                self.store.append_if_sequence(
                    run_id, state.last_sequence, [WaitCompleted(wait_id=wait_id)]
                )
            except EventConflictError:
                continue
            return await self.drive(run_id, now=moment)

    async def resume_due(self, now: datetime | None = None) -> SchedulerTick:
        """Resume exactly the runs with a timer, a delayed step retry or a failed workflow
        task's retry due at ``now``."""
        moment = now or self._clock()
        tick = SchedulerTick()
        by_run: dict[str, list[Wakeup]] = {}
        for wakeup in self.store.due_wakeups(moment):
            by_run.setdefault(wakeup.run_id, []).append(wakeup)
        for run_id, wakeups in by_run.items():
            try:
                for wakeup in wakeups:
                    if wakeup.kind == "wait":
                        await self.resume_wait(run_id, wakeup.subject_id, now=moment)
                if any(w.kind in ("retry", "task") for w in wakeups):  # a step's or the task's
                    await self.drive(run_id, now=moment)
                tick.resumed.append(run_id)
            except FlowError as exc:
                tick.failed[run_id] = exc
        await self._repair_tick(tick, moment)
        return tick

    async def _repair_tick(self, tick: SchedulerTick, now: datetime) -> None:
        """Repair stalled runs: all open runs on the first tick, then a budget per tick."""
        while True:
            repairs = await self.repair_stalled(
                cursor=self._repair_cursor, budget_runs=REPAIR_BUDGET, now=now
            )
            self._repair_cursor = repairs.cursor
            tick.repaired.extend(repairs.repaired)
            tick.failed.update(repairs.failed)
            if self._repaired_once or repairs.cursor is None:
                break
        self._repaired_once = True

    async def _redelivered(self, state: RunState, now: datetime) -> WorkflowRunSnapshot:
        """An input that is already recorded: drive its run if nothing else will."""
        leaf = await self._leaf(state.run_id)
        if self._condition_of(leaf, now).is_stalled:
            return await self.drive(leaf.run_id, now=now)
        return await self._reported(leaf)

    # -- signals and hooks ----------------------------------------------------------------

    async def send_signal(
        self, run_id: str, signal_id: str, name: str, payload: JSON = None
    ) -> WorkflowRunSnapshot:
        """Deliver a signal once per ``signal_id``; the same id with other content conflicts.
        (A handle's ``signal`` takes models and dataclasses too.)"""
        payload = to_json(payload, f"payload of signal {signal_id}")
        while True:
            state = await self._leaf(run_id)
            existing = state.signals.get(signal_id)
            if existing is not None:
                if existing.name == name and json_equal(existing.payload, payload):
                    return await self._redelivered(state, self._clock())
                raise RunConflictError(
                    f"run {state.run_id}: signal {signal_id} was already received with "
                    "another name or payload",
                    run_id=state.run_id,
                )
            if name not in state.spec.signal_names:
                raise InvalidTransitionError(
                    f"signal name {name!r} is not declared by workflow {state.spec.name}",
                    run_id=state.run_id,
                )
            if state.is_terminal:
                raise InvalidTransitionError(
                    f"cannot signal a {state.status.value} run", run_id=state.run_id
                )
            self._admit(state.run_id, state.spec)
            event = SignalReceived(signal_id=signal_id, name=name, payload=payload)
            try:
                self.store.append_if_sequence(state.run_id, state.last_sequence, [event])
            except EventConflictError:
                continue
            return await self.drive(state.run_id)

    async def resume_hook(
        self, run_id: str, hook_id: str, payload: object = None
    ) -> WorkflowRunSnapshot:
        """Deliver a hook payload; an identical repeat is a no-op, another payload conflicts.
        ``payload`` is JSON, or a model or dataclass stored as JSON."""
        payload = to_json(payload, f"payload of hook {hook_id}")
        while True:
            state = self.store.state(run_id)
            hook = state.hooks.get(hook_id)
            if hook is None:
                raise InvalidTransitionError(f"hook {hook_id} does not exist", run_id=run_id)
            if hook.received:
                if json_equal(hook.payload, payload):
                    return await self._redelivered(state, self._clock())
                raise RunConflictError(
                    f"run {run_id}: hook {hook_id} was already resumed with another payload",
                    run_id=run_id,
                )
            if state.is_terminal or hook.status is not HookStatus.ACTIVE:
                raise InvalidTransitionError(
                    f"hook {hook_id} is {hook.status.value} and cannot be resumed",
                    run_id=run_id,
                )
            self._admit(run_id, state.spec)
            try:
                self.store.append_if_sequence(
                    run_id, state.last_sequence, [HookReceived(hook_id=hook_id, payload=payload)]
                )
            except EventConflictError:
                continue
            return await self.drive(run_id)

    async def resume_hook_by_token(self, token: str, payload: object = None) -> WorkflowRunSnapshot:
        """Resume the hook that owns ``token`` (a bearer secret; never logged or echoed)."""
        run_id, hook_id = self._hook_for_token(token)
        return await self.resume_hook(run_id, hook_id, payload)

    async def dispose_hook(self, run_id: str, hook_id: str) -> WorkflowRunSnapshot:
        while True:
            state = self.store.state(run_id)
            hook = state.hooks.get(hook_id)
            if hook is None:
                raise InvalidTransitionError(f"hook {hook_id} does not exist", run_id=run_id)
            if state.is_terminal or hook.status not in (HookStatus.ACTIVE, HookStatus.RECEIVED):
                return await self._reported(state)
            self._admit(run_id, state.spec)
            try:
                self.store.append_if_sequence(
                    run_id, state.last_sequence, [HookDisposed(hook_id=hook_id)]
                )
            except EventConflictError:
                continue
            return await self.drive(run_id)

    def _hook_for_token(self, token: str) -> tuple[str, str]:
        digest = token_digest(token)
        owner = self.store.find_hook(digest)
        if owner is not None:
            run_id, hook_id = owner
            hook = self.store.state(run_id).hooks.get(hook_id)
            if hook is not None and hmac.compare_digest(hook.token_digest, digest):
                return owner
        raise InvalidTransitionError("no hook is registered for the presented token")

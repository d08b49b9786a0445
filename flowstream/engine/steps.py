"""Steps: ``call_step`` invokes one handler; ``StepRunner`` runs decided steps and records them."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from concurrent.futures import Executor
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from flowstream.engine.cycle import ReplayCycle, maybe_await
from flowstream.errors import (
    EventConflictError,
    NonRetryableError,
    PayloadTooLargeError,
    SerializationError,
    UnknownOutcomeError,
)
from flowstream.model.base import JSON, json_value
from flowstream.model.payloads import to_json
from flowstream.model.snapshot import StepStatus
from flowstream.model.spec import ExhaustedAction
from flowstream.replay.context import HistoryView, StepInvocation, step_idempotency_key
from flowstream.replay.decide import step_outcome_events
from flowstream.replay.state import RunState
from flowstream.runtime import FlowRuntime

__all__ = ["StepRunner", "call_step"]


class StepRunner(ReplayCycle):
    """Runs a run's decided steps in this process and appends each attempt's outcome."""

    async def record_step_outcome(
        self,
        run_id: str,
        step_id: str,
        attempt: int,
        *,
        output: JSON = None,
        error: str | None = None,
        retryable: bool = True,
        now: datetime | None = None,
    ) -> bool:
        """Append an attempt's outcome computed elsewhere; False when it was stale (dropped)."""
        if not self.store.state(run_id).attempt_running(step_id, attempt):
            return False
        self._record_outcome(run_id, step_id, attempt, (output, error, retryable), now)
        return True

    async def _run_steps(self, run_id: str, step_ids: list[str], now: datetime | None) -> bool:
        """Run the decided steps concurrently, committing each outcome as it settles; True to
        keep driving.

        A fail-run failure stops the siblings still running; the next cycle settles them with
        ``step_cancelled`` markers before the run's terminal event.
        """
        state = self.store.state(run_id)
        calls = [(step_id, state.steps[step_id].attempt) for step_id in step_ids]
        if len(calls) == 1:
            step_id, attempt = calls[0]
            outcome = await self._call_step(state, step_id, attempt, in_thread=False)
            self._record_outcome(run_id, step_id, attempt, outcome, now)
            return True
        tasks = {
            asyncio.ensure_future(self._call_step(state, step_id, attempt, in_thread=True)): (
                step_id,
                attempt,
            )
            for step_id, attempt in calls
        }
        pending = set(tasks)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    step_id, attempt = tasks[task]
                    if self._record_outcome(run_id, step_id, attempt, task.result(), now):
                        return True
        finally:
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        return True

    async def _call_step(
        self, state: RunState, step_id: str, attempt: int, *, in_thread: bool
    ) -> tuple[JSON, str | None, bool]:
        outcome = await call_step(self._runtime_for(state.spec), state, step_id, attempt, in_thread)
        assert outcome is not None  # no gate: the handler always runs
        return outcome

    def _record_outcome(
        self,
        run_id: str,
        step_id: str,
        attempt: int,
        outcome: tuple[JSON, str | None, bool],
        now: datetime | None,
    ) -> bool:
        """Append one attempt's outcome; True when it ends the run (fail-run failure)."""
        output, error, retryable = outcome
        while True:
            state = self.store.state(run_id)
            moment = max(self._clock(), now) if now is not None else self._clock()
            events = step_outcome_events(
                state, step_id, attempt, output=output, error=error, retryable=retryable, now=moment
            )
            if not events:
                return False
            try:
                self.store.append_if_sequence(run_id, state.last_sequence, events)
            except EventConflictError:
                continue
            except PayloadTooLargeError as exc:
                # Retrying would only produce the same output again: fail the attempt for good.
                output, error, retryable = None, f"step output rejected: {exc}", False
                continue
            step = self.store.state(run_id).steps[step_id]
            return step.status is StepStatus.FAILED and (
                step.retry.on_exhausted is ExhaustedAction.FAIL_RUN
            )


def _error_text(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def call_step(
    runtime: FlowRuntime,
    state: RunState,
    step_id: str,
    attempt: int,
    in_thread: bool,
    *,
    gate: Callable[[], bool] | None = None,
    executor: Executor | None = None,
) -> tuple[JSON, str | None, bool] | None:
    """Invoke a step handler once: (output, error text or None, retryable).

    ``gate`` is asked right before the handler starts (in its thread); when it says no, the
    handler is not called and ``None`` is returned (the caller no longer owns the run).
    """
    step = state.steps[step_id]
    invocation = StepInvocation(
        run_id=state.run_id,
        step_id=step_id,
        step_name=step.step_name,
        attempt=attempt,
        input=step.input,
        history=HistoryView(state.history, state.last_sequence),
        idempotency_key=step_idempotency_key(state.run_id, step_id),
    )

    def guarded() -> Any:
        if gate is not None and not gate():
            return _NOT_RUN
        return runtime.run_step(invocation)

    try:
        if in_thread and not inspect.iscoroutinefunction(runtime.run_step):
            loop = asyncio.get_running_loop()
            # A handler may return an awaitable from its thread (an app's async step): the
            # loop awaits it.
            result = await maybe_await(await loop.run_in_executor(executor, guarded))
        else:
            result = await maybe_await(guarded())
        if result is _NOT_RUN:
            return None
        try:
            json_value(result := to_json(result, "step output"))
        except (ValidationError, SerializationError) as exc:
            return None, f"step returned a value that is not JSON: {exc}", False
        return result, None, True
    except (NonRetryableError, UnknownOutcomeError) as exc:
        return None, _error_text(exc), False
    except Exception as exc:  # a step handler's failure is data, recorded in history
        return None, _error_text(exc), True


_NOT_RUN = object()

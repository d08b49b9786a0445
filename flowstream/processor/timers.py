"""``TimerPunctuator``: due timers and delayed retries (of steps and of failed workflow tasks)
become ``FireTimer`` commands, a bounded number per scan, applied through the same fenced path
as any other command."""

from __future__ import annotations

import time

from flowstream import codec
from flowstream.model.messages import FireTimer
from flowstream.processor.context import Context
from flowstream.processor.tasks import TaskManager
from flowstream.topology import CMD_TIMER

__all__ = ["TimerPunctuator"]

#: Timers are looked for at most this often (their precision; the index scan is not free).
SCAN_INTERVAL_S = 0.02
#: At most this many timers fire per scan: the rest next time, so a backlog of due timers (an
#: outage) never holds one transaction open past its timeout.
FIRE_BUDGET = 500


class TimerPunctuator:
    """Fires the owned partitions' due wakeups."""

    def __init__(self, ctx: Context, tasks: TaskManager) -> None:
        self.ctx = ctx
        self.tasks = tasks
        self._next_scan = 0.0

    def fire(self) -> None:
        wall = time.monotonic()
        if wall < self._next_scan:
            return
        self._next_scan = wall + SCAN_INTERVAL_S
        now = self.ctx.clock()
        refire = self.ctx.settings.timer_refire_ms / 1000
        budget = FIRE_BUDGET
        for task in self.tasks.active():
            first = task.store.next_wakeup()
            if first is None or first.due > now:
                continue
            for wakeup in task.store.due_wakeups(now):
                # A failed workflow task's retry fires as a retry: both drive the run at ``due``.
                kind = "wait" if wakeup.kind == "wait" else "retry"
                key = (wakeup.run_id, kind, wakeup.subject_id)
                fired_at = task.fired.get(key)
                if fired_at is not None and wall - fired_at < refire:
                    continue
                if budget == 0:
                    self._next_scan = wall  # more are due: the next iteration goes on
                    return
                budget -= 1
                task.fired[key] = wall
                self.ctx.metrics.timer_lag_seconds.observe((now - wakeup.due).total_seconds())
                command = FireTimer(
                    run_id=wakeup.run_id, kind=kind, subject_id=wakeup.subject_id, due=wakeup.due
                )
                self.ctx.produce(
                    self.ctx.topics[CMD_TIMER],
                    task.partition,
                    wakeup.run_id,
                    codec.encode_message(command),
                )

"""``run_move``: the phases of a move, in order, each resumed where a stopped run left it.

1. the checks (:class:`MovePlan`): the group idle on the old topics, the old partitions stable,
   the target empty or this move's;
2. the events topic created under the target, and copied to its end;
3. the command topics (and the dead-letter topic) created, which lets processors start; what the
   old group had not applied forwarded, then whatever still arrives, until ``stop()``, while the
   ``outcome`` records of the new events topic are written back to the old one (clients still on
   the old prefix wait there).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from flowstream.kafka import topics
from flowstream.repartition.plan import (
    COPIED,
    FORWARDED,
    MoveError,
    MovePlan,
    Source,
    offsets,
)
from flowstream.repartition.pump import Pump
from flowstream.topology import DEADLETTER

__all__ = ["MoveReport", "run_move"]


@dataclass(slots=True)
class MoveReport:
    """What one run of a move did."""

    resumed: bool = False
    #: Records of the events topic copied (this run only).
    copied: int = 0
    #: Commands forwarded (this run only).
    forwarded: int = 0
    #: Outcomes of the new events topic written back to the old one (this run only).
    mirrored: int = 0
    #: The run stopped before the copy was complete (run it again to resume).
    interrupted: bool = False
    copy_seconds: float = 0.0


def run_move(
    plan: MovePlan,
    *,
    stop: Callable[[], bool],
    forward: bool = True,
    say: Callable[[str], None] = lambda line: None,
    timeout: float = 30.0,
) -> MoveReport:
    """Move ``plan``'s deployment; forward commands until ``stop()`` (``forward=False``: only
    those that were waiting when the copy ended)."""
    report = MoveReport()
    plan.check_group_idle()
    plan.settle_old(timeout)
    sources, report.resumed = plan.sources()
    pump = Pump(plan)
    try:
        if not report.resumed:
            pump.commit(sources)  # the move is known from here on: it resumes
        say(
            f"{'resuming' if report.resumed else 'moving'} {plan.source} "
            f"({plan.source_partitions} partitions) to {plan.target} ({plan.partitions} "
            f"partitions)"
        )
        copying = [s for s in sources if s.suffix in COPIED]
        _apply(plan, COPIED, timeout)
        if not all(s.copied for s in copying):
            began = time.monotonic()
            targets = _ends(plan, copying)
            reported = [0]

            def progress(count: int) -> None:
                if count - reported[0] >= 50_000:
                    reported[0] = count
                    say(f"  ... {count} records copied")

            report.copied = copied = pump.run(
                copying, targets=targets, stop=stop, progress=progress
            )
            if any(s.position < targets[(s.topic, s.partition)] for s in copying):
                report.interrupted = True
                say("interrupted during the copy: run the same command again to resume")
                return report
            grown = [
                f"{topic}[{p}]"
                for (topic, p), end in _ends(plan, copying).items()
                if end > targets[(topic, p)]
            ]
            if grown:
                raise MoveError(
                    f"{', '.join(grown[:4])} grew during the copy: a processor still writes on "
                    f"prefix {plan.source!r} (stop it; then run the move again)"
                )
            for source in copying:
                source.copied = True
            pump.commit(sources)
            report.copy_seconds = time.monotonic() - began
            say(f"copied {copied} records of {' and '.join(COPIED)} in {report.copy_seconds:.1f} s")
        _apply(plan, (*FORWARDED, DEADLETTER), timeout)
        commands = [s for s in sources if s.suffix in FORWARDED]
        if forward:
            say(
                f"forwarding the commands of {plan.source} to {plan.target} until stopped: "
                f"start the processors of {plan.target} now"
            )
            mirrors = plan.mirrors()
            pump.run([*commands, *mirrors], targets=None, stop=stop)
            report.mirrored = sum(s.moved for s in mirrors)
        else:
            pump.run(commands, targets=_ends(plan, commands), stop=stop)
        report.forwarded = sum(s.moved for s in commands)
        say(
            f"forwarded {report.forwarded} commands"
            + (f", mirrored {report.mirrored} outcomes back" if forward else "")
        )
        return report
    finally:
        pump.close()


def _apply(plan: MovePlan, suffixes: tuple[str, ...], timeout: float) -> None:
    topics.apply(
        plan.bootstrap,
        plan.topology,
        prefix=plan.target,
        replication_factor=plan.replication_factor,
        timeout=timeout,
        suffixes=suffixes,
    )


def _ends(plan: MovePlan, sources: list[Source]) -> dict[tuple[str, int], int]:
    """Each source's true high watermark (``read_uncommitted``)."""
    return offsets(plan.bootstrap, [(s.topic, s.partition) for s in sources], latest=True)

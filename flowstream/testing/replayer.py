"""``Replayer``: replay exported histories against the current code, before a rollout.

Export the histories of runs that are open (or a sample of finished ones) with ``flowstream
history RUN... --json``, keep them with the code (golden files), and let the test suite replay
them: a changed step input, a reordered step, a timer that moved, a signal renamed… in code
that old runs still need is reported as nondeterminism, with the sequence and both sides::

    report = await Replayer(app).replay_file("histories/orders.json")
    report.raise_for_problems()

The export format is a JSON array of event envelopes (``EventEnvelope.model_dump(mode="json")``,
each naming its run), for one run or many; JSON Lines (one envelope per line) is read too. The
replay is ``flowstream audit``'s (``replay.audit``): every recorded decision is asked of the
code again with exactly the history of its moment.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from flowstream.errors import NonDeterministicError, SerializationError
from flowstream.model.events import EventEnvelope
from flowstream.model.spec import WorkflowSpec
from flowstream.replay.audit import RunAudit, audit_history
from flowstream.runtime import FlowRuntime, serves

__all__ = ["ReplayReport", "Replayer", "export_histories", "load_histories"]


def export_histories(histories: Iterable[Iterable[EventEnvelope]]) -> bytes:
    """The export format: one JSON array of the envelopes of every history given."""
    envelopes = [e.model_dump(mode="json") for history in histories for e in history]
    return orjson.dumps(envelopes, option=orjson.OPT_INDENT_2)


def load_histories(data: bytes | str) -> dict[str, list[EventEnvelope]]:
    """Histories by run id, from an export (a JSON array, or JSON Lines, of envelopes)."""
    text = data.decode() if isinstance(data, bytes) else data
    try:
        stripped = text.strip()
        if stripped.startswith("["):
            items = orjson.loads(stripped)
        else:
            items = [orjson.loads(line) for line in stripped.splitlines() if line.strip()]
        envelopes = [EventEnvelope.model_validate(item) for item in items]
    except (orjson.JSONDecodeError, ValueError) as exc:
        raise SerializationError(f"not an exported history: {exc}") from None
    histories: dict[str, list[EventEnvelope]] = {}
    for envelope in envelopes:
        histories.setdefault(envelope.run_id, []).append(envelope)
    for history in histories.values():
        history.sort(key=lambda e: e.sequence)
    return histories


@dataclass(slots=True)
class ReplayReport:
    """What replaying some histories found, one ``RunAudit`` per run."""

    runs: list[RunAudit] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No run replayed differently (stalled runs at the end of an export are fine)."""
        return not self.failures

    @property
    def failures(self) -> list[RunAudit]:
        """The runs whose replay found nondeterminism or raised."""
        return [run for run in self.runs if _replay_problems(run)]

    def raise_for_problems(self) -> None:
        """Raise ``NonDeterministicError`` naming every run that replayed differently."""
        failures = self.failures
        if failures:
            detail = "; ".join(
                f"{run.run_id}: {' | '.join(_replay_problems(run))}" for run in failures
            )
            raise NonDeterministicError(failures[0].run_id, detail)


def _replay_problems(run: RunAudit) -> list[str]:
    stalled = run.condition.describe() if run.stalled and run.condition else None
    return [p for p in run.problems if p != stalled]


class Replayer:
    """Replays histories against ``runtime`` (or a function choosing one per spec)."""

    def __init__(self, runtime: FlowRuntime | Callable[[WorkflowSpec], FlowRuntime | None]):
        if isinstance(runtime, FlowRuntime):
            served = runtime
            self._runtime_for: Callable[[WorkflowSpec], FlowRuntime | None] = lambda spec: (
                served if serves(served, spec.name) else None
            )
        else:
            self._runtime_for = runtime

    async def replay(self, histories: Iterable[list[EventEnvelope]]) -> ReplayReport:
        """Replay each history; the report (runs of workflows not served are skipped)."""
        report = ReplayReport()
        for history in histories:
            if history:
                report.runs.append(await audit_history(history, self._runtime_for))
        return report

    async def replay_export(self, data: bytes | str) -> ReplayReport:
        """Replay every run of an export (``flowstream history --json``)."""
        return await self.replay(load_histories(data).values())

    async def replay_file(self, path: str | Path) -> ReplayReport:
        """Replay every run of an export file."""
        return await self.replay_export(Path(path).read_bytes())

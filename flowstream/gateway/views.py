"""The JSON a run is shown as, the same in both modes: its row, snapshot, pending work, history.

The row is the run index's (``flowstream.index.RunRow``), projected from the same state as the
snapshot. Hook tokens are never in a snapshot; their SHA-256 digests, which history events
carry, are left out of the events shown too.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flowstream.index.rows import open_items, row_of
from flowstream.model.events import EventEnvelope
from flowstream.model.snapshot import StepStatus
from flowstream.replay.liveness import Condition
from flowstream.replay.state import RunState

__all__ = ["event_json", "pending_of", "run_json"]

#: Event fields never shown.
_HIDDEN_FIELDS = frozenset({"token", "token_digest"})


def event_json(envelope: EventEnvelope) -> dict[str, Any]:
    """One history event: ``sequence``, ``type``, ``key`` (its dot key), ``at``, then the
    event's own fields."""
    fields = envelope.event.model_dump(mode="json", exclude=set(_HIDDEN_FIELDS))
    fields.pop("type", None)
    return {
        "sequence": envelope.sequence,
        "type": envelope.event.type,
        "key": envelope.event.event_key(),
        "at": envelope.timestamp.isoformat(),
        "event_id": envelope.event_id,
        **fields,
    }


def pending_of(state: RunState, now: datetime) -> list[dict[str, Any]]:
    """What an open run waits on or runs, as ``flowstream describe --json`` lists it: running
    steps, then its open suspensions (``wait``, ``retry``, ``hook``, ``signal``, ``child``),
    ``due`` and ``overdue`` when timed; empty for an ended run."""
    found: list[dict[str, Any]] = [
        {"kind": "step", "id": step_id, "attempt": step.attempt}
        for step_id, step in sorted(state.steps.items())
        if step.status is StepStatus.RUNNING and not state.is_terminal
    ]
    for item in open_items(state):
        entry: dict[str, Any] = {"kind": item.kind, "id": item.subject_id}
        if item.due is not None:
            entry.update(due=item.due.isoformat(), overdue=item.due <= now)
        found.append(entry)
    return found


def run_json(state: RunState, found: Condition, now: datetime) -> dict[str, Any]:
    """``GET /api/runs/{run_id}``: the run's row, its condition in one line, its snapshot and
    its pending work."""
    return {
        "run": row_of(state).model_dump(mode="json"),
        "condition": {"kind": found.kind.value, "text": found.text},
        "snapshot": state.snapshot().model_dump(mode="json"),
        "pending": pending_of(state, now),
    }

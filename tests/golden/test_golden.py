"""Golden histories: recorded runs of the workflows in ``workflows.py`` (``histories/*.json``) are
replayed against the current code, which must make the identical decision at every recorded
point — the same command, validated into the same events. Like Temporal's replayer tests, this
fails when a code change would reinterpret an existing history.

Re-record with ``python -m tests.golden.record`` only when a change is meant to break replay.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flowstream.engine import FlowEngine
from flowstream.model.events import EventEnvelope
from flowstream.model.snapshot import RunStatus
from flowstream.replay.context import WorkflowInvocation
from flowstream.replay.decide import decide
from flowstream.replay.state import RunState
from flowstream.stores.base import EventStore
from tests.golden.workflows import APPROVAL_TOKEN, STEPS, WORKFLOWS
from tests.support import FakeClock, event_types, make_runtime, run
from tests.support.stores import StoreFactory

HISTORIES = Path(__file__).parent / "histories"
FILES = sorted(HISTORIES.glob("*.json"))


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def envelopes(recorded: dict[str, Any]) -> list[EventEnvelope]:
    return [EventEnvelope.model_validate(e) for e in recorded["history"]]


def runs(path: Path) -> list[tuple[str, dict[str, Any]]]:
    return sorted(load(path)["runs"].items())


def test_there_are_golden_histories() -> None:
    assert len(FILES) >= 5
    assert sum(len(load(p)["runs"]) for p in FILES) >= 8


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_recorded_histories_still_decode_and_validate(path: Path) -> None:
    for run_id, recorded in runs(path):
        history = envelopes(recorded)
        # The wire form is stable: decoding and re-encoding gives back the recorded JSON.
        assert [e.model_dump(mode="json") for e in history] == recorded["history"]
        state = RunState.from_history(history)
        assert state.run_id == run_id
        assert state.last_sequence == len(history)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_current_code_makes_the_recorded_decisions(path: Path) -> None:
    checked = 0
    for run_id, recorded in runs(path):
        history = envelopes(recorded)
        for point in recorded["decisions"]:
            seen = point["after_sequence"]
            state = RunState.from_history(history[:seen])
            invocation = WorkflowInvocation(run_id, state.spec, state.input, state.history, state)
            command = WORKFLOWS[state.spec.name](invocation.context())
            where = f"{path.stem}: run {run_id} after sequence {seen}"
            assert command.model_dump(mode="json") == point["command"], where

            now = history[min(seen, len(history) - 1)].timestamp
            decision = decide(state, command, now)
            following = [e.event for e in history[seen : seen + len(decision.events)]]
            assert decision.events == following, where
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_recorded_histories_hold_no_secrets(path: Path) -> None:
    assert APPROVAL_TOKEN not in path.read_text()


def _import(store: EventStore, clock: FakeClock, history: list[EventEnvelope]) -> None:
    """Append a recorded history event by event at its original commit times."""
    for envelope in history:
        clock.set(envelope.timestamp)
        store.append_if_sequence(envelope.run_id, envelope.sequence - 1, [envelope.event])


def test_a_recorded_suspended_run_finishes_on_current_code(stores: StoreFactory) -> None:
    [(run_id, recorded)] = runs(HISTORIES / "order_suspended.json")
    history = envelopes(recorded)
    clock = FakeClock()
    store = stores.open(clock=clock)
    _import(store, clock, history)
    engine = FlowEngine(store, make_runtime(WORKFLOWS, STEPS, asynchronous=True), clock=clock)
    assert engine.snapshot(run_id).status is RunStatus.SUSPENDED

    clock.advance(minutes=1)
    snapshot = run(engine.send_signal(run_id, "ship-9", "shipped", {"carrier": "ups"}))
    assert snapshot.status is RunStatus.SUSPENDED  # now on the settle timer
    clock.advance(seconds=30)
    assert run(engine.resume_due(clock.now)).resumed == [run_id]
    final = engine.snapshot(run_id)
    assert final.status is RunStatus.COMPLETED
    assert final.output["shipment"] == {"carrier": "ups"}  # type: ignore[index]
    assert event_types(store.read(run_id))[: len(history)] == event_types(history)

"""The row projection: the stored row's field order is ``RunRow``'s, and a run with nothing open
waits for nothing but its next decision while one that has something open names it."""

from __future__ import annotations

from flowstream.index.rows import ROW_FIELDS, RunRow, row_fields, row_of, waiting_for
from flowstream.model.events import (
    RunCreated,
    RunStarted,
    StepCompleted,
    StepCreated,
    StepStarted,
    WaitCreated,
)
from flowstream.replay.state import RunState
from flowstream.stores.memory import MemoryEventStore
from tests.support import EPOCH, FakeClock, spec

ORDER = spec("order")


def _state(*more: object) -> RunState:
    store = MemoryEventStore(clock=FakeClock(EPOCH))
    store.append_if_sequence("r1", 0, [RunCreated(spec=ORDER, input=None), RunStarted()])
    if more:
        store.append_if_sequence("r1", 2, list(more))  # type: ignore[arg-type]
    return store.state("r1")


def test_the_row_fields_are_the_run_rows_in_its_order() -> None:
    assert tuple(RunRow.model_fields) == ROW_FIELDS
    state = _state()
    assert dict(zip(ROW_FIELDS, row_fields(state), strict=True)) == row_of(state).model_dump()


def test_a_run_between_two_steps_waits_for_its_next_decision_only() -> None:
    done = _state(
        StepCreated(step_id="s1", step_name="s1", input=None),
        StepStarted(step_id="s1", attempt=1),
        StepCompleted(step_id="s1", output=None),
    )
    assert waiting_for(done) is None
    timer = _state(WaitCreated(wait_id="w1", resume_at=EPOCH))
    assert waiting_for(timer) == f"timer until {EPOCH.isoformat(timespec='seconds')}"

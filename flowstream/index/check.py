"""``index_differences``: where a run index disagrees with the runs' histories.

The histories are the authority: each run's row must be the one projected from its state, every
run must be listed exactly once (unfiltered, under its status, under its workflow), and the
counts must be those of the rows. Tests call it after crashes and rebuilds; an operator may too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from flowstream.index.rows import MAX_LIMIT, RunIndex, RunQuery, RunRow, row_of
from flowstream.model.snapshot import RunStatus
from flowstream.replay.state import RunState

__all__ = ["index_differences", "list_all"]


def list_all(index: RunIndex, query: RunQuery | None = None) -> list[RunRow]:
    """Every row ``query`` selects, page by page (its own limit and cursor are replaced)."""
    base = query if query is not None else RunQuery()
    found: list[RunRow] = []
    cursor: str | None = None
    while True:
        page = index.query(base.model_copy(update={"limit": MAX_LIMIT, "cursor": cursor}))
        found.extend(page.rows)
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor


def _listing(problems: list[str], what: str, rows: list[RunRow], expected: Iterable[str]) -> None:
    listed = Counter(row.run_id for row in rows)
    twice = sorted(run for run, n in listed.items() if n > 1)
    if twice:
        problems.append(f"{what}: listed more than once: {', '.join(twice[:10])}")
    wanted = set(expected)
    missing = sorted(wanted - set(listed))
    extra = sorted(set(listed) - wanted)
    if missing:
        problems.append(f"{what}: missing {', '.join(missing[:10])}")
    if extra:
        problems.append(f"{what}: not expected {', '.join(extra[:10])}")
    stamps = [row.updated_at for row in rows]
    if stamps != sorted(stamps, reverse=True):
        problems.append(f"{what}: not in order of update, newest first")


def index_differences(index: RunIndex, states: Iterable[RunState]) -> list[str]:
    """What ``index`` holds that the states (projected from the histories) do not say; empty
    when the two agree."""
    expected = {state.run_id: row_of(state) for state in states}
    problems: list[str] = []
    for run_id, row in sorted(expected.items()):
        held = index.get(run_id)
        if held != row:
            problems.append(f"run {run_id}: the index holds {held}, the history says {row}")
    _listing(problems, "all runs", list_all(index), expected)
    for status in RunStatus:
        rows = list_all(index, RunQuery(status=frozenset({status})))
        wanted = [run for run, row in expected.items() if row.status is status]
        _listing(problems, f"status {status.value}", rows, wanted)
    for workflow in sorted({row.workflow for row in expected.values()}):
        rows = list_all(index, RunQuery(workflow=frozenset({workflow})))
        wanted = [run for run, row in expected.items() if row.workflow == workflow]
        _listing(problems, f"workflow {workflow}", rows, wanted)
    counted = Counter(row.status.value for row in expected.values())
    counts = index.counts()
    if any(counts.get(status.value, 0) != counted[status.value] for status in RunStatus):
        problems.append(f"counts {counts} differ from the rows' {dict(counted)}")
    return problems

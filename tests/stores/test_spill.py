"""``HistorySpill``: records come back by run, in run id order as Python sorts it, each run's in
the order they were added, duplicates kept; the scratch directory goes with ``close``."""

from __future__ import annotations

from pathlib import Path

from flowstream.stores.spill import HistorySpill


def test_records_come_back_by_run_in_the_order_python_sorts_the_ids(tmp_path: Path) -> None:
    added = [
        ("b", b"b1"),
        ("a-b", b"ab1"),
        ("a", b"a1"),
        ("b", b"b2"),
        ("a", b"a2"),
        ("a", b"a2"),  # a duplicate, as read
        ("é", b"e1"),
        ("z", b""),
    ]
    with HistorySpill(tmp_path) as spill:
        for run_id, value in added:
            spill.add(run_id, value)
        assert len(spill) == len(added)
        found = list(spill.runs())
        assert [run_id for run_id, _ in found] == sorted({r for r, _ in added})
        assert dict(found) == {
            "a": [b"a1", b"a2", b"a2"],
            "a-b": [b"ab1"],
            "b": [b"b1", b"b2"],
            "z": [b""],
            "é": [b"e1"],
        }
    assert list(tmp_path.iterdir()) == []


def test_an_empty_spill_has_no_runs(tmp_path: Path) -> None:
    with HistorySpill(tmp_path) as spill:
        assert list(spill.runs()) == []

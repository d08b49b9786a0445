"""The sitting's own logic: which commit goes first in each pass, and the table of its results."""

from __future__ import annotations

import json

from benchmarks.sitting import order, summarise


def test_passes_alternate_which_commit_goes_first() -> None:
    assert order(3) == [
        (1, "before"),
        (1, "after"),
        (2, "after"),
        (2, "before"),
        (3, "before"),
        (3, "after"),
    ]


def _lines(rate: float, cpu: float) -> list[str]:
    return [
        json.dumps({"figure": "session", "loadavg_1m": 2.0}),
        json.dumps({"peer": "flowstream-embedded", "run": "1", "tp_wf_per_s": rate}),
        json.dumps({"label": "flowstream-embedded-process", "cpu_s": cpu}),
        json.dumps({"label": "flowstream-embedded-broker (CPU)", "cpu_s": 9.0}),
        json.dumps({"peer": "flowstream-embedded-eager", "run": "1", "tp_wf_per_s": 50.0}),
        json.dumps({"label": "flowstream-embedded-eager-process", "cpu_s": 7.0}),
    ]


def test_the_table_gives_each_rows_rates_change_and_process_cpu() -> None:
    table = summarise(
        {
            "before": [_lines(100.0, 2.0), _lines(300.0, 2.5)],
            "after": [_lines(180.0, 2.2), _lines(180.0, 2.4)],
        }
    )
    rows = table.splitlines()
    assert len(rows) == 4
    assert rows[2] == (
        "| flowstream-embedded | 100, 300 | 180, 180 | -10.0 % | process 2.00, 2.50 → 2.20, 2.40 |"
    )
    assert rows[3].endswith("| +0.0 % | process 7.00, 7.00 → 7.00, 7.00 |")

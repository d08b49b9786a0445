"""``flowstream list`` and ``describe``: the embedded store's runs at a glance.

``list`` prints one line per run (id, status, workflow, last update, what it waits for), filtered
by ``--status`` and ``--workflow``; ``describe RUN`` prints the run's condition in one line (what
it waits for, or that nothing will move it), then its pending work: timers and retries with their
due times, hooks, signal waits, children. Both open the store read-only and take ``--json``.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from flowstream.cli.local import add_store_command, run_on_store
from flowstream.cli.options import print_json
from flowstream.engine import FlowEngine
from flowstream.engine.inspection import Suspension
from flowstream.model.snapshot import RunStatus

__all__ = ["register"]


def register(subparsers: Any) -> None:
    listing = add_store_command(
        subparsers,
        "list",
        "list the runs of the embedded store, with what each waits for",
        _list,
        json_help="one JSON array of {run_id, status, workflow, updated_at, condition}",
    )
    listing.add_argument(
        "--status",
        action="append",
        choices=[status.value for status in RunStatus],
        help="only runs with this status (repeatable)",
    )
    listing.add_argument("--workflow", action="append", help="only runs of this workflow name")
    describe = add_store_command(
        subparsers,
        "describe",
        "say in one line what a run waits for, then list its pending work",
        _describe,
        json_help="{run_id, status, workflow, condition, pending: [...]} as JSON",
    )
    describe.add_argument("run_id")


def _row(engine: FlowEngine, run_id: str, now: datetime) -> dict[str, Any]:
    snapshot = engine.snapshot(run_id)
    return {
        "run_id": run_id,
        "status": snapshot.status.value,
        "workflow": snapshot.spec.name,
        "updated_at": snapshot.updated_at.isoformat(timespec="seconds"),
        "condition": engine.condition(run_id, now=now).describe(),
    }


def _list(args: argparse.Namespace) -> int:
    async def work(engine: FlowEngine) -> None:
        now = datetime.now(UTC)
        rows = [_row(engine, run_id, now) for run_id in engine.list_runs()]
        rows = [
            row
            for row in rows
            if (not args.status or row["status"] in args.status)
            and (not args.workflow or row["workflow"] in args.workflow)
        ]
        if args.json:
            print_json(rows)
            return
        for row in rows:
            print(
                f"{row['run_id']:<24} {row['status']:<10} {row['workflow']:<16} "
                f"{row['updated_at']}  {row['condition']}"
            )

    return run_on_store(args, work, read_only=True)


def _pending(item: Suspension, now: datetime) -> dict[str, Any]:
    entry: dict[str, Any] = {"kind": item.kind, "id": item.subject_id}
    if item.due is not None:
        entry["due"] = item.due.isoformat(timespec="seconds")
        entry["overdue"] = item.due <= now
    return entry


def _describe(args: argparse.Namespace) -> int:
    async def work(engine: FlowEngine) -> None:
        now = datetime.now(UTC)
        row = _row(engine, args.run_id, now)
        suspensions = engine.list_open_suspensions(now, run_ids=[args.run_id])
        pending = [_pending(item, now) for item in suspensions]
        snapshot = engine.snapshot(args.run_id)
        running = [
            {"kind": "step", "id": step_id, "attempt": step.attempt}
            for step_id, step in sorted(snapshot.steps.items())
            if step.status.value == "running"
        ]
        if args.json:
            print_json({**row, "pending": running + pending})
            return
        print(f"{args.run_id}: {row['condition']}")
        print(f"  workflow {row['workflow']}, {row['status']}, updated {row['updated_at']}")
        for step in running:
            print(f"  step {step['id']}: attempt {step['attempt']} running")
        for entry in pending:
            due = ""
            if "due" in entry:
                due = f" due {entry['due']}" + (" (overdue)" if entry["overdue"] else "")
            print(f"  {entry['kind']} {entry['id']}{due}")
        if not running and not pending:
            print("  no pending work")

    return run_on_store(args, work, read_only=True)

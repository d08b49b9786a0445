"""``flowstream list`` and ``describe``: the embedded store's runs at a glance, from its run index.

``list`` prints one line per run (id, status, workflow, last update, what it waits for), the most
recently updated first, filtered by ``--status``, ``--workflow`` and update time, a page at a time
(``--limit``, ``--cursor``); it reads the store's run index, never a history. ``describe RUN``
prints the run's condition in one line (what it waits for, or that nothing will move it), its
index row, then its pending work: running steps, timers and retries with their due times, hooks,
signal waits, children. Both open the store read-only and take ``--json``. ``flowstream kafka
list`` and ``kafka describe`` print the same from a Kafka deployment's run index (the helpers
here are theirs too).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from flowstream.cli import UsageError
from flowstream.cli.local import add_store_command, run_on_store
from flowstream.cli.options import print_json
from flowstream.client import FlowClient
from flowstream.engine import FlowEngine
from flowstream.errors import RunNotFoundError
from flowstream.index.kafka import KafkaRunIndex
from flowstream.index.rows import MAX_LIMIT, RunPage, RunQuery, RunRow, open_items
from flowstream.model.snapshot import RunStatus, StepStatus
from flowstream.replay.liveness import condition
from flowstream.replay.state import RunState
from flowstream.settings import Settings

__all__ = [
    "add_index_arguments",
    "add_query_arguments",
    "kafka_describe",
    "kafka_list",
    "register",
]

LIST_JSON = "one JSON object {rows: [run rows], next_cursor}"
DESCRIBE_JSON = "the run's row with its condition and pending: [...], as JSON"


def register(subparsers: Any) -> None:
    listing = add_store_command(
        subparsers,
        "list",
        "list the runs of the embedded store, newest update first, with what each waits for",
        _list,
        json_help=LIST_JSON,
    )
    add_query_arguments(listing)
    describe = add_store_command(
        subparsers,
        "describe",
        "say in one line what a run waits for, then list its pending work",
        _describe,
        json_help=DESCRIBE_JSON,
    )
    describe.add_argument("run_id")


def add_query_arguments(parser: argparse.ArgumentParser) -> None:
    """``--status``, ``--workflow``, ``--updated-after``, ``--updated-before``, ``--limit`` and
    ``--cursor``: the filters and paging of a ``RunQuery``."""
    parser.add_argument(
        "--status",
        action="append",
        choices=[status.value for status in RunStatus],
        help="only runs with this status (repeatable)",
    )
    parser.add_argument(
        "--workflow", action="append", help="only runs of this workflow name (repeatable)"
    )
    parser.add_argument(
        "--updated-after", metavar="TIME", help="only runs updated at or after TIME (ISO 8601)"
    )
    parser.add_argument(
        "--updated-before", metavar="TIME", help="only runs updated before TIME (ISO 8601)"
    )
    parser.add_argument(
        "--limit", type=int, default=50, help=f"runs per page (default 50, at most {MAX_LIMIT})"
    )
    parser.add_argument("--cursor", help="the next page: the cursor the previous page ended with")


def _time(text: str | None, option: str) -> datetime | None:
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"{option} {text!r} is not an ISO 8601 time") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def query_of(args: argparse.Namespace) -> RunQuery:
    """The ``RunQuery`` of ``add_query_arguments``' options (bad values are bad usage)."""
    if not 1 <= args.limit <= MAX_LIMIT:
        raise UsageError(f"--limit must be from 1 to {MAX_LIMIT}")
    try:
        return RunQuery(
            status=None if args.status is None else frozenset(args.status),
            workflow=None if args.workflow is None else frozenset(args.workflow),
            updated_after=_time(args.updated_after, "--updated-after"),
            updated_before=_time(args.updated_before, "--updated-before"),
            limit=args.limit,
            cursor=args.cursor,
        )
    except ValidationError as exc:  # pragma: no cover - the checks above come first
        raise UsageError(str(exc)) from None


def print_page(page: RunPage, *, as_json: bool, more_command: str = "flowstream list") -> None:
    """A page: one line per run (with ``--json``, the page), then how to get the next one."""
    if as_json:
        print_json(page.model_dump(mode="json"))
        return
    for row in page.rows:
        updated = row.updated_at.isoformat(timespec="seconds")
        waiting = row.waiting_for or row.last_error or ""
        print(f"{row.run_id:<24} {row.status.value:<10} {row.workflow:<16} {updated}  {waiting}")
    if page.next_cursor is not None:
        print(f"more: {more_command} ... --cursor {page.next_cursor}", file=sys.stderr)


def pending_of(state: RunState) -> list[dict[str, Any]]:
    """A run's pending work: running steps, then its open suspensions (``due`` when timed)."""
    found: list[dict[str, Any]] = [
        {"kind": "step", "id": step_id, "attempt": step.attempt}
        for step_id, step in sorted(state.steps.items())
        if step.status is StepStatus.RUNNING
    ]
    for item in open_items(state):
        entry: dict[str, Any] = {"kind": item.kind, "id": item.subject_id}
        if item.due is not None:
            entry["due"] = item.due.isoformat(timespec="seconds")
        found.append(entry)
    return found


def print_description(
    row: RunRow, condition: str, state: RunState, *, as_json: bool, now: datetime
) -> None:
    """``describe``'s answer: the condition line, the row in brief, then the pending work."""
    pending = pending_of(state)
    for entry in pending:
        if "due" in entry:
            entry["overdue"] = datetime.fromisoformat(entry["due"]) <= now
    if as_json:
        print_json({**row.model_dump(mode="json"), "condition": condition, "pending": pending})
        return
    print(f"{row.run_id}: {condition}")
    updated = row.updated_at.isoformat(timespec="seconds")
    print(f"  workflow {row.workflow}, {row.status.value}, updated {updated}")
    for entry in pending:
        if entry["kind"] == "step":
            print(f"  step {entry['id']}: attempt {entry['attempt']} running")
            continue
        due = ""
        if "due" in entry:
            due = f" due {entry['due']}" + (" (overdue)" if entry["overdue"] else "")
        print(f"  {entry['kind']} {entry['id']}{due}")
    if not pending:
        print("  no pending work")


def _list(args: argparse.Namespace) -> int:
    query = query_of(args)

    async def work(engine: FlowEngine) -> None:
        print_page(engine.run_index().query(query), as_json=args.json)

    return run_on_store(args, work, read_only=True)


def _describe(args: argparse.Namespace) -> int:
    async def work(engine: FlowEngine) -> None:
        now = datetime.now(UTC)
        row = engine.run_index().get(args.run_id)
        if row is None:
            raise RunNotFoundError(args.run_id)
        condition = engine.condition(args.run_id, now=now).describe()
        state = engine.store.state(args.run_id)
        print_description(row, condition, state, as_json=args.json, now=now)

    return run_on_store(args, work, read_only=True)


# -- flowstream kafka list / describe ------------------------------------------------------------


def add_index_arguments(parser: argparse.ArgumentParser, json_help: str) -> None:
    """``--json``, and ``--index-dir`` and ``--rebuild``: where the Kafka verbs keep the run
    index."""
    parser.add_argument("--json", action="store_true", help=json_help)
    parser.add_argument(
        "--index-dir",
        type=Path,
        help="the run index's directory, kept current from the events topic (FLOWSTREAM_INDEX_DIR;"
        " default: one per bootstrap and prefix under ~/.cache/flowstream/run-index)",
    )
    parser.add_argument(
        "--rebuild", action="store_true", help="index the events topic again from its start"
    )


def index_directory(settings: Settings, given: Path | None) -> Path:
    """``--index-dir``, ``FLOWSTREAM_INDEX_DIR``, or the user's cache directory for this
    deployment (by bootstrap and topic prefix)."""
    if given is not None:
        return given
    if os.environ.get("FLOWSTREAM_INDEX_DIR"):
        return Path(os.environ["FLOWSTREAM_INDEX_DIR"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    where = hashlib.sha256(settings.bootstrap.encode()).hexdigest()[:12]
    return cache / "flowstream" / "run-index" / f"{settings.topic_prefix}-{where}"


def _kafka_index(args: argparse.Namespace, client: FlowClient) -> KafkaRunIndex:
    index = KafkaRunIndex(
        client.settings,
        index_directory(client.settings, args.index_dir),
        topology=client.topology,
        timeout=args.timeout,
        refresh=None,
    )
    try:
        if args.rebuild:
            index.rebuild()
        else:
            index.catch_up()
    except BaseException:
        index.close()
        raise
    return index


def kafka_list(args: argparse.Namespace, client: FlowClient) -> int:
    query = query_of(args)
    with _kafka_index(args, client) as index:
        print_page(index.query(query), as_json=args.json, more_command="flowstream kafka list")
    return 0


def kafka_describe(args: argparse.Namespace, client: FlowClient) -> int:
    with _kafka_index(args, client) as index:
        row = index.get(args.run_id)
        if row is None:
            raise RunNotFoundError(args.run_id)
        now = datetime.now(UTC)
        state = index.state(args.run_id)
        # As the topic shows it; its owner's scan drives a stalled run on.
        line = condition(state, now).describe(drive_command="flowstream kafka retry")
        print_description(row, line, state, as_json=args.json, now=now)
    return 0

"""Subcommands on the embedded store: demo, start, status, history, signal, hook, cancel, tick,
drive (``list`` and ``describe`` are in :mod:`flowstream.cli.inspect`).

Only ``demo`` and ``start`` create a store; every other command refuses a ``--data`` that holds
none (a mistyped path), and the read commands open the store read-only, so they work beside a
running embedded app. JSON options take ``@FILE`` or ``-`` (standard input) too.

``history RUN... --json`` exports histories in the format ``flowstream.testing.Replayer`` reads.

``status`` and ``drive`` lead with the run's liveness condition in one line (what it waits for,
or that nothing will move it); ``tick`` fires due deadlines and repairs stalled runs.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import secrets
import sys
import time
from datetime import UTC, datetime
from typing import Any

import orjson

from flowstream.cli import UsageError
from flowstream.cli.options import (
    JSON_FORMS,
    add_start_arguments,
    json_value,
    load_runtime,
    print_json,
)
from flowstream.engine import FlowEngine
from flowstream.model.events import EventEnvelope
from flowstream.model.snapshot import WorkflowRunSnapshot
from flowstream.replay.decide import token_digest
from flowstream.stores.rocksdb import RocksDBEventStore
from flowstream.testing.replayer import export_histories

DEFAULT_DATA = "flowstream-data"
DEFAULT_APP = "flowstream.examples.order:runtime"

__all__ = ["add_store_command", "load_runtime", "open_engine", "run_on_store"]


def add_store_command(
    subparsers: Any, name: str, help: str, handler: Any, *, json_help: str | None = None
) -> argparse.ArgumentParser:
    """A subcommand on the embedded store (``--data``, ``--app``; ``--json`` with ``json_help``)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(name, help=help)
    parser.add_argument(
        "--data",
        default=os.environ.get("FLOWSTREAM_DATA", DEFAULT_DATA),
        help=f"embedded store directory (default {DEFAULT_DATA}, env FLOWSTREAM_DATA)",
    )
    parser.add_argument(
        "--app",
        help=f"module:attribute of the FlowRuntime to drive runs with (FLOWSTREAM_APP, default "
        f"{DEFAULT_APP})",
    )
    if json_help is not None:
        parser.add_argument("--json", action="store_true", help=json_help)
    parser.set_defaults(handler=handler)
    return parser


def register(subparsers: Any) -> None:
    def add(
        name: str, help: str, handler: Any, json_help: str | None = None
    ) -> argparse.ArgumentParser:
        return add_store_command(subparsers, name, help, handler, json_help=json_help)

    snapshot_json = "print the run's snapshot as JSON"
    add("demo", "run the example order workflow on the embedded store", _demo)
    start = add("start", "start a run (idempotent by run id) and drive it", _start, snapshot_json)
    add_start_arguments(
        start,
        "the WorkflowSpec or @app.workflow function (ATTR defaults to SPEC); without --app "
        "the runtime is the workflow's module's",
    )
    status = add("status", "say why a run is (not) moving, then show its snapshot", _status)
    status.add_argument("run_id")
    status.add_argument("--json", action="store_true", help="only the snapshot, as JSON")
    drive = add("drive", "drive a run on (operator recovery) and say where it stands", _drive)
    drive.add_argument("run_id")
    history = add(
        "history",
        "list runs' committed events, under each run's id when several (export them with --json)",
        _history,
        "one JSON array of the runs' event envelopes, as flowstream.testing.Replayer reads",
    )
    history.add_argument("run_ids", nargs="*", metavar="RUN", help="runs (default: all)")
    signal = add("signal", "send a signal to a run", _signal, snapshot_json)
    signal.add_argument("run_id")
    signal.add_argument("name")
    signal.add_argument("--id", dest="signal_id", required=True, help="idempotency id")
    signal.add_argument("--payload", default="null", help=f"the payload: {JSON_FORMS}")
    hook = add("hook", "resume a hook by run and hook id, or by token", _hook, snapshot_json)
    hook.add_argument("--run", dest="run_id")
    hook.add_argument("--hook", dest="hook_id")
    hook.add_argument(
        "--token-stdin", action="store_true", help="read the hook token from standard input"
    )
    hook.add_argument("--payload", default="null", help="the payload: inline JSON or @FILE")
    cancel = add("cancel", "request cancellation of a run (or --force it)", _cancel, snapshot_json)
    cancel.add_argument("run_id")
    cancel.add_argument("--reason")
    cancel.add_argument("--force", action="store_true", help="end it without workflow code")
    add(
        "tick",
        "resume every run whose timer or retry is due, and repair stalled runs",
        _tick,
        "the resumed, repaired and failed runs as JSON",
    )


def open_engine(
    args: argparse.Namespace, *, create: bool = False, read_only: bool = False
) -> FlowEngine:
    """The engine over ``--data`` with ``--app``'s runtime (loaded before the store opens)."""
    runtime = load_runtime(args.app or os.environ.get("FLOWSTREAM_APP") or DEFAULT_APP)
    store = RocksDBEventStore(args.data, create=create, read_only=read_only)
    return FlowEngine(store, runtime)


def run_on_store(
    args: argparse.Namespace, work: Any, *, create: bool = False, read_only: bool = False
) -> int:
    """Run ``work(engine)`` over the store; errors end in main's one ``error:`` line."""
    engine = open_engine(args, create=create, read_only=read_only)
    try:
        asyncio.run(work(engine))
        return 0
    finally:
        engine.store.close()


def _said(args: argparse.Namespace, snapshot: WorkflowRunSnapshot) -> None:
    """A command's answer: ``RUN: status``, or the snapshot with ``--json``."""
    if args.json:
        print_json(snapshot.model_dump(mode="json"))
    else:
        print(f"{snapshot.run_id}: {snapshot.status.value}")


def describe(envelope: EventEnvelope) -> str:
    """One line per event; payloads are summarised, never dumped (they may hold secrets)."""
    event = envelope.event
    details = [
        f"{name}={value}"
        for name in ("step_id", "attempt", "wait_id", "hook_id", "signal_id", "child_id")
        if (value := getattr(event, name, None)) is not None
    ]
    if (error := getattr(event, "error", None)) is not None:
        details.append(f"error={error!r}")
    if (retry_after := getattr(event, "retry_after", None)) is not None:
        details.append(f"retry_after={retry_after.isoformat(timespec='milliseconds')}")
    if (resume_at := getattr(event, "resume_at", None)) is not None:
        details.append(f"resume_at={resume_at.isoformat(timespec='milliseconds')}")
    stamp = envelope.timestamp.isoformat(timespec="milliseconds")
    return f"{envelope.sequence:>4}  {stamp}  {event.event_key():<32} {' '.join(details)}"


def _demo(args: argparse.Namespace) -> int:
    token = secrets.token_urlsafe(24)
    run_id = f"order-{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
    order: dict[str, Any] = {
        "order_id": run_id.removeprefix("order-"),
        "sku": "sku-8842",
        "quantity": 2,
        "amount_cents": 4599,
        "approval_token_digest": token_digest(token),
    }

    async def work(engine: FlowEngine) -> None:
        def show(batch: list[EventEnvelope]) -> None:
            for envelope in batch:
                print(describe(envelope))

        engine.store.add_listener(show)
        from flowstream.examples.order import SPEC

        print(f"store: {args.data}   run: {run_id}\n")
        snapshot = await engine.start(run_id, SPEC, order)
        while not snapshot.is_terminal:
            print(f"\n-- {run_id} is {snapshot.status.value}: ", end="")
            wakeup = engine.next_wakeup()
            if any(h.status == "active" for h in snapshot.hooks.values()):
                print("a manager approves through the hook token (redacted)")
                snapshot = await engine.resume_hook_by_token(token, {"manager": "dana"})
            elif any(w.status == "waiting" for w in snapshot.signal_waits.values()):
                print("the warehouse sends the 'shipped' signal")
                snapshot = await engine.send_signal(
                    run_id, f"{run_id}-shipped", "shipped", {"carrier": "DHL", "parcel": "p-77"}
                )
            elif wakeup is not None:
                delay = max(0.0, (wakeup.due - datetime.now(UTC)).total_seconds())
                print(f"{wakeup.kind} {wakeup.subject_id} due in {delay:.2f}s; sleeping")
                time.sleep(delay)
                await engine.resume_due()
                snapshot = engine.snapshot(run_id)
            else:
                raise UsageError("the demo run stalled unexpectedly")
        print(f"\n-- final snapshot of {run_id}")
        print(orjson.dumps(snapshot.model_dump(mode="json"), option=orjson.OPT_INDENT_2).decode())
        print(f"\ntry: flowstream status {run_id}   |   flowstream history {run_id}")

    return run_on_store(args, work, create=True)


def _status(args: argparse.Namespace) -> int:
    async def work(engine: FlowEngine) -> None:
        snapshot = engine.snapshot(args.run_id)
        if not args.json:
            print(f"{args.run_id}: {engine.condition(args.run_id).describe()}")
        print(orjson.dumps(snapshot.model_dump(mode="json"), option=orjson.OPT_INDENT_2).decode())

    return run_on_store(args, work, read_only=True)


def _start(args: argparse.Namespace) -> int:
    from flowstream.cli.kafka import load_spec

    spec = load_spec(args.workflow)
    data = json_value(args.input, "--input")
    args.app = args.app or os.environ.get("FLOWSTREAM_APP") or args.workflow.partition(":")[0]

    async def work(engine: FlowEngine) -> None:
        snapshot = await engine.start(args.run_id, spec, data)
        if args.json:
            print_json(snapshot.model_dump(mode="json"))
        else:
            print(f"{args.run_id}: {engine.condition(args.run_id).describe()}")

    return run_on_store(args, work, create=True)


def _drive(args: argparse.Namespace) -> int:
    async def work(engine: FlowEngine) -> None:
        snapshot = await engine.drive(args.run_id, retry_task=True)  # an operator retry
        print(f"{snapshot.run_id}: {engine.condition(snapshot.run_id).describe()}")

    return run_on_store(args, work)


def _history(args: argparse.Namespace) -> int:
    async def work(engine: FlowEngine) -> None:
        histories = [engine.history(run_id) for run_id in args.run_ids or engine.list_runs()]
        if args.json:
            print(export_histories(histories).decode())
            return
        for history in histories:
            if len(histories) > 1 and history:  # several runs: each under its id
                print(f"{history[0].run_id}:")
            for envelope in history:
                print(describe(envelope))

    return run_on_store(args, work, read_only=True)


def _signal(args: argparse.Namespace) -> int:
    payload = json_value(args.payload, "--payload")

    async def work(engine: FlowEngine) -> None:
        _said(args, await engine.send_signal(args.run_id, args.signal_id, args.name, payload))

    return run_on_store(args, work)


def _hook(args: argparse.Namespace) -> int:
    if args.token_stdin and args.payload == "-":
        raise UsageError("--token-stdin reads the token from stdin: give --payload as @FILE")
    payload = json_value(args.payload, "--payload")
    token: str | None = None
    if args.token_stdin:
        token = sys.stdin.readline().strip() if not sys.stdin.isatty() else getpass.getpass()
    elif not (args.run_id and args.hook_id):
        raise UsageError("give --run and --hook, or --token-stdin")

    async def work(engine: FlowEngine) -> None:
        if token is not None:
            snapshot = await engine.resume_hook_by_token(token, payload)
        else:
            snapshot = await engine.resume_hook(args.run_id, args.hook_id, payload)
        _said(args, snapshot)

    return run_on_store(args, work)


def _cancel(args: argparse.Namespace) -> int:
    async def work(engine: FlowEngine) -> None:
        if args.force:
            snapshot = await engine.force_cancel(args.run_id, args.reason)
        else:
            snapshot = await engine.request_cancellation(args.run_id, args.reason)
        _said(args, snapshot)

    return run_on_store(args, work)


def _tick(args: argparse.Namespace) -> int:
    async def work(engine: FlowEngine) -> None:
        tick = await engine.resume_due()
        if args.json:
            failed = {run_id: str(error) for run_id, error in tick.failed.items()}
            print_json({"resumed": tick.resumed, "repaired": tick.repaired, "failed": failed})
            return
        print(f"resumed {len(tick.resumed)} run(s), repaired {len(tick.repaired)} stalled run(s)")
        for run_id, error in tick.failed.items():
            print(f"{run_id}: {error}", file=sys.stderr)

    return run_on_store(args, work)

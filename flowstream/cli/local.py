"""Subcommands on the embedded store: demo, status, history, signal, hook, cancel, tick, drive.

``history RUN... --json`` exports histories in the format ``flowstream.testing.Replayer`` reads.

``status`` and ``drive`` lead with the run's liveness condition in one line (what it waits for,
or that nothing will move it); ``tick`` fires due deadlines and repairs stalled runs.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import importlib
import os
import secrets
import sys
import time
from datetime import UTC, datetime
from typing import Any

import orjson

from flowstream.engine import FlowEngine
from flowstream.errors import FlowError
from flowstream.model.events import EventEnvelope
from flowstream.replay.decide import token_digest
from flowstream.runtime import FlowRuntime
from flowstream.stores.rocksdb import RocksDBEventStore
from flowstream.testing.replayer import export_histories

DEFAULT_DATA = "flowstream-data"
DEFAULT_APP = "flowstream.examples.order:runtime"


def register(subparsers: Any) -> None:
    def add(name: str, help: str, handler: Any) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = subparsers.add_parser(name, help=help)
        parser.add_argument(
            "--data",
            default=os.environ.get("FLOWSTREAM_DATA", DEFAULT_DATA),
            help=f"embedded store directory (default {DEFAULT_DATA}, env FLOWSTREAM_DATA)",
        )
        parser.add_argument(
            "--app",
            default=os.environ.get("FLOWSTREAM_APP", DEFAULT_APP),
            help="module:attribute of the FlowRuntime to drive runs with",
        )
        parser.set_defaults(handler=handler)
        return parser

    add("demo", "run the example order workflow on the embedded store", _demo)
    status = add("status", "say why a run is (not) moving, then show its snapshot", _status)
    status.add_argument("run_id")
    status.add_argument("--json", action="store_true", help="only the snapshot, as JSON")
    drive = add("drive", "drive a run on (operator recovery) and say where it stands", _drive)
    drive.add_argument("run_id")
    history = add("history", "list runs' committed events (export them with --json)", _history)
    history.add_argument("run_ids", nargs="*", metavar="RUN", help="runs (default: all)")
    history.add_argument(
        "--json",
        action="store_true",
        help="one JSON array of the runs' event envelopes, as flowstream.testing.Replayer reads",
    )
    signal = add("signal", "send a signal to a run", _signal)
    signal.add_argument("run_id")
    signal.add_argument("name")
    signal.add_argument("--id", dest="signal_id", required=True, help="idempotency id")
    signal.add_argument("--payload", default="null", help="JSON payload")
    hook = add("hook", "resume a hook by run and hook id, or by token", _hook)
    hook.add_argument("--run", dest="run_id")
    hook.add_argument("--hook", dest="hook_id")
    hook.add_argument(
        "--token-stdin", action="store_true", help="read the hook token from standard input"
    )
    hook.add_argument("--payload", default="null", help="JSON payload")
    cancel = add("cancel", "request cancellation of a run (or --force it)", _cancel)
    cancel.add_argument("run_id")
    cancel.add_argument("--reason")
    cancel.add_argument("--force", action="store_true", help="end it without workflow code")
    add("tick", "resume every run whose timer or retry is due, and repair stalled runs", _tick)


def load_runtime(spec: str) -> FlowRuntime:
    """The runtime at ``module:attribute`` (without an attribute: ``runtime``, else ``app``)."""
    module_name, _, attribute = spec.partition(":")
    module = importlib.import_module(module_name)
    runtime = getattr(module, attribute) if attribute else getattr(module, "runtime", None)
    if runtime is None:
        runtime = getattr(module, "app", None)
    if not isinstance(runtime, FlowRuntime):
        raise SystemExit(f"{spec} is not a FlowRuntime (needs run_workflow and run_step)")
    return runtime


def _engine(args: argparse.Namespace) -> tuple[FlowEngine, RocksDBEventStore]:
    store = RocksDBEventStore(args.data)
    return FlowEngine(store, load_runtime(args.app)), store


def _run(args: argparse.Namespace, work: Any) -> int:
    try:
        engine, store = _engine(args)
    except FlowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(work(engine))
        return 0
    except FlowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()


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
                raise SystemExit("the demo run stalled unexpectedly")
        print(f"\n-- final snapshot of {run_id}")
        print(orjson.dumps(snapshot.model_dump(mode="json"), option=orjson.OPT_INDENT_2).decode())
        print(f"\ntry: flowstream status {run_id}   |   flowstream history {run_id}")

    return _run(args, work)


def _status(args: argparse.Namespace) -> int:
    async def work(engine: FlowEngine) -> None:
        snapshot = engine.snapshot(args.run_id)
        if not args.json:
            print(f"{args.run_id}: {engine.condition(args.run_id).describe()}")
        print(orjson.dumps(snapshot.model_dump(mode="json"), option=orjson.OPT_INDENT_2).decode())

    return _run(args, work)


def _drive(args: argparse.Namespace) -> int:
    async def work(engine: FlowEngine) -> None:
        snapshot = await engine.drive(args.run_id, retry_task=True)  # an operator retry
        print(f"{snapshot.run_id}: {engine.condition(snapshot.run_id).describe()}")

    return _run(args, work)


def _history(args: argparse.Namespace) -> int:
    async def work(engine: FlowEngine) -> None:
        histories = [engine.history(run_id) for run_id in args.run_ids or engine.list_runs()]
        if args.json:
            print(export_histories(histories).decode())
            return
        for history in histories:
            for envelope in history:
                print(describe(envelope))

    return _run(args, work)


def _payload(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise SystemExit(f"--payload is not JSON: {exc}") from exc


def _signal(args: argparse.Namespace) -> int:
    payload = _payload(args.payload)

    async def work(engine: FlowEngine) -> None:
        snapshot = await engine.send_signal(args.run_id, args.signal_id, args.name, payload)
        print(f"{snapshot.run_id}: {snapshot.status.value}")

    return _run(args, work)


def _hook(args: argparse.Namespace) -> int:
    payload = _payload(args.payload)
    token: str | None = None
    if args.token_stdin:
        token = sys.stdin.readline().strip() if not sys.stdin.isatty() else getpass.getpass()
    elif not (args.run_id and args.hook_id):
        raise SystemExit("give --run and --hook, or --token-stdin")

    async def work(engine: FlowEngine) -> None:
        if token is not None:
            snapshot = await engine.resume_hook_by_token(token, payload)
        else:
            snapshot = await engine.resume_hook(args.run_id, args.hook_id, payload)
        print(f"{snapshot.run_id}: {snapshot.status.value}")

    return _run(args, work)


def _cancel(args: argparse.Namespace) -> int:
    async def work(engine: FlowEngine) -> None:
        if args.force:
            snapshot = await engine.force_cancel(args.run_id, args.reason)
        else:
            snapshot = await engine.request_cancellation(args.run_id, args.reason)
        print(f"{snapshot.run_id}: {snapshot.status.value}")

    return _run(args, work)


def _tick(args: argparse.Namespace) -> int:
    async def work(engine: FlowEngine) -> None:
        tick = await engine.resume_due()
        print(f"resumed {len(tick.resumed)} run(s), repaired {len(tick.repaired)} stalled run(s)")
        for run_id, error in tick.failed.items():
            print(f"{run_id}: {error}", file=sys.stderr)

    return _run(args, work)

"""``flowstream worker``: run a processor (a consumer-group member) until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import gc
import logging
import signal
import sys
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from flowstream.cli import UsageError
from flowstream.cli.kafka import problems
from flowstream.cli.options import load_runtime
from flowstream.errors import FlowError
from flowstream.kafka.clients import KafkaError, KafkaException
from flowstream.runtime import FlowRuntime
from flowstream.settings import Settings


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "worker", help="run a Kafka stream processor for a FlowRuntime"
    )
    parser.add_argument("--app", help="module:attribute of the runtime for unpinned runs")
    parser.add_argument(
        "--build",
        action="append",
        default=[],
        metavar="BUILD=module:attribute",
        help="serve runs pinned to BUILD with this runtime (repeatable)",
    )
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (FLOWSTREAM_BOOTSTRAP)")
    parser.add_argument("--group", help="consumer group (FLOWSTREAM_GROUP)")
    parser.add_argument(
        "--prefix", dest="topic_prefix", help="topic prefix (FLOWSTREAM_TOPIC_PREFIX)"
    )
    parser.add_argument("--state-dir", help="RocksDB state directory (FLOWSTREAM_STATE_DIR)")
    parser.add_argument("--instance-id", help="stable id of this process (FLOWSTREAM_INSTANCE_ID)")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    parser.add_argument(
        "--metrics-host",
        help="address the metrics server binds (FLOWSTREAM_METRICS_HOST, default 127.0.0.1)",
    )
    parser.add_argument(
        "--eager-steps",
        action="store_true",
        default=None,
        help="start each step as soon as it is decided, before its step_started commits "
        "(FLOWSTREAM_EAGER_STEPS; README, 'When a step starts')",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        help="DEBUG, INFO, WARNING, ERROR or CRITICAL (default INFO)",
    )
    parser.set_defaults(handler=_worker)


_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def runtimes_from(app: str | None, builds: list[str]) -> dict[str | None, FlowRuntime]:
    runtimes: dict[str | None, FlowRuntime] = {}
    if app:
        runtimes[None] = load_runtime(app)
    for item in builds:
        build, sep, target = item.partition("=")
        if not sep or not build or not target:
            raise UsageError(f"--build needs BUILD=module:attribute, got {item!r}")
        runtimes[build] = load_runtime(target)
    if not runtimes:
        raise UsageError("give --app and/or --build")
    return runtimes


def _print_tasks() -> None:
    for task in asyncio.all_tasks():
        task.print_stack(file=sys.stderr)


#: The worker's collector thresholds. A decision allocates a few hundred short-lived objects
#: (models, datums, dicts) while the run cache holds many long-lived ones; with Python's default
#: (700, 10, 10) the collector ran so often that raising it cut the worker's CPU by 12-19 % and
#: added 5-20 % to its throughput (``benchmarks/workload.py kafka``, interleaved), with the same
#: peak memory.
GC_THRESHOLDS = (50_000, 20, 100)


def worker_settings(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Settings:
    """The worker's settings: ``FLOWSTREAM_*`` variables, overridden by the options given."""
    return Settings.from_env(
        environ,
        bootstrap=args.bootstrap,
        group=args.group,
        topic_prefix=args.topic_prefix,
        state_dir=args.state_dir,
        instance_id=args.instance_id,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        app=args.app,
        eager_steps=args.eager_steps,
    )


def _worker(args: argparse.Namespace) -> int:
    from flowstream.processor.health import HealthCheck
    from flowstream.processor.worker import Processor

    gc.set_threshold(*GC_THRESHOLDS)
    if args.log_level.upper() not in _LOG_LEVELS:
        raise UsageError(f"--log-level {args.log_level!r} is not one of {', '.join(_LOG_LEVELS)}")
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        settings = worker_settings(args)
    except ValidationError as exc:
        print(f"error: {problems(exc)}", file=sys.stderr)
        return 2
    runtimes = runtimes_from(args.app if args.app or not args.build else None, args.build)
    if args.app is None and not args.build:
        runtimes = runtimes_from(settings.app, [])
    processor = Processor(settings, runtimes)
    health = HealthCheck(processor)
    if settings.metrics_port is not None:
        try:
            processor.metrics.serve(settings.metrics_port, settings.metrics_host, health=health)
        except OSError as exc:
            where = f"{settings.metrics_host}:{settings.metrics_port}"
            print(f"error: cannot serve metrics on {where}: {exc.strerror}", file=sys.stderr)
            return 2

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        health.attach(loop)
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        # ``kill -USR1 <pid>`` prints where a stuck processor waits: every task's coroutine
        # stack (when the loop still turns), then every thread's stack.
        loop.add_signal_handler(signal.SIGUSR1, _print_tasks)
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=True)
        await processor.run(stop)

    try:
        asyncio.run(main())
    except FlowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KafkaException as exc:
        error = exc.args[0] if exc.args else exc
        fenced = getattr(error, "code", lambda: None)() == KafkaError._FENCED
        if fenced:
            print(
                "error: this processor's producer was fenced again and again: does another "
                "process run with its instance id? Give each processor its own --instance-id",
                file=sys.stderr,
            )
        else:
            print(f"error: fatal Kafka error: {error}", file=sys.stderr)
        return 3
    return 0

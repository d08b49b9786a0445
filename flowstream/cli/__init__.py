"""The ``flowstream`` command line: it parses arguments and calls the library.

Each subcommand family lives in its own module with a ``register(subparsers)`` function; this
module only assembles them. Library code never prints; only these modules do.

Every failure ends in one ``error: ...`` line on standard error and an exit code (the table is in
docs/cli.md); ``flowstream --debug COMMAND`` (or ``FLOWSTREAM_DEBUG=1``) shows the traceback
instead.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from flowstream.errors import FlowError
from flowstream.stores.rocksdb import corrupt_store

__all__ = ["EXIT_ERROR", "EXIT_USAGE", "UsageError", "main"]

#: The command failed: a refused command, an unknown run, no broker, a store that is missing,
#: locked or corrupt...
EXIT_ERROR = 1
#: Bad usage: arguments that do not parse or do not make sense, an ``--app`` that does not load.
EXIT_USAGE = 2

#: Modules that contribute subcommands, in help order.
_COMMAND_MODULES = (
    "flowstream.cli.local",
    "flowstream.cli.inspect",
    "flowstream.cli.gateway",
    "flowstream.cli.devkafka",
    "flowstream.cli.topics",
    "flowstream.cli.worker",
    "flowstream.cli.kafka",
    "flowstream.cli.audit",
    "flowstream.cli.completion",
)


class UsageError(Exception):
    """Arguments or options that parse but cannot be used (exit 2, one ``error:`` line)."""


def _version() -> str:
    try:
        return version("flowstream")
    except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flowstream",
        description="Durable workflows over an event history, on Kafka or embedded RocksDB.",
        epilog="Exit codes: 0 done; 1 the command failed; 2 bad usage; 3 an awaited run ended "
        "without completing; 4 a Kafka command is parked (docs/cli.md).",
    )
    parser.add_argument(
        "--version", action="version", version=f"flowstream {_version()} (python {_python()})"
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        default=os.environ.get("FLOWSTREAM_DEBUG", "") not in ("", "0"),
        help="show the traceback of an error (FLOWSTREAM_DEBUG=1)",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    _debug_everywhere(subparsers)
    return parser


def _debug_everywhere(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``--debug`` after any command or verb too (it leaves the top level's default alone)."""
    for command in subparsers.choices.values():
        command.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                _debug_everywhere(action)


def _python() -> str:
    return ".".join(str(part) for part in sys.version_info[:3])


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.debug:
        # librdkafka's lines (a broker that does not answer: one per retry) go to this logger;
        # a command that is not a worker says what failed in one line instead.
        logging.getLogger("flowstream.kafka").addHandler(logging.NullHandler())
    try:
        code: int = args.handler(args)
    except Exception as exc:
        if args.debug:
            raise
        return _fail(args, exc)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return code


def _fail(args: argparse.Namespace, exc: Exception) -> int:
    code = EXIT_USAGE if isinstance(exc, UsageError) else EXIT_ERROR
    data = getattr(args, "data", None)
    if data is not None and not isinstance(exc, FlowError):
        exc = corrupt_store(Path(data), exc)
    message = str(exc) if isinstance(exc, FlowError | UsageError) else _unexpected(exc)
    print(f"error: {' '.join(message.split()) or type(exc).__name__}", file=sys.stderr)
    return code


def _unexpected(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = f" {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}{where} (flowstream --debug shows the traceback)"
    return f"{type(exc).__name__}: {exc} (flowstream --debug shows the traceback)"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

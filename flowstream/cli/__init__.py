"""The ``flowstream`` command line: it parses arguments and calls the library.

Each subcommand family lives in its own module with a ``register(subparsers)`` function; this
module only assembles them. Library code never prints; only these modules do.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

#: Modules that contribute subcommands, in help order.
_COMMAND_MODULES = (
    "flowstream.cli.local",
    "flowstream.cli.devkafka",
    "flowstream.cli.topics",
    "flowstream.cli.worker",
    "flowstream.cli.kafka",
    "flowstream.cli.audit",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flowstream",
        description="Durable workflows over an event history, on Kafka or embedded RocksDB.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = args.handler
    code: int = handler(args)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

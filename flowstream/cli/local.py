"""Subcommands that work on the embedded store (demo, status, history)."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    demo = subparsers.add_parser("demo", help="run the example order workflow embedded")
    demo.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    print("flowstream demo: not built yet")
    return 0

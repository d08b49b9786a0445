"""Options every command family shares: JSON values given inline, as ``@FILE`` or ``-``
(standard input), and loading a runtime from ``module:attribute``."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import orjson

from flowstream.cli import UsageError
from flowstream.model.base import JSON
from flowstream.runtime import FlowRuntime

__all__ = ["add_start_arguments", "json_value", "load_runtime", "print_json"]

#: How a JSON option may be given.
JSON_FORMS = "inline JSON, @FILE, or - for standard input"


def add_start_arguments(parser: argparse.ArgumentParser, workflow_help: str) -> None:
    """RUN, ``--workflow`` and ``--input``: a start's arguments, embedded and on Kafka."""
    parser.add_argument("run_id")
    parser.add_argument("--workflow", required=True, metavar="MODULE[:ATTR]", help=workflow_help)
    parser.add_argument("--input", default="null", help=f"the run's input: {JSON_FORMS}")


def json_value(text: str | None, option: str) -> JSON:
    """The JSON of an option: inline, ``@FILE`` (a file's content) or ``-`` (standard input, so a
    payload of any size can be piped in). ``None`` stays ``None``."""
    if text is None:
        return None
    raw: bytes | str = text
    if text == "-":
        raw = sys.stdin.buffer.read()
    elif text.startswith("@"):
        try:
            raw = Path(text[1:]).read_bytes()
        except OSError as exc:
            raise UsageError(f"{option}: cannot read {text[1:]}: {exc.strerror}") from None
    try:
        value: JSON = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise UsageError(f"{option} is not JSON: {exc}") from None
    return value


def print_json(value: object) -> None:
    print(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())


def load_runtime(spec: str) -> FlowRuntime:
    """The runtime at ``module:attribute`` (without an attribute: ``runtime``, else ``app``)."""
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module_name.startswith(exc.name):
            raise  # the module was found; something it imports is missing
        raise UsageError(
            f"--app {spec}: no module named {exc.name!r} (is its directory on PYTHONPATH? "
            "the flowstream script does not add the current directory)"
        ) from None
    if attribute:
        if not hasattr(module, attribute):
            raise UsageError(f"--app {spec}: module {module_name} has no attribute {attribute!r}")
        runtime = getattr(module, attribute)
    else:
        runtime = getattr(module, "runtime", None) or getattr(module, "app", None)
    if not isinstance(runtime, FlowRuntime):
        raise UsageError(f"--app {spec} is not a FlowRuntime (needs run_workflow and run_step)")
    return runtime

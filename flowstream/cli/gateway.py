"""``flowstream gateway`` (embedded) and ``flowstream kafka gateway``: the HTTP gateway.

Embedded, the gateway opens the store of ``--data`` with the runtime of ``--app`` and hosts it
(it fires the runs' timers while it serves); over Kafka it is a client of the deployment
(``--bootstrap``, ``--prefix``), whose processors run the runs. The workflows ``POST /api/runs``
may start are those of ``--app`` (an ``App``'s) and of each ``--workflow MODULE[:ATTR]``.

The bearer token comes from ``FLOWSTREAM_GATEWAY_TOKEN`` or ``--token-file`` (never from an
option: a command line is visible to every user of the machine); without one the gateway does
not start, unless ``--no-auth`` serves it without a credential, on a loopback address, for local
development. docs/gateway.md has the API.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from flowstream.cli import UsageError
from flowstream.model.spec import WorkflowSpec
from flowstream.runtime import FlowRuntime

__all__ = ["register", "register_kafka"]

_DESCRIPTION = (
    "Serve runs over HTTP: start, signal, cancel, retry, status, history and list under /api "
    "(a bearer token from FLOWSTREAM_GATEWAY_TOKEN or --token-file), a webhook URL per hook "
    "(POST /hooks/TOKEN resumes that hook), the OpenAPI description at /openapi.json and the "
    "web console at /. Stop it with ^C."
)


def _add_serving(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host", help="the address to listen on (FLOWSTREAM_GATEWAY_HOST, default 127.0.0.1)"
    )
    parser.add_argument(
        "--port", type=int, help="the port to listen on (FLOWSTREAM_GATEWAY_PORT, default 8080)"
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        help="a file holding the bearer token (default: FLOWSTREAM_GATEWAY_TOKEN)",
    )
    parser.add_argument(
        "--no-auth",
        action="store_true",
        default=None,
        help="serve without a credential: local development only (a loopback --host alone)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        help="refuse request bodies larger than this (default 1048576)",
    )
    parser.add_argument(
        "--workflow",
        action="append",
        default=[],
        metavar="MODULE[:ATTR]",
        help="a WorkflowSpec (or @app.workflow function) POST /api/runs may start (repeatable)",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        help="the level of the gateway's log and its access log (default INFO)",
    )


def register(subparsers: Any) -> None:
    """``flowstream gateway``: the embedded gateway (it creates the store if there is none)."""
    from flowstream.cli.local import add_store_command

    parser = add_store_command(
        subparsers, "gateway", "serve the embedded store's runs over HTTP", _embedded
    )
    parser.description = _DESCRIPTION
    _add_serving(parser)


def register_kafka(verbs: Any, common: argparse.ArgumentParser) -> None:
    """``flowstream kafka gateway``: the gateway as a client of a deployment."""
    parser = verbs.add_parser(
        "gateway",
        help="serve a deployment's runs over HTTP",
        description=_DESCRIPTION,
        parents=[common],
    )
    parser.add_argument(
        "--app", help="a runtime whose App workflows POST /api/runs may start (module:attribute)"
    )
    parser.add_argument(
        "--index-dir",
        type=Path,
        help="the run index's directory, kept current from the events topic (default: the "
        "deployment's one under ~/.cache/flowstream/run-index, with .gateway appended)",
    )
    _add_serving(parser)
    parser.set_defaults(handler=_kafka)


# -- plumbing -----------------------------------------------------------------------------


def _settings(args: argparse.Namespace) -> Any:
    try:
        from flowstream.gateway.settings import GatewaySettings
    except ImportError as exc:  # pragma: no cover - the extra is part of the test install
        raise UsageError(
            f"the gateway needs FastAPI and uvicorn: pip install 'flowstream[gateway]' ({exc})"
        ) from None
    token = None
    if args.token_file is not None:
        try:
            token = args.token_file.read_text().strip()
        except OSError as exc:
            raise UsageError(
                f"--token-file: cannot read {args.token_file}: {exc.strerror}"
            ) from None
    try:
        return GatewaySettings.from_env(
            host=args.host,
            port=args.port,
            token=token,
            no_auth=args.no_auth,
            max_body_bytes=args.max_body_bytes,
        )
    except ValidationError as exc:  # said without the input: it holds the token
        said = []
        for item in exc.errors(include_input=False):
            where = ".".join(str(p) for p in item["loc"])
            message = item["msg"].removeprefix("Value error, ")
            said.append(f"{where}: {message}" if where else message)
        raise UsageError("; ".join(said)) from None


def _log(level: str) -> None:
    try:
        logging.basicConfig(level=level.upper(), format="%(levelname)s %(name)s: %(message)s")
    except ValueError:
        raise UsageError(f"--log-level {level}: not a level (DEBUG, INFO, WARNING...)") from None


def _workflows(runtime: FlowRuntime | None, targets: list[str]) -> dict[str, WorkflowSpec]:
    """The startable workflows: an ``App``'s, then each ``--workflow``'s (by name)."""
    from flowstream.app import App
    from flowstream.cli.kafka import load_spec

    found: dict[str, WorkflowSpec] = {}
    if isinstance(runtime, App):
        found.update({name: d.spec for name, d in runtime.workflows.items()})
    for target in targets:
        spec = load_spec(target)
        found[spec.name] = spec
    return found


def _serve(backend: Any, settings: Any) -> None:
    from flowstream.gateway.app import create_app
    from flowstream.gateway.server import serve

    try:
        serve(create_app(backend, settings), settings)
    except KeyboardInterrupt:  # uvicorn stops on ^C, then raises it again: a normal stop
        pass


def _embedded(args: argparse.Namespace) -> int:
    from flowstream.cli.local import open_engine
    from flowstream.gateway.embedded import EmbeddedBackend

    settings = _settings(args)
    _log(args.log_level)
    engine = open_engine(args, create=True)
    try:
        workflows = _workflows(engine.runtime, args.workflow)
        backend = EmbeddedBackend(engine, workflows, command_timeout=settings.command_timeout)
        _serve(backend, settings)
    finally:
        engine.store.close()
    return 0


def _kafka(args: argparse.Namespace) -> int:
    from flowstream.cli.inspect import index_directory
    from flowstream.cli.kafka import _require_topics
    from flowstream.cli.options import load_runtime
    from flowstream.client import FlowClient
    from flowstream.gateway.kafka import KafkaBackend
    from flowstream.index import KafkaRunIndex
    from flowstream.settings import Settings
    from flowstream.topology import (
        CMD_CANCEL,
        CMD_HOOK,
        CMD_SIGNAL,
        CMD_START,
        EVENTS,
        load_topology,
    )

    settings = _settings(args)
    _log(args.log_level)
    kafka = Settings.from_env(bootstrap=args.bootstrap, topic_prefix=args.topic_prefix)
    topology = load_topology(args.topology)
    _require_topics(
        kafka,
        topology,
        (CMD_START, CMD_SIGNAL, CMD_HOOK, CMD_CANCEL, EVENTS),
        args.timeout,
    )
    runtime = load_runtime(args.app) if args.app else None
    workflows = _workflows(runtime, args.workflow)
    # Its own directory by default: the gateway holds it open, beside `flowstream kafka list`.
    default = index_directory(kafka, None)
    directory = args.index_dir or default.with_name(default.name + ".gateway")
    # refresh=0: every read catches up first, so a command answered shows in the next read.
    index = KafkaRunIndex(kafka, directory, topology=topology, timeout=args.timeout, refresh=0)
    backend = KafkaBackend(
        lambda: FlowClient(kafka, topology=topology, timeout=settings.command_timeout),
        workflows,
        index,
        command_timeout=settings.command_timeout,
    )
    _serve(backend, settings)
    return 0

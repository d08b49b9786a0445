"""``flowstream kafka start|wait|status|history|list|describe|signal|hook|cancel|retry|outcome``:
runs on a Kafka deployment.

The embedded commands (``flowstream status``, ``signal``… of :mod:`flowstream.cli.local`) execute
a run inside this process against a RocksDB directory. These *send* a command to the run's
partition of a command topic, for whichever processor owns it to apply, wait for its outcome
(``--no-wait``: send and return), and read runs back from the events topic. Same verbs, another
meaning and other options (``--bootstrap``, ``--prefix``, ``--topology`` instead of ``--data``,
``--app``), hence a group of their own.

* Before anything is sent or read, the topics involved must exist with the topology's partition
  count: a command routed with another count would land on a partition that does not own its run.
* Starting is idempotent by run id and signalling by signal id (processors enforce both), so any
  command may be sent again with the same ids; a start of an existing run with another spec or
  input is refused (``RunConflictError``), as in embedded mode.
* A command's outcome is written by the processor that applied it, in the same transaction; the
  verb prints it in one line (``applied``, or ``noop`` with why) and exits 0, or exits non-zero
  with the processor's reason: 1 refused (an unknown run, a wrong token, an input that does not
  validate...), 4 parked (its run does not exist yet, its build is not served: it applies if it
  can within the parked time-to-live). ``--timeout`` bounds the wait. ``--command-id`` names
  the command (default: a new id, printed with ``--no-wait``); ``outcome ID --run RUN`` reads
  what became of it, from any machine.
* ``retry`` asks the run's owner to drive it again now: after the code its workflow raised in
  was fixed and deployed, say (``applied``). A run that ended answers ``noop``; an unknown run
  is refused. ``wait`` on a run that does not exist says so at once (exit 1).
* ``list`` and ``describe`` read the deployment's run index (``KafkaRunIndex``), a directory
  kept current from the events topic: each call first reads what was committed since the last
  (``--index-dir``, default one per deployment in the user's cache; ``--rebuild`` reads the
  topic again from its start). The rows and their JSON are the embedded ``list``'s.
* ``hook --token-stdin`` reads a hook token from standard input (without echo on a terminal) and
  resumes the hook by the token alone. No option takes a token and nothing prints one.
* Standard output carries the answer (a confirmation, a snapshot, history lines, a run's output),
  standard error the rest. Exit codes: 0 done; 1 error (broker, topics, unknown run, a refused
  command, time out); 2 bad usage; 3 an awaited run ended without completing; 4 the command is
  parked.
"""

from __future__ import annotations

import argparse
import getpass
import importlib
import sys
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from flowstream.cli import UsageError
from flowstream.cli.inspect import (
    DESCRIBE_JSON,
    LIST_JSON,
    add_index_arguments,
    add_query_arguments,
    kafka_describe,
    kafka_list,
)
from flowstream.cli.options import JSON_FORMS, add_start_arguments, json_value
from flowstream.cli.repartition import register as register_repartition
from flowstream.client import FlowClient
from flowstream.errors import (
    CommandParkedError,
    FlowError,
    InvalidIdentifierError,
    RunNotFoundError,
)
from flowstream.kafka import clients
from flowstream.model.base import JSON
from flowstream.model.messages import CommandOutcome
from flowstream.model.snapshot import RunStatus, WorkflowRunSnapshot
from flowstream.model.spec import WorkflowSpec
from flowstream.outcomes import new_command_id
from flowstream.replay.liveness import condition
from flowstream.replay.state import RunState
from flowstream.settings import Settings
from flowstream.topology import (
    CMD_CANCEL,
    CMD_HOOK,
    CMD_SIGNAL,
    CMD_START,
    EVENTS,
    Topology,
    TopologyError,
    load_topology,
)
from flowstream.workflow import WORKFLOW_ATTRIBUTE

__all__ = ["problems", "register"]

#: The awaited run ended failed, cancelled or continued as new.
EXIT_NOT_COMPLETED = 3
#: The command is parked: it applies once it can, within the parked time-to-live.
EXIT_PARKED = 4


_Work = Callable[[argparse.Namespace, FlowClient], int]


_DESCRIPTION = (
    "Send start, signal, hook, cancel and retry commands to the processors of a Kafka deployment "
    "and read runs back from its events topic. Unlike the embedded commands (flowstream "
    "status, signal, ...), nothing runs here: the processor that owns the run's partition "
    "applies each command; each verb waits for its outcome (--no-wait: send and return). "
    "Starting is idempotent by run id and signalling by signal id. Exit codes: 0 done; 1 error "
    "(a refused command among them); 2 bad usage; 3 an awaited run ended without completing; "
    "4 the command is parked."
)


#: Read errors that pass once partition leadership settles.
_TRANSIENT_CODES = frozenset(
    {
        clients.KafkaError.NOT_LEADER_FOR_PARTITION,
        clients.KafkaError.LEADER_NOT_AVAILABLE,
        clients.KafkaError.UNKNOWN_TOPIC_OR_PART,
        clients.KafkaError._TIMED_OUT,
        clients.KafkaError._TRANSPORT,
    }
)


class _UsageError(UsageError):
    """Arguments that parse but do not make sense together (exit 2)."""


def register(subparsers: Any) -> None:
    text = "send commands to a Kafka deployment and read runs from its events topic"
    parser = subparsers.add_parser("kafka", help=text, description=_DESCRIPTION)
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--bootstrap",
        help="Kafka bootstrap servers (FLOWSTREAM_BOOTSTRAP, default 127.0.0.1:19092)",
    )
    common.add_argument(
        "--prefix", dest="topic_prefix", help="topic prefix (FLOWSTREAM_TOPIC_PREFIX)"
    )
    common.add_argument(
        "--topology",
        type=Path,
        help="topology file (default $FLOWSTREAM_TOPOLOGY or topology/topics.toml)",
    )
    common.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds to wait for the brokers, a read, an outcome or an awaited result "
        "(default 30)",
    )
    sending = argparse.ArgumentParser(add_help=False)
    sending.add_argument(
        "--no-wait",
        action="store_true",
        help="send the command and return, without waiting for its outcome",
    )
    sending.add_argument(
        "--command-id",
        help="the command's id (default: a new one); `flowstream kafka outcome ID --run RUN` "
        "reads what became of it",
    )

    def add(
        name: str, help: str, work: _Work, suffixes: Iterable[str], *, reads: bool = False
    ) -> argparse.ArgumentParser:
        parents = [common] if reads else [common, sending]
        verb: argparse.ArgumentParser = verbs.add_parser(
            name, help=help, description=help, parents=parents
        )
        # A command's outcome is read from the events topic.
        needed = tuple(suffixes) if reads else tuple(dict.fromkeys((*suffixes, EVENTS)))
        verb.set_defaults(handler=_handler(work, needed, reads=reads))
        return verb

    start = add("start", "start a run (idempotent by run id)", _start, (CMD_START, EVENTS))
    add_start_arguments(
        start,
        "the WorkflowSpec (or @app.workflow function) to pin the run to (ATTR defaults to SPEC)",
    )
    start.add_argument(
        "--wait", action="store_true", help="wait until the run ends and print its output"
    )
    wait = add("wait", "wait until a run ends and print its output", _wait, (EVENTS,), reads=True)
    wait.add_argument("run_id")
    status = add(
        "status",
        "show a run's snapshot, read from the events topic",
        _status,
        (EVENTS,),
        reads=True,
    )
    status.add_argument("run_id")
    history = add(
        "history",
        "list runs' committed events (export them with --json)",
        _history,
        (EVENTS,),
        reads=True,
    )
    history.add_argument("run_ids", nargs="+", metavar="RUN")
    history.add_argument(
        "--json",
        action="store_true",
        help="one JSON array of the runs' event envelopes, as flowstream.testing.Replayer reads",
    )

    signal = add("signal", "send a signal to a run (idempotent by --id)", _signal, (CMD_SIGNAL,))
    signal.add_argument("run_id")
    signal.add_argument("name")
    signal.add_argument("--id", dest="signal_id", required=True, help="idempotency id")
    signal.add_argument("--payload", default="null", help=f"the payload: {JSON_FORMS}")

    hook = add(
        "hook", "resume (or --dispose) a hook by --run and --hook, or by token", _hook, (CMD_HOOK,)
    )
    hook.add_argument("--run", dest="run_id", help="the run that owns the hook")
    hook.add_argument("--hook", dest="hook_id", help="the hook's id in that run")
    hook.add_argument(
        "--token-stdin",
        action="store_true",
        help="read the hook's token from standard input instead of naming the hook",
    )
    hook.add_argument("--payload", help="the payload: inline JSON or @FILE (default null)")
    hook.add_argument("--dispose", action="store_true", help="dispose of the hook, no payload")

    cancel = add("cancel", "request cancellation of a run (or --force it)", _cancel, (CMD_CANCEL,))
    cancel.add_argument("run_id")
    cancel.add_argument("--reason")
    cancel.add_argument("--force", action="store_true", help="end it without workflow code")

    retry = add("retry", "drive a run again now (after a fix)", _retry, (CMD_CANCEL,))
    retry.add_argument("run_id")

    listing = add(
        "list",
        "list the deployment's runs from its run index, newest update first",
        kafka_list,
        (EVENTS,),
        reads=True,
    )
    add_query_arguments(listing)
    add_index_arguments(listing, LIST_JSON)
    describe = add(
        "describe",
        "say in one line what a run waits for, then list its pending work",
        kafka_describe,
        (EVENTS,),
        reads=True,
    )
    describe.add_argument("run_id")
    add_index_arguments(describe, DESCRIBE_JSON)

    outcome = add(
        "outcome",
        "show what became of a command, by its id, read from its events partition",
        _outcome_of,
        (EVENTS,),
        reads=True,
    )
    outcome.add_argument("command_id")
    outcome.add_argument("--run", dest="run_id", required=True, help="the run it addressed")
    register_repartition(verbs, common)
    importlib.import_module("flowstream.cli.gateway").register_kafka(verbs, common)


# -- plumbing -----------------------------------------------------------------------------


def _handler(
    work: _Work, suffixes: tuple[str, ...], *, reads: bool
) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        prefix = "error:"
        settings: Settings | None = None
        try:
            settings = Settings.from_env(bootstrap=args.bootstrap, topic_prefix=args.topic_prefix)
            topology = load_topology(args.topology)
            _require_topics(settings, topology, suffixes, args.timeout)
            client = FlowClient(settings, topology=topology)
            if reads:
                return _retrying(work, args, client)
            return work(args, client)
        except UsageError as exc:
            print(f"{prefix} {exc}", file=sys.stderr)
            return 2
        except ValidationError as exc:
            print(f"{prefix} {problems(exc)}", file=sys.stderr)
            return 2
        except InvalidIdentifierError as exc:  # a bad run id, refused before anything is sent
            print(f"{prefix} {exc}", file=sys.stderr)
            return 2
        except CommandParkedError as exc:
            print(f"parked: {exc}", file=sys.stderr)
            return EXIT_PARKED
        except (FlowError, TimeoutError) as exc:
            print(f"{prefix} {exc}", file=sys.stderr)
            return 1
        except clients.KafkaException as exc:
            where = settings.bootstrap if settings is not None else args.bootstrap
            print(f"{prefix} Kafka at {where}: {exc}", file=sys.stderr)
            return 1

    return run


def _retrying(work: _Work, args: argparse.Namespace, client: FlowClient) -> int:
    """Run a read-only verb again while the brokers answer with a transient error.

    Right after topics are created, a broker may still answer offset requests for a partition
    it is about to lead with "not leader"; a read is safe to repeat.
    """
    deadline = time.monotonic() + args.timeout
    while True:
        try:
            return work(args, client)
        except clients.KafkaException as exc:
            error = exc.args[0] if exc.args else None
            transient = isinstance(error, clients.KafkaError) and (
                error.retriable() or error.code() in _TRANSIENT_CODES
            )
            if not transient or time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def _require_topics(
    settings: Settings, topology: Topology, suffixes: Iterable[str], timeout: float
) -> None:
    """The topics exist with the topology's partition count, or a ``TopologyError`` says why."""
    admin = clients.new_admin(settings.bootstrap)
    try:
        metadata = admin.list_topics(timeout=timeout)
    except clients.KafkaException:
        raise TopologyError(
            f"no Kafka broker answered at {settings.bootstrap} within {timeout:g} s "
            "(set --bootstrap or FLOWSTREAM_BOOTSTRAP)"
        ) from None
    for suffix in suffixes:
        name = topology.name(suffix, settings.topic_prefix)
        topic = metadata.topics.get(name)
        if topic is None or topic.error is not None:
            raise TopologyError(
                f"topic {name} does not exist at {settings.bootstrap}: check --prefix, or create "
                "the topics with `flowstream topics apply`"
            )
        if len(topic.partitions) != topology.run_partitions:
            raise TopologyError(
                f"topic {name} has {len(topic.partitions)} partitions but the topology declares "
                f"{topology.run_partitions}; runs would be routed to the wrong partitions "
                "(check --topology)"
            )


def problems(error: ValidationError) -> str:
    """A validation error in one line, without the input (a hook command may hold a token)."""
    return "; ".join(
        f"{'.'.join(str(p) for p in item['loc'])}: {item['msg'].removeprefix('Value error, ')}"
        for item in error.errors(include_input=False)
    )


def _json(text: str | None, option: str) -> JSON:
    return json_value(text, option)


def load_spec(target: str) -> WorkflowSpec:
    """The ``WorkflowSpec`` at ``module:attribute`` (attribute ``SPEC`` when omitted), or the
    spec of the ``@app.workflow`` function there."""
    module_name, _, attribute = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise _UsageError(f"--workflow {target}: cannot import {module_name}: {exc}") from None
    spec = getattr(module, attribute or "SPEC", None)
    registered = getattr(spec, WORKFLOW_ATTRIBUTE, None)
    if registered is not None:
        spec = registered.spec
    if not isinstance(spec, WorkflowSpec):
        raise _UsageError(f"--workflow {target} is not a WorkflowSpec")
    return spec


def _show(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


def _outcome(snapshot: WorkflowRunSnapshot) -> int:
    """Print a terminal run's output (exit 0), or say how it ended otherwise (exit 3)."""
    if snapshot.status is RunStatus.COMPLETED:
        print(_show(snapshot.output))
        return 0
    said = f"run {snapshot.run_id} ended {snapshot.status.value}"
    if snapshot.error:
        said += f": {snapshot.error}"
    if snapshot.outcome is not None and snapshot.outcome.successor_run_id:
        said += f"; its successor is run {snapshot.outcome.successor_run_id}"
    print(said, file=sys.stderr)
    return EXIT_NOT_COMPLETED


# -- verbs --------------------------------------------------------------------------------


def _command_id(args: argparse.Namespace) -> str:
    given: str | None = args.command_id
    return given or new_command_id()


def _said(done: str, outcome: CommandOutcome | None, command_id: str) -> str:
    """What a verb prints: ``sent …`` (and the command's id) without waiting, else the outcome
    (and why, if given)."""
    if outcome is None:
        return f"sent {done} (command {command_id})"
    said = f"{done}: {outcome.status.value}"
    return f"{said} ({outcome.reason})" if outcome.reason else said


def _start(args: argparse.Namespace, client: FlowClient) -> int:
    if args.wait and args.no_wait:
        raise _UsageError("--wait waits for the run to end: it cannot go with --no-wait")
    spec = load_spec(args.workflow)
    data = _json(args.input, "--input")
    command_id = _command_id(args)
    outcome = client.start(
        args.run_id,
        spec,
        data,
        command_id=command_id,
        wait=not args.no_wait,
        timeout=args.timeout,
    )
    client.flush(args.timeout)
    said = _said(
        f"start of run {args.run_id} (workflow {spec.name} version {spec.version})",
        outcome,
        command_id,
    )
    if not args.wait:
        print(said)
        return 0
    print(f"{said}; waiting for it to end", file=sys.stderr)
    return _outcome(client.wait(args.run_id, timeout=args.timeout))


def _wait(args: argparse.Namespace, client: FlowClient) -> int:
    try:
        snapshot = client.wait(args.run_id, timeout=args.timeout, must_exist=True)
    except RunNotFoundError:
        waiting = client.parked(args.run_id, timeout=args.timeout)
        if not waiting:
            raise
        raise FlowError(
            f"run {args.run_id} has not started; commands for it wait: {'; '.join(waiting)}",
            run_id=args.run_id,
        ) from None
    return _outcome(snapshot)


def _status(args: argparse.Namespace, client: FlowClient) -> int:
    """The run's snapshot with its condition line, plus the commands parked for it (e.g.
    waiting for its build)."""
    waiting = client.parked(args.run_id, timeout=args.timeout)
    try:
        state = RunState.from_history(client.history(args.run_id, timeout=args.timeout))
        shown: dict[str, Any] = state.snapshot().model_dump(mode="json")
        # Why the run is (not) moving, in one line (as the topic shows it; its owner's scan
        # drives a stalled run on).
        found = condition(state, datetime.now(UTC))
        shown["condition"] = found.describe(drive_command="flowstream kafka retry")
    except RunNotFoundError:
        if not waiting:
            raise
        shown = {"run_id": args.run_id, "status": "not started"}
    if waiting:
        shown["waiting_commands"] = waiting
    print(_show(shown))
    return 0


def _history(args: argparse.Namespace, client: FlowClient) -> int:
    from flowstream.cli.local import describe
    from flowstream.testing.replayer import export_histories

    histories = [client.history(run_id, timeout=args.timeout) for run_id in args.run_ids]
    if args.json:
        print(export_histories(histories).decode())
        return 0
    for history in histories:
        for envelope in history:
            print(describe(envelope))
    return 0


def _signal(args: argparse.Namespace, client: FlowClient) -> int:
    payload = _json(args.payload, "--payload")
    command_id = _command_id(args)
    outcome = client.signal(
        args.run_id,
        args.name,
        payload,
        id=args.signal_id,
        command_id=command_id,
        wait=not args.no_wait,
        timeout=args.timeout,
    )
    client.flush(args.timeout)
    done = f"signal {args.name} (id {args.signal_id}) to run {args.run_id}"
    print(_said(done, outcome, command_id))
    return 0


def _read_token() -> str:
    token = getpass.getpass("hook token: ") if sys.stdin.isatty() else sys.stdin.readline()
    token = token.strip()
    if not token:
        raise _UsageError("--token-stdin: standard input held no token")
    return token


def _hook(args: argparse.Namespace, client: FlowClient) -> int:
    if args.token_stdin and (args.run_id or args.hook_id or args.dispose):
        raise _UsageError("--token-stdin addresses the hook by its token alone")
    if not args.token_stdin and not (args.run_id and args.hook_id):
        raise _UsageError("give --run and --hook, or --token-stdin and the token on stdin")
    if args.dispose and args.payload is not None:
        raise _UsageError("--dispose takes no --payload")
    payload = _json(args.payload, "--payload")
    command_id = _command_id(args)
    options: dict[str, Any] = {
        "command_id": command_id,
        "wait": not args.no_wait,
        "timeout": args.timeout,
    }
    if args.token_stdin:
        outcome = client.resume_hook_by_token(_read_token(), payload, **options)
        done = "hook resumption by token"
        if outcome is not None:  # followed to the hook's run
            done += f" to run {outcome.key}"
    elif args.dispose:
        outcome = client.dispose_hook(args.run_id, args.hook_id, **options)
        done = f"disposal of hook {args.hook_id} to run {args.run_id}"
    else:
        outcome = client.resume_hook(args.run_id, args.hook_id, payload, **options)
        done = f"resumption of hook {args.hook_id} to run {args.run_id}"
    client.flush(args.timeout)
    print(_said(done, outcome, command_id))
    return 0


def _cancel(args: argparse.Namespace, client: FlowClient) -> int:
    command_id = _command_id(args)
    outcome = client.cancel(
        args.run_id,
        args.reason,
        force=args.force,
        command_id=command_id,
        wait=not args.no_wait,
        timeout=args.timeout,
    )
    client.flush(args.timeout)
    what = "forced cancellation" if args.force else "cancellation request"
    print(_said(f"{what} to run {args.run_id}", outcome, command_id))
    return 0


def _retry(args: argparse.Namespace, client: FlowClient) -> int:
    command_id = _command_id(args)
    outcome = client.retry(
        args.run_id, command_id=command_id, wait=not args.no_wait, timeout=args.timeout
    )
    client.flush(args.timeout)
    print(_said(f"retry of run {args.run_id}", outcome, command_id))
    return 0


def _outcome_of(args: argparse.Namespace, client: FlowClient) -> int:
    """Every outcome of the command so far, oldest first (a parked one's later outcome, a
    forwarded one's on the run it went on to), as a JSON array."""
    found = client.outcomes(args.command_id, args.run_id, timeout=args.timeout)
    if not found:
        raise FlowError(
            f"no outcome of command {args.command_id} for run {args.run_id} (yet): check the "
            "id and the run, and that a processor owns the run's partition",
            run_id=args.run_id,
        )
    print(_show([o.model_dump(mode="json", exclude={"type"}) for o in found]))
    return 0

"""``flowstream kafka …`` against the real broker: runs of the example order workflow are driven by
a real ``flowstream worker`` process and by nothing but CLI calls, made in-process through
``flowstream.cli.main`` with stdout and stderr captured."""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from flowstream import codec
from flowstream.cli import main
from flowstream.kafka import clients
from flowstream.model.messages import CancelRun, CommandMessage, ResumeHook, SendSignal
from flowstream.partitioning import partition_for
from flowstream.replay.decide import token_digest
from flowstream.topology import default_topology_path, load_topology
from tests.processor.harness import Worker, apply_topics

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]

WORKFLOW = "flowstream.examples.order"  # its SPEC, served by the worker below
PARTITIONS = load_topology().run_partitions


@dataclass(frozen=True)
class Deployment:
    bootstrap: str
    prefix: str
    worker: Worker


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return orjson.loads(self.out)


Cli = Callable[..., Result]


@pytest.fixture(scope="module")
def deployment(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    """The topics under a fresh prefix and one processor serving the example order runtime."""
    prefix = f"t-cli-{uuid.uuid4().hex[:8]}"
    apply_topics(kafka_bootstrap, prefix)
    state = tmp_path_factory.mktemp("cli-worker")
    worker = Worker(
        "cli-w1",
        bootstrap=kafka_bootstrap,
        prefix=prefix,
        group=f"{prefix}-group",
        state_dir=state,
        step_log=state / "steps.jsonl",
        app="flowstream.examples.order:runtime",
    )
    try:
        yield Deployment(kafka_bootstrap, prefix, worker)
    finally:
        code = worker.stop()
        assert code == 0, worker.output()[-3000:]


@pytest.fixture
def cli(
    deployment: Deployment, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Cli:
    """``cli("status", run_id)`` runs ``flowstream kafka status RUN --bootstrap … --prefix …``."""

    def run(verb: str, *argv: str, stdin: str | None = None, connect: bool = True) -> Result:
        if stdin is not None:
            monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        where = ["--bootstrap", deployment.bootstrap, "--prefix", deployment.prefix]
        capsys.readouterr()
        try:
            code = main(["kafka", verb, *(where if connect else []), *argv])
        except SystemExit as exit:  # argparse rejected the arguments
            code = int(exit.code or 0)
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


def order(run_id: str, *, approval_token: str | None = None) -> str:
    data = {"order_id": run_id, "sku": "sku-1", "quantity": 2, "amount_cents": 4599}
    if approval_token is not None:
        data["approval_token_digest"] = token_digest(approval_token)
    return orjson.dumps(data).decode()


def status_until(cli: Cli, run_id: str, ready: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Poll ``flowstream kafka status`` until ``ready(snapshot)``."""
    deadline = time.monotonic() + 60
    snapshot: dict[str, Any] = {}
    while time.monotonic() < deadline:
        result = cli("status", run_id)
        if result.code == 0:
            snapshot = result.json()
            if ready(snapshot):
                return snapshot
        else:
            assert "does not exist" in result.err, result.err
        time.sleep(0.2)
    raise AssertionError(f"run {run_id} never got ready; last snapshot: {snapshot}")


def history_keys(result: Result) -> list[str]:
    """Event keys of ``flowstream kafka history`` lines, checking sequences are 1, 2, …"""
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert [int(line.split()[0]) for line in lines] == list(range(1, len(lines) + 1)), result.out
    return [line.split()[2] for line in lines]


def commands_on(bootstrap: str, topic: str, key: str) -> list[CommandMessage]:
    """Every record with ``key`` on its partition of ``topic``, decoded."""
    consumer = clients.new_consumer(bootstrap, f"{topic}-inspect", {"enable.partition.eof": True})
    partition = partition_for(key, PARTITIONS)
    consumer.assign([clients.TopicPartition(topic, partition, 0)])
    found: list[CommandMessage] = []
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            for message in consumer.consume(100, 0.5):
                error = message.error()
                if error is not None:
                    if error.code() == clients.KafkaError._PARTITION_EOF:
                        return found
                    continue
                if message.key() == key.encode():
                    found.append(codec.decode_command(message.value() or b""))
    finally:
        consumer.close()
    raise AssertionError(f"did not reach the end of {topic}[{partition}]")


def test_an_order_run_is_driven_through_the_cli_alone(cli: Cli, deployment: Deployment) -> None:
    run_id = f"order-{uuid.uuid4().hex[:8]}"
    token = f"approval-{uuid.uuid4().hex}"

    started = cli(
        "start", run_id, "--workflow", WORKFLOW, "--input", order(run_id, approval_token=token)
    )
    assert started.code == 0, started.err
    assert started.out == f"start of run {run_id} (workflow order version 1): applied\n"

    waiting = status_until(
        cli, run_id, lambda s: s["hooks"].get("approval", {}).get("status") == "active"
    )
    assert waiting["status"] == "suspended"
    assert waiting["steps"]["charge"]["attempt"] == 2  # failed once, retried after its delay
    assert waiting["condition"] == "waiting for hook approval"

    hooked = cli("hook", "--token-stdin", "--payload", '{"manager": "dana"}', stdin=f"{token}\n")
    assert (hooked.code, hooked.out) == (0, f"hook resumption by token to run {run_id}: applied\n")
    status_until(
        cli, run_id, lambda s: s["signal_waits"].get("shipment", {}).get("status") == "waiting"
    )

    # Idempotent by signal id and by run id: the repeats change nothing.
    for answer in ("applied", "noop (a duplicate: the run holds it already)"):
        signalled = cli(
            "signal",
            run_id,
            "shipped",
            "--id",
            f"{run_id}-shipped",
            "--payload",
            '{"parcel": "p-77"}',
        )
        assert signalled.code == 0, signalled.err
        said = f"signal shipped (id {run_id}-shipped) to run {run_id}: {answer}\n"
        assert signalled.out == said
    again = cli(
        "start", run_id, "--workflow", WORKFLOW, "--input", order(run_id, approval_token=token)
    )
    assert again.code == 0, again.err
    assert again.out.endswith(f"noop (run {run_id} exists with the same spec and input)\n")

    waited = cli("wait", run_id, "--timeout", "60")
    assert waited.code == 0, waited.err + deployment.worker.output()[-2000:]
    assert waited.json() == {
        "order_id": run_id,
        "reservation": {"reservation_id": f"res-{run_id}", "sku": "sku-1"},
        "receipt": {"receipt": f"rcpt-flow:{run_id}:charge", "attempt": 2},
        "approved_by": {"manager": "dana"},
        "shipment": {"parcel": "p-77"},
    }

    final = cli("status", run_id)
    assert final.code == 0 and final.json()["status"] == "completed"
    assert final.json()["output"] == waited.json()
    assert final.json()["condition"] == "completed"

    keys = history_keys(cli("history", run_id))
    assert keys[:2] == ["flow.run.created", "flow.run.started"]
    assert keys[-1] == "flow.run.completed"
    for once in (
        "flow.run.created",
        "flow.hook.received",
        "flow.signal.received",
        "flow.wait.completed",
    ):
        assert keys.count(once) == 1, keys
    assert keys.count("flow.step.completed") == 3
    assert token not in "".join(r.out + r.err for r in (started, hooked, waited, final, again))


def test_start_waits_for_a_run_signalled_before_it_existed(cli: Cli) -> None:
    run_id = f"early-{uuid.uuid4().hex[:8]}"
    signalled = cli("signal", run_id, "shipped", "--id", "s-1", "--payload", '{"carrier": "DHL"}')
    assert (signalled.code, signalled.out) == (4, ""), signalled.err
    assert signalled.err == (
        f"parked: run {run_id} does not exist (yet): the signal is "
        "parked until it starts (for the parked time-to-live at most)\n"
    )

    result = cli(
        "start",
        run_id,
        "--workflow",
        f"{WORKFLOW}:SPEC",
        "--input",
        order(run_id),
        "--wait",
        "--timeout",
        "60",
    )

    assert result.code == 0, result.err
    assert "waiting for it to end" in result.err
    output = result.json()  # stdout holds the run's output and nothing else
    assert output["shipment"] == {"carrier": "DHL"}
    assert output["approved_by"] is None


def test_a_hook_resumed_by_run_and_id_then_a_forced_cancellation(cli: Cli) -> None:
    run_id = f"cancel-{uuid.uuid4().hex[:8]}"
    started = cli(
        "start", run_id, "--workflow", WORKFLOW, "--input", order(run_id, approval_token="t")
    )
    assert started.code == 0, started.err
    status_until(cli, run_id, lambda s: s["hooks"].get("approval", {}).get("status") == "active")
    hooked = cli("hook", "--run", run_id, "--hook", "approval", "--payload", '{"manager": "ana"}')
    assert (hooked.code, hooked.out) == (
        0,
        f"resumption of hook approval to run {run_id}: applied\n",
    )
    waiting = status_until(
        cli, run_id, lambda s: s["signal_waits"].get("shipment", {}).get("status") == "waiting"
    )
    assert waiting["hooks"]["approval"]["payload"] == {"manager": "ana"}

    cancelled = cli("cancel", run_id, "--force", "--reason", "customer left")
    assert (cancelled.code, cancelled.out) == (0, f"forced cancellation to run {run_id}: applied\n")

    waited = cli("wait", run_id, "--timeout", "60")
    assert waited.code == 3, waited.out + waited.err
    assert waited.out == ""
    assert f"run {run_id} ended cancelled" in waited.err
    assert cli("status", run_id).json()["status"] == "cancelled"
    assert history_keys(cli("history", run_id))[-1] == "flow.run.cancelled"


def test_commands_carry_the_ids_and_options_given(cli: Cli, deployment: Deployment) -> None:
    # This run does not exist: the cancellation is refused, the signal parked (fine here).
    run_id = f"ghost-{uuid.uuid4().hex[:8]}"
    assert cli("cancel", run_id, "--reason", "why not").code == 1
    assert cli("signal", run_id, "shipped", "--id", "sig-9", "--payload", "[1, 2]").code == 4

    (cancel,) = commands_on(deployment.bootstrap, f"{deployment.prefix}.cmd.cancel", run_id)
    assert cancel.command_id  # a new one, generated by the client
    assert cancel == CancelRun(
        run_id=run_id, reason="why not", force=False, command_id=cancel.command_id
    )
    (signal,) = commands_on(deployment.bootstrap, f"{deployment.prefix}.cmd.signal", run_id)
    assert signal.command_id and signal.command_id != cancel.command_id
    assert signal == SendSignal(
        run_id=run_id,
        signal_id="sig-9",
        name="shipped",
        payload=[1, 2],
        command_id=signal.command_id,
    )


def test_a_hook_token_comes_from_stdin_and_is_never_shown(cli: Cli, deployment: Deployment) -> None:
    token = f"secret-{uuid.uuid4().hex}"
    digest = token_digest(token)
    topic = f"{deployment.prefix}.cmd.hook"

    sent = cli("hook", "--token-stdin", "--payload", '{"ok": true}', stdin=f"{token}\n")

    # No hook holds that token: refused, in one line that does not show it.
    assert (sent.code, sent.out) == (1, ""), sent.err
    assert sent.err == ("error: no hook is registered for the presented token\n")
    assert token not in sent.out + sent.err
    # Keyed by the token's digest: the partition that indexes the token finds the hook's run.
    (command,) = commands_on(deployment.bootstrap, topic, digest)
    assert isinstance(command, ResumeHook)
    assert command.token is not None and command.token.get_secret_value() == token
    assert (command.run_id, command.hook_id, command.payload) == (None, None, {"ok": True})

    empty = cli("hook", "--token-stdin", stdin="\n")
    assert empty.code == 2 and "held no token" in empty.err
    both = cli("hook", "--run", "r", "--hook", "approval", "--token-stdin", stdin=f"{token}\n")
    assert both.code == 2 and token not in both.out + both.err
    assert len(commands_on(deployment.bootstrap, topic, digest)) == 1


def test_errors_say_what_is_wrong(cli: Cli, deployment: Deployment, tmp_path: Path) -> None:
    missing = cli("status", "no-such-run")
    assert (missing.code, missing.out) == (1, "")
    assert "run no-such-run does not exist" in missing.err

    prefix = cli("status", "x", "--prefix", "t-cli-nothing-here")  # the later --prefix wins
    assert prefix.code == 1 and "flowstream topics apply" in prefix.err

    unreachable = cli("history", "x", "--bootstrap", "127.0.0.1:1", "--timeout", "1", connect=False)
    assert unreachable.code == 1 and "no Kafka broker answered at 127.0.0.1:1" in unreachable.err

    other = tmp_path / "topics.toml"
    other.write_text(
        default_topology_path().read_text().replace(f"partitions = {PARTITIONS}", "partitions = 3")
    )
    wrong_count = cli("signal", "x", "shipped", "--id", "s", "--topology", str(other))
    assert wrong_count.code == 1 and "the topology declares 3" in wrong_count.err

    assert cli("start", "bad id!", "--workflow", WORKFLOW).code == 2
    not_json = cli("start", "r", "--workflow", WORKFLOW, "--input", "{nope")
    assert not_json.code == 2 and "--input is not JSON" in not_json.err
    not_spec = cli("start", "r", "--workflow", "flowstream.examples.order:runtime")
    assert not_spec.code == 2 and "is not a WorkflowSpec" in not_spec.err


def test_settings_come_from_the_environment(
    cli: Cli, deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWSTREAM_BOOTSTRAP", deployment.bootstrap)
    monkeypatch.setenv("FLOWSTREAM_TOPIC_PREFIX", deployment.prefix)
    run_id = f"env-{uuid.uuid4().hex[:8]}"
    sent = cli("cancel", run_id, "--force", "--no-wait", connect=False)
    assert sent.code == 0, sent.err
    (command,) = commands_on(deployment.bootstrap, f"{deployment.prefix}.cmd.cancel", run_id)
    assert command.command_id
    said = f"sent forced cancellation to run {run_id} (command {command.command_id})\n"
    assert sent.out == said
    assert command == CancelRun(run_id=run_id, force=True, command_id=command.command_id)


def one_line_error(result: Result, code: int, verb: str) -> str:
    """The reason of a verb that failed with ``code``: one line on stderr, nothing on stdout."""
    assert (result.code, result.out) == (code, ""), result.out + result.err
    lines = result.err.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.err, result.err
    # A failure says error:, a parked command (exit 4) says parked:.
    assert lines[0].startswith("parked: " if code == 4 else "error: "), (verb, result.err)
    return lines[0]


def test_a_start_that_conflicts_exits_non_zero_without_the_old_output(cli: Cli) -> None:
    run_id = f"conflict-{uuid.uuid4().hex[:8]}"
    first = cli("start", run_id, "--workflow", WORKFLOW, "--input", order(run_id))
    assert first.code == 0, first.err
    other = order(run_id).replace('"quantity":2', '"quantity":3')
    assert other != order(run_id)

    for wait in ((), ("--wait",)):
        refused = cli("start", run_id, "--workflow", WORKFLOW, "--input", other, *wait)
        said = one_line_error(refused, 1, "start")
        assert said == f"error: run {run_id}: workflow input differs"


def test_a_start_whose_input_does_not_validate_exits_non_zero(cli: Cli) -> None:
    run_id = f"invalid-{uuid.uuid4().hex[:8]}"
    refused = cli("start", run_id, "--workflow", WORKFLOW, "--input", '{"order_id": 1}', "--wait")
    said = one_line_error(refused, 1, "start")
    assert "does not validate against OrderInput" in said and "sku" in said
    assert "does not exist" in cli("status", run_id).err  # nothing was written


def test_commands_to_an_unknown_run_exit_non_zero_with_the_reason(cli: Cli) -> None:
    ghost = f"ghost-{uuid.uuid4().hex[:8]}"
    signal = one_line_error(cli("signal", ghost, "shipped", "--id", "s"), 4, "signal")
    assert f"run {ghost} does not exist (yet): the signal is parked" in signal
    hook = one_line_error(cli("hook", "--run", ghost, "--hook", "approval"), 4, "hook")
    assert f"run {ghost} does not exist (yet): the hook resumption is parked" in hook
    cancel = one_line_error(cli("cancel", ghost), 1, "cancel")
    assert cancel == f"error: run {ghost} does not exist"
    retry = one_line_error(cli("retry", ghost), 1, "retry")
    assert retry == f"error: run {ghost} does not exist"
    wait = one_line_error(cli("wait", "nope"), 1, "wait")
    assert wait == "error: run nope does not exist"
    # A run whose commands wait for it to start says so.
    waiting = one_line_error(cli("wait", ghost), 1, "wait")
    assert f"run {ghost} has not started; commands for it wait" in waiting
    # Without waiting, only the sending is confirmed; anyone reads its outcome later.
    sent = cli("signal", ghost, "shipped", "--id", "s2", "--no-wait", "--command-id", "c-s2")
    said = f"sent signal shipped (id s2) to run {ghost} (command c-s2)\n"
    assert (sent.code, sent.out) == (0, said)
    status_until(cli, ghost, lambda s: len(s.get("waiting_commands", [])) == 3)
    (parked,) = cli("outcome", "c-s2", "--run", ghost).json()
    assert parked["status"] == "parked" and parked["error_kind"] == "RunNotFoundError"
    assert (parked["command_id"], parked["key"], parked["command"]) == (
        "c-s2",
        ghost,
        "send_signal",
    )
    unknown = one_line_error(cli("outcome", "c-none", "--run", ghost), 1, "outcome")
    assert f"no outcome of command c-none for run {ghost} (yet)" in unknown
    both = cli("start", ghost, "--workflow", WORKFLOW, "--wait", "--no-wait")
    assert both.code == 2 and "cannot go with --no-wait" in both.err


def test_retry_answers(cli: Cli) -> None:
    run_id = f"retry-{uuid.uuid4().hex[:8]}"
    started = cli("start", run_id, "--workflow", WORKFLOW, "--input", order(run_id))
    assert started.code == 0, started.err
    driven = cli("retry", run_id)
    assert driven.out == f"retry of run {run_id}: applied (run {run_id} is driven again)\n"
    assert cli("cancel", run_id, "--force").code == 0
    assert cli("wait", run_id).code == 3  # cancelled
    ended = cli("retry", run_id)
    assert ended.code == 0, ended.err
    assert ended.out == (
        f"retry of run {run_id}: noop (run {run_id} is cancelled: nothing to retry)\n"
    )

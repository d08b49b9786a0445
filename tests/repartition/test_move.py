"""A deployment with open runs of every kind moves from 8 to 32 partitions on the real broker.

Runs on 8 partitions wait on a signal, a hook (claimed by its token's digest), a timer, a
child (one waiting on a timer, one that continues as new), a continued run's successor, steps
in flight (held until a file exists), and a signal parked for a run that does not exist yet.
The old worker is killed (its transaction may be left open: the move fences it), commands are
sent to the old topics before the move and while it forwards, then processors of the new prefix
(another topology: 32 partitions) take over and every run completes; the move's audit reads the
old and the new topics and passes, and ``flowstream audit`` replays every run on the new topic.
A live old member is refused first, in one line.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from flowstream.cli import main
from flowstream.client import FlowClient
from flowstream.errors import RunNotFoundError
from flowstream.kafka import clients
from flowstream.model.messages import OutcomeStatus
from flowstream.model.snapshot import TERMINAL_STATUSES, RunStatus
from flowstream.replay.decide import token_digest
from flowstream.settings import Settings
from flowstream.topology import default_topology_path, load_topology
from tests.processor.apps import SPEC
from tests.processor.harness import ROOT, Cluster, Worker, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]


def topology_file(directory: Path, partitions: int) -> Path:
    """The default topology with every topic at ``partitions`` partitions."""
    text = default_topology_path().read_text()
    path = directory / f"topics-{partitions}.toml"
    path.write_text(re.sub(r"(?m)^partitions = \d+$", f"partitions = {partitions}", text))
    return path


def group_members(bootstrap: str, group: str) -> int:
    admin = clients.new_admin(bootstrap)
    found = admin.describe_consumer_groups([group], request_timeout=10)[group].result(15)
    return len(found.members or [])


def reached(client: FlowClient, run_id: str, event_type: str) -> bool:
    try:
        return any(e.event.type == event_type for e in client.history(run_id, timeout=10))
    except RunNotFoundError:
        return False  # not started yet


class Lines:
    """The standard output of a process, line by line, read by a thread."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert process.stdout is not None
        stream = process.stdout
        self._thread = threading.Thread(target=lambda: self.lines.extend(stream), daemon=True)
        self._thread.start()

    def text(self) -> str:
        return "".join(self.lines)

    def close(self, process: subprocess.Popen[str]) -> None:
        self._thread.join(10)
        if process.stdout is not None:
            process.stdout.close()


def test_open_runs_of_every_kind_move_from_8_to_32_partitions_and_complete(
    kafka_bootstrap: str, unique_prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = Cluster(kafka_bootstrap, unique_prefix, tmp_path / "old")
    target = f"{unique_prefix}-32"
    topology32 = topology_file(tmp_path, 32)
    hold = tmp_path / "hold"
    tokens = [secrets.token_urlsafe(24) for _ in range(2)]
    runs = {
        **{f"sig-{i}": {"signal": True} for i in range(3)},
        **{f"hook-{i}": {"hook_digest": token_digest(tokens[i])} for i in range(2)},
        "timer-0": {"timer_ms": 15000},
        "parent-0": {"child": True, "child_timer_ms": 15000},
        "parent-1": {"child": True, "child_hops": 1, "child_timer_ms": 15000},
        "chain-0": {"continue_hops": 1, "timer_ms": 15000},  # its successor waits
        "chain-1": {"signal": True, "continue_hops": 1},  # waits, then continues
        **{f"held-{i}": {"hold_file": str(hold)} for i in range(2)},
    }
    waits_for = {
        "sig": "signal_wait_created",
        "hook": "hook_created",
        "timer": "wait_created",
        "parent": "child_workflow_requested",
        "chain-0": "run_continued_as_new",
        "chain-1": "signal_wait_created",
        "held": "step_started",
    }
    new_worker: Worker | None = None
    mover: subprocess.Popen[str] | None = None
    new_client: FlowClient | None = None
    try:
        worker = old.start("old-1")
        for run_id, options in runs.items():
            old.client.start(run_id, SPEC, options)
        old.client.signal("late-0", "go", "parked", id="late-0-go")  # before its run exists
        old.client.flush()
        for run_id in runs:
            event_type = waits_for.get(run_id) or waits_for[run_id.split("-")[0]]
            wait_until(
                lambda r=run_id, t=event_type: reached(old.client, r, t),  # type: ignore[misc]
                60,
                f"{run_id} never reached {event_type}:\n{old.logs()}",
            )
        wait_until(lambda: old.client.parked("late-0", timeout=10), 30, "late-0 not parked")

        # A live member of the old group: refused in one line, nothing created.
        move_args = [
            "kafka",
            "repartition",
            "--bootstrap",
            kafka_bootstrap,
            "--prefix",
            old.prefix,
            "--to-prefix",
            target,
            "--partitions",
            "32",
            "--group",
            old.group,
            "--replication-factor",
            "1",
        ]
        capsys.readouterr()
        assert main(move_args) == 1
        refused = capsys.readouterr().err
        assert refused.count("\n") == 1 and "still has 1 active member(s)" in refused, refused

        successor = next(
            e.event.successor_run_id  # type: ignore[union-attr]
            for e in old.client.history("chain-0")
            if e.event.type == "run_continued_as_new"
        )
        wait_until(lambda: reached(old.client, successor, "wait_created"), 30, "no successor")
        worker.kill()  # its last transaction may stay open: the move fences it
        waiting = {r for r in runs if r != "chain-0"} | {successor}
        ended = {r for r in waiting if old.client.snapshot(r).status in TERMINAL_STATUSES}
        assert not ended, f"{ended} ended before the move"
        # Sent after the old group stopped and before the move: carried over.
        old.client.signal("sig-0", "go", "before the move", id="sig-0-go")
        old.client.resume_hook_by_token(tokens[0], {"by": "token, before"})
        old.client.flush()
        wait_until(lambda: group_members(kafka_bootstrap, old.group) == 0, 30, "old member stays")

        mover = subprocess.Popen(
            [sys.executable, "-m", "flowstream", *move_args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        output = Lines(mover)
        wait_until(
            lambda: "forwarding the commands" in output.text() or mover.poll() is not None,
            90,
            "the move never began forwarding",
        )
        assert mover.poll() is None, output.text()
        new_worker = Worker(
            "new-1",
            bootstrap=kafka_bootstrap,
            prefix=target,
            group=old.group,
            state_dir=tmp_path / "new",
            step_log=old.step_log,
            extra_env={"FLOWSTREAM_TOPOLOGY": str(topology32)},
        )
        hold.touch()
        # Clients that switch late: sent to the old topics while the move forwards; the
        # outcome written on the new topic is written back where the old client waits.
        answered = old.client.signal(
            "sig-1", "go", "during the move", id="sig-1-go", wait=True, timeout=120
        )
        assert answered is not None and answered.status is OutcomeStatus.APPLIED, answered
        old.client.resume_hook("hook-1", "approval", {"by": "run and hook, during"})
        old.client.flush()
        new_client = FlowClient(
            Settings(bootstrap=kafka_bootstrap, topic_prefix=target, group=f"{target}-client"),
            topology=load_topology(topology32),
            wait=False,
        )
        new_client.signal("sig-2", "go", "after the move", id="sig-2-go")
        new_client.signal("chain-1", "go", "first", id="chain-1-a")
        new_client.start("late-0", SPEC, {"signal": True})
        new_client.flush()
        wait_until(
            lambda: reached(new_client, "chain-1", "run_continued_as_new"), 90, "no continuation"
        )
        (second,) = (
            e.event.successor_run_id  # type: ignore[union-attr]
            for e in new_client.history("chain-1")
            if e.event.type == "run_continued_as_new"
        )
        wait_until(lambda: reached(new_client, second, "signal_wait_created"), 60, "no successor")
        # Sent to the continued run: forwarded along the chain to its successor.
        new_client.signal("chain-1", "go", "through the chain", id="chain-1-b")
        new_client.flush()

        everything = [*runs, "late-0", successor, second]
        finished = new_client.wait_all(everything, timeout=120)
        statuses = {r: s.status for r, s in finished.items()}
        assert statuses == {
            **{r: RunStatus.COMPLETED for r in everything},
            "chain-0": RunStatus.CONTINUED_AS_NEW,
            "chain-1": RunStatus.CONTINUED_AS_NEW,
        }, (statuses, new_worker.output()[-3000:])
        payloads = {r: finished[r].output for r in ("sig-0", "sig-1", "sig-2", "late-0")}
        assert {r: p["go"] for r, p in payloads.items()} == {  # type: ignore[index]
            "sig-0": "before the move",
            "sig-1": "during the move",
            "sig-2": "after the move",
            "late-0": "parked",
        }
        assert finished[second].output["go"] == "through the chain"  # type: ignore[index]
        assert finished["hook-0"].output["approval"] == {"by": "token, before"}  # type: ignore[index]
        for run_id in (*runs, "late-0"):
            history = [e.event.type for e in new_client.history(run_id)]
            assert history.count("signal_received") <= 1, (run_id, history)
            assert history.count("hook_received") <= 1, (run_id, history)

        mover.send_signal(signal.SIGTERM)
        assert mover.wait(60) == 0, output.text()
        text = output.text()
        forwarded = int(re.search(r"forwarded (\d+) commands", text).group(1))  # type: ignore[union-attr]
        assert forwarded >= 4, text  # two before the move, two while it forwarded
        mirrored = int(re.search(r"mirrored (\d+) outcomes back", text).group(1))  # type: ignore[union-attr]
        assert mirrored >= 1, text  # at least the answer sig-1's client waited for
        assert "audit: ok" in text and "problem" not in text, text
        assert re.search(r"runs: \d+ on the new events topic", text), text

        # Every run on the new topic replays against today's code.
        replay = subprocess.run(
            [
                sys.executable,
                "-m",
                "flowstream",
                "audit",
                "--bootstrap",
                kafka_bootstrap,
                "--prefix",
                target,
                "--app",
                "tests.processor.apps:runtime",
            ],
            cwd=ROOT,
            env={**os.environ, "FLOWSTREAM_TOPOLOGY": str(topology32)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert replay.returncode == 0, replay.stdout[-3000:] + replay.stderr[-2000:]
        assert re.search(r"audited (\d+) run\(s\): \1 ok", replay.stdout), replay.stdout[-500:]
    finally:
        if mover is not None:
            if mover.poll() is None:
                mover.kill()
            mover.wait(10)
            output.close(mover)
        if new_worker is not None:
            new_worker.stop()
        if new_client is not None:
            new_client.close()
        old.close()

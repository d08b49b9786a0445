"""The host's side of ``docker/test.sh``: drives the compose deployment through its published
ports with the flowstream client, and stages the Kafka image's build context.

``drive.py kafka-context DIR`` fills DIR with the jars ``flowstream dev-kafka`` runs (fetched
from Maven Central into its cache if needed), the broker and storage-tool command lines it runs
them with, rewritten for the image's paths, and its log4j2 configurations.

``drive.py run`` applies the topics, waits until both processors are healthy and share every
partition, then:

1. one run, started, signalled and waited for: the time to the first completed run;
2. a batch of runs, each suspended first (half on a manager's approval hook, all on the
   "shipped" signal), then resumed by hook token and signalled, all waited for;
3. ``/metrics`` and ``/healthz`` of both processors, read on the published ports;
4. runs suspended on both processors' partitions, then processor-1's container killed
   (``docker kill``, its restart policy turned off first) and the runs signalled: processor-2
   takes its partitions and finishes every one.

It prints one line of JSON with the figures and exits non-zero on the first thing that fails.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from flowstream.client import EventTail, FlowClient
from flowstream.examples.order import SPEC
from flowstream.kafka import topics
from flowstream.model.snapshot import HookStatus, RunStatus, WaitStatus, WorkflowRunSnapshot
from flowstream.partitioning import partition_for
from flowstream.replay.decide import token_digest
from flowstream.replay.state import RunState
from flowstream.settings import Settings
from flowstream.topology import EVENTS, load_topology

Check = Callable[[WorkflowRunSnapshot], bool]


def log(message: str) -> None:
    print(f"drive: {message}", file=sys.stderr, flush=True)


# -- the Kafka image's context -------------------------------------------------------------


def kafka_context(target: Path) -> None:
    from flowstream.devkafka import config, jvm
    from flowstream.devkafka.jars import ensure_jars

    home = Path("/opt/kafka")
    libs = ensure_jars()
    shutil.copytree(libs, target / "libs", dirs_exist_ok=True)
    properties = home / "config" / "server.properties"
    broker = jvm.broker_command("java", home / "libs", home, properties, "512m")
    storage = jvm.storage_command("java", home / "libs", home, properties, "@CLUSTER_ID@")
    (target / "broker.args").write_text("\n".join(broker) + "\n")
    (target / "storage.args").write_text("\n".join(storage) + "\n")
    (target / "log4j2.properties").write_text(config.BROKER_LOG4J)
    (target / "tools-log4j2.properties").write_text(config.TOOLS_LOG4J)
    for script in ("entrypoint.sh", "kafka-broker-api-versions.sh", "Dockerfile"):
        shutil.copy2(Path(__file__).parent / "kafka-image" / script, target / script)


# -- reading runs --------------------------------------------------------------------------


class Runs:
    """The runs of this test, folded from the events topic as they are committed."""

    def __init__(self, settings: Settings, partitions: int) -> None:
        topic = load_topology().names(settings.topic_prefix)[EVENTS]
        self._tail = EventTail(settings, list(range(partitions)), topic=topic)
        self.states: dict[str, RunState] = {}
        self.seen_at: dict[str, float] = {}  # when each run was first seen terminal

    def until(self, run_ids: Iterable[str], check: Check, timeout: float, what: str) -> None:
        wanted = set(run_ids)
        deadline = time.monotonic() + timeout
        done = {r for r in wanted if r in self.states and check(self.states[r].snapshot())}
        while done != wanted:
            if time.monotonic() > deadline:
                missing = sorted(wanted - done)
                states = {r: self._status(r) for r in missing[:5]}
                raise AssertionError(f"{len(missing)} run(s) never {what}: {states}")
            changed = set()
            for envelope in self._tail.poll(0.2):
                state = self.states.get(envelope.run_id)
                if state is None:
                    self.states[envelope.run_id] = RunState.first(envelope)
                else:
                    state.apply(envelope)
                changed.add(envelope.run_id)
                if self.states[envelope.run_id].is_terminal:
                    self.seen_at.setdefault(envelope.run_id, time.monotonic())
            for run_id in changed & (wanted - done):
                if check(self.states[run_id].snapshot()):
                    done.add(run_id)

    def snapshot(self, run_id: str) -> WorkflowRunSnapshot:
        return self.states[run_id].snapshot()

    def _status(self, run_id: str) -> str:
        state = self.states.get(run_id)
        return "no event" if state is None else str(state.snapshot().status)

    def close(self) -> None:
        self._tail.close()


def waits_for_signal(snapshot: WorkflowRunSnapshot) -> bool:
    return any(
        w.signal_name == "shipped" and w.status is WaitStatus.WAITING
        for w in snapshot.signal_waits.values()
    )


def waits_for_hook(snapshot: WorkflowRunSnapshot) -> bool:
    hook = snapshot.hooks.get("approval")
    return hook is not None and hook.status is HookStatus.ACTIVE


def terminal(snapshot: WorkflowRunSnapshot) -> bool:
    return snapshot.is_terminal


# -- the processors' HTTP ------------------------------------------------------------------


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:
        return 0, str(error)


def health(address: str) -> tuple[int, dict[str, Any]]:
    status, body = get(f"http://{address}/healthz")
    try:
        report = json.loads(body)
    except ValueError:
        report = {"body": body[:300]}
    return status, report if isinstance(report, dict) else {"body": report}


def metric(page: str, name: str) -> float:
    """The sum of a metric's samples on a metrics page."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line.startswith((name + " ", name + "{"))
    )


def wait_healthy(addresses: list[str], partitions: int, timeout: float) -> list[list[int]]:
    """Until every processor's /healthz is 200, each owns some partitions and they own every
    partition between them (the first to join owns all until the other's rebalance: once its
    restore was quick, that state passed for both healthy)."""
    deadline = time.monotonic() + timeout
    while True:
        reports = [health(a) for a in addresses]
        owned = [r.get("owned_partitions", []) for _, r in reports]
        if (
            all(s == 200 for s, _ in reports)
            and all(owned)
            and sorted(p for part in owned for p in part) == list(range(partitions))
        ):
            return owned
        if time.monotonic() > deadline:
            raise AssertionError(f"the processors never were healthy together: {reports}")
        time.sleep(1)


# -- the scenario --------------------------------------------------------------------------


def docker(*args: str) -> str:
    """A docker command's output; its own output and the reason if it fails."""
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: {done.stdout}{done.stderr}".strip())
    return done.stdout.strip()


def order(run_id: str, token: str | None = None) -> dict[str, Any]:
    return {
        "order_id": run_id,
        "sku": "sku-8842",
        "quantity": 2,
        "amount_cents": 4599,
        "approval_token_digest": token_digest(token) if token else None,
    }


def runs_on(stem: str, owners: list[list[int]], each: int, partitions: int) -> list[list[str]]:
    """``each`` run ids on the partitions of each owner (so every processor has work)."""
    picked: list[list[str]] = [[] for _ in owners]
    for i in range(100_000):
        run_id = f"{stem}-{i}"
        partition = partition_for(run_id, partitions)
        for owned, ids in zip(owners, picked, strict=True):
            if partition in owned and len(ids) < each:
                ids.append(run_id)
        if all(len(ids) == each for ids in picked):
            return picked
    raise AssertionError(f"no {each} run ids for each of the partitions {owners}")


def check_completed(runs: Runs, run_ids: Iterable[str], tokens: dict[str, str]) -> None:
    for run_id in run_ids:
        snapshot = runs.snapshot(run_id)
        if snapshot.status is not RunStatus.COMPLETED:
            raise AssertionError(f"{run_id} ended {snapshot.status}: {snapshot.error}")
        output = snapshot.output
        assert isinstance(output, dict), output
        receipt = output["receipt"]
        assert isinstance(receipt, dict) and receipt["attempt"] == 2, output  # the charge retried
        assert output["shipment"] == {"carrier": "DHL", "run": run_id}, output
        approved = {"by": "manager", "run": run_id} if run_id in tokens else None
        assert output["approved_by"] == approved, output


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = Settings(bootstrap=args.bootstrap, group="docker-test-client")
    topology = load_topology()
    partitions = topology.run_partitions
    applied = topics.apply(args.bootstrap, topology, replication_factor=1)
    created = [t.name for t in applied if t.created]
    log(f"topics applied from the host: {len(applied)} verified, {len(created)} created now")
    addresses = [args.metrics_1, args.metrics_2]
    owned = wait_healthy(addresses, partitions, args.timeout)
    log(f"both processors healthy; partitions {owned[0]} and {owned[1]}")
    nonce = uuid.uuid4().hex[:6]
    client = FlowClient(settings, wait=False)  # sends; the checks below read the runs back
    runs = Runs(settings, partitions)
    figures: dict[str, Any] = {}
    try:
        # 1. the first run
        first = f"order-{nonce}-first"
        began = time.monotonic()
        client.start(first, SPEC, order(first))
        client.signal(first, "shipped", {"carrier": "DHL", "run": first}, id=f"{first}-shipped")
        client.flush()
        runs.until([first], terminal, args.timeout, "completed")
        check_completed(runs, [first], {})
        figures["first_run_s"] = round(runs.seen_at[first] - began, 2)
        figures["deployed_to_first_run_s"] = round(time.time() - args.deployed_at, 1)
        log(f"first run completed {figures['first_run_s']} s after its start was sent")

        # 2. a batch, suspended, then resumed and signalled
        halves = runs_on(f"order-{nonce}-b", owned, args.runs // 2, partitions)
        batch = [run_id for half in halves for run_id in half]
        tokens = {r: uuid.uuid4().hex for r in batch[::2]}
        for run_id in batch:
            client.start(run_id, SPEC, order(run_id, tokens.get(run_id)))
        client.flush()
        runs.until(tokens, waits_for_hook, args.timeout, "waited for their approval hook")
        for run_id, token in tokens.items():
            client.resume_hook_by_token(token, {"by": "manager", "run": run_id})
        client.flush()
        runs.until(batch, waits_for_signal, args.timeout, "waited for the shipped signal")
        for run_id in batch:
            client.signal(
                run_id, "shipped", {"carrier": "DHL", "run": run_id}, id=f"{run_id}-shipped"
            )
        client.flush()
        runs.until(batch, terminal, args.timeout, "completed")
        check_completed(runs, batch, tokens)
        figures["batch_runs"] = len(batch)
        log(f"{len(batch)} runs suspended, resumed ({len(tokens)} hooks), signalled, completed")

        # 3. metrics and health on the published ports
        pages = [get(f"http://{a}/metrics") for a in addresses]
        for address, (status, page) in zip(addresses, pages, strict=True):
            if status != 200 or "flowstream_commands_total" not in page:
                raise AssertionError(f"http://{address}/metrics answered {status}: {page[:200]}")
        commands = [metric(page, "flowstream_commands_total") for _, page in pages]
        owned_gauge = [metric(page, "flowstream_owned_partitions") for _, page in pages]
        if sum(owned_gauge) != partitions or min(commands) == 0:
            raise AssertionError(f"metrics: owned {owned_gauge}, commands {commands}")
        owned = wait_healthy(addresses, partitions, 10)
        figures["commands_per_processor"] = commands
        log(f"/metrics: commands {commands}, owned partitions {owned_gauge}; /healthz 200 on both")

        # 4. kill processor-1 with runs suspended on its partitions
        on_killed, on_other = runs_on(f"order-{nonce}-fo", owned, args.runs, partitions)
        failover = on_killed + on_other
        for run_id in failover:
            client.start(run_id, SPEC, order(run_id))
        client.flush()
        runs.until(failover, waits_for_signal, args.timeout, "waited for the shipped signal")
        docker("update", "--restart=no", args.kill)
        docker("kill", args.kill)
        killed_at = time.monotonic()
        log(f"killed processor-1 ({args.kill[:12]}) with {len(on_killed)} runs on its partitions")
        for run_id in failover:
            client.signal(
                run_id, "shipped", {"carrier": "DHL", "run": run_id}, id=f"{run_id}-shipped"
            )
        client.flush()
        runs.until(failover, terminal, args.timeout, "completed after the kill")
        check_completed(runs, failover, {})
        status, report = health(args.metrics_2)
        if status != 200 or report.get("owned_partitions") != list(range(partitions)):
            raise AssertionError(f"processor-2 after the kill: {status} {report}")
        state = docker("inspect", "--format", "{{.State.Running}}", args.kill)
        if state != "false":
            raise AssertionError(f"processor-1 runs again after the kill: {state}")
        figures["runs_after_kill"] = len(failover)
        figures["runs_after_kill_on_killed_partitions"] = len(on_killed)
        figures["kill_to_last_run_s"] = round(max(runs.seen_at[r] for r in failover) - killed_at, 1)
        log(
            f"after the kill, processor-2 finished all {len(failover)} runs ({len(on_killed)} on "
            f"processor-1's partitions) in {figures['kill_to_last_run_s']} s and owns every one"
        )
    finally:
        runs.close()
        client.close()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="drive.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    context = commands.add_parser("kafka-context", help="stage the Kafka image's build context")
    context.add_argument("directory", type=Path)
    scenario = commands.add_parser("run", help="drive the deployment")
    scenario.add_argument("--bootstrap", required=True)
    scenario.add_argument("--metrics-1", required=True, help="host:port of processor-1")
    scenario.add_argument("--metrics-2", required=True, help="host:port of processor-2")
    scenario.add_argument("--kill", required=True, help="processor-1's container id")
    scenario.add_argument("--runs", type=int, default=8, help="runs per batch and processor")
    scenario.add_argument("--timeout", type=float, default=120, help="seconds per wait")
    scenario.add_argument("--deployed-at", type=float, default=time.time(), help="epoch s")
    args = parser.parse_args(argv)
    if args.command == "kafka-context":
        kafka_context(args.directory)
        return 0
    try:
        figures = run(args)
    except AssertionError as error:
        log(f"FAILED: {error}")
        return 1
    print(json.dumps(figures, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

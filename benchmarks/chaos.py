"""Chaos: runs of every kind driven through faults on three brokers, then an independent audit.

A three-broker cluster (its own, or one given by ``--home``/``--port``) gets topics under a fresh
prefix with replication 3, and ``--workers`` ``flowstream worker`` processes serve
``benchmarks.chaos_app`` (a batch of steps, a step retried after a failure, a timer, a signal, a
hook resumed by its token, a child workflow). Over ``--minutes`` the driver starts ``--runs`` runs
through ``FlowClient`` at a steady pace. It sends each run's signal before its start, just after
it, or once the run waits for it (some twice, with the same signal id), resends some starts, and
resumes each hook by its token once the hook is committed. Meanwhile it injects faults on a
schedule, cycling through the kinds unless ``--faults`` names them:

* ``worker-kill``: SIGKILL a worker, restart it ``--worker-down`` s later;
* ``worker-stop``: SIGSTOP a worker for 7-14 s, then SIGCONT (the zombie must stay fenced);
* ``state-wipe``: SIGKILL a worker, delete its state directory, restart it later;
* ``broker-kill``: SIGKILL a broker (the processors' group coordinator first, then the others
  in turn), restart it ``--broker-down`` s later, at niceness ``--restart-nice`` (10) until it
  answers. A broker restarted after a SIGKILL recovers its logs, and on a machine of its
  own that costs nobody else; here it shares 2 cores with the others, their controller and the
  workers: one restart took 41 s, and meanwhile the controller fenced both live brokers three
  times (it heard none of their heartbeats for its 2 s session), which stalled every partition
  for 19 s. Each kill's figures say what the host did meanwhile and whom the controller fenced;
* ``coordinator-kill``: a ``broker-kill`` of the processors' group coordinator every time (not in
  the default cycle; it measures the longest kind of broker kill);
* ``broker-stop``: SIGSTOP a broker (chosen as for ``broker-kill``) for ``--broker-stop`` s, then
  SIGCONT (not in the default cycle). A killed broker's sockets are closed by its kernel, so its
  clients learn at once; a stopped one's stay open and answer nothing, as a long GC pause or a
  network that drops packets would, and its clients learn only from their own timeouts.

After the window the driver waits until every run it started is terminal, stops the workers, and
hands over to :mod:`benchmarks.chaos_audit`, which reads the events topic on its own. Printed:
runs, faults by kind, violations, failover after a worker fault, and the longest commit gap after
a broker kill (no new committed event on the partitions it did not lead, and on all).

Failover is measured with probes: right after each worker fault the driver starts one more run
(audited like the others) on every partition, and the failover of a partition the victim wrote
last is the time from the fault until its probe's first event is committed: an input given after
the fault, answered. (The first event by another processor after the fault, also printed, counts
a quiet partition's idle time too.) A broker kill gets the same probes: the slowest answer on
the partitions whose events and starts the dead broker did not lead is printed beside the gap.

Usage: ``python -m benchmarks.chaos --runs 600 --minutes 9 --workers 3 [--faults worker-kill,...]
[--home DIR --port 29092] [--set NAME=VALUE] [--out results.jsonl]``
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import itertools
import logging
import os
import random
import secrets
import shutil
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.chaos_app import EFFECTS_ENV, HOOK_ID, SIGNAL_NAME, SPEC, make_input
from benchmarks.chaos_audit import Audit, Expectations, audit, format_audit
from benchmarks.chaos_watch import Fault, Follow, HostWatch, fault_figures
from flowstream.client import FlowClient
from flowstream.devkafka import DEFAULT_PORT_3, Cluster
from flowstream.devkafka.config import CONTROLLER
from flowstream.kafka import clients, topics
from flowstream.partitioning import partition_for
from flowstream.replay.decide import token_digest
from flowstream.settings import Settings
from flowstream.topology import CMD_START, EVENTS, load_topology

__all__ = ["FAULT_KINDS", "SHORT", "ChaosOptions", "ChaosResult", "format_result", "run_chaos"]

FAULT_KINDS = ("worker-kill", "worker-stop", "broker-kill", "state-wipe")
#: Kinds that run only when ``--faults`` names them.
NAMED_KINDS = ("coordinator-kill", "broker-stop")


@dataclass
class ChaosOptions:
    runs: int = 600
    minutes: float = 9.0
    workers: int = 3
    #: Fault kinds in order; empty: ``FAULT_KINDS`` cycled, one fault per ``fault_every`` s.
    faults: tuple[str, ...] = ()
    fault_every: float = 40.0
    stop_s: tuple[float, float] = (7.0, 14.0)
    worker_down: float = 6.0
    broker_down: float = 10.0
    #: How long a ``broker-stop`` holds its broker stopped.
    broker_stop: float = 8.0
    #: The niceness a killed broker restarts at, until it answers.
    restart_nice: int = 10
    settle: float = 300.0
    seed: int = 1
    #: ``FLOWSTREAM_<NAME>`` settings of the workers.
    settings: dict[str, str] = field(default_factory=dict)

    def schedule(self) -> list[tuple[float, str]]:
        """(seconds into the window, kind) of every fault, spread evenly over the window."""
        window = self.minutes * 60
        kinds = list(self.faults)
        if not kinds:
            count = max(1, int(window // self.fault_every))
            kinds = [FAULT_KINDS[i % len(FAULT_KINDS)] for i in range(count)]
        step = window / (len(kinds) + 1)
        return [(step * (i + 1), kind) for i, kind in enumerate(kinds)]


#: The short form (about three minutes): one fault of each kind, 25-30 s apart.
SHORT = ChaosOptions(runs=150, minutes=2.0, workers=3, faults=FAULT_KINDS, settle=240.0)


@dataclass
class ChaosResult:
    figures: dict[str, Any]
    audit: Audit


class _Workers:
    """The worker processes by name, and what was done to them."""

    def __init__(self, bootstrap: str, prefix: str, root: Path, env: dict[str, str]) -> None:
        self.bootstrap, self.prefix, self.root, self.env = bootstrap, prefix, root, env
        self.procs: dict[str, harness.Worker] = {}
        self.state: dict[str, str] = {}  # up, stopped, down
        self.back_at: dict[str, list[float]] = {}  # when each came back (started, SIGCONT)
        self.unplanned: list[tuple[str, int | None]] = []

    def start(self, name: str) -> None:
        self.procs[name] = harness.Worker(
            name,
            prefix=self.prefix,
            state_root=self.root / "state",
            app="benchmarks.chaos_app:runtime",
            bootstrap=self.bootstrap,
            env=self.env,
        )
        self.state[name] = "up"
        self.back_at.setdefault(name, []).append(time.monotonic())

    def up(self) -> list[str]:
        return [n for n, s in self.state.items() if s == "up"]

    def kill(self, name: str, wipe: bool = False) -> None:
        self.procs[name].kill()
        self.state[name] = "down"
        if wipe:
            shutil.rmtree(self.procs[name].state_dir, ignore_errors=True)

    def pause(self, name: str) -> None:
        os.kill(self.procs[name].pid, signal.SIGSTOP)
        self.state[name] = "stopped"

    def resume(self, name: str) -> None:
        os.kill(self.procs[name].pid, signal.SIGCONT)
        self.state[name] = "up"
        self.back_at[name].append(time.monotonic())

    def check(self) -> None:
        """A worker that exited on its own is noted and started again."""
        for name, state in list(self.state.items()):
            code = self.procs[name].process.poll()
            if state == "up" and code is not None:
                self.unplanned.append((name, code))
                self.procs[name].stop()
                self.start(name)

    def stop_all(self) -> None:
        for name, state in self.state.items():
            if state == "stopped":
                os.kill(self.procs[name].pid, signal.SIGCONT)
        for worker in self.procs.values():
            worker.stop(timeout=30)

    def tracebacks(self) -> int:
        return sum(w.output().count("Traceback") for w in self.procs.values())


class _Driver:
    """Starts runs, sends their signals and hook resumptions, and injects the faults."""

    def __init__(self, cluster: Cluster, options: ChaosOptions, root: Path, prefix: str) -> None:
        self.cluster = cluster
        self.options = options
        self.prefix = prefix
        self.random = random.Random(options.seed)
        self.bootstrap = cluster.bootstrap
        self.topic = load_topology().names(prefix)[EVENTS]
        self.partitions = load_topology().run_partitions
        self.effects = root / "effects"
        self.effects.mkdir(parents=True, exist_ok=True)
        env = {f"FLOWSTREAM_{k.upper()}": v for k, v in options.settings.items()}
        env[EFFECTS_ENV] = str(self.effects)
        # An unplanned exit leaves its traceback in the worker's log (the CLI prints one line
        # without it): session X's one exit, a closed store used after a revocation, had none.
        env["FLOWSTREAM_DEBUG"] = "1"
        self.workers = _Workers(self.bootstrap, prefix, root, env)
        self.client = FlowClient(
            Settings(bootstrap=self.bootstrap, topic_prefix=prefix, group=f"{prefix}-client"),
            wait=False,
        )
        self.expected = Expectations()
        self.tokens: dict[str, str] = {}
        self.faults: list[Fault] = []
        self.actions: list[tuple[float, int, Callable[[], None]]] = []
        self._sequence = 0
        self._brokers_killed = 0
        self._restarts: list[threading.Thread] = []
        #: Brokers killed and not yet back (a restart in progress counts as down).
        self._brokers_down: set[int] = set()
        self.follow: Follow | None = None
        self._nodes_seen: tuple[float, dict[int, int | None]] = (0.0, {})
        self.host = HostWatch(self._processes)
        self._pending_signals: dict[str, Callable[[], None]] = {}
        self._pending_hooks: set[str] = set()
        self._probes = 0

    def _processes(self) -> dict[str, int]:
        """The processes whose CPU a broker kill's report divides: brokers, workers, driver."""
        now = time.monotonic()
        if now - self._nodes_seen[0] > 1.0:  # reading each node's pid file costs a little
            self._nodes_seen = (now, {s.node.node_id: s.pid for s in self.cluster.status()})
        found = {"driver": os.getpid()}
        for node_id, pid in self._nodes_seen[1].items():
            if pid is not None:
                found[f"node-{node_id}"] = pid
        for name, worker in list(self.workers.procs.items()):
            if self.workers.state.get(name) != "down":
                found[name] = worker.pid
        return found

    # -- the schedule ---------------------------------------------------------------------

    def later(self, at: float, action: Callable[[], None]) -> None:
        self._sequence += 1
        heapq.heappush(self.actions, (at, self._sequence, action))

    def _due(self, now: float) -> None:
        while self.actions and self.actions[0][0] <= now:
            _, _, action = heapq.heappop(self.actions)
            action()

    # -- runs -----------------------------------------------------------------------------

    def _start_run(self, index: int, now: float, run_id: str = "") -> None:
        run_id = run_id or f"r{index:05d}"
        token = f"chaos-{self.prefix}-{index}-{secrets.token_hex(12)}"
        self.tokens[run_id] = token
        self.expected.runs.append(run_id)
        self.expected.hooks[run_id] = HOOK_ID
        signal_id = f"sig-{index}"
        self.expected.signals[run_id] = [signal_id]
        run_input = make_input(index, token_digest(token), self.random.randint(300, 2000))
        mode = self.random.random()
        send = self._signal_sender(run_id, signal_id)
        if mode < 0.1:
            send()  # before the run exists: it waits in the run's inbox
        self.client.start(run_id, SPEC, run_input)
        if 0.1 <= mode < 0.3:
            self.later(now + self.random.uniform(0, 0.3), send)
        elif mode >= 0.3:
            self._pending_signals[run_id] = send
        if self.random.random() < 0.15:
            self.later(now + self.random.uniform(0.5, 3), send)  # the same signal id again
        if self.random.random() < 0.05:
            self.later(
                now + self.random.uniform(1, 5), lambda: self.client.start(run_id, SPEC, run_input)
            )
        self._pending_hooks.add(run_id)

    def _signal_sender(self, run_id: str, signal_id: str) -> Callable[[], None]:
        def send() -> None:
            self.client.signal(
                run_id, SIGNAL_NAME, {"from": "driver", "id": signal_id}, id=signal_id
            )

        return send

    def _react(self, now: float) -> None:
        """Signals for runs that wait for one, hook resumptions for runs whose hook exists."""
        assert self.follow is not None
        for run_id in list(self._pending_signals):
            seen = self.follow.seen(run_id)
            if seen is not None and seen.signal_wait is not None:
                self.later(now + self.random.uniform(0, 0.5), self._pending_signals.pop(run_id))
        for run_id in list(self._pending_hooks):
            seen = self.follow.seen(run_id)
            if seen is not None and seen.hook is not None:
                self._pending_hooks.discard(run_id)
                token = self.tokens[run_id]
                self.later(
                    now + self.random.uniform(0, 0.3),
                    lambda t=token, r=run_id: self.client.resume_hook_by_token(t, {"run": r}),
                )

    def _probe(self, now: float) -> dict[int, str]:
        """Start one run on every partition (a probe of when each answers); their run ids."""
        self._probes += 1
        ids: dict[int, str] = {}
        for n in itertools.count():
            run_id = f"probe{self._probes:02d}-{n}"
            p = partition_for(run_id, self.partitions)
            if p not in ids:
                ids[p] = run_id
                self._start_run(self.options.runs + len(self.expected.runs), now, run_id)
            if len(ids) == self.partitions:
                return ids
        raise AssertionError("unreachable")

    def unfinished(self) -> list[str]:
        assert self.follow is not None
        follow = self.follow
        return [r for r in self.expected.runs if (s := follow.seen(r)) is None or s.ended is None]

    # -- faults ---------------------------------------------------------------------------

    def inject(self, kind: str) -> None:
        now = time.monotonic()
        if kind in ("broker-kill", "coordinator-kill", "broker-stop"):
            if self._brokers_down:
                print(f"chaos: {kind} waits: a broker is still restarting", flush=True)
            self._kill_broker_when_up(
                coordinator_only=kind == "coordinator-kill", stop=kind == "broker-stop"
            )
            return
        candidates = self.workers.up()
        if len(candidates) < 2:  # keep one worker serving
            print(f"chaos: {kind} skipped, {len(candidates)} worker(s) up", flush=True)
            return
        victim = self.random.choice(sorted(candidates))
        assert self.follow is not None
        writers = self.follow.last_writers()
        owned = sorted(p for p, w in writers.items() if w == victim)
        spread = dict(sorted(Counter(writers.values()).items()))
        fault = Fault(kind, now, victim, {"partitions": owned, "last_writers": spread})
        self.faults.append(fault)
        if kind == "worker-stop":
            self.workers.pause(victim)
            paused = self.random.uniform(*self.options.stop_s)
            fault.detail["stopped_s"] = round(paused, 1)
            self.later(now + paused, lambda: self.workers.resume(victim))
        else:
            self.workers.kill(victim, wipe=kind == "state-wipe")
            self.later(now + self.options.worker_down, lambda: self.workers.start(victim))
        fault.detail["probes"] = self._probe(now)
        print(f"chaos: {kind} {victim} (it wrote last on partitions {owned})", flush=True)

    def _kill_broker_when_up(self, coordinator_only: bool = False, stop: bool = False) -> None:
        """A broker killed while another restarts would take two down at once (and its gap
        would be the restart's): the kill waits until every broker is back."""
        now = time.monotonic()
        if self._brokers_down:
            self.later(now + 1.0, lambda: self._kill_broker_when_up(coordinator_only, stop))
        else:
            self._kill_broker(now, coordinator_only, stop)

    def _kill_broker(self, now: float, coordinator_only: bool = False, stop: bool = False) -> None:
        admin = clients.new_admin(self.bootstrap)
        start_topic = load_topology().names(self.prefix)[CMD_START]
        metadata = admin.list_topics(timeout=10).topics
        leaders = {p: meta.leader for p, meta in metadata[self.topic].partitions.items()}
        starts = {p: meta.leader for p, meta in metadata[start_topic].partitions.items()}
        coordinator = _group_coordinator(self.bootstrap, f"{self.prefix}-group")
        others = sorted({n.node_id for n in self.cluster.nodes} - {coordinator})
        turn = 0 if coordinator_only else self._brokers_killed % (len(others) + 1)
        if coordinator < 0:  # not known now (the group is being described again)
            broker = others[turn % len(others)]
        else:
            broker = coordinator if turn == 0 else others[turn - 1]
        self._brokers_killed += 1
        led = sorted(p for p, leader in leaders.items() if leader == broker)
        self._brokers_down.add(broker)
        pid = next(s.pid for s in self.cluster.status() if s.node.node_id == broker)
        stop = stop and pid is not None  # a node not running is killed (already gone)
        if stop and pid is not None:
            os.kill(pid, signal.SIGSTOP)
        else:
            self.cluster.kill_node(broker)
        fault = Fault(
            "broker-stop" if stop else "broker-kill",
            time.monotonic(),
            f"broker-{broker}",
            {
                "led": led,
                "start_led": sorted(p for p, leader in starts.items() if leader == broker),
                "group_coordinator": broker == coordinator,
            },
        )
        self.faults.append(fault)
        fault.detail["probes"] = self._probe(fault.at)
        print(
            f"chaos: {fault.kind} node {broker} (led {led}, coordinator {coordinator})", flush=True
        )
        if stop and pid is not None:

            def resume() -> None:
                os.kill(pid, signal.SIGCONT)
                self._brokers_down.discard(broker)

            self.later(now + self.options.broker_stop, resume)
            return

        def restart() -> None:
            began = time.monotonic()
            nice = self.options.restart_nice
            try:
                self.cluster.start_node(broker, timeout=180, nice=nice)
                fault.detail["restart_s"] = round(time.monotonic() - began, 1)
                if nice:
                    # Not longer: once it has caught up it is an in-sync replica again, and a
                    # slow one holds back every write to the partitions it follows (a gap of
                    # 6 s began 23 s after a kill while it was still niced 10 s past its start).
                    fault.detail["reniced"] = self.cluster.renice(broker, 0)
            except Exception as exc:
                fault.detail["restart_error"] = str(exc)
            finally:
                self._brokers_down.discard(broker)

        def spawn() -> None:
            thread = threading.Thread(target=restart, daemon=True)
            thread.start()
            self._restarts.append(thread)

        self.later(now + self.options.broker_down, spawn)

    def faults_undone(self) -> bool:
        brokers_back = all(not t.is_alive() for t in self._restarts)
        return not self.actions and brokers_back

    # -- the run ----------------------------------------------------------------------------

    def drive(self) -> dict[str, Any]:
        options = self.options
        for i in range(options.workers):
            self.workers.start(f"w{i + 1}")
        ready_s = harness.wait_owned(list(self.workers.procs.values()), self.partitions, 180)
        self.follow = Follow(self.bootstrap, self.topic, self.partitions)
        window = options.minutes * 60
        began = time.monotonic()
        for at, kind in options.schedule():
            self.later(began + at, lambda k=kind: self.inject(k))
        started = 0
        settled_at = None
        while True:
            now = time.monotonic()
            while started < options.runs and now >= began + window * started / options.runs:
                self._start_run(started, now)
                started += 1
            self._due(now)
            self._react(now)
            self.workers.check()
            if now >= began + window and started == options.runs and self.faults_undone():
                if not self.unfinished():
                    settled_at = now
                    break
                if now > began + window + options.settle:
                    break
            time.sleep(0.05)
        self.client.flush(60)
        ended = time.monotonic()
        return {
            "workers_ready_s": round(ready_s, 1),
            "drive_s": round(ended - began, 1),
            "settle_s": None if settled_at is None else round(settled_at - began - window, 1),
            "unfinished_at_end": len(self.unfinished()),
        }

    def figures(self) -> dict[str, Any]:
        """Failover after each worker fault and the commit gaps after each broker kill."""
        assert self.follow is not None
        return {
            **fault_figures(
                self.faults,
                self.follow,
                self.workers.back_at,
                self.partitions,
                self.options.broker_down,
                self.host,
                self._controller_log(),
            ),
            "unplanned_worker_exits": self.workers.unplanned,
            "worker_tracebacks": self.workers.tracebacks(),
        }

    def _controller_log(self) -> Path | None:
        controllers = [n for n in self.cluster.all_nodes if n.roles == CONTROLLER]
        return self.cluster.log_path(controllers[0].node_id) if controllers else None

    def close(self) -> None:
        self.host.close()
        for thread in self._restarts:
            thread.join(240)
        with contextlib.suppress(Exception):
            self.client.close()
        self.workers.stop_all()
        if self.follow is not None:
            self.follow.close()


def _group_coordinator(bootstrap: str, group: str) -> int:
    try:
        return clients.describe_group(bootstrap, group).coordinator
    except clients.KafkaException:
        return -1


def _wait_for_brokers(cluster: Cluster, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    expected = {node.node_id for node in cluster.nodes}
    while set(clients.probe_brokers(cluster.bootstrap, 5) or ()) != expected:
        if time.monotonic() > deadline:
            raise SystemExit(f"the brokers of {cluster.bootstrap} did not all register")
        time.sleep(0.5)


def _remove_earlier_runs(bootstrap: str) -> None:
    """Delete the topics of earlier runs on a kept cluster. Each run leaves about 60 partitions
    behind, every one of them replicated on every broker, and a broker kill then moves all of
    them: a controller that fences a broker changes each partition it holds, and the survivors
    take over the leaders of all of them (188 per fence after three runs)."""
    admin = clients.new_admin(bootstrap)
    names = [name for name in admin.list_topics(timeout=30).topics if name.startswith("chaos-")]
    if names:
        harness.delete_topics(names, bootstrap)
        print(f"chaos: deleted {len(names)} topics of earlier runs", flush=True)


def run_chaos(cluster: Cluster, options: ChaosOptions, root: Path) -> ChaosResult:
    """Drive one chaos run on ``cluster`` (three running brokers) and audit it."""
    _wait_for_brokers(cluster)
    _remove_earlier_runs(cluster.bootstrap)
    prefix = f"chaos-{uuid.uuid4().hex[:8]}"
    topics.apply(cluster.bootstrap, load_topology(), prefix=prefix, replication_factor=3)
    driver = _Driver(cluster, options, root, prefix)
    began = time.monotonic()
    try:
        figures = driver.drive()
        figures.update(driver.figures())
    finally:
        driver.close()
    driver.expected.save(root / "expected.json")
    for node in cluster.nodes:  # a broker still down would fail the audit's reads
        cluster.start_node(node.node_id, timeout=180)
    result = audit(cluster.bootstrap, prefix, driver.expected, driver.effects)
    figures = {
        "figure": "chaos",
        "prefix": prefix,
        "runs": options.runs,
        "minutes": options.minutes,
        "workers": options.workers,
        "settings": options.settings,
        **figures,
        **result.figures,
        "wall_s": round(time.monotonic() - began, 1),
        **harness.machine(),
    }
    return ChaosResult(figures, result)


def format_result(result: ChaosResult) -> Iterator[str]:
    f = result.figures
    yield (
        f"chaos: {f['runs']} runs on {f['workers']} workers over {f['minutes']} min "
        f"(drive {f['drive_s']} s, settled {f['settle_s']} s after the window, "
        f"{f['unfinished_at_end']} unfinished), wall {f['wall_s']} s, load {f['loadavg_1m']}"
    )
    yield f"chaos: faults {f['faults_by_kind']}"
    for fault in f["faults"]:
        yield f"  {fault}"
    yield (
        f"chaos: failover after a worker kill: median {f['failover_kill_median_s']} s, max "
        f"{f['failover_kill_max_s']} s; after a stop: median {f['failover_stop_median_s']} s, "
        f"max {f['failover_stop_max_s']} s; partitions without progress in the window "
        f"{f['failover_partitions_without_progress']} (a probe started after the fault, answered; "
        f"the other partitions' probes after a kill: max {f['failover_kill_others_max_s']} s)"
    )
    yield (
        f"chaos: first event by another writer after a worker kill: median "
        f"{f['new_writer_kill_median_s']} s, max {f['new_writer_kill_max_s']} s (counts idle time)"
    )
    yield (
        f"chaos: longest commit gap after a broker kill: {f['broker_kill_gap_other_max_s']} s "
        f"on partitions it did not lead, {f['broker_kill_gap_all_max_s']} s on all; a start "
        f"given after the kill answered within {f['broker_kill_probe_spared_max_s']} s on every "
        "partition whose events and starts it did not lead"
    )
    yield (
        f"chaos: unplanned worker exits {f['unplanned_worker_exits']}, tracebacks in worker "
        f"logs {f['worker_tracebacks']}"
    )
    yield from format_audit(result.audit)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="the test's short form")
    parser.add_argument("--runs", type=int, default=600)
    parser.add_argument("--minutes", type=float, default=9.0, help="the fault window")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--faults", default="", help="comma-separated kinds, in order")
    parser.add_argument("--fault-every", type=float, default=40.0, help="seconds (no --faults)")
    parser.add_argument("--worker-down", type=float, default=6.0)
    parser.add_argument("--broker-down", type=float, default=10.0)
    parser.add_argument("--broker-stop", type=float, default=8.0, help="seconds (broker-stop)")
    parser.add_argument(
        "--restart-nice",
        type=int,
        default=10,
        help="niceness of a restarting broker until it answers (0: as the others)",
    )
    parser.add_argument("--settle", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--set", type=harness.setting, action="append", default=[], metavar="NAME=VALUE"
    )
    parser.add_argument("--home", type=Path, default=None, help="the cluster's home")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT_3)
    parser.add_argument("--keep-cluster", action="store_true")
    parser.add_argument("--data-dir", default=None, help="where worker state and logs go")
    parser.add_argument("--out", default=None, help="append the figures as a JSON line")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.getLogger("flowstream.kafka").setLevel(logging.ERROR)  # brokers die on purpose
    kinds = tuple(k for k in args.faults.split(",") if k)
    known = (*FAULT_KINDS, *NAMED_KINDS)
    unknown = set(kinds) - set(known)
    if unknown:
        raise SystemExit(f"unknown fault kinds {sorted(unknown)}; use {', '.join(known)}")
    options = ChaosOptions(
        runs=args.runs,
        minutes=args.minutes,
        workers=args.workers,
        faults=kinds,
        fault_every=args.fault_every,
        worker_down=args.worker_down,
        broker_down=args.broker_down,
        broker_stop=args.broker_stop,
        restart_nice=args.restart_nice,
        settle=args.settle,
        seed=args.seed,
        settings=dict(args.set),
    )
    if args.short:
        options = replace(SHORT, seed=args.seed, settings=dict(args.set))
    home = args.home or Path.home() / ".cache" / "flowstream" / "chaos-kafka3"
    cluster = Cluster(home, brokers=3, port=args.port)
    started_here = not cluster.is_running()
    cluster.start(fresh=started_here)
    root = harness.scratch("chaos-", args.data_dir)
    print(f"chaos: cluster {cluster.bootstrap}, worker state and logs in {root}", flush=True)
    try:
        result = run_chaos(cluster, options, root)
    finally:
        if started_here and not args.keep_cluster:
            cluster.stop()
    for line in format_result(result):
        print(line)
    harness.emit(result.figures, args.out)
    raise SystemExit(1 if result.audit.violation_count else 0)


if __name__ == "__main__":
    main()

"""Failover: with runs in flight, SIGKILL the owner of some partitions; time until every run on
them progresses again.

Two ``flowstream worker`` processes share the 8 partitions. A client starts order runs at a steady
``--rate`` and follows every committed event (with the header naming the processor that wrote it).
After ``--warm`` seconds, the partitions whose latest events the first worker wrote are its own;
it gets SIGKILL. For every run on those partitions that had started and was not finished at the
kill, the time until its first event written by another processor is its failover time; the
figure is the worst of them. Runs started after the kill on those partitions are reported too
(start → first event), and every run must finish.

Run with the workers' default settings (1.5 s session, 10 s transaction timeout), or e.g. ``--set
SESSION_TIMEOUT_MS=3000 --set TRANSACTION_TIMEOUT_MS=3000`` (liveness, not durability: the broker
still fences the dead member's transaction before anyone reads past it). The broker's
``group.min.session.timeout.ms`` and timed-out-transaction check interval bound the figure too
(docs/architecture.md, "Failover"); ``FLOWSTREAM_BENCH_LOG_LEVEL=INFO`` makes the workers log
assignments and restores with millisecond times, to set beside the kill's.

Usage: ``python -m benchmarks.failover [--rate 100] [--warm 5] [--timeline FILE]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.order_app import SPEC, check_result, make_input
from flowstream.client import FlowClient
from flowstream.kafka import clients
from flowstream.partitioning import partition_for
from flowstream.settings import Settings


class Follow:
    """Per run: its partition, when it was started, its events (time, writer), when it ended."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.started: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.events: dict[str, list[tuple[float, str]]] = {}
        self.last_writer: dict[int, str] = {}
        self.lock = threading.Lock()

    def on_event(self, envelope: Any, now: float, partition: int, writer: str) -> None:
        with self.lock:
            self.events.setdefault(envelope.run_id, []).append((now, writer, envelope.event.type))
            self.last_writer[partition] = writer
            if envelope.event.type in harness.TERMINAL:
                self.ended[envelope.run_id] = now

    def partition(self, run_id: str) -> int:
        return partition_for(run_id, self.partitions)


class GroupWatch:
    """Polls the processors' consumer group; records (seconds, state, members) on each change."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.changes: list[tuple[float, str, int]] = []
        self._admin = clients.new_admin(harness.BOOTSTRAP)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        last = None
        while not self._stop.is_set():
            try:
                found = self._admin.describe_consumer_groups([self.group])[self.group].result(5)
                now = (str(found.state).rsplit(".", 1)[-1], len(found.members))
            except Exception:  # a coordinator move or timeout: try again
                now = ("unknown", -1)
            if now != last:
                self.changes.append((time.monotonic(), *now))
                last = now
            time.sleep(0.05)

    def since(self, moment: float) -> list[str]:
        return [
            f"{t - moment:+.2f}s {state}/{members}"
            for t, state, members in self.changes
            if t >= moment - 0.5
        ]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


async def drive(args: argparse.Namespace) -> dict[str, Any]:
    prefix = harness.new_prefix("failover")
    harness.apply_topics(prefix)
    env = {f"FLOWSTREAM_{k.upper()}": v for k, v in args.set}
    state_root = harness.scratch(f"{prefix}-", args.data_dir)
    client = FlowClient(
        Settings(bootstrap=harness.BOOTSTRAP, topic_prefix=prefix, group=f"{prefix}-client"),
        wait=False,
    )
    workers = [
        harness.Worker(name, prefix=prefix, state_root=state_root, env=env) for name in ("w1", "w2")
    ]
    follow = Follow(client.partitions)
    tracker = None
    watch = GroupWatch(f"{prefix}-group")
    try:
        harness.wait_owned(workers, client.partitions)
        tracker = harness.RunTracker(client.settings, asyncio.get_running_loop())
        tracker.listen(follow.on_event)
        pending: set[asyncio.Task[None]] = set()
        stop_load = asyncio.Event()
        results: dict[str, Any] = {}

        async def one(index: int) -> None:
            run_id = f"fo-{index}"
            assert tracker is not None
            future = tracker.expect(run_id)
            follow.started[run_id] = time.monotonic()
            client.start(run_id, SPEC, make_input(index))
            kind, output = await asyncio.wait_for(future, args.timeout)
            results[run_id] = output if kind == "run_completed" else kind
            check_result(index, results[run_id])

        async def load() -> None:
            index = 0
            began = time.monotonic()
            while not stop_load.is_set():
                task = asyncio.ensure_future(one(index))
                pending.add(task)
                index += 1
                await asyncio.sleep(max(0.0, began + index / args.rate - time.monotonic()))

        loader = asyncio.ensure_future(load())
        await asyncio.sleep(args.warm)
        with follow.lock:
            victim_parts = {p for p, w in follow.last_writer.items() if w == "w1"}
        killed_at = time.monotonic()
        workers[0].process.kill()
        with follow.lock:
            in_flight = [
                r
                for r in follow.started
                if r not in follow.ended and follow.partition(r) in victim_parts
            ]
        print(
            f"SIGKILL w1 at {_wall()} (partitions {sorted(victim_parts)}) with {len(in_flight)} "
            f"of its runs in flight"
        )

        # Watch the survivor take over: when it owns all 8 partitions again.
        owned_all_at = None
        while time.monotonic() - killed_at < args.after:
            if owned_all_at is None and workers[1].owned() >= client.partitions:
                owned_all_at = time.monotonic()
            with follow.lock:
                moved = all(
                    any(t > killed_at and w != "w1" for t, w, *_ in follow.events.get(r, []))
                    for r in in_flight
                )
            if moved and owned_all_at is not None:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(2)
        stop_load.set()
        await loader
        done, not_done = await asyncio.wait(pending, timeout=args.timeout)
        failures = [t.exception() for t in done if t.exception() is not None]
        survivor = harness.procstat("w2", [workers[1].pid])
    finally:
        watch.close()
        for worker in workers:
            worker.stop()
        if tracker is not None:
            tracker.close()
        client.close()

    def first_progress(run_id: str, after: float) -> float | None:
        times = [t for t, w, *_ in follow.events.get(run_id, []) if t > after and w != "w1"]
        return min(times) - after if times else None

    waits = [first_progress(r, killed_at) for r in in_flight]
    if args.timeline:
        write_timeline(Path(args.timeline), follow, victim_parts, killed_at, in_flight)
    # Every run on the victim's partitions waited: those in flight from the kill, later ones
    # from their start. The failover time is the longest of those waits.
    # A run with no event from the survivor either ended in the killed worker's last commit
    # (visible only after the kill) or never progressed at all.
    silent = [r for r, w in zip(in_flight, waits, strict=True) if w is None]
    ended_by_victim = sum(r in follow.ended for r in silent)
    stuck = len(silent) - ended_by_victim
    waits_s = [w for w in waits if w is not None]
    new_runs = [
        r
        for r, t in follow.started.items()
        if t > killed_at and follow.partition(r) in victim_parts
    ]
    new_waits = [first_progress(r, follow.started[r]) for r in new_runs]
    new_s = [w for w in new_waits if w is not None]
    return {
        "figure": "failover",
        "settings": env,
        "rate": args.rate,
        "victim_partitions": sorted(victim_parts),
        "in_flight_at_kill": len(in_flight),
        "failover_s": round(max(waits_s + new_s), 2) if waits_s + new_s else None,
        "in_flight_max_s": round(max(waits_s), 2) if waits_s else None,
        "in_flight_median_s": round(statistics.median(waits_s), 2) if waits_s else None,
        # Seconds from the kill at which a tenth, a fifth ... of the runs in flight progressed.
        "in_flight_deciles_s": (
            [round(q, 2) for q in statistics.quantiles(waits_s, n=10)] if len(waits_s) > 1 else None
        ),
        "never_progressed": stuck,
        "ended_in_killed_commit": ended_by_victim,
        "survivor_owns_all_s": round(owned_all_at - killed_at, 2) if owned_all_at else None,
        "group_states": watch.since(killed_at),
        "new_runs_on_victim": len(new_runs),
        "new_run_first_event_max_s": round(max(new_s), 2) if new_s else None,
        "runs_started": len(follow.started),
        "runs_finished": len(results),
        "runs_failed_or_timed_out": len(failures) + len(not_done),
        "survivor_cpu_s": survivor["cpu_s"],
    }


def write_timeline(
    path: Path, follow: Follow, victim_parts: set[int], killed_at: float, in_flight: list[str]
) -> None:
    """Every run of the victim's partitions: when it started and each event (seconds from the
    kill, writer, type), to see which runs waited and for what."""
    with follow.lock:
        runs = {
            run_id: {
                "in_flight": run_id in in_flight,
                "started_s": round(started - killed_at, 3),
                "events": [
                    (round(t - killed_at, 3), writer, str(kind))
                    for t, writer, kind in follow.events.get(run_id, [])
                ],
            }
            for run_id, started in follow.started.items()
            if follow.partition(run_id) in victim_parts
        }
    path.write_text(json.dumps(runs))


def _wall() -> str:
    """The wall clock to the millisecond, as the workers' log lines print it."""
    now = time.time()
    return time.strftime("%H:%M:%S", time.localtime(now)) + f",{int(now % 1 * 1000):03d}"


def run(args: argparse.Namespace) -> dict[str, Any]:
    started_broker = harness.ensure_broker()
    try:
        context = harness.machine()
        record = {**asyncio.run(drive(args)), **context}
    finally:
        if started_broker and not args.keep_broker:
            harness.stop_broker()
    print(
        f"failover: every run on the killed worker's partitions progressed again within "
        f"{record['failover_s']} s ({record['in_flight_at_kill']} in flight at the kill: worst "
        f"{record['in_flight_max_s']} s, median {record['in_flight_median_s']} s; "
        f"{record['new_runs_on_victim']} started after it: worst "
        f"{record['new_run_first_event_max_s']} s from their start); survivor owned all "
        f"partitions after {record['survivor_owns_all_s']} s; "
        f"{record['ended_in_killed_commit']} ended in the killed worker's last commit, "
        f"{record['never_progressed']} never progressed; "
        f"{record['runs_finished']}/{record['runs_started']} runs finished"
    )
    print(f"group state/members after the kill: {', '.join(record['group_states'])}")
    harness.emit(record, args.out)
    return record


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=100, help="runs started per second")
    parser.add_argument("--warm", type=float, default=5, help="seconds of load before the kill")
    parser.add_argument("--after", type=float, default=60, help="longest wait after the kill")
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument(
        "--set", type=harness.setting, action="append", default=[], metavar="NAME=VALUE"
    )
    parser.add_argument("--data-dir", default=None)
    parser.add_argument(
        "--timeline", metavar="FILE", help="write every victim run's events (seconds from the kill)"
    )
    parser.add_argument("--keep-broker", action="store_true")
    parser.add_argument("--out", default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    main()

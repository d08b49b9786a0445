"""Scale: one worker restores a partition holding many suspended runs, and takes a burst of
starts; counts producer fences on the way (issue 15: 100,000 of each with no fence).

Modes (``both`` runs restore then burst, each on a fresh topic prefix, one worker at a time,
serving ``benchmarks.scale_app:runtime``):

* ``restore``: a filler worker (eager, inline steps and a 60 s transaction timeout: only to
  fill faster and unfenced) takes ``--runs`` ``scale-park`` runs whose ids hash to partition 0;
  each is suspended after its one step, waiting for a signal. Starts are produced straight to
  the start topic in batches of ``--batch`` with at most ``--window`` runs not yet suspended
  (suspended = its ``signal_wait_created`` is committed). The filler stops (SIGTERM), its
  state directory is deleted and a worker with the default settings and the same instance id
  starts (**cold**); it is then stopped and started again on the state it kept (**warm**).
  For each: seconds from spawn until the log says ``partition 0: restored in X s`` (and the
  offsets it restored, so records/s) and until the worker owns all 8 partitions; then
  ``--probes`` of the parked runs get their signal (seconds until all of them completed: the
  partition really serves), and the worker is watched ``--settle`` s more.
* ``burst``: one worker with the default settings owns all partitions; ``--runs`` ``scale-one``
  runs (one step, then complete) are produced at once over the 8 partitions. Measured: seconds
  until every run completed, how many times start commands were applied (``run_created``
  events committed per run, which must be exactly one each; and the worker's
  ``flowstream_commands_total`` for the start topic, which also counts applications that an
  aborted transaction lost), whether the worker survived.

``--fill synthetic`` fills partition 0 without a filler: one real ``scale-park`` history is
cloned for each run id and produced straight to the events topic (a million runs in minutes,
where a filler takes hours); the cold worker is then the first to take them. ``--reuse
PREFIX`` restores the topics of an earlier synthetic fill of as many runs again. For cold and warm
the record also gives the worker's RSS once restored (it holds every run: issue 19's figure),
its state directory's size per run, and the seconds until the first signalled run completed
(first-decision latency after the restart). After them, ``flowstream audit`` reads the topic in
a child process: its wall time and peak RSS (``--no-audit`` skips it).

* ``embedded``: ``benchmarks/scale_embedded.py`` in child processes: ``--runs`` suspended runs
  created by ``FlowEngine`` on a ``RocksDBEventStore``, ``--concurrency`` at a time (or with
  ``--fill synthetic`` written straight into the store), then a fresh process opens the store:
  create rate, RSS while it serves the runs, disk per run, reopen and first-decision latency,
  ``summary()`` and listings, and the audit of the store.

Every measurement also gives the worker's producer resets (``flowstream_producer_resets``: a
fence, e.g. the coordinator aborted a transaction older than the 2 s transaction timeout),
aborted transactions, peak RSS (VmHWM, sampled every 0.25 s, so a worker that dies keeps its
last figure) and CPU seconds. A phase that does not finish in ``--timeout`` s (a worker looping
on fences, or dead) is reported as it stood then. One JSON line per measurement goes to stdout
and to ``--out`` (default ``benchmarks/results/<UTC date>.jsonl``).

Usage: ``python -m benchmarks.scale --runs 100000 [--mode restore|burst|both|embedded]
[--fill worker|synthetic]``; the load average before and after goes with every record.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import re
import shutil
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import harness, scale_embedded
from benchmarks.restore import run_ids_on
from benchmarks.scale_app import ONE, PARK, SIGNAL
from benchmarks.scale_embedded import audit_usage, disk_bytes, status_kib, synthetic_runs
from flowstream import codec
from flowstream.client import FlowClient
from flowstream.kafka import clients
from flowstream.model.messages import StartRun
from flowstream.model.spec import WorkflowSpec
from flowstream.partitioning import partition_for
from flowstream.settings import Settings
from flowstream.topology import CMD_START, EVENTS, load_topology

APP = "benchmarks.scale_app:runtime"
PARTITIONS = load_topology().run_partitions
#: The filler only has to be quick and must not be fenced itself (starts arriving faster than
#: it applies them can hold a transaction open past the default 2 s); the measured workers run
#: the defaults.
FILL_ENV = {
    "FLOWSTREAM_EAGER_STEPS": "true",
    "FLOWSTREAM_INLINE_SYNC_STEPS": "true",
    "FLOWSTREAM_TRANSACTION_TIMEOUT_MS": "60000",
}
_RESTORED = re.compile(rb"partition (\d+): restored in ([0-9.]+) s")
_RESTORING = re.compile(rb"partition (\d+): restoring events (\d+)\.\.(\d+)")
#: Log lines counted: a producer reset, partitions lost (e.g. the poll interval exceeded).
#: librdkafka's logical offsets.
_OFFSET_BEGINNING, _OFFSET_END = -2, -1
_COUNTED = {"log_producer_resets": b"replacing it", "lost_partitions": b"lost partitions"}


class Counts:
    """Tails every partition of the events topic from its start (``read_committed``) and counts,
    per run, its ``run_created`` events; keeps the runs suspended on a signal and the finished
    ones. Only the first bytes of an event are read (``codec.event_head``)."""

    def __init__(self, prefix: str, *, from_end: bool = False) -> None:
        self.topic = load_topology().names(prefix)[EVENTS]
        self.created: collections.Counter[str] = collections.Counter()
        self.suspended: set[str] = set()
        self.finished: set[str] = set()
        self.events = [0] * PARTITIONS
        self._stop = threading.Event()
        self._consumer = clients.new_consumer(harness.BOOTSTRAP, f"{prefix}-counts-{_tag()}")
        start = _OFFSET_END if from_end else _OFFSET_BEGINNING
        self._consumer.assign(
            [clients.TopicPartition(self.topic, p, start) for p in range(PARTITIONS)]
        )
        self._thread = threading.Thread(target=self._tail, daemon=True)
        self._thread.start()

    def _tail(self) -> None:
        while not self._stop.is_set():
            first = self._consumer.poll(0.05)
            if first is None:
                continue
            for message in [first, *self._consumer.consume(num_messages=5000, timeout=0)]:
                data = message.value()
                if message.error() is not None or not data or data[:2] != codec.MARKER:
                    continue  # not an event (anchor, inbox or hook-token record)
                head = codec.event_head(data)
                if head is None:
                    envelope = codec.decode_event(data)
                    head = (envelope.run_id, envelope.sequence, envelope.event.type)
                run_id, _, kind = head
                self.events[message.partition() or 0] += 1
                if kind == "run_created":
                    self.created[run_id] += 1
                elif kind == "signal_wait_created":
                    self.suspended.add(run_id)
                elif kind in harness.TERMINAL:
                    self.finished.add(run_id)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()


class Watch:
    """One worker from its spawn: alive or not, its metrics, peak RSS, CPU, and its log lines
    since the spawn (restores, producer resets), sampled by :meth:`sample`."""

    def __init__(self, label: str, make: Any, log_path: Path) -> None:
        self.label = label
        self._log_at = log_path.stat().st_size if log_path.exists() else 0
        self.began = time.monotonic()
        self.worker: harness.Worker = make()
        self.metrics: dict[str, float] = {}
        self.peak_rss_mib = 0.0
        self.cpu_s = 0.0
        self.exit_code: int | None = None
        self.died_s: float | None = None
        self.all_owned_s: float | None = None
        self.reset_s: list[float] = []
        self.restored: list[tuple[int, float, float]] = []  # (partition, seconds, at)
        self.counted = dict.fromkeys(_COUNTED, 0)
        self.offsets: list[tuple[int, int, int]] = []  # (partition, from, to) of each restore
        self._tail = b""

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    @property
    def alive(self) -> bool:
        return self.exit_code is None

    def sample(self) -> None:
        now = self.elapsed()
        self._read_log(now)
        if not self.alive:
            return
        code = self.worker.process.poll()
        if code is not None:
            self.exit_code, self.died_s = code, now
            return
        usage = harness.procstat(self.label, [self.worker.pid], tree=False)
        self.peak_rss_mib = max(self.peak_rss_mib, usage["max_single_peak_rss_mib"])
        self.cpu_s = max(self.cpu_s, usage["cpu_s"])
        metrics = self.worker.metrics()
        if not metrics:
            return
        before = self.metrics.get("flowstream_producer_resets_total", 0.0)
        if metrics.get("flowstream_producer_resets_total", 0.0) > before:
            self.reset_s.append(round(now, 2))
        if self.all_owned_s is None and metrics.get("flowstream_owned_partitions", 0) >= 8:
            self.all_owned_s = now
        self.metrics = metrics

    def _read_log(self, now: float) -> None:
        with open(self.worker.log_path, "rb") as handle:
            handle.seek(self._log_at)
            chunk = handle.read()
        self._log_at += len(chunk)
        lines = (self._tail + chunk).split(b"\n")
        self._tail = lines.pop()
        for line in lines:
            found = _RESTORED.search(line)
            if found:
                self.restored.append((int(found[1]), float(found[2]), now))
            found = _RESTORING.search(line)
            if found:
                self.offsets.append((int(found[1]), int(found[2]), int(found[3])))
            for name, text in _COUNTED.items():
                self.counted[name] += text in line

    def restored_first(self, partition: int) -> tuple[float, float] | None:
        """(the worker's own restore seconds, seconds from spawn) of the first restore."""
        for p, took, at in self.restored:
            if p == partition:
                return took, at
        return None

    def wait(self, done: Any, until: float, every: float = 0.25) -> bool:
        """Sample until ``done()``, the worker's death or ``until`` seconds from the spawn."""
        while True:
            self.sample()
            if done():
                return True
            if not self.alive or self.elapsed() > until:
                return False
            time.sleep(every)

    def stop(self) -> None:
        self.sample()
        self.worker.stop()

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def figures(self) -> dict[str, Any]:
        m = self.metrics
        # flowstream_commands_total{outcome="applied",topic="<prefix>.cmd.start"} and the like
        starts = {
            k.split('outcome="')[1].split('"')[0]: int(v)
            for k, v in m.items()
            if k.startswith("flowstream_commands_total{") and f'.{CMD_START}"' in k
        }
        return {
            "producer_resets": int(m.get("flowstream_producer_resets_total", 0)),
            "producer_resets_at_s": self.reset_s,
            **self.counted,
            "aborts": int(m.get("flowstream_transaction_aborts_total", 0)),
            "transactions": int(m.get("flowstream_transaction_seconds_count", 0)),
            "start_commands_applied": sum(starts.values()),
            "start_commands_by_outcome": starts,
            "survived": self.alive,
            "exit_code": self.exit_code,
            "died_s": round(self.died_s, 2) if self.died_s is not None else None,
            "peak_rss_mib": self.peak_rss_mib,
            "cpu_s": self.cpu_s,
        }

    def last_lines(self, count: int = 12) -> list[str]:
        text = self.worker.output().splitlines()
        return [line[:300] for line in text[-count:]]


def _tag() -> str:
    return uuid.uuid4().hex[:6]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


class Starts:
    """Produces ``StartRun`` commands straight to the start topic (no ``FlowClient`` call per
    run): encoded here, batched by librdkafka."""

    def __init__(self, prefix: str) -> None:
        self.topic = load_topology().names(prefix)[CMD_START]
        self._producer = clients.new_producer(harness.BOOTSTRAP, {"linger.ms": 20})

    def send(self, run_ids: list[str], spec: WorkflowSpec) -> None:
        for index, run_id in enumerate(run_ids):
            value = codec.encode_message(StartRun(run_id=run_id, spec=spec, input={"i": index}))
            while True:
                try:
                    self._producer.produce(
                        self.topic,
                        value=value,
                        key=run_id.encode(),
                        partition=partition_for(run_id, PARTITIONS),
                    )
                    break
                except BufferError:
                    self._producer.poll(0.05)
            self._producer.poll(0)
        if self._producer.flush(60):
            raise SystemExit("start commands were not acknowledged in 60 s")


# -- restore ----------------------------------------------------------------------------------


def fill(prefix: str, state_root: Path, args: argparse.Namespace, counts: Counts) -> dict[str, Any]:
    """``args.runs`` parked runs on partition 0, through a filler worker named ``restorer``."""
    ids = run_ids_on(0, args.runs, PARTITIONS, prefix[-8:])
    starts = Starts(prefix)
    with Watch("filler", lambda: _worker(prefix, state_root, FILL_ENV), _log(state_root)) as watch:
        harness.wait_owned([watch.worker], PARTITIONS)
        began = time.monotonic()
        sent = 0
        while sent < len(ids):
            if sent - len(counts.suspended) < args.window:
                batch = ids[sent : sent + args.batch]
                starts.send(batch, PARK)
                sent += len(batch)
                if sent % 20_000 < len(batch):
                    print(f"  {sent:,} started, {len(counts.suspended):,} suspended", flush=True)
            else:
                watch.sample()
                if not watch.alive:
                    raise SystemExit(f"the filler exited:\n{watch.worker.output()[-3000:]}")
                time.sleep(0.1)
            if time.monotonic() - began > args.fill_timeout:
                raise SystemExit(f"filling took over {args.fill_timeout} s")
        finished = watch.wait(lambda: len(counts.suspended) >= len(ids), args.fill_timeout)
        fill_s = time.monotonic() - began
    if not finished:
        raise SystemExit(f"only {len(counts.suspended)} of {len(ids)} runs suspended in time")
    record: dict[str, Any] = {
        "runs": len(ids),
        "fill_s": round(fill_s, 1),
        "events_partition_0": counts.events[0],
        "filler": watch.figures(),
    }
    print(
        f"filled partition 0 with {len(ids):,} suspended runs ({counts.events[0]:,} events) in "
        f"{fill_s:.1f} s; filler: {record['filler']['producer_resets']} producer resets"
    )
    return {**record, "ids": ids}


def fill_synthetic(prefix: str, args: argparse.Namespace) -> dict[str, Any]:
    """``args.runs`` parked runs on partition 0, their histories produced straight to the events
    topic (``scale_embedded.synthetic_runs``): no worker wrote them, the cold restore is the
    first to take them. With ``--reuse`` the topic of an earlier fill is taken as it is."""
    ids = run_ids_on(0, args.runs, PARTITIONS, prefix[-8:])
    topic = load_topology().names(prefix)[EVENTS]
    if args.reuse:
        events = _high_watermark(topic)
        print(f"reusing {prefix}: {len(ids):,} runs, {events:,} records on partition 0")
        return {"runs": len(ids), "fill_s": None, "events_partition_0": events, "ids": ids}
    producer = clients.new_producer(harness.BOOTSTRAP, {"linger.ms": 50})
    began = time.monotonic()
    events = 0
    for run_id, _, records, _ in synthetic_runs(((r, PARK) for r in ids), codec.encode_event):
        key = run_id.encode()
        for value in records:
            while True:
                try:
                    producer.produce(topic, value=value, key=key, partition=0)
                    break
                except BufferError:
                    producer.poll(0.05)
            events += 1
        producer.poll(0)
        if events % 600_000 < len(records):
            print(f"  {events:,} events produced", flush=True)
    if producer.flush(120):
        raise SystemExit("the synthetic events were not acknowledged in 120 s")
    fill_s = time.monotonic() - began
    print(f"produced {len(ids):,} suspended runs ({events:,} events) in {fill_s:.1f} s")
    return {"runs": len(ids), "fill_s": round(fill_s, 1), "events_partition_0": events, "ids": ids}


def _high_watermark(topic: str) -> int:
    consumer = clients.new_consumer(harness.BOOTSTRAP, f"scale-watermark-{_tag()}")
    try:
        _, high = consumer.get_watermark_offsets(clients.TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()
    return int(high)


def restart(
    prefix: str, state_root: Path, kind: str, ids: list[str], counts: Counts, args: Any
) -> dict[str, Any]:
    """One worker over the filled partition: restore, then a signal to a few parked runs."""
    events = args.events_partition_0
    with Watch(kind, lambda: _worker(prefix, state_root), _log(state_root)) as watch:
        restored = watch.wait(
            lambda: watch.all_owned_s is not None and watch.restored_first(0) is not None,
            args.timeout,
            every=0.1,
        )
        probes = [r for r in ids if r not in counts.finished][: args.probes]
        if args.reuse:  # an earlier restore of the topic signalled the first runs
            probes = random.Random(kind).sample(ids, args.probes)
        probe_s = first_s = None
        held: dict[str, Any] = {}
        if restored:
            kib = status_kib(watch.worker.pid)
            held = {
                "rss_restored_mib": round(kib["VmRSS"] / 1024, 1),
                "disk_bytes_per_run": round(disk_bytes(watch.worker.state_dir) / len(ids)),
            }
            client = FlowClient(
                Settings(
                    bootstrap=harness.BOOTSTRAP, topic_prefix=prefix, group=f"{prefix}-client"
                ),
                wait=False,
            )
            sent_at = watch.elapsed()
            for run_id in probes:
                client.signal(run_id, SIGNAL, id=f"probe-{kind}-{run_id}")
            client.flush()
            until = max(args.timeout, sent_at + 30)
            if watch.wait(lambda: not counts.finished.isdisjoint(probes), until, every=0.01):
                first_s = watch.elapsed() - sent_at
            if watch.wait(lambda: counts.finished.issuperset(probes), until):
                probe_s = watch.elapsed() - sent_at
            client.close()
            watch.wait(lambda: False, watch.elapsed() + args.settle, every=0.5)
        first = watch.restored_first(0)
        read = next((high - low for p, low, high in watch.offsets if p == 0), None)
        figures = watch.figures()
    record = {
        "figure": f"scale-restore-{kind}",
        "runs": len(ids),
        "events_partition_0": events,
        "restored": restored,
        "partition_0_restored_at_s": _round(first[1]) if first else None,
        "partition_0_restore_s": first[0] if first else None,
        "partition_0_records_restored": read,
        "restore_records_per_s": round(read / first[0]) if read and first and first[0] else None,
        "all_owned_at_s": _round(watch.all_owned_s),
        "restores_logged": len(watch.restored),
        "partition_0_restores_logged": sum(p == 0 for p, _, _ in watch.restored),
        "probes": len(probes),
        "first_probe_completed_s": _round(first_s),
        "probes_completed_s": _round(probe_s),
        **held,
        "watched_s": round(watch.elapsed(), 1),
        **figures,
    }
    if not figures["survived"] or not restored:
        record["last_log_lines"] = watch.last_lines()
    return record


def run_restore(args: argparse.Namespace, state_root: Path) -> list[dict[str, Any]]:
    prefix = args.reuse or harness.new_prefix("scale-restore")
    if not args.reuse:
        harness.apply_topics(prefix)
    if args.fill == "synthetic":
        filled = fill_synthetic(prefix, args)
        filled["filler"] = {"producer_resets": None}
        counts = Counts(prefix, from_end=True)
    else:
        counts = Counts(prefix)
    try:
        if args.fill == "worker":
            filled = fill(prefix, state_root, args, counts)
            shutil.rmtree(state_root / "restorer")
        ids = filled.pop("ids")
        args.events_partition_0 = filled["events_partition_0"]
        records = []
        for kind in ("cold", "warm"):
            record = {**restart(prefix, state_root, kind, ids, counts, args), "prefix": prefix}
            record.update(
                fill_s=filled["fill_s"], filler_resets=filled["filler"]["producer_resets"]
            )
            records.append(record)
            _say(record)
            if not (record["survived"] and record["restored"]):
                break
    finally:
        counts.close()
    if args.audit:
        audit = {
            "figure": "scale-audit",
            "prefix": prefix,
            "runs": len(ids),
            "events": filled["events_partition_0"],
            **audit_usage(["--bootstrap", harness.BOOTSTRAP, "--prefix", prefix]),
        }
        print(
            f"audit of the topic ({len(ids):,} runs): {audit['audit_s']} s, peak RSS "
            f"{audit['audit_peak_rss_mib']} MiB, exit {audit['audit_exit']}: "
            f"{audit['audit_summary']}"
        )
        records.append(audit)
    return records


# -- burst ------------------------------------------------------------------------------------


def run_burst(args: argparse.Namespace, state_root: Path) -> list[dict[str, Any]]:
    prefix = harness.new_prefix("scale-burst")
    harness.apply_topics(prefix)
    counts = Counts(prefix)
    tag = prefix[-8:]
    ids = [f"burst-{tag}-{i}" for i in range(args.runs)]
    try:
        with Watch("burst", lambda: _worker(prefix, state_root), _log(state_root)) as watch:
            harness.wait_owned([watch.worker], PARTITIONS)
            began = watch.elapsed()
            Starts(prefix).send(ids, ONE)
            produced_s = watch.elapsed() - began
            done = watch.wait(lambda: len(counts.finished) >= len(ids), began + args.timeout, 0.5)
            done_s = watch.elapsed() - began
            time.sleep(2)  # what the last commit made visible reaches the tail
            figures = watch.figures()
    finally:
        counts.close()
    created = sum(counts.created[r] for r in ids)
    record = {
        "figure": "scale-burst",
        "prefix": prefix,
        "runs": len(ids),
        "produce_s": round(produced_s, 2),
        "all_completed": done,
        "completed": len(counts.finished.intersection(ids)),
        "completed_s": round(done_s, 2),
        "runs_per_s": round(len(counts.finished) / done_s) if done_s else None,
        "run_created_events": created,
        "runs_created_more_than_once": sum(counts.created[r] > 1 for r in ids),
        "runs_never_created": sum(counts.created[r] == 0 for r in ids),
        **figures,
    }
    if not figures["survived"] or not done:
        record["last_log_lines"] = watch.last_lines()
    _say(record)
    return [record]


# -- the whole ------------------------------------------------------------------------------


def _worker(prefix: str, state_root: Path, env: dict[str, str] | None = None) -> harness.Worker:
    return harness.Worker("restorer", prefix=prefix, state_root=state_root, app=APP, env=env)


def _log(state_root: Path) -> Path:
    return state_root / "restorer.log"


def _say(record: dict[str, Any]) -> None:
    fate = "survived" if record["survived"] else f"DIED (exit {record['exit_code']})"
    common = (
        f"{record['producer_resets']} producer resets {record['producer_resets_at_s']}, "
        f"{record['aborts']} aborts, partitions lost {record['lost_partitions']} times, "
        f"peak RSS {record['peak_rss_mib']} MiB, "
        f"{record['cpu_s']} CPU s, worker {fate}"
    )
    if record["figure"] == "scale-burst":
        print(
            f"burst of {record['runs']:,} starts (produced in {record['produce_s']} s): "
            f"{record['completed']:,} completed in {record['completed_s']} s; "
            f"{record['run_created_events']:,} run_created events "
            f"({record['runs_created_more_than_once']} runs more than once), "
            f"{record['start_commands_applied']:,} start commands applied; {common}"
        )
    else:
        print(
            f"{record['figure']}: {record['runs']:,} suspended runs, "
            f"{record['events_partition_0']:,} events on partition 0: partition 0 restored "
            f"at {record['partition_0_restored_at_s']} s from spawn (its restore "
            f"{record['partition_0_restore_s']} s, "
            f"{record['partition_0_records_restored']} records, "
            f"{record['restore_records_per_s']}/s), "
            f"all 8 owned at {record['all_owned_at_s']} s, RSS then "
            f"{record.get('rss_restored_mib')} MiB, disk {record.get('disk_bytes_per_run')} "
            f"B/run; {record['probes']} signalled runs completed in "
            f"{record['probes_completed_s']} s (the first {record['first_probe_completed_s']} s); "
            f"{record['partition_0_restores_logged']} restores of partition 0; {common}"
        )
    for line in record.get("last_log_lines", []):
        print(f"    | {line}")


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    # The restore log lines are at INFO.
    os.environ.setdefault("FLOWSTREAM_BENCH_LOG_LEVEL", "INFO")
    started_broker = args.mode != "embedded" and harness.ensure_broker()
    records: list[dict[str, Any]] = []
    try:
        context = harness.machine()
        if args.mode == "embedded":
            record = {**scale_embedded.run_child(args), **context}
            scale_embedded.say(record)
            harness.emit(record, args.out)
            return [record]
        for mode in ("restore", "burst"):
            if args.mode in (mode, "both"):
                state_root = harness.scratch(f"scale-{mode}-", args.data_dir)
                try:
                    found = (run_restore if mode == "restore" else run_burst)(args, state_root)
                finally:
                    if not args.keep_state:
                        shutil.rmtree(state_root, ignore_errors=True)
                for record in found:
                    record.update(context, loadavg_1m_after=round(os.getloadavg()[0], 2))
                    harness.emit(record, args.out)
                records += found
    finally:
        if started_broker:
            harness.stop_broker()
    return records


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--mode", choices=("restore", "burst", "both", "embedded"), default="both")
    parser.add_argument(
        "--fill",
        choices=("worker", "synthetic"),
        default="worker",
        help="restore: a filler worker drives the runs, or their histories are produced",
    )
    parser.add_argument(
        "--reuse",
        metavar="PREFIX",
        default=None,
        help="restore, synthetic: the topics of an earlier synthetic fill of --runs runs",
    )
    parser.add_argument("--no-audit", dest="audit", action="store_false", help="skip the audit")
    parser.add_argument("--concurrency", type=int, default=500, help="embedded: starts at once")
    parser.add_argument("--no-inspect", dest="inspect", action="store_false", help="embedded")
    parser.add_argument("--timeout", type=float, default=600, help="longest wait of a phase, s")
    parser.add_argument("--fill-timeout", type=float, default=1800)
    parser.add_argument("--batch", type=int, default=500, help="starts produced at once (fill)")
    parser.add_argument("--window", type=int, default=1000, help="runs not yet suspended (fill)")
    parser.add_argument("--probes", type=int, default=20, help="parked runs signalled")
    parser.add_argument("--settle", type=float, default=20, help="seconds watched after that")
    parser.add_argument("--data-dir", default=None, help="where the state directories go")
    parser.add_argument("--keep-state", action="store_true")
    parser.add_argument(
        "--out",
        default=str(
            harness.ROOT / "benchmarks" / "results" / f"{datetime.now(UTC):%Y-%m-%d}.jsonl"
        ),
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    main()

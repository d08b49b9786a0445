"""Scale, embedded, and what both halves of ``benchmarks/scale.py`` share: N suspended
``scale-park`` runs in one process, and the audit's peak RSS.

``embedded``: one child process creates ``--runs`` runs in a new ``RocksDBEventStore``, each
suspended after its step on the signal ``go``: through ``FlowEngine``, ``--concurrency`` at a
time, or with ``--fill synthetic`` written straight into the store (``bulk_fill``). Measured
there: create rate, RSS after creating (VmRSS) and its peak (VmHWM), the projections cached and
RocksDB's shared memory (cache and memtables), disk per run. A second, fresh child process then
opens the store and serves it (``reopen``): the open, first-decision latency (a signal to a run
never read since it was written, until it completed), ``summary()``, counts, listings by status
(the first page and the 100th), ``next_wakeup()``, one pass of the stalled-run scan, and its RSS
then (the figure of issue 19: a process holding every run); last ``list_open_suspensions()``,
whose answer is as long as the runs, and the RSS after it. Then ``flowstream audit --data`` over
the store (wall time, peak RSS). ``--keep-state`` keeps the store; ``python -m
benchmarks.scale_embedded reopen DIR 1 [RUN]`` measures a kept store again.

``synthetic_runs`` gives real histories under many run ids fast (a template's encoded events
with its ids replaced), for ``bulk_fill`` and for filling an events topic straight from a
producer (``scale.py --fill synthetic``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.scale_app import PARK, SIGNAL, runtime
from flowstream import codec
from flowstream.engine import FlowEngine
from flowstream.errors import FlowError
from flowstream.model.events import EventEnvelope
from flowstream.model.spec import WorkflowSpec
from flowstream.replay.state import RunState
from flowstream.stores.base import new_event_id
from flowstream.stores.memory import MemoryEventStore

APP = "benchmarks.scale_app:runtime"


def status_kib(pid: int | str = "self") -> dict[str, int]:
    """VmRSS and VmHWM of a process, KiB."""
    found: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith(("VmRSS:", "VmHWM:")):
                found[line.split(":")[0]] = int(line.split()[1])
    return found


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def audit_usage(arguments: list[str]) -> dict[str, Any]:
    """``flowstream audit ARGS`` in a child: its wall seconds, exit code, peak RSS (its VmHWM,
    sampled until it exits: ``ru_maxrss`` counts the parent's pages the fork started with) and
    the last line it printed (the summary)."""
    command = [sys.executable, "-m", "flowstream", "audit", "--app", APP, *arguments]
    began = time.monotonic()
    peak = 0
    with tempfile.TemporaryFile() as out:
        child = subprocess.Popen(command, cwd=harness.ROOT, stdout=out, stderr=subprocess.DEVNULL)
        while child.poll() is None:
            try:
                peak = max(peak, status_kib(child.pid).get("VmHWM", 0))
            except OSError:
                break
            time.sleep(0.1)
        child.wait()
        out.seek(0, os.SEEK_END)
        out.seek(max(0, out.tell() - 400))
        tail = out.read().decode(errors="replace").strip().splitlines()
    return {
        "audit_s": round(time.monotonic() - began, 1),
        "audit_exit": child.returncode,
        "audit_peak_rss_mib": round(peak / 1024, 1),
        "audit_summary": tail[-1] if tail else "",
    }


#: One synthetic run: its id, the template's envelopes (their sequences), the run's records
#: (the template's bytes under the run's id and fresh event ids) and its state.
Synthetic = tuple[str, list[EventEnvelope], list[bytes], RunState]


def synthetic_runs(
    runs: Iterable[tuple[str, WorkflowSpec]], encode: Callable[[EventEnvelope], bytes]
) -> Iterator[Synthetic]:
    """A real history for each ``(run id, spec)``: the engine runs a template of that spec once
    per run-id length (on a memory store), its events are encoded with ``encode`` once, and each
    run gets those bytes with the template's run id and event ids replaced (same lengths, so an
    Avro encoding stays valid; the first run of each template is checked by decoding it).
    Thousands of times faster than encoding every event."""
    templates: dict[tuple[str, int], tuple[bytes, list[EventEnvelope], list[bytes], RunState]] = {}
    checked: set[tuple[str, int]] = set()
    for run_id, spec in runs:
        key = (spec.name, len(run_id))
        template = templates.get(key)
        if template is None:
            template = templates[key] = _template(spec, len(run_id), encode)
        template_id, envelopes, encoded, state = template
        new_id = run_id.encode()
        records = [
            raw.replace(template_id, new_id).replace(e.event_id.encode(), new_event_id().encode())
            for e, raw in zip(envelopes, encoded, strict=True)
        ]
        if key not in checked:
            checked.add(key)
            _check(records, envelopes, run_id)
        yield run_id, envelopes, records, dataclasses.replace(state, run_id=run_id)


def _template(
    spec: WorkflowSpec, length: int, encode: Callable[[EventEnvelope], bytes]
) -> tuple[bytes, list[EventEnvelope], list[bytes], RunState]:
    run_id = "T" * length  # a run of T's appears nowhere else in the encoded events

    async def make() -> RunState:
        store = MemoryEventStore()
        await FlowEngine(store, runtime).start(run_id, spec, {"i": 0})
        return store.state(run_id)

    state = asyncio.run(make())
    envelopes = list(state.history)
    return run_id.encode(), envelopes, [encode(e) for e in envelopes], state


def _check(records: list[bytes], envelopes: list[EventEnvelope], run_id: str) -> None:
    """The first run of a template decodes to the template's events under its id."""
    for raw, template in zip(records, envelopes, strict=True):
        try:
            decoded = codec.decode_event(raw)
        except FlowError:
            decoded = EventEnvelope.model_validate_json(raw)
        expected = template.model_copy(update={"run_id": run_id, "event_id": decoded.event_id})
        assert decoded == expected and decoded.event_id != template.event_id, decoded


def bulk_fill(store: Any, runs: Iterable[tuple[str, WorkflowSpec]], every: int = 5000) -> int:
    """Write synthetic runs straight into a ``RocksDBEventStore``, ``every`` runs per write,
    through the store's own append record (``put_append``: events, last sequence, the open-runs
    and wakeup entries) with the run index's keys that ``RunTable.change`` gives for each run's
    state, as an append of its whole history would; returns the runs written."""
    from rocksdict import WriteBatch

    from flowstream.stores.base import IndexChanges
    from flowstream.stores.rocksdb import put_append

    table = store.run_index()
    batch = WriteBatch(raw_mode=True)
    count = 0
    for run_id, envelopes, records, state in synthetic_runs(runs, store._encode):
        changes = IndexChanges()
        changes.run_open = True if not state.is_terminal else None
        changes.added_wakeups = state.wakeups()
        changes.run_index = table.change(None, state)
        put_append(batch, run_id, envelopes, records, changes)
        count += 1
        if count % every == 0:
            store._db.write(batch)
            batch = WriteBatch(raw_mode=True)
            if count % 100_000 == 0:
                print(f"  {count:,} runs written", file=sys.stderr, flush=True)
    store._db.write(batch)
    return count


async def _create(engine: Any, count: int, concurrency: int) -> None:
    started = 0
    began = time.monotonic()
    while started < count:
        batch = range(started, min(count, started + concurrency))
        snapshots = await asyncio.gather(
            *(engine.start(f"park-{i}", PARK, {"i": i}) for i in batch)
        )
        assert all(s.status.value == "suspended" for s in snapshots), snapshots[0]
        started = batch.stop
        if started % 100_000 < concurrency:
            rate = started / (time.monotonic() - began)
            print(f"  {started:,} created ({rate:.0f}/s)", file=sys.stderr, flush=True)


def _timed(work: Any) -> tuple[float, Any]:
    began = time.perf_counter()
    result = work()
    return round(time.perf_counter() - began, 3), result


def _rss() -> dict[str, float]:
    kib = status_kib()
    return {"rss_mib": round(kib["VmRSS"] / 1024, 1), "peak_mib": round(kib["VmHWM"] / 1024, 1)}


def create(directory: Path, runs: int, concurrency: int, fill: str) -> dict[str, Any]:
    """``runs`` suspended runs in a new store at ``directory`` (in this process): through the
    engine, or ``fill="synthetic"``: ``bulk_fill``."""
    from flowstream.stores.rocksdb import RocksDBEventStore, rocksdb_memory

    store = RocksDBEventStore(directory)
    began = time.monotonic()
    if fill == "synthetic":
        bulk_fill(store, ((f"park-{i}", PARK) for i in range(runs)))
    else:
        asyncio.run(_create(FlowEngine(store, runtime), runs, concurrency))
    create_s = time.monotonic() - began
    rss = _rss()
    record = {
        "create_s": round(create_s, 1),
        "create_per_s": round(runs / create_s),
        "rss_after_create_mib": rss["rss_mib"],
        "peak_rss_create_mib": rss["peak_mib"],
        "cached_projections": len(store._states),
        "rocksdb": rocksdb_memory(),
        "loadavg_after_create": round(os.getloadavg()[0], 2),
    }
    store.close()
    return {**record, "disk_bytes_per_run": round(disk_bytes(directory) / runs)}


def reopen(directory: Path, inspect: bool, probe: str = "park-0") -> dict[str, Any]:
    """What a fresh process that opens the store and serves its runs measures: the open, the
    first decision (a signal to ``probe``, never read since the store was written), the fleet
    views (``summary()``, counts, listings by status through the run index, ``next_wakeup()``,
    one pass of the stalled-run scan), the RSS then (the process holds every run: the figure of
    issue 19), and last ``list_open_suspensions()``, which returns every open suspension (its
    list is as long as the runs) and the RSS after it."""
    from flowstream.index import RunQuery
    from flowstream.model.snapshot import RunStatus
    from flowstream.stores.rocksdb import RocksDBEventStore, rocksdb_memory

    record: dict[str, Any] = {"rss_before_open_mib": _rss()["rss_mib"]}
    open_s, store = _timed(lambda: RocksDBEventStore(directory))
    engine = FlowEngine(store, runtime)
    record.update(reopen_s=open_s, rss_after_open_mib=_rss()["rss_mib"])
    first_s, snapshot = _timed(
        lambda: asyncio.run(engine.signal(probe, SIGNAL, "now", id=f"probe-{probe}"))
    )
    assert snapshot.status.value == "completed", snapshot.status
    record["first_decision_after_reopen_s"] = first_s
    if inspect:
        suspended = frozenset({RunStatus.SUSPENDED})
        index = engine.run_index()
        record["summary_s"], summary = _timed(engine.summary)
        record["summary_by_status"] = {k.value: v for k, v in summary.by_status.items()}
        record["counts_s"], _ = _timed(index.counts)
        record["list_by_status_s"], page = _timed(lambda: index.query(RunQuery(status=suspended)))
        deep = page.next_cursor
        for _ in range(98):
            deep = index.query(RunQuery(status=suspended, cursor=deep)).next_cursor
        record["list_by_status_page_100_s"], _ = _timed(
            lambda: index.query(RunQuery(status=suspended, cursor=deep))
        )
        record["next_wakeup_s"], _ = _timed(store.next_wakeup)
        record["repair_pass_s"], repairs = _timed(lambda: asyncio.run(engine.repair_stalled()))
        record["repair_pass_scanned"] = repairs.scanned
        rss = _rss()
        record.update(
            rss_serving_mib=rss["rss_mib"],
            peak_rss_serving_mib=rss["peak_mib"],
            cached_projections=len(store._states),
            rocksdb=rocksdb_memory(),
        )
        record["list_open_suspensions_s"], found = _timed(engine.list_open_suspensions)
        record["open_suspensions"] = len(found)
        del found
        rss = _rss()
        record.update(rss_after_inspect_mib=rss["rss_mib"], peak_rss_mib=rss["peak_mib"])
    store.close()
    return record


def _child(*arguments: str) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.scale_embedded", *arguments]
    done = subprocess.run(command, cwd=harness.ROOT, stdout=subprocess.PIPE, check=True)
    return dict(json.loads(done.stdout.decode().strip().splitlines()[-1]))


def run_child(args: Any) -> dict[str, Any]:
    """``embedded``: the store created in one child process, opened and inspected in another,
    then audited; its record."""
    directory = harness.scratch("scale-embedded-", args.data_dir)
    fill = getattr(args, "fill", "worker")
    record: dict[str, Any] = {
        "figure": "scale-embedded",
        "runs": args.runs,
        "fill": "synthetic" if fill == "synthetic" else "engine",
    }
    try:
        record.update(_child("create", str(directory), str(args.runs), str(args.concurrency), fill))
        record.update(_child("reopen", str(directory), "1" if args.inspect else "0"))
        if args.audit:
            record.update(audit_usage(["--data", str(directory)]))
    finally:
        if not getattr(args, "keep_state", False):
            shutil.rmtree(directory, ignore_errors=True)
    record["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    return record


def say(record: dict[str, Any]) -> None:
    keys = (
        "create_per_s",
        "rss_after_create_mib",
        "peak_rss_create_mib",
        "disk_bytes_per_run",
        "reopen_s",
        "rss_after_open_mib",
        "first_decision_after_reopen_s",
        "summary_s",
        "list_by_status_s",
        "list_by_status_page_100_s",
        "rss_serving_mib",
        "peak_rss_serving_mib",
        "list_open_suspensions_s",
        "rss_after_inspect_mib",
        "peak_rss_mib",
        "audit_s",
        "audit_peak_rss_mib",
    )
    figures = ", ".join(f"{k} {record[k]}" for k in keys if k in record)
    print(
        f"embedded ({record.get('fill')}), {record['runs']:,} suspended runs: {figures}; load "
        f"{record.get('loadavg_1m')} before, {record.get('loadavg_1m_after')} after"
    )


if __name__ == "__main__":
    if sys.argv[1] == "create":
        directory, runs, concurrency, fill = sys.argv[2:6]
        found = create(Path(directory), int(runs), int(concurrency), fill)
    else:  # reopen DIRECTORY INSPECT [PROBE]
        found = reopen(Path(sys.argv[2]), sys.argv[3] == "1", *sys.argv[4:5])
    print(json.dumps(found))

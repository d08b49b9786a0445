"""Scale, embedded, and what both halves of ``benchmarks/scale.py`` share: N suspended
``scale-park`` runs in one process, and the audit's peak RSS.

``embedded`` (run in a child process, so its RSS is the engine's alone): ``FlowEngine`` over a
``RocksDBEventStore`` creates ``--runs`` runs, ``--concurrency`` at a time, each suspended after
its step on the signal ``go``. Measured: create rate; RSS after creating (VmRSS) and its peak
(VmHWM); the projections cached and RocksDB's shared memory (cache and memtables); disk per run;
the open of the store again (the restore, with its state); first-decision latency (a signal to the
first run, long evicted, until it completed); ``summary()``, ``list_open_suspensions()`` and a
listing by status where the engine has one; RSS after them; and ``flowstream audit --data`` over
the store (wall time, peak RSS).

``synthetic_histories`` clones one real ``scale-park`` history for many run ids (new event ids),
for filling an events topic straight from a producer (``scale.py --fill synthetic``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
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


def embedded(
    runs: int, concurrency: int, data_dir: str | None, inspect: bool, audit: bool
) -> dict[str, Any]:
    """The measurement itself (in this process)."""
    from flowstream.engine import FlowEngine
    from flowstream.stores.rocksdb import RocksDBEventStore, rocksdb_memory

    record: dict[str, Any] = {"figure": "scale-embedded", "runs": runs}
    directory = Path(tempfile.mkdtemp(prefix="scale-embedded-", dir=data_dir))
    store = RocksDBEventStore(directory)
    engine = FlowEngine(store, runtime)
    began = time.monotonic()
    asyncio.run(_create(engine, runs, concurrency))
    create_s = time.monotonic() - began
    kib = status_kib()
    record.update(
        create_s=round(create_s, 1),
        create_per_s=round(runs / create_s),
        rss_after_create_mib=round(kib["VmRSS"] / 1024, 1),
        peak_rss_create_mib=round(kib["VmHWM"] / 1024, 1),
        cached_projections=len(store._states),
        rocksdb=rocksdb_memory(),
        loadavg_after_create=round(os.getloadavg()[0], 2),
    )
    store.close()
    record["disk_bytes_per_run"] = round(disk_bytes(directory) / runs)
    open_s, store = _timed(lambda: RocksDBEventStore(directory))
    engine = FlowEngine(store, runtime)
    first_s, snapshot = _timed(
        lambda: asyncio.run(engine.signal("park-0", SIGNAL, "now", id="probe-0"))
    )
    assert snapshot.status.value == "completed", snapshot.status
    record.update(reopen_s=open_s, first_decision_after_reopen_s=first_s)
    if inspect:
        record["summary_s"], summary = _timed(engine.summary)
        record["summary_by_status"] = {k.value: v for k, v in summary.by_status.items()}
        record["list_open_suspensions_s"], found = _timed(engine.list_open_suspensions)
        record["open_suspensions"] = len(found)
        by_status = getattr(engine, "list_runs_by_status", None)
        if by_status is not None:
            record["list_by_status_s"], _ = _timed(lambda: by_status("suspended"))
        kib = status_kib()
        record.update(
            rss_after_inspect_mib=round(kib["VmRSS"] / 1024, 1),
            peak_rss_mib=round(kib["VmHWM"] / 1024, 1),
        )
    store.close()
    if audit:
        record.update(audit_usage(["--data", str(directory)]))
    record["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    return {**record, "directory": str(directory)}


def run_child(args: Any) -> dict[str, Any]:
    """``embedded`` in a child process; its record."""
    command = [
        sys.executable,
        "-m",
        "benchmarks.scale_embedded",
        str(args.runs),
        str(args.concurrency),
        args.data_dir or "",
        "1" if args.inspect else "0",
        "1" if args.audit else "0",
    ]
    done = subprocess.run(command, cwd=harness.ROOT, stdout=subprocess.PIPE, check=True)
    return dict(json.loads(done.stdout.decode().strip().splitlines()[-1]))


def say(record: dict[str, Any]) -> None:
    keys = (
        "create_per_s",
        "rss_after_create_mib",
        "peak_rss_create_mib",
        "disk_bytes_per_run",
        "reopen_s",
        "first_decision_after_reopen_s",
        "summary_s",
        "list_open_suspensions_s",
        "list_by_status_s",
        "rss_after_inspect_mib",
        "audit_s",
        "audit_peak_rss_mib",
    )
    figures = ", ".join(f"{k} {record[k]}" for k in keys if k in record)
    print(
        f"embedded, {record['runs']:,} suspended runs: {figures}; load "
        f"{record.get('loadavg_1m')} before, {record.get('loadavg_1m_after')} after"
    )


if __name__ == "__main__":
    runs, concurrency, data_dir, inspect, audit = sys.argv[1:6]
    found = embedded(int(runs), int(concurrency), data_dir or None, inspect == "1", audit == "1")
    import shutil

    shutil.rmtree(found.pop("directory"), ignore_errors=True)
    print(json.dumps(found))

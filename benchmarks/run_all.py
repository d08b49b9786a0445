"""Every flowstream figure in one command, then one table beside the peers.

Runs, one after another on the bench broker (started here if it is down, stopped after if so):

1. the peers' workload: embedded (RocksDB, group commit, group commit with eager steps, and
   fsync per append); then, after unrecorded passes that warm the broker, Kafka with 1
   processor and with 2;
2. replay scaling (100 / 1,000 / 10,000 sequential steps);
3. restore of a partition holding 100,000 events;
4. failover (SIGKILL one of two processors) with default settings and with the shortest session
   and transaction timeouts the broker accepts (6 s);
5. the plain consume→produce→commit Kafka loop, and flowstream's events/s as a ratio of it.

Every JSON line goes to ``--out`` (default ``benchmarks/results/<UTC date>.jsonl``); the table is
printed at the end and can be printed again from a results file with ``--table FILE``. The peers'
rows come from ``--peers-results FILE`` (default ``../shared/bench/peers/results.jsonl`` from the
repository root); their harness, for ``--peers``, is the ``run_all.sh`` beside that file.

Usage: ``python -m benchmarks.run_all [--quick] [--only workload,replay,...]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import failover, harness, kafka_limit, replay_scaling, restore, workload

#: The peers' recorded results, beside their harness (``run_all.sh``).
DEFAULT_PEERS = harness.ROOT.parent / "shared" / "bench" / "peers" / "results.jsonl"
EVENTS_PER_RUN = 12
PARTS = ("workload", "replay", "restore", "failover", "limit")


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _best(rows: list[dict[str, Any]], peer: str) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("peer") == peer and "lat_p50_ms" in r]


def table(ours: list[dict[str, Any]], peers: list[dict[str, Any]]) -> str:
    """The workload table (every run of every engine), then resources and the extra figures.

    Peer rows from ``ours`` were rerun in this session (``--peers``); the others are the peers'
    recorded results."""
    lines = [
        "| engine | run | seq p50 ms | seq p99 ms | seq mean ms | wf/s (1000, 100 in flight) "
        "| steps/s | load 1m | fsync 4K ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for source, rows in (("flowstream", ours), ("peer", peers)):
        for r in rows:
            if "lat_p50_ms" not in r:
                continue
            name = f"{r['peer']} (rerun, this session)" if r.get("rerun") else r["peer"]
            if source == "peer":
                name = f"{name} (recorded 2026-11-30)"
            load = r.get("loadavg_1m", "")
            fsync = r.get("fsync_4k_ms", "0.12 (dd)" if source == "peer" else "")
            lines.append(
                f"| {name} | {r['run']} | {r['lat_p50_ms']} | {r['lat_p99_ms']} | "
                f"{r['lat_mean_ms']} | {r['tp_wf_per_s']} | {r['tp_steps_per_s']} | {load} | "
                f"{fsync} |"
            )
    lines += ["", "| process | peak RSS MiB | CPU s |", "|---|---|---|"]
    for r in ours + peers:
        label = f"{r.get('label')} (rerun)" if r.get("rerun") else r.get("label")
        if "peak_rss_mib_sum" in r:
            lines.append(f"| {label} | {r['peak_rss_mib_sum']} | {r['cpu_s']} |")
        elif "peak_rss_kib" in r:
            cpu = round(r["user_s"] + r["sys_s"], 2)
            lines.append(f"| {label} run {r['run']} | {r['peak_rss_kib'] / 1024:.1f} | {cpu} |")
    extra = [r for r in ours if "figure" in r]
    if extra:
        lines += ["", "| figure | result |", "|---|---|"]
    for r in extra:
        lines.append(f"| {r['figure']} | {_describe(r)} |")
    return "\n".join(lines)


def _describe(r: dict[str, Any]) -> str:
    figure = r["figure"]
    if figure == "replay_scaling":
        return (
            f"{r['store']} {r['steps']} steps: {r['total_s']} s, {r['us_per_decision']} µs "
            f"per decision ({r['cpu_us_per_decision']} µs CPU), {r['ratio_to_first']}x the "
            f"100-step run ({r['cpu_ratio_to_first']}x in CPU)"
        )
    if figure == "restore":
        return (
            f"{r['events']} events restored in {r['restore_s']} s = {r['events_per_s']:,} "
            f"events/s (fresh start {r['fresh_start_s']} s − empty start "
            f"{r['empty_start_s']} s)"
        )
    if figure == "failover":
        settings = ", ".join(f"{k}={v}" for k, v in r["settings"].items()) or "defaults"
        return (
            f"{settings}: every run on the killed worker's partitions progressed within "
            f"{r['failover_s']} s ({r['in_flight_at_kill']} in flight at the kill, worst "
            f"{r['in_flight_max_s']} s; {r['new_runs_on_victim']} started after it); survivor "
            f"owned all partitions after {r['survivor_owns_all_s']} s; "
            f"{r['runs_finished']}/{r['runs_started']} runs finished"
        )
    if figure == "session":
        return (
            f"{r['date']}, flowstream {r['commit']}, {r['cores']} cores, Python "
            f"{r['python']}, load {r['loadavg_1m']}, fsync 4 KiB {r['fsync_4k_ms']} ms"
        )
    if figure == "kafka_limit":
        ratio = r.get("flowstream_ratio")
        tail = (
            f"; flowstream {r['flowstream_events_per_s']:.0f} events/s = {ratio:.1%}"
            if ratio is not None
            else ""
        )
        return (
            f"{r['records_per_s']:.0f} records/s ({r['transactions']} transactions, mean "
            f"commit {r['mean_commit_ms']} ms){tail}"
        )
    return json.dumps(r)


def peer_rows(path: Path) -> list[dict[str, Any]]:
    """The peers' recorded rows; none, with a note saying so, when ``path`` is missing."""
    if not path.exists():
        print(_no_peers(path))
        return []
    return _rows(path)


def _no_peers(path: Path) -> str:
    return (
        f"no peers' results at {path}: the table has flowstream's rows only "
        "(pass --peers-results FILE)"
    )


def rerun_peers(peers: str, script: Path, out: Path) -> None:
    """Run the peers' own harness now (``script``, their ``run_all.sh``, with ``PEERS``), its
    lines into ``out`` marked ``"rerun": true``; their ``results.jsonl`` is left alone."""
    scratch = out.with_suffix(".peers.tmp")
    env = {**os.environ, "PEERS": peers.replace(",", " "), "OUT": str(scratch)}
    subprocess.run(["bash", str(script)], env=env, check=False)
    load = round(os.getloadavg()[0], 2)
    for row in _rows(scratch):
        harness.emit({**row, "rerun": True, "loadavg_1m": load}, str(out))
    scratch.unlink(missing_ok=True)


#: Unrecorded Kafka passes before the rows: at least ``_WARM_MIN`` and at most ``_WARM_PASSES``,
#: until the broker's CPU per pass stops falling by more than ``_WARM_SETTLED``.
_WARM_MIN = 3
_WARM_PASSES = 8
_WARM_SETTLED = 0.15


def warm_broker(quick: list[str]) -> None:
    """Run unrecorded Kafka passes until the broker is warm, as a long-running one is.

    A fresh broker's JIT compiles its hot paths over its first ~15,000 runs here: the same pass
    (200 sequential and 3,000 concurrent runs) cost it 19–20 CPU s first, then 12–14, 7–9, and
    about 5 from the fifth on, with p50 falling from 24 ms to 8–11 ms. One pass is not enough.
    """
    pid = harness.broker_pid()
    before: float | None = None
    for number in range(1, (1 if quick else _WARM_PASSES) + 1):
        start = harness.cpu_seconds(pid) if pid else 0.0
        with tempfile.TemporaryDirectory() as scratch:
            warm = ["--lat", "200", "--tp", "3000", "--runs", "1", "--out", f"{scratch}/w"]
            workload.main(["kafka", "--workers", "1", "--keep-broker", *warm, *quick])
        if not pid:
            return
        spent = harness.cpu_seconds(pid) - start
        print(f"warm-up pass {number}: broker {spent:.2f} CPU s")
        if number >= _WARM_MIN and before is not None and spent > before * (1 - _WARM_SETTLED):
            return
        before = spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--only", default=",".join(PARTS), help=f"some of {','.join(PARTS)}")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke test")
    parser.add_argument("--table", metavar="FILE", help="only print the table of a results file")
    parser.add_argument(
        "--peers",
        default="",
        help="also rerun these peers right after the workload (e.g. restate; needs their "
        "install, see the README beside --peers-results)",
    )
    parser.add_argument(
        "--peers-results",
        type=Path,
        default=DEFAULT_PEERS,
        metavar="FILE",
        help="the peers' recorded results.jsonl (default: ../shared/bench/peers/results.jsonl "
        "from the repository root)",
    )
    args = parser.parse_args()
    peers_script = args.peers_results.parent / "run_all.sh"
    if args.peers and not peers_script.exists():
        parser.error(f"--peers needs the peers' harness at {peers_script} (see --peers-results)")
    if args.table:
        print(table(_rows(Path(args.table)), peer_rows(args.peers_results)))
        return
    if not args.peers_results.exists():
        print(_no_peers(args.peers_results))
    out = Path(
        args.out or harness.ROOT / "benchmarks" / "results" / f"{datetime.now(UTC):%Y-%m-%d}.jsonl"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(","))
    quick = ["--lat", "20", "--tp", "100", "--runs", "1"] if args.quick else []
    began = time.monotonic()
    started_broker = harness.ensure_broker()
    harness.emit(
        {
            "figure": "session",
            "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
            "uname": " ".join(os.uname()),
            **harness.machine(),
        },
        str(out),
    )
    tp_x1 = None
    try:
        if "workload" in only:
            for embedded in (["--sync", "group"], ["--eager-steps"], ["--sync", "always"]):
                workload.main(["embedded", *embedded, "--out", str(out), *quick])
            warm_broker(quick)
            eager = ["--set", "EAGER_STEPS=true"]
            inline = [*eager, "--set", "INLINE_SYNC_STEPS=true"]
            for workers, settings in (
                ("1", []),
                ("1", eager),
                ("1", inline),
                ("2", []),
                ("2", eager),
            ):
                command = ["kafka", "--workers", workers, "--keep-broker", "--out", str(out)]
                rows = workload.main([*command, *settings, *quick])
                if workers == "1" and not settings:
                    tp_x1 = max(r["tp_wf_per_s"] for r in rows if "tp_wf_per_s" in r)
            if args.peers:
                rerun_peers(args.peers, peers_script, out)
        if "replay" in only:
            sizes = [100, 1000] if args.quick else [100, 1000, 10000]
            replay_scaling.run(list(replay_scaling.STORES), sizes, str(out))
        if "restore" in only:
            restore.run(12_000 if args.quick else 100_000, 1 if args.quick else 2, 300, str(out))
        if "failover" in only:
            failover.run(failover.parse_args(["--keep-broker", "--out", str(out)]))
            failover.run(
                failover.parse_args(
                    [
                        "--keep-broker",
                        "--out",
                        str(out),
                        "--set",
                        "SESSION_TIMEOUT_MS=6000",
                        "--set",
                        "TRANSACTION_TIMEOUT_MS=6000",
                    ]
                )
            )
        if "limit" in only:
            events = tp_x1 * EVENTS_PER_RUN if tp_x1 else None
            kafka_limit.run(10_000 if args.quick else 50_000, 112, 20, 500, events, str(out))
    finally:
        if started_broker:
            harness.stop_broker()
    print(f"\nall figures in {time.monotonic() - began:.0f} s; results in {out}\n")
    print(table(_rows(out), peer_rows(args.peers_results)))


if __name__ == "__main__":
    main()

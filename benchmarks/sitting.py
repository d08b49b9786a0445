"""A before-and-after sitting of the workload: two commits in turns, one table.

    python -m benchmarks.sitting --before f840c2b [--after HEAD] [--passes 3] [--out DIR]

Each commit runs from a worktree of its own (made here, removed at the end), through its own
``python -m benchmarks.run_all --only workload``. The passes alternate which commit goes first
(before-after, after-before, …) and every pass gets a fresh bench broker (its own
``FLOWSTREAM_BENCH_HOME``): a broker that carried the earlier passes' topics used more CPU in
the later ones, and the commit that always went second paid for it (session Y). Nothing else
should run meanwhile; the load is printed with each pass.

Prints, per row, each commit's wf/s, the change of the means, and each process's CPU seconds
per pass. The results files stay in ``--out`` (``before-<n>.jsonl``, ``after-<n>.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("before", "after")


def order(passes: int) -> list[tuple[int, str]]:
    """The runs of a sitting: (pass, tree), alternating which tree goes first."""
    runs = []
    for number in range(1, passes + 1):
        trees = TREES if number % 2 else tuple(reversed(TREES))
        runs += [(number, tree) for tree in trees]
    return runs


def summarise(results: dict[str, list[Iterable[str]]]) -> str:
    """A Markdown table from each tree's results files' lines (``run_all``'s JSON lines)."""
    rates: dict[str, dict[str, list[float]]] = {tree: {} for tree in results}
    cpu: dict[str, dict[str, list[float]]] = {tree: {} for tree in results}
    for tree, files in results.items():
        for lines in files:
            for line in lines:
                record = json.loads(line)
                if "peer" in record and "tp_wf_per_s" in record:
                    rates[tree].setdefault(record["peer"], []).append(record["tp_wf_per_s"])
                elif "label" in record and record.get("cpu_s") is not None:
                    cpu[tree].setdefault(record["label"], []).append(record["cpu_s"])
    before, after = (rates.get(tree, {}) for tree in TREES)
    lines = [
        "| row | before wf/s | after wf/s | means, after against before | CPU s per pass, "
        "before → after |",
        "|---|---|---|---|---|",
    ]
    for peer in before:
        if peer not in after:
            continue
        was, now = statistics.mean(before[peer]), statistics.mean(after[peer])
        change = f"{(now - was) / was * 100:+.1f} %" if was else "-"
        processes = [label for label in cpu["before"] if _process_of(label, peer)]
        spent = "; ".join(
            f"{label[len(peer) + 1 :]} {_values(cpu['before'][label])} → "
            f"{_values(cpu['after'].get(label, []))}"
            for label in processes
        )
        lines.append(
            f"| {peer} | {_values(before[peer], 0)} | {_values(after[peer], 0)} | {change} "
            f"| {spent} |"
        )
    return "\n".join(lines)


def _process_of(label: str, peer: str) -> bool:
    """Whether ``label`` is a flowstream process of ``peer``'s row (``<peer>-process`` or
    ``<peer>-worker-w<n>``; not a longer row's, nor the broker or the client)."""
    if not label.startswith(f"{peer}-"):
        return False
    rest = label[len(peer) + 1 :]
    return rest == "process" or (rest.startswith("worker-") and rest.count("-") == 1)


def _values(values: list[float], digits: int = 2) -> str:
    return ", ".join(f"{value:.{digits}f}" for value in values)


def _worktree(commit: str, where: Path) -> Path:
    subprocess.run(
        ["git", "worktree", "add", "--detach", "-f", str(where), commit],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    return where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the commit to compare against")
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="where the results files go")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="flowstream-sitting-"))
    out = args.out or scratch / "results"
    out.mkdir(parents=True, exist_ok=True)
    trees = {"before": scratch / "before", "after": scratch / "after"}
    try:
        for tree, commit in (("before", args.before), ("after", args.after)):
            _worktree(commit, trees[tree])
        for number, tree in order(args.passes):
            home = scratch / f"broker-{tree}-{number}"
            env = {**os.environ, "FLOWSTREAM_BENCH_HOME": str(home)}
            began = time.monotonic()
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.run_all",
                    "--only",
                    "workload",
                    "--out",
                    str(out / f"{tree}-{number}.jsonl"),
                ],
                cwd=trees[tree],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            (out / f"{tree}-{number}.log").write_text(done.stdout + done.stderr)
            load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
            print(
                f"pass {number} {tree}: exit {done.returncode}, "
                f"{time.monotonic() - began:.0f} s, load {load}",
                flush=True,
            )
            shutil.rmtree(home, ignore_errors=True)
        results = {
            tree: [
                (out / f"{tree}-{n}.jsonl").read_text().splitlines()
                for n in range(1, args.passes + 1)
                if (out / f"{tree}-{n}.jsonl").exists()
            ]
            for tree in TREES
        }
        print(f"\nbefore {args.before}, after {args.after}; results in {out}\n")
        print(summarise(results))
    finally:
        for where in trees.values():
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(where)],
                cwd=ROOT,
                capture_output=True,
                check=False,
            )


if __name__ == "__main__":
    main()

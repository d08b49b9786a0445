"""Where the time goes: run a benchmark under py-spy and print the top functions.

Three views of the collapsed stacks (py-spy ``--format raw``; idle threads excluded, so the
percentages are of CPU samples):

* **inclusive**: samples with the function anywhere on the stack;
* **self**: samples where the function is the innermost frame;
* **flowstream self**: each sample charged to its innermost ``flowstream/`` frame, so the cost
  of pydantic, uuid, fastavro, rocksdict or librdkafka lands on the flowstream line that called it.

Usage::

    python -m benchmarks.profile embedded            # the workload, embedded, under py-spy
    python -m benchmarks.profile kafka --tp 3000     # the worker process of the Kafka workload
    python -m benchmarks.profile restore             # a fresh worker restoring 36,000 events
    python -m benchmarks.profile summarize FILE.raw  # any collapsed-stack file
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import harness

_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^:()]+)(?::\d+)?\)$")


def _key(frame: str) -> str:
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    path = match["file"]
    for marker in ("site-packages/", "lib/python3.11/", f"{harness.ROOT}/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{path}:{match['function']}"


def summarize(path: Path, top: int = 25, focus: str | None = None) -> str:
    """The three views of one collapsed-stack file, as text."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    charged: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = [_key(f) for f in stack.split(";") if f]
        if focus and not any(focus in f for f in frames):
            continue
        count = int(count_text)
        total += count
        for frame in set(frames):
            inclusive[frame] += count
        own[frames[-1]] += count
        ours = [f for f in frames if f.startswith("flowstream/")]
        charged[ours[-1] if ours else f"(outside flowstream) {frames[-1]}"] += count
    lines = [f"{total} samples{f' with {focus!r} on the stack' if focus else ''}"]
    for title, counter in (
        ("inclusive", inclusive),
        ("self", own),
        ("flowstream self (library time charged to its flowstream caller)", charged),
    ):
        lines.append(f"\n-- {title}")
        for name, count in counter.most_common(top):
            lines.append(f"{100 * count / max(total, 1):6.1f}%  {name}")
    return "\n".join(lines)


def _pyspy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: pip install py-spy")
    return found


def profile_embedded(out: Path, rate: int, extra: list[str]) -> None:
    command = [
        _pyspy(),
        "record",
        "--nonblocking",
        "-r",
        str(rate),
        "--format",
        "raw",
        "-o",
        str(out),
        "--",
        sys.executable,
        "-m",
        "benchmarks.workload",
        "embedded",
        "--runs",
        "1",
        *extra,
    ]
    subprocess.run(command, cwd=harness.ROOT, check=True)


def profile_kafka(out: Path, rate: int, extra: list[str]) -> None:
    """The Kafka workload with its one worker process started under py-spy."""
    wrap = f"{_pyspy()} record --nonblocking -r {rate} --format raw -o {out} --"
    command = [
        sys.executable,
        "-m",
        "benchmarks.workload",
        "kafka",
        "--workers",
        "1",
        "--runs",
        "1",
        "--wrap",
        wrap,
        *extra,
    ]
    subprocess.run(command, cwd=harness.ROOT, check=True)


def profile_restore(out: Path, rate: int, extra: list[str]) -> None:
    """A fresh worker restoring a partition of ``--events`` events (default 36,000), under
    py-spy from its spawn until it owns every partition."""
    import asyncio
    import time

    from benchmarks import restore

    events = int(extra[extra.index("--events") + 1]) if "--events" in extra else 36_000
    started = harness.ensure_broker()
    try:
        prefix = harness.new_prefix("restore-prof")
        harness.apply_topics(prefix)
        with tempfile.TemporaryDirectory() as directory:
            asyncio.run(restore.fill(prefix, events, Path(directory), 300))
        wrap = [
            _pyspy(),
            "record",
            "--nonblocking",
            "-r",
            str(rate),
            "--format",
            "raw",
            "-o",
            str(out),
            "--",
        ]
        with tempfile.TemporaryDirectory() as directory:
            worker = harness.Worker("fresh", prefix=prefix, state_root=Path(directory), wrap=wrap)
            began = time.monotonic()
            try:
                while worker.owned() < 8:
                    time.sleep(0.02)
                print(f"restored after {time.monotonic() - began:.2f} s (with py-spy attached)")
            finally:
                worker.stop()
    finally:
        if started:
            harness.stop_broker()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["embedded", "kafka", "restore", "summarize"])
    parser.add_argument("file", nargs="?", help="summarize: the collapsed-stack file")
    parser.add_argument("--rate", type=int, default=100, help="samples per second")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--focus", help="only samples with this text on the stack")
    parser.add_argument("--keep", help="write the raw profile here")
    args, extra = parser.parse_known_args()  # the rest goes to benchmarks.workload
    extra = [a for a in extra if a != "--"]
    if args.what == "summarize":
        if not args.file:
            parser.error("summarize needs a file")
        print(summarize(Path(args.file), args.top, args.focus))
        return
    out = Path(args.keep or tempfile.mktemp(suffix=".raw", prefix=f"profile-{args.what}-"))
    run = {"embedded": profile_embedded, "kafka": profile_kafka, "restore": profile_restore}
    run[args.what](out, args.rate, extra)
    # Only the steady state: the measured loop (or the restore), not start-up and imports.
    focus = (
        args.focus
        or {"embedded": "measure", "kafka": "Processor.run", "restore": "_restore_slice"}[args.what]
    )
    print(f"\nprofile of the {args.what} path ({out}):")
    print(summarize(out, args.top, focus))


if __name__ == "__main__":
    main()

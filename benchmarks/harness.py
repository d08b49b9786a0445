"""What every flowstream benchmark shares: the bench broker, worker processes, the run tracker,
process resources (the peers' ``procstat.py`` approach) and a note of the machine's state.

The broker is our own (``flowstream dev-kafka`` on port 19392, home
``~/.cache/flowstream/bench-kafka``; ``FLOWSTREAM_BENCH_PORT`` and ``FLOWSTREAM_BENCH_HOME`` pick
another); ``ensure_broker`` starts it when it is down and ``stop_broker`` stops it only when this
process started it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flowstream import codec, wire
from flowstream.errors import SerializationError
from flowstream.kafka import clients, topics
from flowstream.settings import Settings
from flowstream.topology import EVENTS, load_topology

ROOT = Path(__file__).resolve().parents[1]
BENCH_PORT = int(os.environ.get("FLOWSTREAM_BENCH_PORT", "19392"))
BENCH_HOME = Path(
    os.environ.get("FLOWSTREAM_BENCH_HOME", Path.home() / ".cache" / "flowstream" / "bench-kafka")
).expanduser()
BOOTSTRAP = f"127.0.0.1:{BENCH_PORT}"
TERMINAL = {
    "run_completed",
    "run_failed",
    "run_cancelled",
    "run_timed_out",
    "run_retry_exhausted",
    "run_continued_as_new",
}
_TICK = os.sysconf("SC_CLK_TCK")


# -- the broker -----------------------------------------------------------------------------


def _devkafka(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "flowstream", "dev-kafka", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)


def ensure_broker() -> bool:
    """Start the bench broker unless it runs; True when this call started it."""
    home = ["--port", str(BENCH_PORT), "--home", str(BENCH_HOME)]
    if _devkafka("status", "--home", str(BENCH_HOME)).returncode == 0:
        return False
    done = _devkafka("start", *home)
    if done.returncode != 0:
        raise SystemExit(f"could not start the bench broker: {done.stderr or done.stdout}")
    return True


def stop_broker() -> None:
    _devkafka("stop", "--home", str(BENCH_HOME))


def broker_pid() -> int | None:
    try:
        return int((BENCH_HOME / "node-1" / "kafka.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def new_prefix(kind: str) -> str:
    return f"bench-{kind}-{uuid.uuid4().hex[:8]}"


def apply_topics(prefix: str, bootstrap: str = BOOTSTRAP) -> None:
    topics.apply(bootstrap, load_topology(), prefix=prefix, replication_factor=1)


def scratch(prefix: str, under: str | Path | None = None) -> Path:
    """A new directory for one pass (under ``under``, created if missing; else the temp dir)."""
    if under is not None:
        Path(under).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=under))


def remove_pass(prefix: str, state_root: Path, bootstrap: str = BOOTSTRAP) -> None:
    """Delete one pass's topics and state, so a broker kept between passes does not pile up
    topics (a broker home with tens of thousands of them starts slowly, then not at all) and the
    temp dir does not pile up stores."""
    shutil.rmtree(state_root, ignore_errors=True)
    delete_topics(list(load_topology().names(prefix).values()), bootstrap)


def delete_topics(names: list[str], bootstrap: str = BOOTSTRAP) -> None:
    """Delete topics ``names``; one left over is reported, not fatal."""
    if not names:
        return
    admin = clients.new_admin(bootstrap)
    for name, future in admin.delete_topics(names, operation_timeout=30).items():
        try:
            future.result(timeout=60)
        except Exception as error:
            print(f"topic {name} not deleted: {error}", file=sys.stderr)


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -- workers --------------------------------------------------------------------------------


class Worker:
    """One ``flowstream worker`` process serving ``app``, with metrics on ``metrics_port``."""

    def __init__(
        self,
        name: str,
        *,
        prefix: str,
        state_root: Path,
        metrics_port: int | None = None,
        app: str = "benchmarks.order_app:runtime",
        bootstrap: str = BOOTSTRAP,
        env: dict[str, str] | None = None,
        wrap: list[str] | None = None,
    ) -> None:
        self.name = name
        self.metrics_port = metrics_port or free_port()
        self.wrapped = bool(wrap)
        self.state_dir = state_root / name
        self.log_path = state_root / f"{name}.log"
        state_root.mkdir(parents=True, exist_ok=True)
        command = [
            *(wrap or []),
            sys.executable,
            "-m",
            "flowstream",
            "worker",
            "--app",
            app,
            "--bootstrap",
            bootstrap,
            "--prefix",
            prefix,
            "--group",
            f"{prefix}-group",
            "--state-dir",
            str(self.state_dir),
            "--instance-id",
            name,
            "--metrics-port",
            str(self.metrics_port),
            "--log-level",
            os.environ.get("FLOWSTREAM_BENCH_LOG_LEVEL", "WARNING"),
        ]
        full_env = dict(os.environ)
        full_env.update(env or {})
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=full_env, stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def metrics(self) -> dict[str, float]:
        """The worker's Prometheus samples (name with labels → value); empty when unreachable."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                text = response.read().decode()
        except OSError:
            return {}
        samples: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                try:
                    samples[name] = float(value)
                except ValueError:
                    continue
        return samples

    def owned(self) -> int:
        return int(self.metrics().get("flowstream_owned_partitions", 0))

    def stop(self, timeout: float = 20) -> int | None:
        if self.process.poll() is None and self.wrapped:
            # A profiler wrapping the worker writes its output on SIGINT; then stop the worker.
            workers = _children(self.pid)
            self.process.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout)
            for pid in workers:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
                time.sleep(0.1)
            for pid in workers:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._log.close()
        return self.process.returncode

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)
        self._log.close()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_owned(workers: list[Worker], partitions: int, timeout: float = 120) -> float:
    """Wait until the live workers own all ``partitions`` between them; seconds waited."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        live = [w for w in workers if w.process.poll() is None]
        if len(live) < len(workers):
            dead = [w for w in workers if w.process.poll() is not None]
            raise SystemExit(f"worker {dead[0].name} exited:\n{dead[0].output()[-3000:]}")
        counts = [w.owned() for w in live]
        if sum(counts) == partitions and all(counts):
            return time.monotonic() - began
        time.sleep(0.1)
    raise SystemExit(f"workers did not take all {partitions} partitions in {timeout}s")


# -- runs: start through FlowClient, results from one tail of the events topic ----------------


class RunTracker:
    """Resolves an asyncio future per run id when the run's terminal event is committed.

    One background thread tails every partition of the events topic (``read_committed``) from
    its current end, so results arrive the way any client of flowstream would see them.
    """

    def __init__(self, settings: Settings, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.topic = load_topology().names(settings.topic_prefix)[EVENTS]
        self.partitions = load_topology().run_partitions
        self._futures: dict[str, asyncio.Future[tuple[str, Any]]] = {}
        self._listeners: list[Any] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.consumer = clients.new_consumer(
            settings.bootstrap, f"{settings.topic_prefix}-tracker-{uuid.uuid4().hex[:6]}"
        )
        # Explicit end offsets (not OFFSET_END, resolved lazily): no run started after this
        # constructor returns can be missed.
        starts = []
        for partition in range(self.partitions):
            tp = clients.TopicPartition(self.topic, partition)
            high = watermark(self.consumer, tp)[1]
            starts.append(clients.TopicPartition(self.topic, partition, high))
        self.consumer.assign(starts)
        self.events_seen = 0
        self._thread = threading.Thread(target=self._tail, daemon=True)
        self._thread.start()

    def expect(self, run_id: str) -> asyncio.Future[tuple[str, Any]]:
        future: asyncio.Future[tuple[str, Any]] = self.loop.create_future()
        with self._lock:
            self._futures[run_id] = future
        return future

    def listen(self, callback: Any) -> None:
        """``callback(envelope, monotonic_time, partition, writer)`` for every committed event
        (called in the tail thread; ``writer`` is the instance id of the processor)."""
        self._listeners.append(callback)

    def _tail(self) -> None:
        while not self._stop.is_set():
            # consume(n, timeout) waits for n messages or the whole timeout; poll() returns on
            # the first one, and what else is already fetched is drained without waiting.
            first = self.consumer.poll(0.05)
            if first is None:
                continue
            batch = [first, *self.consumer.consume(num_messages=1000, timeout=0)]
            events = [
                m for m in batch if m.error() is None and wire.kind_of(m) is wire.RecordKind.EVENT
            ]
            now = time.monotonic()
            self.events_seen += len(events)
            if not self._listeners:
                events = [m for m in events if _may_be_terminal(m)]
            for message, envelope in wire.event_records(events):
                writer = wire.writer_of(message)
                for callback in self._listeners:
                    callback(envelope, now, message.partition(), writer)
                event = envelope.event
                if event.type in TERMINAL:
                    with self._lock:
                        future = self._futures.pop(envelope.run_id, None)
                    if future is not None:
                        output = getattr(event, "output", None)
                        self.loop.call_soon_threadsafe(_resolve, future, (event.type, output))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.consumer.close()


def watermark(consumer: Any, tp: Any, timeout: float = 30) -> tuple[int, int]:
    """(low, high) of one partition, retried while a new topic's leadership settles."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
            return int(low), int(high)
        except clients.KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _may_be_terminal(message: Any) -> bool:
    """Only a terminal event resolves anything: the others are skipped after their first bytes,
    as a client waiting for results would."""
    try:
        head = codec.event_head(message.value() or b"")
    except SerializationError:
        return True  # decoded in full, so that it is reported
    return head is None or head[2] in TERMINAL


def _resolve(future: asyncio.Future[tuple[str, Any]], value: tuple[str, Any]) -> None:
    if not future.done():
        future.set_result(value)


# -- resources (the peers' procstat.py, as a function) ---------------------------------------


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    text = handle.read()
                if int(text.rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
            except OSError:
                pass
    return found


def _stat(pid: int) -> tuple[int, int, float]:
    hwm = rss = 0
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
            elif line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return hwm, rss, _cpu(pid)


def _cpu(pid: int, children: bool = True) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    # After the name: utime, stime, cutime and cstime are fields 14-17 of stat(5).
    return sum(int(x) for x in fields[11 : 15 if children else 13]) / _TICK


def procstat(label: str, pids: Iterable[int], *, tree: bool = True) -> dict[str, Any]:
    """Peak RSS (VmHWM) and CPU seconds (user+sys incl. reaped children) of process trees (or
    of the processes alone, when ``tree`` is false)."""
    seen: set[int] = set()
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            if tree:
                todo += _children(pid)
    hwm_sum = rss_sum = cpu_sum = 0.0
    peaks: list[int] = []
    for pid in sorted(seen):
        try:
            hwm, rss, cpu = _stat(pid)
        except OSError:
            continue
        peaks.append(hwm)
        hwm_sum += hwm
        rss_sum += rss
        cpu_sum += cpu
    return {
        "label": label,
        "pids": sorted(seen),
        "peak_rss_mib_sum": round(hwm_sum / 1024, 1),
        "max_single_peak_rss_mib": round(max(peaks, default=0) / 1024, 1),
        "rss_now_mib_sum": round(rss_sum / 1024, 1),
        "cpu_s": round(cpu_sum, 2),
    }


class SelfUsage:
    """This process's CPU seconds and peak RSS from now on (``VmHWM`` is reset through
    ``/proc/self/clear_refs``, so several modes in one process are measured apart)."""

    def __init__(self) -> None:
        try:
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")
        except OSError:
            pass
        self._cpu = sum(os.times()[:2])

    def record(self, label: str) -> dict[str, Any]:
        hwm, rss, _ = _stat(os.getpid())
        return {
            "label": label,
            "pids": [os.getpid()],
            "peak_rss_mib_sum": round(hwm / 1024, 1),
            "max_single_peak_rss_mib": round(hwm / 1024, 1),
            "rss_now_mib_sum": round(rss / 1024, 1),
            "cpu_s": round(sum(os.times()[:2]) - self._cpu, 2),
        }


def cpu_seconds(pid: int, *, children: bool = True, gone: float = 0.0) -> float:
    """User and system CPU seconds of process ``pid`` (its threads included), with those of
    the children it reaped unless ``children`` is false; ``gone`` once it has exited."""
    try:
        return _cpu(pid, children)
    except (OSError, IndexError):
        return gone


# -- the machine ----------------------------------------------------------------------------


def fsync_probe(writes: int = 200) -> float:
    """Median ms of one 4 KiB write + fdatasync in this directory's file system (the disk's
    state at the moment: the peers measured 0.12 ms with ``dd oflag=dsync``)."""
    times = []
    with tempfile.NamedTemporaryFile() as handle:
        block = b"x" * 4096
        for _ in range(writes):
            began = time.perf_counter()
            os.write(handle.fileno(), block)
            os.fdatasync(handle.fileno())
            times.append((time.perf_counter() - began) * 1000)
    return round(statistics.median(times), 3)


def machine() -> dict[str, Any]:
    """The flowstream commit, cores, load average and the fsync cost right now (the machine is
    shared and noisy)."""
    load1, load5, _ = os.getloadavg()

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout

    # Dirty means code changed: the results file these figures go to does not count.
    changed = git("status", "--porcelain", "--", ".", ":(exclude)benchmarks/results")
    commit = git("rev-parse", "--short=7", "HEAD").strip() + ("-dirty" if changed.strip() else "")
    return {
        "commit": commit,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "loadavg_1m": round(load1, 2),
        "loadavg_5m": round(load5, 2),
        "fsync_4k_ms": fsync_probe(),
    }


def setting(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` from the command line (``--set``), as a pair."""
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError("use NAME=VALUE")
    return key, value


def emit(record: dict[str, Any], out: str | None) -> None:
    """Print one JSON line and append it to ``out``."""
    line = json.dumps(record)
    print(line, flush=True)
    if out:
        with open(out, "a") as handle:
            handle.write(line + "\n")

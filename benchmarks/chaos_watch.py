"""What the chaos driver watches: every committed event as it arrives, and the figures read from
those arrivals (failover after a worker fault, the longest commit gap after a broker kill).

``Follow`` tails every partition of the events topic ``read_committed`` from its first offset in a
background thread and notes, per partition, when each event arrived and which processor wrote it
(its ``flowstream-writer`` header), and per run when its first event arrived, when it created its
signal wait and its hook and when it ended. The driver reads it to know when to resume hooks and
signals; the figures are computed from it after the run.
"""

from __future__ import annotations

import bisect
import itertools
import re
import statistics
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import harness
from flowstream import codec, wire
from flowstream.kafka import clients

__all__ = [
    "Fault",
    "Follow",
    "HostWatch",
    "RunSeen",
    "answer_after",
    "commit_gap",
    "controller_fences",
    "fault_figures",
    "progress_after",
]

TERMINAL = harness.TERMINAL
#: How long after a fault its figures are read, at most (the next fault ends it sooner).
_WINDOW_S = 60.0
_WATCHED = frozenset({"signal_wait_created", "hook_created", *TERMINAL})


@dataclass
class Fault:
    kind: str
    at: float  # monotonic
    victim: str
    detail: dict[str, Any] = field(default_factory=dict)

    #: The wall clock (seconds since the epoch) when it was injected.
    epoch: float = 0.0

    def __post_init__(self) -> None:
        # The wall clock to the millisecond, as the workers' log lines print it.
        now = self.epoch = time.time()
        self.detail["wall"] = (
            time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
        )


@dataclass
class RunSeen:
    """When (monotonic seconds) the driver saw a run's first event, its waits and its end
    committed."""

    first: float | None = None
    signal_wait: float | None = None
    hook: float | None = None
    ended: float | None = None
    ended_as: str = ""


@dataclass
class _Arrivals:
    """One partition's committed events in arrival order: times and writers."""

    times: list[float] = field(default_factory=list)
    writers: list[str] = field(default_factory=list)


class Follow:
    """Tails the events topic; see the module docstring."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.topic = topic
        self.partitions = partitions
        self.runs: dict[str, RunSeen] = {}
        self.arrivals = [_Arrivals() for _ in range(partitions)]
        self.events = 0
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._consumer = clients.new_consumer(
            bootstrap, f"{topic}-chaos-follow", {"fetch.wait.max.ms": 50}
        )
        self._consumer.assign([clients.TopicPartition(topic, p, 0) for p in range(partitions)])
        self._thread = threading.Thread(target=self._tail, name="chaos-follow", daemon=True)
        self._thread.start()

    def _tail(self) -> None:
        while not self._stop.is_set():
            first = self._consumer.poll(0.05)
            if first is None:
                continue
            now = time.monotonic()
            batch = [first, *self._consumer.consume(num_messages=1000, timeout=0)]
            with self.lock:
                for message in batch:
                    if message.error() is None:
                        self._note(message, now)

    def _note(self, message: clients.Message, now: float) -> None:
        if wire.kind_of(message) is not wire.RecordKind.EVENT:
            return
        data = message.value() or b""
        head = codec.event_head(data)
        if head is None:
            envelope = codec.decode_event(data)
            head = (envelope.run_id, envelope.sequence, envelope.event.type)
        run_id, _, kind = head
        arrivals = self.arrivals[message.partition()]
        arrivals.times.append(now)
        arrivals.writers.append(wire.writer_of(message))
        self.events += 1
        seen = self.runs.get(run_id)
        if seen is None:
            seen = self.runs[run_id] = RunSeen(first=now)
        if kind not in _WATCHED:
            return
        if kind == "signal_wait_created":
            seen.signal_wait = now
        elif kind == "hook_created":
            seen.hook = now
        else:
            seen.ended, seen.ended_as = now, kind

    def seen(self, run_id: str) -> RunSeen | None:
        with self.lock:
            return self.runs.get(run_id)

    def last_writers(self) -> dict[int, str]:
        """The processor that wrote each partition's latest event so far."""
        with self.lock:
            return {p: a.writers[-1] for p, a in enumerate(self.arrivals) if a.writers}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


def fault_figures(
    faults: list[Fault],
    follow: Follow,
    back_at: dict[str, list[float]],
    partitions: int,
    broker_down: float,
    host: HostWatch | None = None,
    controller_log: Path | None = None,
) -> dict[str, Any]:
    """Failover after each worker fault (its probes answered, and the first event by another
    writer) and the commit gaps after each broker kill; each fault's figures join its detail."""
    ends = [f.at for f in faults[1:]] + [float("inf")]
    failover: dict[str, list[float]] = defaultdict(list)
    stalled = 0
    gaps = []
    for fault, next_at in zip(faults, ends, strict=True):
        until = min(next_at, fault.at + _WINDOW_S)
        if fault.kind in ("broker-kill", "broker-stop"):
            led = set(fault.detail["led"])
            others = set(range(partitions)) - led
            gap_until = min(next_at, fault.at + broker_down + 30)
            for name, subset in (("other", others), ("all", set(range(partitions)))):
                found = commit_gap(follow, subset, fault.at, gap_until)
                fault.detail[f"gap_{name}_s"] = None if found is None else found[0]
                fault.detail[f"gap_{name}_from_s"] = None if found is None else found[1]
            _beside_the_gap(fault, host, controller_log, gap_until - fault.at)
            # A start given right after the kill, answered: on a partition whose events and
            # starts the dead broker led neither, what the kill cost its runs.
            spared = others - set(fault.detail.get("start_led", ()))
            answers = {
                p: answer_after(follow, run_id, fault.at, gap_until)
                for p, run_id in fault.detail.pop("probes", {}).items()
            }
            fault.detail["probe_s"] = {
                p: None if t is None else round(t, 2) for p, t in sorted(answers.items())
            }
            spared_answers = [answers[p] for p in spared if p in answers]
            fault.detail["probe_spared_max_s"] = (
                None
                if not spared_answers or None in spared_answers
                else round(max(t for t in spared_answers if t is not None), 2)
            )
            gaps.append(fault.detail)
            continue
        returned = next((t for t in back_at[fault.victim] if t > fault.at), None)
        kind = "stop" if fault.kind == "worker-stop" else "kill"
        times, writers = {}, {}
        probes: dict[int, str] = fault.detail.pop("probes")
        for p, run_id in probes.items():
            answered = answer_after(follow, run_id, fault.at, until)
            times[p] = None if answered is None else round(answered, 2)
            if p not in fault.detail["partitions"]:
                if answered is not None:
                    failover[f"{kind}-others"].append(answered)
                continue
            if answered is None:
                stalled += 1
            else:
                failover[kind].append(answered)
            with follow.lock:
                waited = progress_after(follow.arrivals[p], fault.at, until, fault.victim, returned)
            writers[p] = None if waited is None else round(waited, 2)
            if waited is not None:
                failover[f"{kind}-writer"].append(waited)
        fault.detail["failover_s"] = {p: times[p] for p in fault.detail["partitions"]}
        fault.detail["others_answered_s"] = {
            p: t for p, t in times.items() if p not in fault.detail["partitions"]
        }
        fault.detail["new_writer_s"] = writers
    kill_median, kill_max = _median_max(failover["kill"])
    stop_median, stop_max = _median_max(failover["stop"])
    return {
        "faults_by_kind": dict(Counter(f.kind for f in faults)),
        "faults": [{"kind": f.kind, "victim": f.victim, **f.detail} for f in faults],
        "failover_kill_median_s": kill_median,
        "failover_kill_max_s": kill_max,
        "failover_stop_median_s": stop_median,
        "failover_stop_max_s": stop_max,
        "failover_partitions_without_progress": stalled,
        "failover_kill_others_max_s": _median_max(failover["kill-others"])[1],
        "new_writer_kill_median_s": _median_max(failover["kill-writer"])[0],
        "new_writer_kill_max_s": _median_max(failover["kill-writer"])[1],
        "broker_kill_gap_other_max_s": max(
            (g["gap_other_s"] for g in gaps if g["gap_other_s"] is not None), default=None
        ),
        "broker_kill_gap_all_max_s": max(
            (g["gap_all_s"] for g in gaps if g["gap_all_s"] is not None), default=None
        ),
        "broker_kill_probe_spared_max_s": max(
            (g["probe_spared_max_s"] for g in gaps if g["probe_spared_max_s"] is not None),
            default=None,
        ),
        "events_followed": follow.events,
    }


class HostWatch:
    """What the machine did while a gap lasted. A thread sleeps 0.1 s at a time and notes how
    late it woke (a host that froze wakes it seconds late) and the kernel's pressure totals
    (``/proc/pressure``: microseconds in which some task waited for CPU or IO, and in which every
    task waited for IO). On 2 cores shared by four JVMs, three workers and the driver, a gap may
    be the machine's rather than Kafka's; these say which."""

    _EVERY_S = 0.1

    def __init__(self, processes: Callable[[], dict[str, int]] | None = None) -> None:
        self.samples: list[tuple[float, float, int, int, int]] = []
        #: CPU seconds each watched process (name and pid) had used, at each sample's time.
        self.cpu: list[tuple[float, dict[tuple[str, int], float]]] = []
        self._processes = processes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="host-watch", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        expected = time.monotonic()
        while not self._stop.is_set():
            time.sleep(self._EVERY_S)
            now = time.monotonic()
            late = max(0.0, now - expected - self._EVERY_S)
            expected = now
            cpu = _pressure("cpu", "some")
            self.samples.append((now, late, cpu, _pressure("io", "some"), _pressure("io", "full")))
            if self._processes is not None:
                used = {
                    (n, pid): harness.cpu_seconds(pid, children=False, gone=-1.0)
                    for n, pid in self._processes().items()
                }
                self.cpu.append((now, {key: s for key, s in used.items() if s >= 0}))

    def window(self, since: float, until: float) -> dict[str, Any]:
        """Between ``since`` and ``until`` (monotonic): the latest wake-up, the seconds of CPU
        and IO pressure (``None`` without ``/proc/pressure``), and the CPU seconds of each
        watched process (``cpu_s``, and second by second: ``cpu_by_second``)."""
        inside = [s for s in self.samples if since <= s[0] <= until]
        if len(inside) < 2:
            return {"late_max_s": None}
        first, last = inside[0], inside[-1]
        figures: dict[str, Any] = {
            "late_max_s": round(max(s[1] for s in inside), 2),
            "span_s": round(last[0] - first[0], 2),
        }
        for index, name in ((2, "cpu_some_s"), (3, "io_some_s"), (4, "io_full_s")):
            valid = first[index] >= 0 and last[index] >= 0
            figures[name] = round((last[index] - first[index]) / 1e6, 2) if valid else None
        figures["cpu_s"] = self._cpu_by_process(since, until)
        figures["cpu_by_second"] = {
            name: [self._cpu_by_process(t, t + 1.0).get(name, 0.0) for t in _seconds(since, until)]
            for name in figures["cpu_s"]
        }
        return figures

    def _cpu_by_process(self, since: float, until: float) -> dict[str, float]:
        """CPU seconds each watched process used between ``since`` and ``until``, busiest first
        (a process restarted in between counts from its first sample)."""
        inside = [used for at, used in self.cpu if since <= at <= until]
        if len(inside) < 2:
            return {}
        spent: dict[str, float] = {}
        for (name, pid), last in inside[-1].items():
            first = next((used[(name, pid)] for used in inside if (name, pid) in used), last)
            spent[name] = spent.get(name, 0.0) + last - first
        return {n: round(s, 2) for n, s in sorted(spent.items(), key=lambda kv: -kv[1]) if s > 0}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)


def _seconds(since: float, until: float) -> list[float]:
    """The starts of the whole seconds from ``since`` (at least one) until ``until``."""
    return [since + i for i in range(max(1, int(until - since + 0.999)))]


def _pressure(resource: str, line: str) -> int:
    """The ``total`` (microseconds) of one line of ``/proc/pressure/<resource>``; -1 without."""
    try:
        text = Path("/proc/pressure", resource).read_text()
    except OSError:
        return -1
    for row in text.splitlines():
        if row.startswith(line + " "):
            return int(row.rsplit("total=", 1)[1])
    return -1


_FENCING = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\].*Fencing broker (\d+) at epoch \d+ "
    r"because its session has timed out"
)


def controller_fences(log: Path, since: float, until: float) -> list[tuple[int, float]]:
    """The brokers the controller fenced for a timed-out session between ``since`` and
    ``until`` (wall clock, seconds since the epoch), each with when (seconds after ``since``),
    read from the controller's log."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    fences = []
    for line in lines:
        found = _FENCING.match(line)
        if found is None:
            continue
        stamp = time.mktime(time.strptime(found[1], "%Y-%m-%d %H:%M:%S")) + int(found[2]) / 1000
        if since <= stamp <= until:
            fences.append((int(found[3]), round(stamp - since, 2)))
    return fences


def _beside_the_gap(
    fault: Fault, host: HostWatch | None, controller_log: Path | None, window: float
) -> None:
    """What the machine and the controller did during a broker kill's gap on the partitions it
    did not lead: ``host`` (:class:`HostWatch`), and ``fenced``, each broker the controller fenced
    for a timed-out session within the window (seconds after the kill). A broker fenced that
    was not killed means the controller heard none of its heartbeats for a session."""
    gap, began = fault.detail.get("gap_other_s"), fault.detail.get("gap_other_from_s")
    if host is not None and gap is not None and began is not None:
        fault.detail["host"] = host.window(fault.at + began, fault.at + began + gap)
    if controller_log is not None:
        fences = controller_fences(controller_log, fault.epoch, fault.epoch + window)
        fault.detail["fenced"] = fences
        victim = int(fault.victim.rsplit("-", 1)[1])
        end = None if gap is None or began is None else began + gap
        fault.detail["alive_fenced_in_gap"] = sorted(
            {b for b, t in fences if b != victim and (end is None or t <= end)}
        )


def progress_after(
    arrivals: _Arrivals, since: float, until: float, victim: str, back_at: float | None
) -> float | None:
    """Seconds from ``since`` to the partition's first event after it written by another
    processor than ``victim`` (or by ``victim`` once it came back at ``back_at``); ``None`` when
    there was none before ``until``."""
    start = bisect.bisect_right(arrivals.times, since)
    for t, writer in zip(arrivals.times[start:], arrivals.writers[start:], strict=True):
        if t > until:
            return None
        if writer != victim or (back_at is not None and t > back_at):
            return t - since
    return None


def answer_after(follow: Follow, run_id: str, since: float, until: float) -> float | None:
    """Seconds from ``since`` to the first committed event of ``run_id`` (a probe started right
    after a fault); ``None`` if none arrived before ``until``."""
    seen = follow.seen(run_id)
    if seen is None or seen.first is None or seen.first > until:
        return None
    return seen.first - since


def commit_gap(
    follow: Follow, partitions: set[int], since: float, until: float
) -> tuple[float, float] | None:
    """The longest time between ``since`` and ``until`` in which no new event was committed on
    any of ``partitions`` (from the last one before ``since`` to the first one after it, and on),
    and when it began (seconds after ``since``, negative when before it); ``None`` if nothing at
    all arrived in the window."""
    with follow.lock:
        times = sorted(t for p in partitions for t in follow.arrivals[p].times)
    start = max(0, bisect.bisect_right(times, since) - 1)
    end = bisect.bisect_right(times, until)
    window = times[start:end]
    if len(window) < 2 or window[-1] <= since:
        return None
    gap, began = max((b - a, a) for a, b in itertools.pairwise(window))
    return round(gap, 2), round(began - since, 2)


def _median_max(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return round(statistics.median(values), 2), round(max(values), 2)

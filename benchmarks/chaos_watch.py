"""What the chaos driver watches: every committed event as it arrives, and the figures read from
those arrivals (failover after a worker fault, the longest commit gap after a broker kill).

``Follow`` tails every partition of the events topic ``read_committed`` from its first offset in a
background thread and notes, per partition, when each event arrived and which processor wrote it
(its ``flowstream-writer`` header), and per run when it created its signal wait and its hook and
when it ended. The driver reads it to know when to resume hooks and signals; the figures are
computed from it after the run.
"""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from dataclasses import dataclass, field

from benchmarks import harness
from flowstream import codec, wire
from flowstream.kafka import clients

__all__ = ["Follow", "RunSeen", "commit_gap", "progress_after"]

TERMINAL = harness.TERMINAL
_WATCHED = frozenset({"signal_wait_created", "hook_created", *TERMINAL})


@dataclass
class RunSeen:
    """When (monotonic seconds) the driver saw a run's waits and its end committed."""

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
        if kind not in _WATCHED:
            return
        seen = self.runs.setdefault(run_id, RunSeen())
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

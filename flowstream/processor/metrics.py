"""Prometheus metrics of one processor, in a registry of its own (several may share a process).

No ``*_created`` series: prometheus_client's creation-time gauges are turned off for the process
(they were a third of the page and say nothing a scrape's own time does not).

Label cardinality is bounded: ``step`` takes a step's name, which workflow code chooses (step ids
may be per item; names are the handlers), and the first ``MAX_STEP_NAMES`` names seen get their
own series, truncated to ``MAX_STEP_NAME_CHARS``; any later name is counted under ``_other``.
"""

from __future__ import annotations

import json
import platform
import socket
import threading
from collections.abc import Callable, Iterable
from importlib.metadata import PackageNotFoundError, version
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIEnvironment

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    make_wsgi_app,
)
from prometheus_client.exposition import ThreadingWSGIServer

__all__ = ["MAX_STEP_NAMES", "MAX_STEP_NAME_CHARS", "OTHER_STEPS", "Health", "ProcessorMetrics"]

disable_created_metrics()  # type: ignore[no-untyped-call]

#: ``/healthz``: whether the processor is healthy, and a report saying why (JSON).
Health = Callable[[], tuple[bool, dict[str, Any]]]

_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
#: Step handlers run from milliseconds (a lookup) to minutes (a report).
_STEP_SECONDS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
#: Step names with a series of their own; later names share ``OTHER_STEPS``.
MAX_STEP_NAMES = 100
MAX_STEP_NAME_CHARS = 64
OTHER_STEPS = "_other"


class ProcessorMetrics:
    """Commands, appends, conflicts, nondeterminism, steps, timers, latency, ownership, restore."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        r = self.registry
        self.commands = Counter(
            "flowstream_commands",
            "Commands consumed, by topic and outcome",
            ["topic", "outcome"],
            registry=r,
        )
        self.outcomes = Counter(
            "flowstream_command_outcomes",
            "Command outcomes written (outcome records of the events topic), by status",
            ["status"],
            registry=r,
        )
        self.events_appended = Counter(
            "flowstream_events_appended", "Events staged into transactions", registry=r
        )
        self.conflicts = Counter(
            "flowstream_append_conflicts", "append_if_sequence conflicts (replayed)", registry=r
        )
        self.nondeterminism = Counter(
            "flowstream_nondeterminism_failures",
            "Replays that produced another decision",
            registry=r,
        )
        self.step_attempts = Counter(
            "flowstream_step_attempts", "Step attempts by outcome", ["outcome"], registry=r
        )
        self.dead_letters = Counter(
            "flowstream_dead_letters", "Records sent to the dead-letter topic", registry=r
        )
        self.corrupt_records = Counter(
            "flowstream_corrupt_records",
            "Records of the events topic skipped during restore because they are not valid events",
            registry=r,
        )
        self.workflow_failures = Counter(
            "flowstream_workflow_task_failures",
            "Decisions whose workflow code (or the engine around it) raised, by run",
            registry=r,
        )
        self.runs_repaired = Counter(
            "flowstream_runs_repaired",
            "Runs the liveness scan found waiting on nothing (stalled) and drove on",
            registry=r,
        )
        self.quarantined_runs = Gauge(
            "flowstream_quarantined_runs",
            "Runs of the owned partitions whose history cannot be read completely",
            registry=r,
        )
        self.records_left_out = Counter(
            "flowstream_records_left_out",
            "Dead letters the producer refused in full and in their minimal form",
            registry=r,
        )
        self.owner_fences = Counter(
            "flowstream_owner_fences",
            "Gone previous owners of taken partitions whose open transactions this member aborted",
            registry=r,
        )
        self.aborts = Counter("flowstream_transaction_aborts", "Aborted transactions", registry=r)
        self.loop_iterations = Counter(
            "flowstream_loop_iterations",
            "Iterations of the processor's loop (one that spins while it waits shows here)",
            registry=r,
        )
        self.producer_resets = Counter(
            "flowstream_producer_resets",
            "Transactional producers replaced after a fatal error (fenced: e.g. the coordinator "
            "aborted a transaction that outlived transaction.timeout.ms)",
            registry=r,
        )
        self.parked_expired = Counter(
            "flowstream_parked_expired",
            "Parked commands dead-lettered after waiting past their time-to-live",
            registry=r,
        )
        self.parked_for_build = Counter(
            "flowstream_parked_for_build",
            "Commands parked because no runtime here serves their run's build or workflow",
            registry=r,
        )
        self.timer_lag_seconds = Histogram(
            "flowstream_timer_lag_seconds",
            "How late timers and retries fire",
            buckets=_LATENCY,
            registry=r,
        )
        self.transaction_seconds = Histogram(
            "flowstream_transaction_seconds", "Commit latency", buckets=_LATENCY, registry=r
        )
        self.decision_seconds = Histogram(
            "flowstream_decision_seconds",
            "Time to apply one command or step result",
            buckets=_LATENCY,
            registry=r,
        )
        self.owned_partitions = Gauge(
            "flowstream_owned_partitions", "Partitions owned and active", registry=r
        )
        self.step_seconds = Histogram(
            "flowstream_step_duration_seconds",
            f"Time a step handler ran, by step name (the first {MAX_STEP_NAMES} names; "
            f"later ones as {OTHER_STEPS})",
            ["step"],
            buckets=_STEP_SECONDS,
            registry=r,
        )
        self._step_names: set[str] = set()
        self._step_lock = threading.Lock()
        self.build_info = Gauge(
            "flowstream_build_info",
            "flowstream's version, the Python it runs on and the runtime builds served (1)",
            ["version", "python", "builds"],
            registry=r,
        )
        self.restore_seconds = Histogram(
            "flowstream_restore_seconds",
            "Time to restore a partition before its first decision",
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120),
            registry=r,
        )

    def child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, kept: a labelled child is looked up on every decision.
        (Not for ``build_info``, which is cleared.)"""
        key = (id(metric), values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

    def observe_step(self, name: str, seconds: float) -> None:
        """One step attempt's handler time, under its bounded name label."""
        label = name[:MAX_STEP_NAME_CHARS]
        if label not in self._step_names:
            with self._step_lock:  # steps finish on several threads
                if label not in self._step_names:
                    if len(self._step_names) >= MAX_STEP_NAMES:
                        label = OTHER_STEPS
                    else:
                        self._step_names.add(label)
        self.child(self.step_seconds, label).observe(seconds)

    def set_build(self, builds: Iterable[str | None]) -> None:
        """``flowstream_build_info``: ``builds`` are the runtime builds served (``None``: the
        runtime of unpinned runs)."""
        served = ",".join(sorted(b or "unpinned" for b in builds))
        self.build_info.clear()
        self.build_info.labels(
            version=_version(), python=platform.python_version(), builds=served
        ).set(1)

    def serve(
        self, port: int, host: str = "127.0.0.1", *, health: Health | None = None
    ) -> WSGIServer:
        """Serve the metrics over HTTP on ``host:port`` in a daemon thread; with ``health``,
        ``/healthz`` answers 200 or 503 with its JSON report. Returns the server (its
        ``shutdown`` stops it)."""
        metrics = make_wsgi_app(self.registry)

        def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
            if health is None or environ.get("PATH_INFO") != "/healthz":
                scraped: Iterable[bytes] = metrics(environ, start_response)
                return scraped
            ok, report = health()
            body = json.dumps(report, sort_keys=True).encode()
            status = "200 OK" if ok else "503 Service Unavailable"
            headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
            start_response(status, headers)
            return [body]

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server_class = type("MetricsServer", (ThreadingWSGIServer,), {"address_family": family})
        server: WSGIServer = make_server(host, port, app, server_class, handler_class=_QuietHandler)
        threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
        return server


def _version() -> str:
    try:
        return version("flowstream")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


class _QuietHandler(WSGIRequestHandler):
    """No access log on stderr (a scrape every few seconds)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

"""Prometheus metrics of one processor, in a registry of its own (several may share a process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = ["ProcessorMetrics"]

_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class ProcessorMetrics:
    """Commands, appends, conflicts, nondeterminism, steps, timers, latency, ownership, restore."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.commands = Counter(
            "flowstream_commands",
            "Commands consumed, by topic and outcome",
            ["topic", "outcome"],
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
        self.restore_seconds = Histogram(
            "flowstream_restore_seconds",
            "Time to restore a partition before its first decision",
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120),
            registry=r,
        )

    def serve(self, port: int) -> None:
        """Expose the metrics over HTTP on ``127.0.0.1:port``."""
        start_http_server(port, addr="127.0.0.1", registry=self.registry)

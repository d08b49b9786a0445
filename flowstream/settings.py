"""``Settings``: the one frozen configuration object, read once at the entry point.

Every field can come from an environment variable ``FLOWSTREAM_<FIELD>`` (upper case); command-line
options override the environment. The object is passed down; nothing else reads the environment.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from pydantic import Field, field_validator

from flowstream.model.base import FrozenModel

__all__ = ["Settings", "from_environment"]

M = TypeVar("M", bound=FrozenModel)


class Settings(FrozenModel):
    """Processor and client settings."""

    bootstrap: str = "127.0.0.1:19092"
    topic_prefix: str = "flowstream"
    group: str = "flowstream-processors"
    #: Names this member: its client id, its transactional ids (``processor.fence``), the
    #: writer of its records. Give each worker a stable one (a restart keeps its ids).
    instance_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    state_dir: str = "flowstream-state"
    app: str = "flowstream.examples.order:runtime"
    #: Longest time events wait in an open transaction before it commits.
    commit_interval_ms: int = Field(default=20, ge=1)
    #: Longest time a transaction waits for the outcomes of the steps the last commit started.
    commit_linger_ms: int = Field(default=5, ge=0)
    #: Commit early once this many commands were applied in the open transaction.
    max_commands_per_transaction: int = Field(default=500, ge=1)
    #: Steps running at once in this processor.
    step_concurrency: int = Field(default=64, ge=1)
    #: Run synchronous step handlers on the loop thread (fast, blocks decisions while running).
    inline_sync_steps: bool = False
    #: Start a step as soon as its ``step_started`` is decided, before the transaction holding
    #: it commits, so a short step's outcome and the decisions after it join that same
    #: transaction. A crash or an aborted transaction can then leave a handler that ran with no
    #: durable ``step_started``; the next owner runs that attempt again with the same
    #: idempotency key, as after any crash (steps are at least once either way). Off: a handler
    #: starts only once its ``step_started`` committed.
    eager_steps: bool = False
    #: The coordinator aborts a transaction open longer than this, which fences its producer
    #: (a new one is made). Transactions commit every few ms, so this only bounds a stall (a
    #: slow broker, a starved host). A dead processor's open transaction does not wait for it:
    #: the next owner of its partitions fences it at once (``processor.fence``).
    transaction_timeout_ms: int = Field(default=10_000, ge=1000)
    #: How long the processor's producers and group member, and ``FlowClient``'s producer, wait
    #: for a broker's answer before they close that connection and ask again, where the
    #: partition's leader or the coordinator is now (librdkafka's ``socket.timeout.ms``: 60 s
    #: by default, just under ``transaction_timeout_ms`` for a transactional producer, which it
    #: may not exceed). A broker that stops answering without dying (a long pause, a network
    #: that drops packets) keeps its connections open: the controller moves its partitions
    #: within its session, but a write left waiting there holds the whole transaction, and a
    #: start sent there its caller, until this runs out.
    request_timeout_ms: int = Field(default=3_000, ge=1000)
    #: A processor that sent no heartbeat for this long loses its partitions (heartbeats every
    #: tenth of it). Raised to the brokers' ``group.min.session.timeout.ms`` if below.
    session_timeout_ms: int = Field(default=1_500, ge=1000)
    #: The consumer group protocol. ``classic``: the member counts its session from the last
    #: heartbeat the coordinator answered. ``consumer`` (KIP-848, Kafka 4): the coordinator
    #: counts it from the last heartbeat it received, and the processor sets the group's
    #: ``consumer.session.timeout.ms`` to ``session_timeout_ms``. ``auto``: ``consumer`` where
    #: the brokers offer it and their ``group.consumer.min.session.timeout.ms`` allows the
    #: session (45 s unless lowered), else ``classic``.
    group_protocol: Literal["auto", "classic", "consumer"] = "auto"
    max_poll_interval_ms: int = Field(default=60_000, ge=1000)
    #: How long one loop iteration takes decisions before its transaction is sealed (steps'
    #: outcomes first, then new commands; what is left waits for the next iteration).
    decision_budget_ms: int = Field(default=200, ge=1)
    #: A fired timer not applied within this many ms is fired again.
    timer_refire_ms: int = Field(default=30_000, ge=100)
    #: A failed workflow task is retried after this many ms, doubling up to the maximum.
    task_retry_initial_ms: int = Field(default=1_000, ge=1)
    task_retry_max_interval_ms: int = Field(default=300_000, ge=1)
    #: The consecutive workflow-task failure that is no longer retried by itself.
    task_retry_max_automatic: int = Field(default=10, ge=1)
    #: The consecutive workflow-task failure that fails the run (unset: none does).
    task_fail_after: int | None = Field(default=None, ge=1)
    max_message_bytes: int = Field(default=1024 * 1024, ge=1024)
    #: Hops a continue-as-new chain may have after its root (0: no limit); the continuation
    #: that would go beyond is refused before its link is written.
    max_continuations: int = Field(default=1_000, ge=0)
    #: A command parked this long (a signal for a run that never started, a start whose build
    #: no processor serves) is dead-lettered with the reason. Seven days: as long as the
    #: command topics keep a command, so it can still be looked up, and sent again.
    parked_ttl_ms: int = Field(default=7 * 24 * 3_600_000, ge=1000)
    metrics_port: int | None = None
    #: The address the metrics server (``/metrics``, ``/healthz``) binds: loopback by default;
    #: ``0.0.0.0`` in a container, where a published port reaches the container's interface.
    metrics_host: str = "127.0.0.1"
    #: librdkafka debug contexts of the processor's clients (``eos,protocol``, ``all``); their
    #: lines go to the ``flowstream.kafka`` logger. Empty: none.
    kafka_debug: str = ""

    @field_validator("instance_id")
    @classmethod
    def _instance_id(cls, value: str) -> str:
        if not value or any(c in value for c in "/#") or any(c.isspace() for c in value):
            raise ValueError(f"instance id {value!r} must be non-empty, without '/', '#' or spaces")
        return value

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from ``FLOWSTREAM_*`` variables, then non-``None`` ``overrides``."""
        return from_environment(cls, "FLOWSTREAM_", environ, overrides)


def from_environment(
    model: type[M], prefix: str, environ: Mapping[str, str] | None, overrides: Mapping[str, Any]
) -> M:
    """``model`` from ``<prefix><FIELD>`` variables (upper case; ``os.environ`` when
    ``environ`` is ``None``), then the non-``None`` ``overrides``."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for name in model.model_fields:
        raw = env.get(f"{prefix}{name.upper()}")
        if raw is not None:
            values[name] = raw
    values.update({k: v for k, v in overrides.items() if v is not None})
    return model.model_validate(values)
